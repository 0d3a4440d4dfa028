"""The LangChain adapter: lossless message conversion (a property), and the real
``create_agent`` loop and LangGraph's prebuilt agent compacting in the background against a real
Redis and real worker processes, with a scripted chat model."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import create_react_agent
from langgraph.warnings import LangGraphDeprecatedSinceV10
from pydantic import Field
from support.service_support import (
    REPO_ROOT,
)

from worker.core.projection import count_request_tokens
from worker.integrations.langchain import (
    EXTRA_KEY,
    CompactingMiddleware,
    CompactingPreModelHook,
    from_wire,
    to_wire,
)
from worker.session import CompactingSession
from worker.tokens import tokenizer_for
from worker.wire import formats

# --- conversion: messages -> wire -> messages is the identity -----------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=3)
words = st.text(max_size=40)
urls = st.sampled_from(["https://example.com/a.png", "http://x/y.jpg?size=2"])
base64_data = st.sampled_from(["iVBORw0KGgo=", "R0lGODlhAQABAAAAACw=", ""])

blocks = st.one_of(
    words,  # a bare string in a content list
    st.builds(lambda t: {"type": "text", "text": t}, words),
    st.builds(lambda t, i: {"type": "text", "text": t, "id": i, "annotations": []}, words, words),
    st.builds(lambda u: {"type": "image", "url": u}, urls),
    st.builds(
        lambda b, m: {"type": "image", "base64": b, "mime_type": m},
        base64_data,
        st.sampled_from(["image/png", "image/gif"]),
    ),
    st.builds(lambda b: {"type": "image", "base64": b}, base64_data),  # no mime type
    st.builds(lambda b: {"type": "image", "file_id": b}, words),
    st.builds(lambda u: {"type": "image_url", "image_url": {"url": u, "detail": "high"}}, urls),
    st.builds(lambda u: {"type": "file", "url": u, "mime_type": "application/pdf"}, urls),
    st.builds(lambda t: {"type": "reasoning", "reasoning": t, "id": "rs_1"}, words),
    st.builds(lambda t, s: {"type": "thinking", "thinking": t, "signature": s}, words, words),
    st.builds(
        lambda a: {"type": "tool_call", "id": "tc_x", "name": "bash", "args": a}, json_objects
    ),
    st.builds(lambda v: {"type": "x-provider", "data": v}, json_values),
    st.builds(lambda t: {"type": "text", "text": t, EXTRA_KEY: {"str": True}}, words),
    st.builds(lambda v: {"no_type": v}, json_values),
)
contents = words | st.lists(blocks, max_size=4)
names = st.none() | st.sampled_from(["alice", "bash"])


@st.composite
def conversations(draw: Any) -> list[BaseMessage]:
    """System, human, AI and tool messages; each tool result answers a call before it (so the
    worker's own validation accepts the wire form); ids unique or absent."""
    counter = iter(range(10_000))

    def new_id() -> str | None:
        return draw(st.none() | st.just(f"m-{next(counter)}"))

    out: list[BaseMessage] = []
    for kind in draw(st.lists(st.sampled_from(["system", "human", "ai", "tools"]), max_size=6)):
        common = {
            "content": draw(contents),
            "id": new_id(),
            "name": draw(names),
            "additional_kwargs": draw(json_objects),
            "response_metadata": draw(json_objects),
        }
        if kind == "system":
            out.append(SystemMessage(**common))
        elif kind == "human":
            out.append(HumanMessage(**common))
        elif kind == "ai":
            out.append(
                AIMessage(
                    **common,
                    usage_metadata=draw(
                        st.none()
                        | st.builds(
                            lambda i, o: {
                                "input_tokens": i,
                                "output_tokens": o,
                                "total_tokens": i + o,
                            },
                            st.integers(0, 9999),
                            st.integers(0, 9999),
                        )
                    ),
                    invalid_tool_calls=draw(
                        st.lists(
                            st.builds(
                                lambda a: {
                                    "name": "bash",
                                    "args": a,
                                    "id": None,
                                    "error": "bad JSON",
                                    "type": "invalid_tool_call",
                                },
                                words,
                            ),
                            max_size=1,
                        )
                    ),
                )
            )
        else:
            calls = [
                {"name": draw(st.sampled_from(["bash", "read"])), "args": draw(json_objects)}
                | {"id": f"call-{next(counter)}"}
                for _ in range(draw(st.integers(1, 3)))
            ]
            out.append(AIMessage(**common, tool_calls=calls))
            for call in calls:
                out.append(
                    ToolMessage(
                        content=draw(contents),
                        tool_call_id=call["id"],
                        id=new_id(),
                        name=draw(st.none() | st.just(call["name"])),
                        status=draw(st.sampled_from(["success", "error"])),
                        artifact=draw(st.none() | json_values),
                    )
                )
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_messages_to_wire_and_back_is_the_identity(messages: list[BaseMessage]) -> None:
    wire = to_wire(messages)
    assert from_wire(wire) == messages
    # through JSON, as a snapshot and a compaction's messages travel
    assert from_wire(json.loads(json.dumps(wire))) == messages
    # a message's id is its wire id; messages without one get the service's derived id
    assert [w.get("id") for w in wire] == [m.id for m in messages]
    ids = formats.source_ids(wire)
    assert [i for i, m in zip(ids, messages, strict=True) if m.id] == [
        m.id for m in messages if m.id
    ]
    # the worker accepts the wire form, and counts the text it carries
    normalized = formats.to_messages("openai", wire)
    assert len(normalized) == len(messages)
    for m, n in zip(messages, normalized, strict=True):
        assert n.role == {"system": "system", "human": "user", "ai": "assistant"}.get(
            m.type, "tool"
        )
        if isinstance(m, AIMessage):
            assert [c.id for c in n.tool_calls] == [c["id"] for c in m.tool_calls]


def test_the_wire_form_is_chat_completions() -> None:
    messages = [
        SystemMessage("Be brief.", id="s"),
        HumanMessage(
            [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image", "base64": "iVBORw0KGgo=", "mime_type": "image/png"},
            ],
            id="h",
        ),
        AIMessage("", tool_calls=[{"name": "look", "args": {"x": 1}, "id": "c1"}], id="a"),
        ToolMessage("a cat", tool_call_id="c1", id="t"),
    ]
    wire = to_wire(messages)
    assert wire[0] == {"id": "s", "role": "system", "content": "Be brief."}
    assert wire[1]["content"][0] == {"type": "text", "text": "What is in this image?"}
    image = wire[1]["content"][1]
    assert image["type"] == "image_url"
    assert image["image_url"] == {"url": "data:image/png;base64,iVBORw0KGgo="}
    assert wire[2] == {
        "id": "a",
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"x": 1}'}}
        ],
    }
    assert wire[3] == {"id": "t", "role": "tool", "content": "a cat", "tool_call_id": "c1"}
    # what the worker writes (a summary; a message rendered without the extension) reads too
    summary = {"id": "cws-1", "role": "user", "content": "[compaction-worker summary] ..."}
    assert from_wire([summary]) == [HumanMessage("[compaction-worker summary] ...", id="cws-1")]
    rendered = {
        "id": "a",
        "role": "assistant",
        "content": None,
        "tool_calls": wire[2]["tool_calls"],
    }
    assert from_wire([rendered]) == [messages[2]]


