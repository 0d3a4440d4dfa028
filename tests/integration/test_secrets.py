"""Nothing secret leaves (issue 36 §1): every secret shape of the issue's conversation, and every
kind, in every position a summarizer or an event can carry it (a message's text, a tool's
output, a tool call's arguments written with JSON escapes, a URL's first query parameter, a file
part's name, a requested compaction's instructions, a reviewer's edited summary) reaches neither
the LLM (the stand-in records what it was sent), the digest, the event nor a log, and the event
counts it by kind. Coverage is measured against detect-secrets' own rules, used as a library;
random high-entropy tokens (by detect-secrets' measure) never reach the digest's text. The
pipeline here is the one the workers run, in process, with a real HTTP stand-in for the LLM; an
edit is checked by the function the approve route, the inspector's form and a review hook's
answer all call (worker.core.review.edited_summary)."""

from __future__ import annotations

import base64
import json
import logging
import random
import string
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionContentPartTextParam
from openai.types.chat.chat_completion_content_part_param import File, FileFile
from support.redaction_samples import DOCUMENTED_KINDS, PLANTED, SHAPES, Planted
from support.service_support import conversation

from worker.config import Settings
from worker.core.identifiers import code_names
from worker.core.redaction import (
    PATTERNS,
    RANDOM_PLACEHOLDER,
    looks_random,
    redact,
    without_random_tokens,
)
from worker.core.review import edited_summary
from worker.errors import InvalidInput
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.summarize.llm import LLMSummarizer
from worker.summarize.prompt import system_prompt
from worker.testing.standin_llm import StandinLLM
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent
from worker.wire.requests import CompactRequest

KEY_ENV = "COMPACTOR_TEST_SECRETS_KEY"
SINGLE_LINE = {name: p for name, p in SHAPES.items() if "\n" not in p.text}


def escaped(text: str) -> str:
    """``text`` with every character a JSON ``\\uXXXX`` escape (``\\u0073\\u006b-…``)."""
    return "".join(f"\\u{ord(c):04x}" for c in text)


def written(shape: Planted) -> str:
    """The secret as its text writes it: itself, or JSON-quoted when the text is a JSON
    document (a service account's key, its line breaks written ``\\n``)."""
    return shape.secret if shape.secret in shape.text else json.dumps(shape.secret)[1:-1]


def with_escaped_secret(shape: Planted) -> str:
    """Tool-call arguments running ``cat`` on the shape's text, the secret's every character
    (as the text writes it) a ``\\uXXXX`` escape inside the arguments' JSON."""
    plain = json.dumps({"command": f"cat <<EOF\n{shape.text}\nEOF"})
    arguments = plain.replace(json.dumps(written(shape))[1:-1], escaped(written(shape)))
    assert arguments != plain and json.loads(arguments) == json.loads(plain)
    return arguments


def leaked(secret: str, text: str) -> bool:
    """Whether a line of ``secret`` is in ``text`` as written, JSON-escaped or JSON-quoted."""
    lines = [line for line in secret.splitlines() if line.strip()]
    forms = {form for line in lines for form in (line, escaped(line), json.dumps(line)[1:-1])}
    return any(form in text for form in forms)


# --- the shapes, as written and encoded -----------------------------------------------------------


@pytest.mark.parametrize("name", SHAPES)
def test_each_shape_is_redacted_where_it_is_written(name: str) -> None:
    shape = SHAPES[name]
    out = redact(shape.text)
    assert not leaked(shape.secret, out.text)
    assert shape.kind in out.counts
    assert shape.kept in out.text  # only the secret goes, not what names it


@pytest.mark.parametrize("name", SHAPES)
def test_each_shape_is_redacted_in_tool_arguments_written_with_json_escapes(name: str) -> None:
    """The secret's every character a ``\\uXXXX`` escape inside the arguments' JSON: decoded,
    found with its context, and written back so that the arguments are still JSON."""
    shape = SHAPES[name]
    out = redact(with_escaped_secret(shape))
    assert shape.kind in out.counts
    command = json.loads(out.text)["command"]
    assert not leaked(shape.secret, command) and not leaked(shape.secret, out.text)


