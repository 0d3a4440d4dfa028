"""Microsoft Agent Framework's own agent loop (Agent, function tools, InMemoryHistoryProvider)
with a scripted chat client, kept compact by CompactingContextProvider against a real Redis and
real worker processes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("agent_framework")

from agent_framework import (
    Agent,
    BaseChatClient,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    InMemoryHistoryProvider,
    Message,
    tool,
)

from worker.integrations.agent_framework import (
    CompactingContextProvider,
    from_wire,
    to_wire,
)
from worker.session import CompactingSession
from worker.wire import formats

pytestmark = pytest.mark.slow

SETTLE_S = 60.0  # generous: the machine is shared
WINDOW = 3000
RUNS = 12
SUMMARY = "[compaction-worker summary]"


async def wait_until(predicate: Callable[[], bool], what: Callable[[], Any] = str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {SETTLE_S}s: {what()}")
        await asyncio.sleep(0.01)


def settled(session: CompactingSession) -> bool:
    """Every snapshot submitted so far (the provider submits after each run) is answered."""
    s = session.status
    if s.pending_submits:
        return False
    if s.last_submitted_revision is None:
        return True
    return (
        s.last_outcome_revision is not None and s.last_outcome_revision >= s.last_submitted_revision
    )


class ScriptedClient(FunctionInvocationLayer[Any], BaseChatClient[Any]):
    """Each run: one tool call, then a final answer. Records the messages of every call; before
    answering a tool result it waits (as a real model's latency would) until the service has
    answered the newest snapshot, so the compaction arrives while the agent goes on."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[list[Message]] = []
        self.compacting: Callable[[], CompactingSession] | None = None

    async def _answer(self, messages: Sequence[Message]) -> ChatResponse[Any]:
        self.requests.append(list(messages))
        n = len(self.requests)
        if any(c.type == "function_result" for c in messages[-1].contents):
            assert self.compacting is not None
            session = self.compacting()
            await wait_until(lambda: settled(session), lambda: session.status)
            return ChatResponse(messages=[Message("assistant", [f"Done {n}."])])
        call = Content.from_function_call(
            call_id=f"call{n}", name="read_file", arguments=json.dumps({"path": f"src/m{n}.py"})
        )
        return ChatResponse(messages=[Message("assistant", [call])])

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Any, **kwargs: Any
    ) -> Any:
        assert not stream
        return self._answer(messages)


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return " ".join(f"{path}:{i}" for i in range(120))


def unattributed(message: Message) -> dict[str, Any]:
    """The message as a dict, without the per-run ``_attribution`` of the provider that loaded
    it."""
    whole = message.to_dict()
    whole["additional_properties"] = {
        k: v for k, v in whole.get("additional_properties", {}).items() if k != "_attribution"
    }
    return whole


def assert_pairs_intact(messages: Sequence[Message]) -> None:
    calls = [c.call_id for m in messages for c in m.contents if c.type == "function_call"]
    results = [c.call_id for m in messages for c in m.contents if c.type == "function_result"]
    assert sorted(calls) == sorted(results)  # type: ignore[type-var]
    seen: set[Any] = set()
    for m in messages:
        for c in m.contents:
            if c.type == "function_call":
                seen.add(c.call_id)
            elif c.type == "function_result":
                assert c.call_id in seen  # each result after its call


def test_agent_gets_compacted_history_and_history_provider_keeps_everything(
    framework_workers: Any,
) -> None:
    async def run() -> None:
        chat = ScriptedClient()
        history = InMemoryHistoryProvider()
        compactor = CompactingContextProvider(
            client=framework_workers.client,
            history_source_id=history.source_id,
            conversation_prefix="af-",
            model="gpt-4.1",
            context_window=WINDOW,
        )
        agent = Agent(
            client=chat,
            name="coder",
            instructions="You fix code.",
            tools=[read_file],
            context_providers=[history, compactor],
        )
        session = agent.create_session()
        chat.compacting = lambda: compactor.compacting_session(session)
        try:
            firsts: list[int] = []  # index in chat.requests of each run's first call
            compacted_at: int | None = None  # the run whose before_run applied a compaction
            applied = 0
            for run in range(RUNS):
                firsts.append(len(chat.requests))
                result = await agent.run(f"Task {run}: fix module {run}.", session=session)
                assert result.text.startswith("Done")
                compacting = compactor.compacting_session(session)
                if compacted_at is None and compacting.compactions:
                    compacted_at, applied = run, len(compacting.compactions)
                elif compacted_at is not None and run > compacted_at + 1:
                    break
            compacting = compactor.compacting_session(session)
            assert compacted_at is not None, compacting.status
            assert compacting.status.compactions_skipped == 0

            # the first model call of that run was sent the compacted history
            first = chat.requests[firsts[compacted_at]]
            stored: list[Message] = session.state[history.source_id]["messages"]
            compaction = compacting.compactions[applied - 1].compaction
            assert compaction.start == 0
            summary = from_wire(compaction.replacement)
            assert any(m.text.startswith(SUMMARY) for m in summary)
            assert [unattributed(m) for m in first[: len(summary)]] == [
                unattributed(m) for m in summary
            ]
            calls = [c.call_id for m in stored for c in m.contents if c.type == "function_call"]
            sent = {c.call_id for m in first for c in m.contents if c.type == "function_call"}
            assert calls[0] not in sent
            for request in chat.requests[firsts[compacted_at] :]:
                assert_pairs_intact(request)

            # the history provider still holds every message of every run
            runs = len(firsts)
            assert len(stored) == 4 * runs
            assert [m.text for m in stored[::4]] == [
                f"Task {k}: fix module {k}." for k in range(runs)
            ]
            assert not any(m.text.startswith(SUMMARY) for m in stored)
            assert_pairs_intact(stored)
        finally:
            compactor.close()

    asyncio.run(run())