def test_what_cannot_travel_is_refused_or_left_on_the_agents_message() -> None:
    with pytest.raises(TypeError, match="AIMessageChunk"):
        to_wire([AIMessageChunk("partial")])
    with pytest.raises(ValueError, match="has no id"):
        to_wire([AIMessage("", tool_calls=[{"name": "bash", "args": {}, "id": None}])])
    with pytest.raises(TypeError, match="not JSON"):
        to_wire([HumanMessage([{"type": "text", "text": "x", "when": object()}])])
    # an artifact the model never sees stays on the agent's message, not in the snapshot
    wire = to_wire([ToolMessage("ok", tool_call_id="c1", id="t", artifact=object())])
    assert wire == [{"id": "t", "role": "tool", "content": "ok", "tool_call_id": "c1"}]


# --- the real agent loops against a real Redis and real workers ---------------------------

SETTLE_S = 60.0  # generous: the machine is shared
WINDOW = 4_000
SYSTEM = "You are a coding agent."


def wait_until(predicate: Callable[[], bool], what: Callable[[], Any] = str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {SETTLE_S}s: {what()}")
        time.sleep(0.01)


def settled(session: CompactingSession) -> bool:
    """Every turn is submitted and the service's outcome for the newest one has arrived."""
    s = session.status
    return (
        s.pending_submits == 0
        and s.last_submitted_revision is not None
        and s.last_outcome_revision is not None
        and s.last_outcome_revision >= s.last_submitted_revision
    )


class ScriptedModel(BaseChatModel):
    """Calls ``read_file`` ``turns`` times, then answers; given ``recall``, its next call (in a
    later run) asks ``recall_message`` for that id, then it answers again; given ``more``, the
    next run reads that many files more before answering. Records what it was given."""

    turns: int
    recall: str | None = None
    more: int = 0
    given: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.given.append(list(messages))
        k = len(self.given) - 1
        if k < self.turns or self.turns < k <= self.turns + self.more:
            path = f"src/pkg/mod_{k}.py"
            message = AIMessage(
                f"Step {k}: reading {path}.",
                tool_calls=[{"name": "read_file", "args": {"path": path}, "id": f"call{k}"}],
            )
        elif k == self.turns + 1 and self.recall is not None:
            message = AIMessage(
                "Looking at the first file again.",
                tool_calls=[{"name": "recall_message", "args": {"id": self.recall}, "id": "rc"}],
            )
        else:
            message = AIMessage("All files read; the fix is in mod_3.py.")
        return ChatResult(generations=[ChatGeneration(message=message)])


def file_body(path: str) -> str:
    return " ".join(f"{path.split('/')[-1][:-3]}_line{i}" for i in range(120))


def read_file_tool(session: Callable[[], CompactingSession]) -> Any:
    @tool
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        # The model's own latency, as it were: the snapshot submitted after the model call
        # that asked for this file is evaluated (and maybe compacted) before the next call.
        wait_until(lambda: settled(session()), what=lambda: session().status)
        return file_body(path)

    return read_file


SUMMARY = "[compaction-worker summary]"


def check_run(
    model: ScriptedModel, state_messages: list[BaseMessage], session: CompactingSession
) -> None:
    """What every model call was given, against the agent's state at the end."""
    turns = model.turns
    # the state keeps the whole history: the task, every call and its full result, the answer
    assert len(state_messages) == 1 + 2 * turns + 1
    assert len({m.id for m in state_messages}) == len(state_messages)
    results = [m for m in state_messages if isinstance(m, ToolMessage)]
    assert [m.content for m in results] == [file_body(f"src/pkg/mod_{k}.py") for k in range(turns)]
    by_id = {m.id: m for m in state_messages}
    compacted_calls = []
    for k, sent in enumerate(model.given):
        assert isinstance(sent[0], SystemMessage) and sent[0].content == SYSTEM
        history = sent[1:]
        # tool-call pairs are intact: every call answered, every result after its call
        calls: list[str] = []
        for m in history:
            if isinstance(m, AIMessage):
                calls += [c["id"] for c in m.tool_calls]
            if isinstance(m, ToolMessage):
                assert m.tool_call_id in calls, (k, m.tool_call_id)
        answered = {m.tool_call_id for m in history if isinstance(m, ToolMessage)}
        assert set(calls) == answered, k
        # the newest messages are always the agent's own
        assert history[-1] is by_id[history[-1].id] or history[-1] == by_id[history[-1].id]
        summaries = [m for m in history if str(m.content).startswith(SUMMARY)]
        if summaries:
            compacted_calls.append(k)
            assert len(history) < 1 + 2 * k  # fewer than the state held at that call
        for m in history:
            if m not in summaries:
                assert m.id in by_id
                if isinstance(m, ToolMessage) and m != by_id[m.id]:  # a projected result
                    assert m.tool_call_id == by_id[m.id].tool_call_id
                else:
                    assert m == by_id[m.id]
    assert compacted_calls, "no model call was given a compacted history"
    # once compacted, every later call is (the compaction arrived while the agent went on)
    assert compacted_calls == list(range(compacted_calls[0], len(model.given)))
    assert session.compactions and session.status.compactions_skipped == 0
    last = model.given[-1]
    assert request_tokens(to_wire(last)) < WINDOW


def request_tokens(request: list[dict[str, Any]]) -> int:
    return count_request_tokens(formats.to_messages("openai", request), tokenizer_for("gpt-4.1"))


@pytest.mark.slow
@pytest.mark.parametrize("call", ["invoke", "ainvoke"])
def test_create_agent_gives_the_model_the_compacted_history_and_keeps_the_full_state(
    framework_workers: Any, call: str
) -> None:
    session = CompactingSession(
        f"c-lc-create-agent-{call}",
        client=framework_workers.client,
        model="gpt-4.1",
        context_window=WINDOW,
    )
    model = ScriptedModel(turns=12)
    try:
        agent = create_agent(
            model,
            tools=[read_file_tool(lambda: session)],
            system_prompt=SYSTEM,
            middleware=[CompactingMiddleware(session)],
        )
        task = {"messages": [HumanMessage("Find the bug in src/pkg.")]}
        config: Any = {"recursion_limit": 100}
        if call == "invoke":
            result = agent.invoke(task, config)
        else:  # awrap_model_call; the tool runs in a thread
            result = asyncio.run(agent.ainvoke(task, config))
        check_run(model, result["messages"], session)
        # after the last model call its answer was submitted too: the session has everything
        wait_until(lambda: settled(session), what=lambda: session.status)
        assert session.messages[-1]["id"] == result["messages"][-1].id
    finally:
        session.close()


@pytest.mark.slow
def test_one_session_per_thread_across_runs_and_the_recall_tool(framework_workers: Any) -> None:
    """A checkpointer keeps each thread's history between runs; the middleware keeps one
    session per thread_id, and the model recalls a compacted tool result by its call id."""
    made: dict[str, CompactingSession] = {}

    def session_for(thread_id: str) -> CompactingSession:
        made[thread_id] = CompactingSession(
            f"c-lc-thread-{thread_id}",
            client=framework_workers.client,
            model="gpt-4.1",
            context_window=WINDOW,
        )
        return made[thread_id]

    model = ScriptedModel(turns=8, recall="call0")
    middleware = CompactingMiddleware(session_for, recall_tool=True)
    agent = create_agent(
        model,
        tools=[read_file_tool(lambda: made["t1"])],
        system_prompt=SYSTEM,
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "t1"}, "recursion_limit": 100}
    try:
        first = agent.invoke({"messages": [HumanMessage("Find the bug in src/pkg.")]}, config)
        assert len(first["messages"]) == 1 + 2 * 8 + 1
        session = made["t1"]
        wait_until(lambda: settled(session), what=lambda: session.status)
        second = agent.invoke({"messages": [HumanMessage("Show me mod_0.py again.")]}, config)
        assert list(made) == ["t1"] and middleware.sessions == [session]
        messages = second["messages"]
        assert messages[: len(first["messages"])] == first["messages"]  # the state keeps it all
        assert len(messages) == len(first["messages"]) + 1 + 2 + 1
        # the compacted history went on into the second run: the model never saw call0 again
        # except through the recall tool
        sent = model.given[8 + 1]
        assert any(str(m.content).startswith(SUMMARY) for m in sent)
        assert not any(getattr(m, "tool_call_id", None) == "call0" for m in sent)
        recalled = messages[-2]
        assert isinstance(recalled, ToolMessage) and recalled.tool_call_id == "rc"
        original = json.loads(str(recalled.content))
        assert original["tool_call_id"] == "call0"
        assert original["content"] == file_body("src/pkg/mod_0.py")
        assert from_wire([original]) == [first["messages"][2]]  # the agent's own message
        assert session.status.compactions_skipped == 0
    finally:
        for s in made.values():
            s.close()


