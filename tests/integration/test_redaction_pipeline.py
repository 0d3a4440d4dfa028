"""Secrets in the compacted range never reach a summarizer, the summary or the event (issue 21
§4): the stand-in LLM records what it was sent, the digest writes from the same request, and the
completed event counts what was redacted by kind. Transcripts stay verbatim unless
``[transcripts] redact``. Summaries keep the conversation's language."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support.redaction_samples import PLANTED, Planted
from support.service_support import ServiceEnv, client_for, conversation, wait_for_outcome

from worker.config import Settings
from worker.core.inspection import compaction_view
from worker.pipeline import Adapters, Pipeline
from worker.pipeline.prepare import plan_compaction, prepare
from worker.reuse import Reuse
from worker.summarize import SummaryRequest
from worker.summarize.digest import DigestSummarizer
from worker.summarize.llm import LLMSummarizer
from worker.summarize.prompt import SECTIONS, system_prompt
from worker.testing.standin_llm import StandinLLM
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent
from worker.wire.history import range_digest
from worker.wire.models import Message, canonical_json

KEY_ENV = "COMPACTOR_TEST_REDACTION_KEY"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
PLANTED_IN = ("a1", "r1")  # an assistant turn (its text and its call's arguments), a tool result


@pytest.fixture(scope="module")
def server(sockets: None) -> Iterator[StandinLLM]:
    with StandinLLM() as llm:
        yield llm


def planted_conversation(conversation_id: str, planted: list[Planted]) -> dict[str, Any]:
    """A coding session with every ``planted`` secret in turn 1: the assistant's text, its
    bash command and the command's output (the range a compaction summarizes)."""
    snap = conversation(conversation_id, 12)
    text = "\n".join(p.text for p in planted)
    by_id = {m["id"]: m for m in snap["messages"]}
    by_id["a1"]["content"] = f"Step 1. The config says:\n{text}"
    by_id["a1"]["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": f"cat {text}"})
    by_id["r1"]["content"] = f"{text}\n{by_id['r1']['content']}"
    return snap


def runner(root: Path, llm: StandinLLM | None = None, **settings: Any) -> Pipeline:
    if llm is not None:
        settings["llm"] = {"base_url": llm.openai_base_url, "api_key_env": KEY_ENV}
        settings["compaction"] = {"mode": "remote_only"}
    resolved = Settings(**settings)
    summarizer = (
        LLMSummarizer(resolved.llm, environ={KEY_ENV: "test-key"}) if llm is not None else None
    )
    adapters = Adapters(store=FileStore(root), llm=summarizer, now=lambda: NOW)
    return Pipeline(resolved, adapters, Reuse())


def completed(pipeline: Pipeline, snap: dict[str, Any]) -> CompletedEvent:
    events = pipeline.run(pipeline.parse(json.dumps(snap).encode()))
    outcome = events[-1]
    assert isinstance(outcome, CompletedEvent), outcome
    c = outcome.compaction
    index = {m["id"]: k for k, m in enumerate(snap["messages"])}
    for mid in PLANTED_IN:  # the secrets are in what was summarized, not carried verbatim
        assert c.start <= index[mid] < c.end and mid not in c.preserved_ids
    return outcome


def leaked(secret: str, text: str) -> bool:
    """Whether any line of ``secret`` is in ``text`` (JSON escapes a PEM block's line breaks)."""
    return any(line in text for line in secret.splitlines())


def published(events: list[Any]) -> str:
    return "\n".join(e.to_json() for e in events)


@pytest.mark.parametrize("planted", PLANTED, ids=lambda p: p.kind)
def test_the_llm_is_never_sent_a_planted_secret_and_the_event_counts_it(
    planted: Planted, server: StandinLLM, tmp_path: Path
) -> None:
    server.reset()
    event = completed(runner(tmp_path, server), planted_conversation("c-red", [planted]))
    assert event.compaction.summary.source == "llm"
    assert server.requests, "the LLM was asked"
    for request in server.requests:
        assert not leaked(planted.secret, json.dumps(request.body, ensure_ascii=False))
    assert f"[redacted: {planted.kind}]" in server.requests[0].user_text
    assert not leaked(planted.secret, event.to_json())
    # the text, the command and its output: three places, each counted
    assert event.compaction.summary.redactions == {planted.kind: 3}