@pytest.mark.parametrize("name", SINGLE_LINE)
def test_each_shape_is_redacted_percent_encoded_in_a_url(name: str) -> None:
    shape = SHAPES[name]
    url = f"https://logs.example.com/search?q={quote(shape.text, safe='')}&page=1"
    out = redact(url)
    assert shape.kind in out.counts and not leaked(shape.secret, out.text)
    assert out.text.startswith("https://logs.example.com/search?q=")
    assert out.text.endswith("&page=1")


@pytest.mark.parametrize("name", SHAPES)
def test_each_shape_is_redacted_wrapped_in_base64(name: str) -> None:
    shape = SHAPES[name]
    wrapped = base64.b64encode(shape.text.encode()).decode()
    out = redact(f"echo {wrapped} | base64 -d > restored.txt")
    assert shape.kind in out.counts
    assert wrapped not in out.text and not leaked(shape.secret, out.text)
    assert out.text.endswith("| base64 -d > restored.txt")


def test_a_secret_inside_a_refused_candidate_is_still_found() -> None:
    """A URL's scheme and its first query parameter: ``https://…?token=`` is first read as
    ``https`` assigned ``//…?token`` (refused: not a secret's name), and the search goes on from
    the end of that name, not of that value."""
    value = SHAPES["query_token"].secret
    for url in (
        f"https://api.example.com/v1?token={value}",
        f"https://api.example.com/v1?api_key={value}&page=2",
        f"http://h/x?access_token={value}",
    ):
        out = redact(url)
        assert value not in out.text and out.counts == {"secret_assignment": 1}, url
    assert redact(f"https://h/x?q=1&page=2&v={value}").counts == {}  # no secret's name


def test_the_shapes_of_issue_36_are_all_there() -> None:
    """The 31 of the issue and more; every kind, the 13 documented then among them."""
    assert len(SHAPES) >= 31
    assert {p.kind for p in SHAPES.values()} == {p.kind for p in PATTERNS}
    assert set(DOCUMENTED_KINDS) <= {p.kind for p in PATTERNS}


# --- coverage against detect-secrets' rules -------------------------------------------------------

# detect-secrets' rules that match a secret's own shape (its entropy rules and its public IP
# rule are not shapes of a secret). Each rule's sample below is one the rule itself flags.
_PLUGINS: dict[str, type[Any]] = dict(get_mapping_from_secret_type_to_class())
RULES: dict[str, RegexBasedDetector] = {
    kind: cls()
    for kind, cls in _PLUGINS.items()
    if issubclass(cls, RegexBasedDetector) and kind != "Public IP (ipv4)"
}
# Shapes none of our kinds covers (docs/summaries.md says so): a bare token with no prefix or
# name around it that tells it from an identifier.
NOT_COVERED = {
    "Artifactory Credentials",
    "Discord Bot Token",
}


def _rule_samples() -> dict[str, str]:
    by_kind = {p.kind: p.text for p in PLANTED}
    return {
        "AWS Access Key": by_kind["aws_access_key_id"],
        "Artifactory Credentials": "artifactory token AKC" + "p8aB3dE5fG7hJ9kL2mN4",
        "Azure Storage Account access key": by_kind["azure_storage_key"],
        "Basic Auth Credentials": by_kind["url_password"],
        "Cloudant Credentials": "cloudant_password = '"
        + "3f2a9c4e1b7d8a6f5e4d3c2b1a0f9e8d" * 2
        + "'",
        "Discord Bot Token": "MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs",
        "GitHub Token": SHAPES["github_classic_token"].text,
        "GitLab Token": by_kind["gitlab_token"],
        "IBM Cloud IAM Key": "ibm_cloud_iam_api_key = '"
        + "aB3dE5fG7hJ9kL2mN4pQ6rS8tU0vW1xY"
        + "zC3dE5fG7hJ9'",
        "IBM COS HMAC Credentials": "secret_access_key = '" + "3f2a9c4e1b7d8a6f5e4d3c2b" * 2 + "'",
        "JSON Web Token": by_kind["jwt"],
        "Mailchimp Access Key": by_kind["mailchimp_api_key"],
        "NPM tokens": "//registry.npmjs.org/:_authToken=" + SHAPES["npm_token"].secret,
        "OpenAI Token": "sk-" + "aB3dE5fG7hJ9kL2mN4pQ" + "T3Blbk" + "FJ" + "aB3dE5fG7hJ9kL2mN4pQ",
        "Private Key": by_kind["private_key"],
        "PyPI Token": by_kind["pypi_token"],
        "SendGrid API Key": by_kind["sendgrid_api_key"],
        "Slack Token": by_kind["slack_token"],
        "SoftLayer Credentials": "softlayer_api_key = '" + "3f2a9c4e1b7d8a6f" * 4 + "'",
        "Square OAuth Secret": by_kind["square_token"],
        "Stripe Access Key": by_kind["stripe_secret_key"],
        "Telegram Bot Token": by_kind["telegram_bot_token"],
        "Twilio API Key": by_kind["twilio_key"],
    }


