"""Secrets of well-known shapes redacted (worker.core.redaction): each kind found, replaced by
its placeholder and counted; ordinary code left alone; linear cost on adversarial input."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.redaction_samples import ORDINARY, PLANTED, Planted

from worker.core.redaction import (
    PATTERNS,
    placeholder,
    redact,
    redact_json,
    redact_messages,
    without_random_tokens,
)
from worker.core.redaction.decoders import _BASE64_RUN, _base64_runs
from worker.core.redaction.randomness import _RUN as _RANDOM_RUN
from worker.wire.models import Message, ToolCall


@pytest.mark.parametrize("planted", PLANTED, ids=lambda p: p.kind)
def test_each_kind_is_replaced_by_its_placeholder_and_counted(planted: Planted) -> None:
    out = redact(planted.text)
    assert planted.secret not in out.text
    assert placeholder(planted.kind) in out.text
    assert planted.kept in out.text  # only the secret goes, not what names it
    assert out.counts == {planted.kind: 1}


@pytest.mark.parametrize("planted", PLANTED, ids=lambda p: p.kind)
def test_each_kind_is_found_in_json_inside_a_json_string(planted: Planted) -> None:
    """Tool-call arguments are JSON text: quotes and line breaks arrive escaped, and the
    arguments must stay valid JSON once the secret is gone."""
    arguments = json.dumps({"command": f"cat <<EOF\n{planted.text}\nEOF"})
    out = redact(arguments)
    assert out.counts == {planted.kind: 1}
    command = json.loads(out.text)["command"]
    assert not any(line in command for line in planted.secret.splitlines())
    assert planted.kept in command


def test_every_pattern_has_a_planted_sample() -> None:
    assert {p.kind for p in PATTERNS} == {p.kind for p in PLANTED}


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_code_is_not_redacted(text: str) -> None:
    out = redact(text)
    assert out.text == text
    assert out.counts == {}


def test_a_redacted_text_is_redacted_again_to_itself() -> None:
    text = "\n".join(p.text for p in PLANTED)
    once = redact(text)
    assert once.counts == dict(Counter(p.kind for p in PLANTED))
    twice = redact(once.text)
    assert twice.text == once.text and twice.counts == {}


def test_a_pem_key_cut_off_before_its_end_line_is_still_redacted() -> None:
    pem = next(p for p in PLANTED if p.kind == "private_key")
    cut = pem.text.split("-----END")[0]
    out = redact(cut)
    assert "MIIEowIBAAKCAQEA" not in out.text and out.counts == {"private_key": 1}


def test_a_pem_key_inside_json_with_escaped_newlines_is_redacted_whole() -> None:
    pem = next(p for p in PLANTED if p.kind == "private_key")
    arguments = json.dumps({"path": "id_rsa", "content": pem.text})
    out = redact(arguments)
    for line in pem.secret.splitlines():
        assert line not in out.text
    assert json.loads(out.text)["path"] == "id_rsa"  # still JSON: the placeholder has no quotes


def test_messages_are_redacted_in_text_reasoning_and_tool_arguments() -> None:
    openai, jwt = (next(p for p in PLANTED if p.kind == k) for k in ("openai_api_key", "jwt"))
    call = ToolCall(id="c1", name="bash", arguments=json.dumps({"command": openai.text}))
    messages = [
        Message(id="m0", role="user", content="plain request", source_index=0),
        Message(id="m1", role="assistant", reasoning=jwt.text, tool_calls=(call,), source_index=1),
        Message(id="m2", role="tool", content=jwt.text, tool_call_id="c1", source_index=2),
    ]
    out, counts = redact_messages(messages)
    assert out[0] is messages[0]  # untouched messages are the same objects
    assert counts == {"openai_api_key": 1, "jwt": 2}
    dumped = json.dumps([m.model_dump() for m in out])
    assert openai.secret not in dumped and jwt.secret not in dumped
    assert [m.id for m in out] == ["m0", "m1", "m2"] and out[1].tool_calls[0].id == "c1"


# Pieces of text that make or break the patterns' needles, gates and matches around the joins
# of a range's texts: planted secrets, their halves, needles, assignment and URL syntax.
_PIECES = [
    *(p.text for p in PLANTED),
    *(half for p in PLANTED for half in (p.text[: len(p.text) // 2], p.text[len(p.text) // 2 :])),
    *(needle for p in PATTERNS for needle in p.needles),
    *"=: \n\"'",
    "secretoken",
    "TOKEN",
    "İ",  # lower() makes it two characters: positions in the lowered range no longer agree
    "https://u:",
    "@host",
    "aB3dE5fG7hJ9kL2m",
]
_TEXTS = st.lists(st.sampled_from(_PIECES), max_size=6).map("".join)


_SECRET_VALUE = "aB3dE5fG7hJ9kL2m"


@settings(deadline=None, max_examples=300)
@given(st.lists(st.tuples(_TEXTS, _TEXTS, st.lists(_TEXTS, max_size=2)), max_size=6))
# Two needles overlapping ("secret", "token"): the second one is where the assignment is.
@example([(f"secretoken={_SECRET_VALUE}", "", [])])
# Lower-casing lengthens the first text: found in the lowered range, the assignment's place
# would point past its own text.
@example([("İ" * 40, "", []), ("x", f"token={_SECRET_VALUE}", []), ("z" * 100, "", [])])
def test_a_range_is_redacted_as_each_of_its_texts_alone(
    parts: list[tuple[str, str, list[str]]],
) -> None:
    """The range's needles are looked for once in all its texts joined: each text still comes
    out as redacting it alone makes it, and the counts are the sum of those."""
    messages = [
        Message(
            id=f"m{k}",
            role="assistant",
            content=content,
            reasoning=reasoning,
            tool_calls=tuple(
                ToolCall(id=f"c{k}-{j}", name="bash", arguments=a) for j, a in enumerate(args)
            ),
            source_index=k,
        )
        for k, (content, reasoning, args) in enumerate(parts)
    ]
    out, counts = redact_messages(messages)
    expected: Counter[str] = Counter()
    for before, after in zip(messages, out, strict=True):
        assert after.content == redact(before.content, expected).text
        assert after.reasoning == redact(before.reasoning, expected).text
        for call_before, call_after in zip(before.tool_calls, after.tool_calls, strict=True):
            assert call_after.arguments == redact(call_before.arguments, expected).text
    assert counts == dict(expected)


@settings(deadline=None, max_examples=300)
@given(st.lists(st.sampled_from(_PIECES), max_size=8).map("".join))
def test_every_gate_match_starts_with_a_needle_of_its_pattern(text: str) -> None:
    """The gate is its needles' alternatives, each searched for apart in a range (a literal
    start is fast to skip to): none may start elsewhere."""
    for pattern in PATTERNS:
        if pattern.gate is not None:
            haystack = text.lower() if pattern.folded else text
            for found in pattern.gate.finditer(haystack):
                assert found.group().startswith(pattern.needles)


def test_json_documents_are_redacted_string_by_string() -> None:
    github = next(p for p in PLANTED if p.kind == "github_token")
    doc = {"messages": [{"role": "tool", "content": [{"type": "text", "text": github.text}]}]}
    counts: Counter[str] = Counter()
    out = redact_json(doc, counts)
    assert github.secret not in json.dumps(out)
    assert counts == {"github_token": 1}
    assert out["messages"][0]["role"] == "tool"


# --- bounded cost -----------------------------------------------------------------------------

_MB = 1 << 20
# Inputs each pattern's start matches over and over, with nothing (or little) to redact.
ADVERSARIAL = {
    "one long run": "a" * _MB,
    "sk- prefixes": "sk-" * (_MB // 3),
    "PEM headers": "-----BEGIN RSA PRIVATE KEY-----" * (_MB // 31),
    "PEM body without an end": "-----BEGIN PRIVATE KEY-----" + "A" * _MB,
    "jwt heads": "eyJ" * (_MB // 3),
    "jwt dots": "eyJabcdefghij." * (_MB // 14),
    "url schemes": "a://b:" * (_MB // 6),
    "url without @": "http://user:" + "p" * _MB,
    "assignments": "token=" * (_MB // 6),
    "assignment chain": "api_key:a" * (_MB // 9),
    "authorization": "Authorization: Bearer " * (_MB // 22),
    "aws secret context": "aws_secret_access_key=" * (_MB // 22),
    "dashes": "-" * _MB,
    "spaces then colon": " " * _MB + ":",
}


def _seconds(text: str) -> float:
    start = time.process_time()
    redact(text)
    return time.process_time() - start


def test_adversarial_megabytes_cost_about_what_a_plain_megabyte_costs() -> None:
    """A pattern that backtracked (or rescanned a run from each of its characters) would take
    minutes on these; a linear one stays within a small multiple of ordinary text, in which
    every pattern runs (each pattern's literal appears once)."""
    words = "the parser reads src/app.py line 42 and returns 17 items; "
    needles = " sk- PRIVATE KEY AKIA ghp_ xoxb- AIza eyJ _live_ :// "
    plain = (needles + words * (_MB // len(words)))[:_MB]
    baseline = max(min(_seconds(plain) for _ in range(3)), 0.01)
    for name, text in ADVERSARIAL.items():
        took = _seconds(text)
        assert took < baseline * 40, f"{name}: {took:.3f}s against {baseline:.3f}s for plain text"


def test_the_documented_table_lists_every_kind_in_the_order_they_run() -> None:
    doc = (Path(__file__).resolve().parent.parent.parent / "docs" / "summaries.md").read_text()
    section = doc.split("## Secrets are redacted before summarizing", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
    assert rows == [p.kind for p in PATTERNS]


def test_real_coding_sessions_are_left_almost_untouched() -> None:
    """False positives over the corpus (100 real SWE-bench sessions with no real credentials):
    grep and cat output, diffs, hashes, tracebacks, URL-parsing tests with ``user:pass@``. The
    only finds are a test's ``Proxy-Authorization: Basic`` value (base64 of ``user:pass``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
    from corpus import conversations, corpus_dir

    if corpus_dir() is None:
        pytest.skip("corpus absent: set COMPACTOR_CORPUS_DIR or place it at ../shared/corpus")
    counts: Counter[str] = Counter()
    sessions = 0
    for _name, snap in conversations():
        redact_json(snap["messages"], counts)
        sessions += 1
    assert sessions == 100
    assert sum(counts.values()) <= 5, counts


@settings(max_examples=500)
@given(st.text(alphabet="aZ9+/=_- .é%\n", max_size=120))
def test_base64_runs_are_found_as_the_regex_finds_them(text: str) -> None:
    """The base64 decoder's runs are found by marking and str.find (fast), then matched by
    the regex only where a long run is: the same matches as the regex over the whole text."""
    expected = [m.span() for m in _BASE64_RUN.finditer(text)]
    assert [m.span() for m in _base64_runs(text)] == expected


def test_the_digest_mask_keeps_the_corpus_names() -> None:
    """Over the corpus (100 real sessions, no real credentials), the digest's mask of random
    tokens takes at most a handful of the 16+ character runs (message ids, an anchor), none of
    them a code name, a path, a hash or a version tag."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
    from corpus import conversations, corpus_dir

    if corpus_dir() is None:
        pytest.skip("corpus absent: set COMPACTOR_CORPUS_DIR or place it at ../shared/corpus")
    runs = masked = 0
    for _name, snap in conversations():
        for message in snap["messages"]:
            content = message.get("content")
            for text in [content] if isinstance(content, str) else []:
                for run in _RANDOM_RUN.finditer(text):
                    runs += 1
                    masked += without_random_tokens(run.group(0)) != run.group(0)
    assert runs > 10_000
    assert masked <= 10, masked