@pytest.mark.parametrize("planted", PLANTED, ids=lambda p: p.kind)
def test_the_digest_is_written_from_the_redacted_range(planted: Planted, tmp_path: Path) -> None:
    pipeline = runner(tmp_path)
    snap = planted_conversation("c-dig", [planted])
    context = pipeline.context(pipeline.parse(json.dumps(snap).encode()))
    evaluation = pipeline.evaluate(context).evaluation
    planned = plan_compaction(context, evaluation)
    assert planned is not None and planned.pays
    prepared = prepare(context, evaluation, planned)
    raw = json.dumps([m.model_dump() for m in prepared.plan.to_summarize])
    assert leaked(planted.secret, raw)  # the range held it ...
    assert not leaked(planted.secret, prepared.request.model_dump_json())  # ... its input not
    event = completed(pipeline, snap)
    assert event.compaction.summary.source == "digest"
    assert not leaked(planted.secret, event.to_json())
    assert event.compaction.summary.redactions == {planted.kind: 3}


def test_nothing_redacted_is_published_as_no_redactions(tmp_path: Path) -> None:
    event = completed(runner(tmp_path), conversation("c-none", 12))
    assert event.compaction.summary.redactions == {}
    assert json.loads(event.to_json())["compaction"]["summary"]["redactions"] == {}


def _transcript(root: Path, event: CompletedEvent) -> dict[str, Any]:
    assert event.compaction.transcript is not None
    found = [p for p in root.rglob("*") if p.is_file() and p.suffix == ".json"]
    assert len(found) == 1, found
    return dict(json.loads(found[0].read_bytes()))


def test_transcripts_keep_the_verbatim_history_by_default(tmp_path: Path) -> None:
    planted = list(PLANTED)
    event = completed(runner(tmp_path), planted_conversation("c-tv", planted))
    stored = json.dumps(_transcript(tmp_path, event), ensure_ascii=False)
    assert all(leaked(p.secret, stored) for p in planted)
    assert "redactions" not in _transcript(tmp_path, event)


def test_transcripts_are_redacted_when_the_operator_asks(tmp_path: Path) -> None:
    planted = list(PLANTED)
    pipeline = runner(tmp_path, transcripts={"redact": True})
    event = completed(pipeline, planted_conversation("c-tr", planted))
    doc = _transcript(tmp_path, event)
    stored = json.dumps(doc, ensure_ascii=False)
    assert not [p.kind for p in planted if leaked(p.secret, stored)]
    assert sum(doc["redactions"].values()) == 3 * len(planted)
    assert doc["messages"][0]["content"] == "You are a coding agent."  # the rest as it was
    # the redacted range no longer hashes to the event's range_sha256: the inspector says so
    view = compaction_view(event, doc["messages"], raw=json.loads(event.to_json()))
    assert view.replaced == [] and view.transcript_problem
    assert view.redactions == event.compaction.summary.redactions


@pytest.mark.parametrize("redact", [False, True])
def test_a_transcript_is_the_canonical_json_of_its_document(tmp_path: Path, redact: bool) -> None:
    """Put together from each message's canonical JSON (made once, for the range digest too),
    it is byte for byte the canonical JSON of what it holds; unredacted, its range hashes to
    the event's digest."""
    pipeline = runner(tmp_path, transcripts={"redact": redact})
    event = completed(pipeline, planted_conversation(f"c-cj{int(redact)}", list(PLANTED)))
    [path] = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".json"]
    stored = path.read_bytes()
    doc = json.loads(stored)
    assert stored == canonical_json(doc).encode("utf-8")
    assert ("redactions" in doc) is redact
    c = event.compaction
    matches = range_digest(doc["messages"][c.start : c.end]) == c.range_sha256
    assert matches is not redact