def _found(rule: RegexBasedDetector, text: str) -> set[str]:
    """What ``rule``'s expressions match in ``text``, line by line: each whole match (its
    ``analyze_string`` gives a group, for some rules only a prefix such as ``ghp``), but none
    that holds our placeholder (``://app:[redacted: url_password]@`` hides nothing)."""
    return {
        match.group(0)
        for line in text.splitlines()
        for regex in rule.denylist
        for match in regex.finditer(line)
        if "[redacted: " not in match.group(0)
    }


def test_every_rule_of_detect_secrets_has_a_sample_it_flags() -> None:
    samples = _rule_samples()
    assert set(samples) == set(RULES)
    for kind, rule in RULES.items():
        assert _found(rule, samples[kind]), f"{kind}: its sample is not of its shape"


@pytest.mark.parametrize("rule_kind", sorted(RULES))
def test_what_a_detect_secrets_rule_flags_is_redacted_unless_documented_as_not(
    rule_kind: str,
) -> None:
    sample = _rule_samples()[rule_kind]
    out = redact(sample).text
    left = _found(RULES[rule_kind], out)
    if rule_kind in NOT_COVERED:
        assert left, f"{rule_kind} is covered now: take it off NOT_COVERED and the docs"
    else:
        assert not left, f"{rule_kind}: {left} left in {out!r}"


@pytest.mark.parametrize("name", SHAPES)
def test_nothing_a_detect_secrets_rule_flags_in_a_shape_is_left(name: str) -> None:
    out = redact(SHAPES[name].text).text
    for kind, rule in RULES.items():
        assert not _found(rule, out), kind


# --- what looks random ----------------------------------------------------------------------------

DETECT_SECRETS_ENTROPY = Base64HighEntropyString()  # its limit: 4.5 bits a character
ALPHABETS = {
    "base64": string.ascii_letters + string.digits + "+/",
    "base64url": string.ascii_letters + string.digits + "-_",
    "alphanumeric": string.ascii_letters + string.digits,
}


def high_entropy(token: str) -> bool:
    """High entropy as detect-secrets' Base64HighEntropyString rule measures it."""
    entropy = DETECT_SECRETS_ENTROPY.calculate_shannon_entropy(token)
    return bool(entropy > DETECT_SECRETS_ENTROPY.entropy_limit)


def random_token(seed: int, alphabet: str, length: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(length))


TOKENS = st.builds(
    random_token,
    st.integers(0, 2**32),
    st.sampled_from(sorted(ALPHABETS.values())),
    st.integers(24, 88),
)


@settings(max_examples=400)
@given(TOKENS)
def test_a_random_high_entropy_token_looks_random(token: str) -> None:
    assume(high_entropy(token))
    assert looks_random(token)
    assert looks_random(f"/tmp/{token}/out")  # as a path's segment
    assert looks_random(f"AccountKey={token}==")


@pytest.mark.parametrize(
    "name",
    [
        "ForeignKeyRawIdWidget",
        "AbstractSingletonProxyFactoryBean",
        "test_a_random_high_entropy_token_looks_random",
        "django/contrib/auth/locale/zh_Hans/LC_MESSAGES",
        "opt/venv/lib/python3/site-packages/django/db/models/query_utils",
        "cp39-cp39-manylinux_2_17_x86_64",
        "Django-2.2.dev20180625180104-py3",
        "3f2a9c4e1b7d8a6f5e4d3c2b1a0f9e8d7c6b5a49",  # a hash in lower case: no case to mix
        "HttpResponseNotAllowed",
        "KeyTransformIEndsWith",
    ],
)
def test_names_in_code_do_not_look_random(name: str) -> None:
    assert not looks_random(name)