def test_conversion_round_trips_messages() -> None:
    messages = [
        Message("system", ["Be careful."]),
        Message(
            "user",
            [
                "Look at these.",
                Content.from_data(b"\x89PNG\r\n", media_type="image/png"),
                Content.from_uri("https://example.com/spec.pdf", media_type="application/pdf"),
            ],
            author_name="ana",
            message_id="m1",
        ),
        Message(
            "assistant",
            [
                Content.from_text_reasoning(text="Two files."),
                "Reading both.",
                Content.from_function_call(call_id="c1", name="read", arguments={"path": "a"}),
                Content.from_function_call(call_id="c2", name="read", arguments='{"path": "b"}'),
            ],
        ),
        Message(
            "tool",
            [
                Content.from_function_result("c1", result="alpha"),
                Content.from_function_result("c2", result={"lines": [1, 2]}),
            ],
        ),
        Message("assistant", [Content.from_error(message="disk full"), "Stopped."]),
    ]
    chat = to_wire(messages)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert chat[1]["content"][1]["type"] == "image_url"
    assert [c["id"] for c in chat[2]["tool_calls"]] == ["c1", "c2"]
    assert chat[2]["reasoning_content"] == "Two files."
    assert len(formats.to_messages("openai", chat)) == 6  # the service accepts them
    back = from_wire(chat)
    assert [m.to_dict() for m in back] == [m.to_dict() for m in messages]

    chat[3]["content"] = "alpha (shortened)"  # a projection shortened the first result
    shortened = from_wire(chat)[3].contents
    assert all(isinstance(c, Content) for c in shortened)
    assert (shortened[0].call_id, shortened[0].result) == ("c1", "alpha (shortened)")


def test_existing_history_is_submitted_and_a_cleared_one_starts_again(
    framework_workers: Any,
) -> None:
    async def run() -> None:
        chat = ScriptedClient()
        history = InMemoryHistoryProvider()
        compactor = CompactingContextProvider(
            client=framework_workers.client, conversation_prefix="af-seed-", model="gpt-4.1"
        )
        agent = Agent(
            client=chat, name="coder", tools=[read_file], context_providers=[history, compactor]
        )
        session = agent.create_session()
        chat.compacting = lambda: compactor.compacting_session(session)
        earlier = [
            Message("user", ["Earlier question."]),
            Message("assistant", ["Earlier answer."]),
        ]
        session.state[history.source_id] = {"messages": list(earlier)}
        try:
            await agent.run("Now this.", session=session)
            stored: list[Message] = session.state[history.source_id]["messages"]
            assert len(stored) == 6
            compacting = compactor.compacting_session(session)
            assert compacting.messages == to_wire(stored)  # what was there, then the run's
            assert [m.text for m in chat.requests[0]] == [
                "Earlier question.",
                "Earlier answer.",
                "Now this.",
            ]

            sent = chat.requests[0]
            assert all(
                m.additional_properties["_attribution"]["source_id"] == "in_memory"
                for m in sent[:2]
            )

            session.state[history.source_id] = {"messages": []}  # the user cleared it
            await agent.run("Fresh start.", session=session)
            stored = session.state[history.source_id]["messages"]
            assert len(stored) == 4
            assert compacting.messages == to_wire(stored)
        finally:
            compactor.close()

    asyncio.run(run())
