"""Google ADK's own Runner and agent loop with a stand-in model (a ``BaseLlm`` of ADK's), its
events compaction answered by CompactingEventsSummarizer: against a real Redis and real worker
processes, and in process."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from support.service_support import StartedWorkers

pytest.importorskip("google.adk")

from google.adk.agents import LlmAgent
from google.adk.apps.app import App, EventsCompactionConfig
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from worker.client import restore
from worker.config import load_settings
from worker.integrations.google_adk import (
    EXTRA_KEY,
    CompactingEventsSummarizer,
    from_wire,
    to_wire,
)
from worker.wire.events import SUMMARY_MARKER, CompletedEvent

pytestmark = [
    pytest.mark.slow,
    # ADK labels its events compaction experimental, and says so once per class.
    pytest.mark.filterwarnings(r"ignore:\[EXPERIMENTAL\]:UserWarning"),
]

TURNS = 30
THRESHOLD = 2000  # ADK's estimate (characters / 4): a compaction every few turns
SIGNATURE = b"\x00\xff\x10opaque-signature"


class StandInModel(BaseLlm):
    """A model that reads a file for each task, then says it is done; it keeps every request."""

    model: str = "stand-in"
    requests: list[list[types.Content]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        contents = [c.model_copy(deep=True) for c in llm_request.contents]
        self.requests.append(contents)
        n = len(self.requests)
        if any(p.function_response for p in contents[-1].parts or ()):
            parts = [types.Part(text=f"Done {n}.")]
        else:
            call = types.FunctionCall(name="read_file", args={"path": f"src/mod_{n}.py"})
            parts = [types.Part(function_call=call, thought_signature=SIGNATURE + bytes([n]))]
        yield LlmResponse(content=types.Content(role="model", parts=parts))


def read_file(path: str) -> str:
    """Read a file."""
    return " ".join(f"{path}:{i}" for i in range(150))


async def run_agent(summarizer: CompactingEventsSummarizer, turns: int) -> tuple[Any, StandInModel]:
    """``turns`` tasks through ADK's Runner; the session as it ends, and the model."""
    model = StandInModel()
    agent = LlmAgent(name="coder", model=model, instruction="You fix code.", tools=[read_file])
    config = EventsCompactionConfig(
        summarizer=summarizer, token_threshold=THRESHOLD, event_retention_size=4
    )
    app = App(name="fixer", root_agent=agent, events_compaction_config=config)
    sessions = InMemorySessionService()
    runner = Runner(app=app, session_service=sessions)
    try:
        session = await sessions.create_session(app_name="fixer", user_id="u1")
        for k in range(turns):
            message = types.Content(role="user", parts=[types.Part(text=f"Task {k}: fix {k}.")])
            async for _event in runner.run_async(
                user_id="u1", session_id=session.id, new_message=message
            ):
                pass
        final = await sessions.get_session(app_name="fixer", user_id="u1", session_id=session.id)
    finally:
        await runner.close()
    return final, model


def size(contents: list[types.Content]) -> int:
    return sum(len(c.model_dump_json(exclude_none=True)) for c in contents)


def assert_pairs_intact(contents: list[types.Content]) -> None:
    open_calls = 0
    for part in (p for c in contents for p in c.parts or ()):
        if part.function_call:
            open_calls += 1
        if part.function_response:
            assert open_calls > 0, "a function response without its call"
            open_calls -= 1
    assert open_calls == 0