# --- through the pipeline: the LLM, the digest, the event, the logs -------------------------------

POSITIONS = (
    "text",
    "tool_output",
    "escaped_arguments",
    "url_first_parameter",
    "file_name",
    "instructions",
)
SUMMARIZED = ("u0", "a1", "r1")  # the first user turn and turn 1: in the summarized range


def session(conversation_id: str) -> dict[str, Any]:
    """A coding session whose first user message (with a text part) is summarized: a later
    user message is the recent one a compaction carries."""
    snap = conversation(conversation_id, 10, body=200)
    messages = snap["messages"]
    first: ChatCompletionContentPartTextParam = {"type": "text", "text": messages[1]["content"]}
    messages[1]["content"] = [first]
    later = {"id": "u9", "role": "user", "content": "Now run the linter as well."}
    messages.insert(len(messages) - 5, later)
    snap["revision"] = len(messages)
    return snap


def planted(conversation_id: str, shape: Planted, position: str) -> dict[str, Any]:
    snap = session(conversation_id)
    by_id = {m["id"]: m for m in snap["messages"]}
    if position == "text":
        by_id["a1"]["content"] = f"Step 1. The config says:\n{shape.text}"
    elif position == "tool_output":
        by_id["r1"]["content"] = f"{shape.text}\n{by_id['r1']['content']}"
    elif position == "escaped_arguments":
        by_id["a1"]["tool_calls"][0]["function"]["arguments"] = with_escaped_secret(shape)
    elif position == "url_first_parameter":
        url = f"https://api.example.com/v1/export?token={shape.secret}&format=csv"
        by_id["r1"]["content"] = f"GET {url} -> 200\n{by_id['r1']['content']}"
    elif position == "file_name":
        part: File = {"type": "file", "file": FileFile(filename=shape.text, file_data="QUJD")}
        by_id["u0"]["content"].append(part)
    return snap


# The task (the first user turn) is carried verbatim when it fits beside the newest turn: with
# no room for it, it is summarized, and what was planted in it reaches the summarizer.
_NO_CARRIED_TASK = {"preserve_recent_user_tokens": 0}


def pipeline(root: Path, llm: StandinLLM | None) -> Pipeline:
    if llm is None:
        settings_ = Settings(compaction=_NO_CARRIED_TASK)
        return Pipeline(settings_, Adapters(store=FileStore(root)), Reuse())
    settings_ = Settings(
        llm={"base_url": llm.openai_base_url, "api_key_env": KEY_ENV},
        compaction={"mode": "remote_only", **_NO_CARRIED_TASK},
    )
    summarizer = LLMSummarizer(settings_.llm, environ={KEY_ENV: "test-key"})
    return Pipeline(settings_, Adapters(store=FileStore(root), llm=summarizer), Reuse())


def compacted(pipe: Pipeline, snap: dict[str, Any], instructions: str | None) -> CompletedEvent:
    parsed = pipe.parse(json.dumps(snap).encode())
    outcome: object
    if instructions is None:
        outcome = pipe.run(parsed)[-1]
    else:
        request = CompactRequest(request_id=uuid.uuid4().hex, instructions=instructions)
        outcome = pipe.compact_requested(parsed, request)
    assert isinstance(outcome, CompletedEvent), outcome
    c = outcome.compaction
    index = {m["id"]: k for k, m in enumerate(snap["messages"])}
    for mid in SUMMARIZED:  # summarized, not carried verbatim
        assert c.start <= index[mid] < c.end and mid not in c.preserved_ids
    return outcome