def test_the_redact_setting_reads_from_toml_and_the_environment(tmp_path: Path) -> None:
    from worker.config import load_settings

    path = tmp_path / "c.toml"
    path.write_text("[transcripts]\nredact = true\n")
    assert load_settings(path, environ={}).transcripts.redact is True
    on = load_settings(None, environ={"COMPACTOR_TRANSCRIPTS_REDACT": "true"})
    assert on.transcripts.redact is True
    assert load_settings(None, environ={}).transcripts.redact is False


# --- through real workers -----------------------------------------------------------------------


def test_workers_send_the_llm_no_planted_secret_and_publish_the_counts(
    service_env: ServiceEnv,
) -> None:
    _, make = service_env
    planted = list(PLANTED)
    with StandinLLM() as llm:
        workers = make(
            f'mode = "remote_only"\n[llm]\nbase_url = "{llm.openai_base_url}"\n'
            f'api_key_env = "COMPACTOR_TEST_UNSET_KEY"\ntimeout_s = 5.0\ndeadline_s = 10.0\n'
        )
        workers.start("w1")
        client = client_for(workers)
        client.submit(planted_conversation("c-workers", planted))
        events = wait_for_outcome(client, "c-workers")
        outcome = events[-1]
        assert outcome.type == "compaction.completed", outcome
        assert outcome.compaction.summary.source == "llm"
        sent = "\n".join(json.dumps(r.body, ensure_ascii=False) for r in llm.requests)
        text = published(events)
        for p in planted:
            assert not leaked(p.secret, sent), p.kind
            assert not leaked(p.secret, text), p.kind
            assert not leaked(p.secret, workers.log("w1")), p.kind
        counts = outcome.compaction.summary.redactions
        expected: dict[str, int] = {}
        for p in planted:
            expected[p.kind] = expected.get(p.kind, 0) + 3
        assert counts == expected


# --- the conversation's language ----------------------------------------------------------------

GERMAN = "Bitte prüfe die Größenänderung in src/straße.py – Grüße, Jürgen"
JAPANESE = "このテストが失敗する理由を調べて、src/解析.py を直してください。"
CONCLUSION = "Ergebnis: Der Fehler lag an der Zeichenkodierung; die Änderung ist fertig."


def _message(k: int, role: Any, content: str) -> Message:
    return Message(id=f"m{k}", role=role, content=content, source_index=k)


def test_the_digest_quotes_the_conversation_in_its_own_language() -> None:
    request = SummaryRequest(
        conversation_id="c-lang",
        revision=4,
        messages=[
            _message(0, "user", GERMAN),
            _message(1, "assistant", CONCLUSION),
            _message(2, "user", JAPANESE),
            _message(3, "assistant", "了解しました。"),
        ],
        max_input_chars=100_000,
        max_output_tokens=800,
        source_tokens=10_000,
    )
    text = DigestSummarizer().summarize(request).text
    for quoted in (GERMAN, JAPANESE, CONCLUSION):
        assert quoted in text  # verbatim: no folding to ASCII, no escapes, no mojibake
    assert "\ufffd" not in text and "\\u" not in text


def test_redaction_leaves_non_english_text_as_it_is() -> None:
    from worker.core.redaction import redact

    for text in (GERMAN, JAPANESE, CONCLUSION, "Passwort: geheim, Schlüssel: öffentlich"):
        assert redact(text).text == text


def test_the_llm_is_told_to_write_in_the_conversations_language(server: StandinLLM) -> None:
    prompt = system_prompt("Summarize.", budget_tokens=500, extra="")
    assert "language the conversation is written in" in prompt
    assert all(f"## {s}" in prompt for s in SECTIONS)
    server.reset()
    summarizer = LLMSummarizer(
        Settings(llm={"base_url": server.openai_base_url, "api_key_env": KEY_ENV}).llm,
        environ={KEY_ENV: "test-key"},
    )
    request = SummaryRequest(
        conversation_id="c-lang",
        revision=2,
        messages=[_message(0, "user", JAPANESE), _message(1, "assistant", CONCLUSION)],
        max_input_chars=100_000,
        max_output_tokens=500,
        source_tokens=10_000,
    )
    summarizer.summarize(request)
    sent = server.requests[-1]
    assert JAPANESE in sent.user_text and CONCLUSION in sent.user_text
    assert "language the conversation is written in" in sent.system_text