@pytest.mark.parametrize("mode", ["service", "in_process"])
def test_thirty_turns_compacted_through_the_adapter_stay_bounded(
    mode: str, framework_workers: StartedWorkers, tmp_path: Path
) -> None:
    if mode == "service":
        summarizer = CompactingEventsSummarizer(client=framework_workers.client, model="gpt-4.1")
        transcripts: Any = framework_workers.client.store
    else:
        config = tmp_path / "compactor.toml"
        config.write_text(f'[compaction]\ntranscript_dir = "{tmp_path / "transcripts"}"\n')
        settings = load_settings(config, environ={})
        summarizer = CompactingEventsSummarizer(in_process=True, settings=settings)
        transcripts = tmp_path / "transcripts"
    try:
        session, model = asyncio.run(run_agent(summarizer, TURNS))
    finally:
        summarizer.close()

    # ADK compacted again and again, each time with what the adapter answered
    compactions = [e.actions.compaction for e in session.events if e.actions.compaction]
    assert len(compactions) >= 3
    completed = [o for o in summarizer.outcomes if isinstance(o, CompletedEvent)]
    summaries = {o.compaction.summary.text for o in completed}
    for compaction in compactions:
        parts = compaction.compacted_content.parts or []
        assert compaction.compacted_content.role == "user"
        assert parts[-1].text in summaries
        assert any(p.text == f"Task {k}: fix {k}." for p in parts for k in range(TURNS))

    # our events: published with their transcripts (service), and kept (both)
    for outcome in completed:
        assert outcome.compaction.transcript is not None
        assert outcome.trigger.kind == "requested"
        if mode == "service":
            published = [e for _, e in framework_workers.client.events(outcome.conversation_id)]
            assert outcome.event_id in {e.event_id for e in published}

    # what ADK sent the model stayed bounded to the end, the summary in place of the range
    requests = model.requests
    assert len(requests) == 2 * TURNS
    first = next(k for k, r in enumerate(requests) if _has_summary(r))
    assert max(len(r) for r in requests[first:]) <= 24  # 4 per turn, uncompacted: 120
    assert max(size(r) for r in requests[-10:]) <= 3 * max(size(r) for r in requests[:first])
    assert all(_has_summary(r) for r in requests[first:])
    for contents in requests:
        assert_pairs_intact(contents)

    # nothing lost: every event is in a transcript, byte for byte, or still sent as it is
    kept: dict[str, Event] = {}
    for outcome in completed:
        for event in from_wire(restore(outcome, store=transcripts)):
            kept[event.id] = event
    newest_end = max(c.end_timestamp for c in compactions)
    for event in session.events:
        if event.content is None or event.actions.compaction:
            continue
        if event.id in kept:
            assert kept[event.id].model_dump() == event.model_dump()
        else:
            assert event.timestamp > newest_end, event
    signatures = [p.thought_signature for e in kept.values() for p in e.content.parts or ()]
    assert SIGNATURE + bytes([1]) in signatures
    for text in summaries:  # opaque bytes never reach a summary
        assert base64.b64encode(SIGNATURE).decode()[:8] not in text


def _has_summary(contents: list[types.Content]) -> bool:
    return any((p.text or "").startswith(SUMMARY_MARKER) for c in contents for p in c.parts or ())


def user_event(text: str) -> Event:
    return Event(
        author="user",
        invocation_id="inv-1",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
    )


def test_nothing_to_compact_answers_no_compaction(
    framework_workers: StartedWorkers, tmp_path: Path
) -> None:
    config = tmp_path / "compactor.toml"
    config.write_text(f'[compaction]\ntranscript_dir = "{tmp_path / "transcripts"}"\n')
    summarizers = [
        CompactingEventsSummarizer(client=framework_workers.client),
        CompactingEventsSummarizer(in_process=True, settings=load_settings(config, environ={})),
    ]
    for summarizer in summarizers:
        try:
            events = [user_event("Fix the failing test.")]
            answer = asyncio.run(summarizer.maybe_summarize_events(events=events))
            assert answer is None
            assert [o.type for o in summarizer.outcomes] == ["compaction.skipped"]
            assert asyncio.run(summarizer.maybe_summarize_events(events=[])) is None
        finally:
            summarizer.close()
    assert not (tmp_path / "transcripts").exists()


# What the lookup found: long enough that compacting it pays for the image the turn carries.
LISTING = "\n".join(f"src/pricing.py:{k}: price = parse(row[{k}])" for k in range(600))