@pytest.mark.slow
def test_the_prebuilt_react_agent_with_the_pre_model_hook(framework_workers: Any) -> None:
    session = CompactingSession(
        "c-lc-react-agent", client=framework_workers.client, model="gpt-4.1", context_window=WINDOW
    )
    model = ScriptedModel(turns=12)
    hook = CompactingPreModelHook(session)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
            agent = create_react_agent(
                model, [read_file_tool(lambda: session)], prompt=SYSTEM, pre_model_hook=hook
            )
        result = agent.invoke(
            {"messages": [HumanMessage("Find the bug in src/pkg.")]},
            {"recursion_limit": 100},
        )
        assert "llm_input_messages" not in result
        check_run(model, result["messages"], session)
        hook.flush(result["messages"])
        wait_until(lambda: settled(session), what=lambda: session.status)
        assert session.messages[-1]["id"] == result["messages"][-1].id
    finally:
        session.close()


@pytest.mark.slow
def test_the_example_runs_offline(tmp_path: Path, subprocesses: None) -> None:
    """examples/langchain_example.py: its own embedded Redis, workers and scheduler."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "langchain_example.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len([line for line in lines if line.startswith("model call")]) == 13
    assert "(compacted)" in proc.stdout
    assert "the agent's state holds all 26 messages" in lines[-1]


@pytest.mark.slow
def test_an_edited_state_is_submitted_whole_and_compacted_again(framework_workers: Any) -> None:
    """The agent's history changes under the middleware (a turn removed from the checkpoint):
    the model is given the edited history as it is, the session submits it whole, and the
    compaction of the old history is not applied to it; later calls are compacted again."""
    session = CompactingSession(
        "c-lc-edited", client=framework_workers.client, model="gpt-4.1", context_window=WINDOW
    )
    model = ScriptedModel(turns=8, more=8)
    agent = create_agent(
        model,
        tools=[read_file_tool(lambda: session)],
        system_prompt=SYSTEM,
        middleware=[CompactingMiddleware(session)],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "edited"}, "recursion_limit": 100}
    try:
        first = agent.invoke({"messages": [HumanMessage("Find the bug in src/pkg.")]}, config)
        assert session.compactions
        wait_until(lambda: settled(session), what=lambda: session.status)
        call1, result1 = first["messages"][3:5]
        assert isinstance(result1, ToolMessage) and result1.tool_call_id == "call1"
        agent.update_state(
            config, {"messages": [RemoveMessage(id=call1.id), RemoveMessage(id=result1.id)]}
        )
        second = agent.invoke({"messages": [HumanMessage("Read the rest.")]}, config)
        messages = second["messages"]
        assert len(messages) == len(first["messages"]) - 2 + 1 + 2 * 8 + 1
        assert call1.id not in {m.id for m in messages}
        after_edit = model.given[9]
        assert after_edit[1:] == messages[: len(after_edit) - 1]  # the edited history, whole
        assert not any(str(m.content).startswith(SUMMARY) for m in after_edit)
        later = model.given[-1]
        assert any(str(m.content).startswith(SUMMARY) for m in later)
        assert "call1" not in {getattr(m, "tool_call_id", None) for m in later}
        assert request_tokens(to_wire(later)) < WINDOW
    finally:
        session.close()
