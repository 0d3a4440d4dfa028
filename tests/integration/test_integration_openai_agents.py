"""The OpenAI Agents SDK's own agent loop (Runner, tools, SQLiteSession) with a scripted model,
kept compact by CompactingAgentSession against a real Redis and real worker processes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from worker.integrations.openai_agents import (  # noqa: E402
    CompactingAgentSession,
    from_wire,
    to_wire,
)

pytestmark = pytest.mark.slow

SETTLE_S = 60.0  # generous: the machine is shared
WINDOW = 3000
RUNS = 12


@pytest.fixture(scope="module", autouse=True)
def _no_tracing() -> None:
    set_tracing_disabled(True)  # the SDK would otherwise try to export its traces


async def wait_until(predicate: Callable[[], bool], what: Callable[[], Any] = str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {SETTLE_S}s: {what()}")
        await asyncio.sleep(0.01)


def settled(session: CompactingAgentSession) -> bool:
    s = session.compacting.status
    return (
        s.pending_submits == 0
        and s.last_submitted_revision is not None
        and s.last_outcome_revision is not None
        and s.last_outcome_revision >= s.last_submitted_revision
    )


class ScriptedModel(Model):
    """Each run: one tool call, then a final answer. Records every input it is given; before
    answering a tool result it waits (as a real model's latency would) until the service has
    answered the newest snapshot, so the compaction arrives while the run goes on."""

    def __init__(self) -> None:
        self.inputs: list[list[dict[str, Any]]] = []
        self.session: CompactingAgentSession | None = None
        self.calls = 0

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kw: Any
    ) -> Any:
        items = [input] if isinstance(input, str) else [dict(i) for i in input]
        self.inputs.append(json.loads(json.dumps(items, default=str)))
        self.calls += 1
        if items[-1].get("type") == "function_call_output":
            assert self.session is not None
            session = self.session
            await wait_until(lambda: settled(session), lambda: session.compacting.status)
            text = ResponseOutputText(
                type="output_text", text=f"Done {self.calls}.", annotations=[]
            )
            out: list[Any] = [
                ResponseOutputMessage(
                    id=f"msg{self.calls}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[text],
                )
            ]
        else:
            out = [
                ResponseFunctionToolCall(
                    id=f"fc{self.calls}",
                    call_id=f"call{self.calls}",
                    type="function_call",
                    name="read_file",
                    arguments=json.dumps({"path": f"src/mod_{self.calls}.py"}),
                )
            ]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError


@function_tool
def read_file(path: str) -> str:
    """Read a file."""
    return " ".join(f"{path}:{i}" for i in range(120))


def assert_pairs_intact(items: list[dict[str, Any]]) -> None:
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert sorted(calls) == sorted(outputs)
    for cid in outputs:  # each output follows its call
        at = [k for k, i in enumerate(items) if i.get("call_id") == cid]
        assert items[at[0]].get("type") == "function_call"


def test_runner_gets_compacted_history_and_sqlite_keeps_everything(framework_workers: Any) -> None:
    async def run() -> None:
        model = ScriptedModel()
        agent = Agent(name="coder", instructions="You fix code.", model=model, tools=[read_file])
        store = SQLiteSession("agents-1")
        session = CompactingAgentSession(
            store,
            client=framework_workers.client,
            conversation_id="oa-agents-1",
            model="gpt-4.1",
            context_window=WINDOW,
        )
        model.session = session
        try:
            firsts: list[int] = []  # index in model.inputs of each run's first call
            compacted_at: int | None = None  # the run whose get_items applied a compaction
            applied = 0
            for run in range(RUNS):
                firsts.append(len(model.inputs))
                result = await Runner.run(agent, f"Task {run}: fix module {run}.", session=session)
                assert result.final_output.startswith("Done")
                if compacted_at is None and session.compacting.compactions:
                    compacted_at, applied = run, len(session.compacting.compactions)
                elif compacted_at is not None and run > compacted_at + 1:
                    break
            assert compacted_at is not None, session.compacting.status
            assert session.compacting.status.compactions_skipped == 0

            # the first model call of that run was given the compacted history
            first = model.inputs[firsts[compacted_at]]
            full = await store.get_items()
            compaction = session.compacting.compactions[applied - 1].compaction
            assert compaction.start == 0
            summary = from_wire(compaction.replacement)
            assert any(
                str(i.get("content")).startswith("[compaction-worker summary]") for i in summary
            )
            assert first[: len(summary)] == summary
            assert next(i for i in full if i.get("type") == "function_call") not in first
            for inputs in model.inputs[firsts[compacted_at] :]:
                assert_pairs_intact(inputs)

            # the wrapped session still holds every item of every run, as the SDK stored them
            runs = len(firsts)
            assert len(full) == 4 * runs
            assert [i.get("content") for i in full[::4]] == [
                f"Task {k}: fix module {k}." for k in range(runs)
            ]
            assert_pairs_intact([dict(i) for i in full])
        finally:
            session.close()

    asyncio.run(run())


def test_conversion_keeps_items_and_pop_item(framework_workers: Any) -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "input_text", "text": "look"}]},
        {"type": "reasoning", "id": "rs1", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}", "id": "f1"},
        {"type": "function_call", "call_id": "c2", "name": "ls", "arguments": "{}", "id": "f2"},
        {"type": "function_call_output", "call_id": "c1", "output": "a"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "b"}],
        },
        {"type": "web_search_call", "id": "ws1", "status": "completed", "action": {"query": "x"}},
        {
            "type": "message",
            "role": "assistant",
            "id": "m1",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        },
    ]
    chat = to_wire(items)
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c["id"] for c in chat[1]["tool_calls"]] == ["c1", "c2"]
    assert chat[1]["reasoning_content"] == "hm"
    assert from_wire(chat) == items

    async def pop() -> None:
        store = SQLiteSession("agents-pop")
        session = CompactingAgentSession(
            store, client=framework_workers.client, conversation_id="oa-agents-pop", model="gpt-4.1"
        )
        try:
            await session.add_items(items)  # type: ignore[arg-type]
            assert await session.get_items() == items
            assert await session.pop_item() == items[-1]
            assert await session.get_items() == items[:-1]
            assert await session.get_items(limit=2) == items[-3:-1]
            await session.clear_session()
            assert await session.get_items() == [] == await store.get_items()
        finally:
            session.close()

    asyncio.run(pop())