def mixed_events() -> list[Event]:
    """A turn of every part kind the conversion knows, each event as ADK would store it."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    call = types.FunctionCall(id="adk-call-1", name="lookup", args={"q": "price"})
    orphan = types.FunctionResponse(id="adk-gone", name="old", response={"data": [1, 2]})
    specs: list[tuple[str, str, list[types.Part]]] = [
        (
            "user",
            "user",
            [
                types.Part(text="Where is the price parsed? See the screenshot."),
                types.Part(inline_data=types.Blob(mime_type="image/png", data=png)),
                types.Part(
                    file_data=types.FileData(
                        file_uri="https://files.example/v1/files/abc123",
                        mime_type="application/pdf",
                        display_name="spec.pdf",
                    )
                ),
            ],
        ),
        (
            "coder",
            "model",
            [
                types.Part(text="Let me look.", thought=True, thought_signature=SIGNATURE),
                types.Part(function_call=call, thought_signature=SIGNATURE + b"2"),
            ],
        ),
        (
            "coder",
            "user",
            [
                types.Part(
                    function_response=types.FunctionResponse(
                        id="adk-call-1", name="lookup", response={"result": LISTING}
                    )
                ),
                types.Part(function_response=orphan),
            ],
        ),
        (
            "coder",
            "model",
            [
                types.Part(
                    executable_code=types.ExecutableCode(code="print(1)", language="PYTHON")
                ),
                types.Part(text="It is parsed in src/pricing.py."),
            ],
        ),
        ("user", "user", [types.Part(text="Thanks; now make it round half up.")]),
        ("coder", "model", [types.Part(text="Done.")]),
    ]
    return [
        Event(
            author=author,
            invocation_id=f"inv-{k // 4}",
            timestamp=1000.0 + k,
            content=types.Content(role=role, parts=parts),
        )
        for k, (author, role, parts) in enumerate(specs)
    ]


def test_conversion_keeps_every_part_and_reads_no_opaque_field() -> None:
    events = mixed_events()
    wire = to_wire(events)
    roles = ["user", "assistant", "tool", "assistant", "assistant", "user", "assistant"]
    assert [m["role"] for m in wire] == roles
    assert wire[1]["reasoning_content"] == "Let me look."
    assert wire[1]["tool_calls"][0]["function"]["arguments"] == '{"q": "price"}'
    assert json.loads(wire[2]["content"]) == {"result": LISTING}
    assert wire[0]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert wire[0]["content"][2] == {"type": "file", "file": {"filename": "spec.pdf"}}
    assert [e.model_dump() for e in from_wire(wire)] == [e.model_dump() for e in events]

    # what the service reads of them holds no signature, file URI or id of the provider
    readable = json.dumps([{k: v for k, v in m.items() if k != EXTRA_KEY} for m in wire])
    for opaque in (base64.b64encode(SIGNATURE).decode()[:8], "files.example", "abc123"):
        assert opaque not in readable
    assert "adk-gone" not in readable and '"data": [1, 2]' in wire[3]["content"]
    png = base64.b64encode(events[0].content.parts[1].inline_data.data).decode()
    assert sum(json.dumps(m).count(png) for m in wire) == 1  # the bytes once, in the image part


def test_messages_the_service_changed_or_wrote_come_back_as_such() -> None:
    events = mixed_events()
    wire = to_wire(events)
    text = "Where is …[user message shortened by compaction]…"
    shortened = {**wire[0], "content": [{"type": "text", "text": text}, *wire[0]["content"][1:]]}
    stripped = {**wire[2], "content": "[compacted: tool output stripped]"}
    summary = {"id": "cws-1", "role": "user", "content": f"{SUMMARY_MARKER}\nThe price."}
    turn, result, written = from_wire([shortened, stripped, summary])

    original = events[0].content.parts or []
    assert turn.id == events[0].id and turn.content is not None
    # the new text, then the image (its bytes) and the file reference as they were
    assert turn.content.parts == [types.Part(text=text), *original[1:]]
    assert result.content is not None and result.content.parts is not None
    [part] = result.content.parts
    assert part.function_response is not None
    assert part.function_response.id == "adk-call-1"
    assert part.function_response.response == {"result": "[compacted: tool output stripped]"}
    assert written.content is not None and written.content.role == "user"
    assert written.content.parts == [types.Part(text=summary["content"])]


def test_carried_turns_come_back_as_adk_parts_byte_for_byte(tmp_path: Path) -> None:
    config = tmp_path / "compactor.toml"
    config.write_text(f'[compaction]\ntranscript_dir = "{tmp_path / "transcripts"}"\n')
    settings = load_settings(config, environ={})
    summarizer = CompactingEventsSummarizer(in_process=True, settings=settings)
    events = mixed_events()
    try:
        answer = asyncio.run(summarizer.maybe_summarize_events(events=events))
    finally:
        summarizer.close()
    assert answer is not None and answer.actions.compaction is not None
    compaction = answer.actions.compaction
    # the whole range but the protected reply, which stays a raw event after it
    assert (compaction.start_timestamp, compaction.end_timestamp) == (1000.0, 1004.0)
    parts = compaction.compacted_content.parts or []
    originals = [*(events[0].content.parts or []), *(events[4].content.parts or [])]
    assert parts[:-1] == originals  # the carried user turns, image and file reference as sent
    assert (parts[-1].text or "").startswith(SUMMARY_MARKER)
    assert "abc123" not in (parts[-1].text or "")
    [outcome] = summarizer.outcomes
    assert isinstance(outcome, CompletedEvent)
    assert from_wire(restore(outcome, store=tmp_path / "transcripts")) == events