def _counted(shape: Planted, position: str, redactions: dict[str, int]) -> bool:
    if position == "url_first_parameter":  # a key of its own shape, or the parameter's value
        return shape.kind in redactions or "secret_assignment" in redactions
    return shape.kind in redactions


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("name", SHAPES)
def test_no_shape_reaches_the_llm_the_event_or_a_log_in_any_position(
    name: str,
    position: str,
    llm: StandinLLM,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    shape = SHAPES[name]
    if position in ("url_first_parameter", "file_name") and "\n" in shape.text:
        pytest.skip("a URL's parameter and a file's name are one line")
    llm.reset()
    caplog.set_level(logging.DEBUG)
    snap = planted(f"c-{position}", shape, position)
    raw = json.dumps(snap).replace("\\\\", "\\")  # escaped arguments as the LLM would read them
    instructions = f"Focus on the deploy: {shape.text}" if position == "instructions" else None
    assert instructions is not None or leaked(shape.secret, raw)  # planted where it should be
    event = compacted(pipeline(tmp_path, llm), snap, instructions)
    assert event.compaction.summary.source == "llm" and llm.requests
    for request in llm.requests:
        sent = request.system_text + "\n" + request.user_text
        assert not leaked(shape.secret, sent)
        assert not leaked(shape.secret, json.dumps(request.body))
    assert not leaked(shape.secret, event.to_json())
    assert not leaked(shape.secret, caplog.text)
    assert _counted(shape, position, event.compaction.summary.redactions)


@pytest.mark.parametrize("name", SHAPES)
def test_no_shape_reaches_the_digest_in_any_position(name: str, tmp_path: Path) -> None:
    """One session with the shape in every position (its file name a line of it), summarized
    by the offline digest: its text, names, files and facts hold none of it."""
    shape = SHAPES[name]
    snap = session("c-digest")
    by_id = {m["id"]: m for m in snap["messages"]}
    by_id["a1"]["content"] = f"Step 1. The config says:\n{shape.text}"
    by_id["r1"]["content"] = f"{shape.text}\nsee /srv/app?token={shape.secret.splitlines()[0]}"
    by_id["a1"]["tool_calls"][0]["function"]["arguments"] = with_escaped_secret(shape)
    part: File = {"type": "file", "file": {"filename": shape.text.splitlines()[0]}}
    by_id["u0"]["content"].append(part)
    event = compacted(pipeline(tmp_path, None), snap, f"Focus: {shape.text}")
    assert event.compaction.summary.source == "digest"
    assert not leaked(shape.secret, event.to_json())
    assert shape.kind in event.compaction.summary.redactions


# --- an edited summary ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompletedEvent, dict[str, Any]]:
    """A compaction and its transcript, as a reviewer's edit is checked against them."""
    root = tmp_path_factory.mktemp("held")
    event = compacted(pipeline(root, None), session("c-held"), None)
    [path] = [p for p in root.rglob("*.json") if p.is_file()]
    return event, json.loads(path.read_bytes())


def _edit(held: tuple[CompletedEvent, dict[str, Any]], text: str) -> Any:
    event, transcript = held
    return edited_summary(
        event.compaction, text, transcript, delegation_tools=[], max_output_tokens=4000
    )


@pytest.mark.parametrize("name", SHAPES)
def test_an_edited_summary_is_redacted_and_counted(
    name: str, held: tuple[CompletedEvent, dict[str, Any]]
) -> None:
    shape = SHAPES[name]
    summary = _edit(held, f"The agent deployed with:\n{shape.text}\nand moved on.")
    assert summary.edited and not leaked(shape.secret, summary.model_dump_json())
    assert summary.redactions.get(shape.kind, 0) >= 1
    proposed = held[0].compaction.summary.redactions
    assert sum(summary.redactions.values()) > sum(proposed.values())


@pytest.mark.parametrize(
    "character", ["\x00", "\x1b", "\x9b", "\x85", "\x07", "\x7f", "\ud800"], ids=repr
)
def test_an_edited_summary_with_a_control_character_is_refused(
    character: str, held: tuple[CompletedEvent, dict[str, Any]]
) -> None:
    with pytest.raises(InvalidInput, match=r"^summary: "):
        _edit(held, f"The agent read the modules.{character}[2J And went on.")
    assert _edit(held, "Tabs\tand\nline breaks\r\nstay.").edited


# --- random tokens and the digest's names ---------------------------------------------------------

RANDOM_PLACES: dict[str, Callable[[str], tuple[str, str]]] = {
    # (the command the agent ran, what it printed), the token somewhere in them
    "printed alone": lambda t: ("cat out.txt", f"result\n{t}\ndone"),
    "printed as an id": lambda t: ("cat state.json", f'{{"session": "{t}", "ok": true}}'),
    "a printed path": lambda t: ("ls -d /tmp/*", f"/tmp/{t}/report.log"),
    "an account key": lambda t: ("cat .env", f"STORAGE=AccountName=dev;AccountKey={t}==;x=1"),
    "sshpass": lambda t: (f"sshpass -p {t} ssh ci@10.0.0.7 uptime", "up 3 days"),
    "mysql": lambda t: (f"mysql -u root -p{t} shop -e 'select 1'", "1"),
    "base64-wrapped": lambda t: (
        "echo " + base64.b64encode(f"TOKEN_X={t}".encode()).decode() + " | base64 -d",
        "TOKEN_X=[shown]",
    ),
}


@settings(max_examples=60)
@given(TOKENS, st.sampled_from(sorted(RANDOM_PLACES)))
def test_random_high_entropy_tokens_never_reach_the_digests_text(token: str, place: str) -> None:
    """A token that detect-secrets calls high-entropy, in a tool's output, a command or a
    file's content, is listed in no section of the digest, whole or in a piece of 12+ of its
    characters (the names collected the random pieces of keys: issue 36)."""
    assume(high_entropy(token))
    command, output = RANDOM_PLACES[place](token)
    snap = session("c-random")
    by_id = {m["id"]: m for m in snap["messages"]}
    by_id["a1"]["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": command})
    by_id["r1"]["content"] = f"<returncode>0</returncode>\n<output>\n{output}\n</output>"
    write = {"path": "notes.md", "content": f"remember {token} for later"}
    by_id["a2"]["tool_calls"][0]["function"] = {"name": "write", "arguments": json.dumps(write)}
    with _store() as root:
        event = compacted(pipeline(root, None), snap, None)
    text = event.compaction.summary.text
    pieces = {token[k : k + 12] for k in range(len(token) - 11)}
    assert not [piece for piece in pieces if piece in text], place


class _store:
    """A fresh transcript folder for one example (Hypothesis runs many in one test)."""

    def __enter__(self) -> Path:
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        return Path(self._dir.name)

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()


def test_the_names_of_issue_36_are_no_longer_listed() -> None:
    """What the digest's "Code names" listed in the issue: a base64-wrapped key, 80 of an
    Azure AccountKey's 88 characters, a GitLab token's body, password fragments."""
    from worker.wire.models import Message

    key = SHAPES["azure_connection_string"].secret
    gitlab = SHAPES["gitlab_token"].secret
    wrapped = SHAPES["base64_wrapped_key"].secret
    output = f"AccountKey={key}\n{gitlab}\n{wrapped}\nS3cr3tP4ssw0rdZz9Qx7"
    messages = [
        Message(id="r", role="tool", content=output, tool_call_id="c", source_index=0),
    ]
    names = [n.text for n in code_names(messages)]
    for secret in (key, gitlab.split("-", 1)[1], wrapped):
        assert not [n for n in names if len(n) >= 12 and n in secret], names


@pytest.mark.parametrize("name", SHAPES)
def test_a_focus_is_redacted_in_the_prompt_itself(name: str) -> None:
    """The last step before the LLM: a caller building the prompt with a focus that was not
    redacted first (the pipeline redacts and counts it) still sends no secret."""
    shape = SHAPES[name]
    text = system_prompt("Summarize.", budget_tokens=500, extra="", focus=f"Keep {shape.text}")
    assert not leaked(shape.secret, text)
    assert f"[redacted: {shape.kind}]" in text


def test_the_digest_masks_a_random_token_but_keeps_the_words_around_it() -> None:
    token = random_token(0, ALPHABETS["alphanumeric"], 40)
    assert high_entropy(token)
    out = without_random_tokens(f"wrote /tmp/{token}/report.log and AccountKey={token}==;")
    assert token not in out
    assert out == (
        f"wrote /tmp/{RANDOM_PLACEHOLDER}/report.log and AccountKey={RANDOM_PLACEHOLDER}==;"
    )
    ordinary = "django/db/models/query_utils.py ForeignKeyRawIdWidget 3f2a9c4e1b7d8a6f5e4d3c2b"
    assert without_random_tokens(ordinary) == ordinary
