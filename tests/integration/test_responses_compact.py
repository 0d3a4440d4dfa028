"""OpenAI's compact endpoint served by the service (``POST /v1/responses/compact``, and the same
under the proxy's OpenAI base path), driven by the official ``openai`` SDK and the OpenAI
Agents SDK's own ``OpenAIResponsesCompactionSession`` against a real ``compactor serve``, Redis,
worker process and the stand-in LLM (which writes the summaries).

The SDK parses what we answer as its ``CompactedResponse``; the output, sent back as input, is
accepted; the compaction is the workers' (its event, transcript, recall and undo are there over
the HTTP API); nothing opaque is quoted, no encrypted item is made up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import (
    CompactedResponse,
    EasyInputMessageParam,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_input_param import FunctionCallOutput
from openai.types.responses.response_reasoning_item import Summary
from support.fault_support import UNSET_KEY_ENV
from support.http_support import KEY_A, KEY_B, Stack, wait_events

from worker.api.responses_compact import request_field
from worker.backend.embedded import EmbeddedRedis
from worker.testing.standin_llm import StandinLLM
from worker.wire.events import SUMMARY_MARKER

pytestmark = pytest.mark.slow

AGENT_KEY = "sk-agent-own-key-0123456789"  # the agent's provider key: never needed by us
SETTLE_S = 120.0  # generous: the machine is shared
MODEL = "gpt-4.1"


def stack_config(llm: StandinLLM, *, ready_timeout_s: float = 10.0) -> str:
    """Summaries by the stand-in (the digest if it fails); a generous worker check (it runs
    beside the wait, so it delays nothing), and the proxy's upstream the stand-in."""
    return f"""mode = "prefer_remote"
[llm]
base_url = "{llm.openai_base_url}"
model = "stand-in"
api_key_env = "{UNSET_KEY_ENV}"
max_retries = 1
[http]
ready_timeout_s = {ready_timeout_s}
[proxy]
openai_base_url = "{llm.openai_base_url}"
"""


_CLIENTS: list[Any] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def sdk_client(stack: Stack, *, key: str = KEY_A, **headers: str) -> openai.OpenAI:
    """The official client with its base URL pointed at us; no retries, so each call is one."""
    client = openai.OpenAI(
        base_url=f"{stack.base}/v1",
        api_key=key,
        max_retries=0,
        timeout=SETTLE_S,
        default_headers=headers or None,
    )
    _CLIENTS.append(client)
    return client


def dumped(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    return out


def user(text: str) -> dict[str, Any]:
    return dict(EasyInputMessageParam(type="message", role="user", content=text))


def secret(tag: str, k: int) -> str:
    """An opaque value (an encrypted reasoning state): carried, never quoted."""
    return f"gAAAAB-OPAQUE-{tag}-{k}-" + "x" * 40


def sdk_turn(tag: str, k: int) -> list[dict[str, Any]]:
    """One agent step as the SDK's own types make it: reasoning (with encrypted content), a
    function call, its output (about 600 tokens of paths), the assistant's answer."""
    reasoning = ResponseReasoningItem(
        id=f"rs_{tag}{k}",
        type="reasoning",
        summary=[Summary(type="summary_text", text=f"Look at module {k}.")],
        encrypted_content=secret(tag, k),
    )
    call = ResponseFunctionToolCall(
        id=f"fc_{tag}{k}",
        type="function_call",
        call_id=f"call_{tag}{k}",
        name="read_file",
        arguments=json.dumps({"path": f"src/pkg/mod_{k}.py"}),
        status="completed",
    )
    output = FunctionCallOutput(
        type="function_call_output",
        call_id=f"call_{tag}{k}",
        output=" ".join(f"src/pkg/mod_{k}.py:{i}: value_{k}_{i}" for i in range(120)),
    )
    answer = ResponseOutputMessage(
        id=f"msg_{tag}{k}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=f"Module {k} read.", annotations=[])],
    )
    return [dumped(reasoning), dumped(call), dict(output), dumped(answer)]


def sdk_history(tag: str, turns: int) -> list[dict[str, Any]]:
    items = [
        {"type": "message", "role": "developer", "content": "You are a careful coding agent."},
        user(f"Fix the failing test in tests/test_{tag}.py."),
    ]
    for k in range(turns):
        if k == turns // 2:
            items.append(user(f"Also keep ISSUE-{k} in mind."))
        items += sdk_turn(tag, k)
    return items


def compact(client: openai.OpenAI, **kw: Any) -> tuple[CompactedResponse, httpx.Headers, Any]:
    """``client.responses.compact`` as the SDK makes it: the parsed object, the headers and
    the raw JSON."""
    raw = client.responses.with_raw_response.compact(model=MODEL, **kw)
    return raw.parse(), raw.headers, raw.http_response.json()


def summaries(items: list[dict[str, Any]]) -> list[int]:
    return [k for k, i in enumerate(items) if SUMMARY_MARKER in json.dumps(i.get("content"))]


def opaque_values(value: Any) -> set[str]:
    if isinstance(value, dict):
        found = {v for k, v in value.items() if k == "encrypted_content" and isinstance(v, str)}
        return found.union(*(opaque_values(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(opaque_values(v) for v in value))
    return set()


def http(stack: Stack, key: str | None = KEY_A) -> httpx.Client:
    """A plain HTTP client with the tenant's key, patient enough for a compaction."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=stack.base, headers=headers, timeout=SETTLE_S)


def events_of(stack: Stack, conversation_id: str, key: str = KEY_A) -> list[dict[str, Any]]:
    with http(stack, key) as client:
        r = client.get(f"/v1/conversations/{conversation_id}/events", params={"limit": 1000})
    assert r.status_code == 200, r.text
    events: list[dict[str, Any]] = r.json()
    return events


# --- the SDK's compact against compactor serve -------------------------------------------------


def test_the_sdk_compacts_through_us_and_the_compaction_is_the_workers(
    stack: Stack, llm: StandinLLM
) -> None:
    history = sdk_history("a", 8)
    compacted, headers, raw = compact(sdk_client(stack), input=history)

    # the SDK's own type, parsed from our answer; the output round-trips as the SDK dumps it
    assert isinstance(compacted, CompactedResponse)
    assert compacted.object == "response.compaction"
    output = [o.model_dump(exclude_unset=True, warnings=False) for o in compacted.output]
    assert output == raw["output"]
    conversation = headers["x-compactor-conversation"]
    assert conversation.startswith("responses-")
    assert headers["x-compactor-outcome"].startswith('type="compaction.completed"')

    # the developer item, both user turns, one readable summary after them, then the kept tail
    assert output[0] == history[0]
    (at,) = summaries(output)
    assert output[at]["role"] == "user" and output[at]["type"] == "message"
    users = [i["content"] for i in history if i.get("role") == "user"]
    assert [i["content"] for i in output[:at] if i.get("role") == "user"] == users
    tail = output[at + 1 :]
    assert tail and tail == history[-len(tail) :]
    assert len(output) < len(history)

    # no encrypted item made up; the client's opaque values only carried, never quoted
    assert not any(i.get("type") == "compaction" for i in output)
    assert opaque_values(output) <= opaque_values(history)
    summary_text = json.dumps(output[at])
    assert not any(s in summary_text for s in opaque_values(history))
    assert not any(s in json.dumps(r.body) for r in llm.requests for s in opaque_values(history))

    # usage: ours, the window before and after
    usage = compacted.usage
    assert usage.input_tokens > usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0

    # the event, its transcript and recall, over the HTTP API with the same key
    events = events_of(stack, conversation)
    done = next(e for e in events if e["type"] == "compaction.completed")
    assert done["event_id"] == compacted.id == headers["x-compactor-compaction-id"]
    assert done["trigger"]["kind"] == "requested"
    assert done["compaction"]["format"] == "responses"
    assert done["compaction"]["summary"]["source"] == "llm"
    assert done["compaction"]["tokens_before"] == usage.input_tokens
    assert not any(s in json.dumps(events) for s in opaque_values(history))
    c = done["compaction"]
    with stack.http() as client:
        transcript = client.get(c["transcript"]["uri"])
        assert transcript.status_code == 200, transcript.text
        assert transcript.json()["messages"] == history
        recalled = client.get(f"/v1/conversations/{conversation}/messages/{c['first_id']}")
        assert recalled.status_code == 200, recalled.text
        assert recalled.json()["message"] == history[c["start"]]
        # and undo: the compaction restored, published as compaction.reverted
        undone = client.post(
            f"/v1/conversations/{conversation}/compactions/{done['event_id']}/restore"
        )
        assert undone.status_code == 200, undone.text
        assert undone.json()["reverted_event_id"] == done["event_id"]


def test_the_output_sent_back_is_accepted_in_the_same_conversation(stack: Stack) -> None:
    sdk = sdk_client(stack)
    first, headers, raw = compact(sdk, input=sdk_history("b", 6))
    conversation = headers["x-compactor-conversation"]

    # the next window: the output as the SDK gives it, plus the session's new turns
    window = [o.model_dump(exclude_unset=True, warnings=False) for o in first.output]
    window += [user("Now run the tests."), *sdk_turn("b2", 0), *sdk_turn("b2", 1)]
    second, again, _ = compact(sdk, input=window)
    assert again["x-compactor-conversation"] == conversation  # one session, one conversation
    assert again["x-compactor-outcome"].startswith('type="compaction.completed"')
    output = [o.model_dump(exclude_unset=True, warnings=False) for o in second.output]
    assert len(summaries(output)) == 1  # the earlier summary folded into the new one
    assert output[-1] == window[-1]  # the newest exchange kept as it came

    # and as a snapshot of a conversation of its own: parsed, not rejected
    snapshot = {
        "conversation_id": "sent-back-1",
        "revision": 1,
        "format": "responses",
        "model": {"name": MODEL},
        "messages": raw["output"],
    }
    with http(stack) as client:
        r = client.post("/v1/conversations/sent-back-1/snapshots", content=json.dumps(snapshot))
        assert r.status_code == 202, r.text
        events = wait_events(client, "sent-back-1", until="compaction.skipped", timeout_s=SETTLE_S)
    assert not any(e["type"] == "compaction.rejected" for e in events)


def test_a_text_input_has_nothing_to_compact_and_comes_back_as_it_went(stack: Stack) -> None:
    compacted, headers, raw = compact(sdk_client(stack), input="What does src/app.py do?")
    assert headers["x-compactor-outcome"].startswith('type="compaction.skipped"')
    assert raw["output"] == [
        {"type": "message", "role": "user", "content": "What does src/app.py do?"}
    ]
    assert compacted.usage.input_tokens == compacted.usage.output_tokens > 0
    assert "x-compactor-compaction-id" not in headers
    skipped = events_of(stack, headers["x-compactor-conversation"])
    assert any(e["event_id"] == compacted.id for e in skipped)


def test_previous_response_id_needs_a_named_conversation(stack: Stack) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        sdk_client(stack).responses.compact(model=MODEL, previous_response_id="resp_0123")
    said = refused.value.response.json()
    assert said["error"] == "invalid_request" and said["field"] == "previous_response_id"
    assert "keeps no responses" in said["message"]

    named = sdk_client(stack, **{"X-Compactor-Conversation": "prev-1"})
    with pytest.raises(openai.ConflictError) as none_yet:
        named.responses.compact(model=MODEL, previous_response_id="resp_0123")
    assert none_yet.value.response.json()["error"] == "no_snapshot"

    first, headers, _ = compact(named, input=sdk_history("p", 6))
    assert headers["x-compactor-conversation"] == "prev-1"
    question = user("And the flaky test in tests/test_slow.py?")
    second, again, raw = compact(named, previous_response_id="resp_0123", input=[question])
    assert again["x-compactor-conversation"] == "prev-1"
    # the conversation's newest snapshot stood for the previous response (with its compaction
    # applied: one summary), the input follows it
    assert raw["output"][-1] == question
    assert len(summaries(raw["output"])) == 1
    events = events_of(stack, "prev-1")
    revisions = [e["revision"] for e in events if e["event_id"] in (first.id, second.id)]
    assert len(revisions) == 2 and revisions[0] < revisions[1]
    assert "resp_0123" not in json.dumps(events)  # an id we cannot use is kept nowhere

    # a conversation whose newest snapshot is no Responses history cannot stand for one
    chat = {"conversation_id": "prev-chat-1", "revision": 1, "messages": [user("hi")]}
    chat["messages"][0].pop("type")
    with http(stack) as client:
        assert client.post("/v1/conversations/prev-chat-1/snapshots", json=chat).status_code == 202
        r = client.post(
            "/v1/responses/compact",
            json={"model": MODEL, "previous_response_id": "resp_1"},
            headers={"X-Compactor-Conversation": "prev-chat-1"},
        )
    assert r.status_code == 409 and r.json()["error"] == "format_mismatch", r.text


def test_a_refused_item_is_named_as_the_request_names_it() -> None:
    """The worker names a snapshot's field; the answer names the request's (pure)."""
    assert request_field("messages[1].role", 0) == "input[1].role"
    assert request_field("messages[7].content[0].text", 5) == "input[2].content[0].text"
    assert request_field("messages[3].role", 5) == "messages[3].role"  # the stored history's
    assert request_field("model.name", 0) == "model"
    assert request_field(None, 0) == request_field("messages", 0) == "input"


def test_bad_bodies_are_refused_naming_the_field(stack: Stack) -> None:
    good = {"model": MODEL, "input": "hello"}
    cases = [
        ({"input": "hello"}, "model"),
        ({"model": MODEL}, "input"),
        (good | {"model": 5}, "model"),
        (good | {"model": "m" * 300}, "model"),
        (good | {"input": 5}, "input"),
        (good | {"input": []}, "input"),
        (good | {"input": ["hello"]}, "input[0]"),
        (good | {"instructions": ["be brief"]}, "instructions"),
        (good | {"previous_response_id": 7}, "previous_response_id"),
        (good | {"stream": True}, "stream"),
        ([good], ""),
    ]
    with http(stack) as client:
        for body, field in cases:
            r = client.post("/v1/responses/compact", json=body)
            assert r.status_code == 422, (body, r.text)
            assert r.json()["error"] == "invalid_request" and r.json()["field"] == field, r.text
        assert client.post("/v1/responses/compact", content=b"{nope").status_code == 400
        bad_id = client.post(
            "/v1/responses/compact", json=good, headers={"X-Compactor-Conversation": "../x"}
        )
        assert bad_id.status_code == 422 and bad_id.json()["field"] == "X-Compactor-Conversation"
        # what the worker refuses comes back naming the item of the input
        robot = {"type": "message", "role": "robot", "content": "beep"}
        r = client.post("/v1/responses/compact", json=good | {"input": [user("hi"), robot]})
        assert r.status_code == 422, r.text
        assert r.json() == r.json() | {"error": "invalid_snapshot", "field": "input[1].role"}
    with http(stack, key=None) as anonymous:
        r = anonymous.post("/v1/responses/compact", json=good)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"


def test_what_openai_and_codex_send_along_is_accepted(stack: Stack) -> None:
    """OpenAI's other compact parameters and the request settings Codex sends with its window:
    accepted, used for nothing here."""
    body = {
        "model": MODEL,
        "input": sdk_history("c", 4),
        "instructions": "You are a careful coding agent.\nKeep answers short.",
        "tools": [{"type": "function", "name": "read_file", "parameters": {}}],
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium"},
        "text": {"verbosity": "low"},
        "service_tier": "auto",
        "prompt_cache_key": "session-42",
        "prompt_cache_retention": "24h",
        "safety_identifier": "user-7",
    }
    with http(stack) as client:
        r = client.post("/v1/responses/compact", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "response.compaction"
    # the instructions are the client's to send with every request: not part of the window
    assert "Keep answers short" not in r.text


# --- under the proxy's OpenAI base path -------------------------------------------------------


def test_under_the_proxys_base_path_with_the_proxys_headers(stack: Stack, llm: StandinLLM) -> None:
    history = sdk_history("x", 6)
    headers = {"X-Compactor-Key": KEY_A, "X-Compactor-Conversation": "proxy-c-1"}
    client = openai.OpenAI(
        base_url=f"{stack.base}/proxy/openai/v1",
        api_key=AGENT_KEY,  # the agent's provider key, as it would send it upstream
        max_retries=0,
        timeout=SETTLE_S,
        default_headers=headers,
    )
    _CLIENTS.append(client)
    seen = len(llm.requests)
    compacted, answer, raw = compact(client, input=history)
    assert answer["x-compactor-conversation"] == "proxy-c-1"
    assert len(summaries(raw["output"])) == 1
    # nothing went upstream: the stand-in saw only the summarizer's calls, never the agent's key
    assert all(
        r.path.endswith("/chat/completions") and not r.auth_present for r in llm.requests[seen:]
    )
    # the compaction is the conversation's, under /v1 with the tenant's key
    assert any(e["event_id"] == compacted.id for e in events_of(stack, "proxy-c-1"))

    # the proxy applies it to the agent's full history on its next request
    proxied = httpx.post(
        f"{stack.base}/proxy/openai/v1/responses",
        json={"model": MODEL, "input": history},
        headers=headers | {"Authorization": f"Bearer {AGENT_KEY}"},
        timeout=SETTLE_S,
    )
    assert proxied.headers["x-compactor-compactions"] == "1"
    assert proxied.headers["x-compactor-compaction-id"] == compacted.id

    without_key = openai.OpenAI(
        base_url=f"{stack.base}/proxy/openai/v1",
        api_key=KEY_A,  # our key as Authorization does not name a tenant here
        max_retries=0,
        default_headers={"X-Compactor-Conversation": "proxy-c-1"},
    )
    _CLIENTS.append(without_key)
    with pytest.raises(openai.AuthenticationError) as refused:
        without_key.responses.compact(model=MODEL, input="hello")
    assert "X-Compactor-Key" in refused.value.response.json()["message"]


# --- bounded waits ---------------------------------------------------------------------------


def test_an_outcome_not_in_time_is_a_json_timeout_and_the_compaction_still_lands(
    stack: Stack, llm: StandinLLM, redis_server: str, tmp_path: Path
) -> None:
    """A second ``serve`` (the same workers) waits at most 2 s; the summarizer is held."""
    slow = Stack(tmp_path, redis_server, stack_config(llm))
    slow.start(workers=False, env={"COMPACTOR_WORKER_SUMMARIZE_TIME_LIMIT_S": "2"})
    llm.hold()
    try:
        with http(slow) as client:
            r = client.post(
                "/v1/responses/compact",
                json={"model": MODEL, "input": sdk_history("t", 6)},
                headers={"X-Compactor-Conversation": "slow-1"},
            )
    finally:
        llm.release()
        slow.stop()
    assert r.status_code == 504, r.text
    assert r.json()["error"] == "timeout" and "summarize_time_limit_s" in r.json()["message"]
    assert r.headers["x-should-retry"] == "false"  # the SDKs do not ask a second time
    with stack.http() as client:
        events = wait_events(client, "slow-1", until="compaction.completed", timeout_s=SETTLE_S)
    done = next(e for e in events if e["type"] == "compaction.completed")
    assert done["trigger"]["request_id"] == r.json()["request_id"]


def test_without_a_summarize_worker_the_answer_is_a_503_not_a_wait(
    llm: StandinLLM, tmp_path: Path, sockets: None
) -> None:
    with EmbeddedRedis() as url:
        alone = Stack(tmp_path, url, stack_config(llm, ready_timeout_s=1.0))
        alone.start(workers=False)
        try:
            with http(alone) as client:
                r = client.post("/v1/responses/compact", json={"model": MODEL, "input": "hi"})
        finally:
            alone.stop()
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "no_workers" and r.json()["request_id"]
    assert r.headers["x-should-retry"] == "false"


# --- the OpenAI Agents SDK's own compaction session ---------------------------------------------


def test_the_agents_sdks_compaction_session_compacts_40_turns_through_us(stack: Stack) -> None:
    agents = pytest.importorskip("agents")
    from agents.items import ModelResponse
    from agents.memory import OpenAIResponsesCompactionSession
    from agents.models.interface import Model
    from agents.usage import Usage

    agents.set_tracing_disabled(True)

    class ScriptedModel(Model):
        """Each run: a tool call, then an answer, each with a response id (so the Runner asks
        the session to compact after it). Records every input."""

        def __init__(self) -> None:
            self.inputs: list[list[dict[str, Any]]] = []

        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kw: Any
        ) -> Any:
            items = [user(input)] if isinstance(input, str) else [dict(i) for i in input]
            self.inputs.append(json.loads(json.dumps(items, default=str)))
            n = len(self.inputs)
            if items[-1].get("type") == "function_call_output":
                text = ResponseOutputText(type="output_text", text=f"Done {n}.", annotations=[])
                out: list[Any] = [
                    ResponseOutputMessage(
                        id=f"msg_{n}", type="message", role="assistant", status="completed",
                        content=[text],
                    )
                ]  # fmt: skip
            else:
                out = [
                    ResponseFunctionToolCall(
                        id=f"fc_{n}", type="function_call", call_id=f"call_{n}",
                        name="read_file", arguments=json.dumps({"path": f"src/mod_{n}.py"}),
                    )
                ]  # fmt: skip
            return ModelResponse(output=out, usage=Usage(), response_id=f"resp_{n}")

        def stream_response(self, *args: Any, **kw: Any) -> Any:
            raise NotImplementedError

    @agents.function_tool(name_override="read_file")
    def read_file_tool(path: str) -> str:
        """Read a file."""
        return read_file(path)

    async def run() -> tuple[ScriptedModel, list[Any]]:
        model = ScriptedModel()
        agent = agents.Agent(name="coder", instructions="You fix code.", model=model,
                             tools=[read_file_tool])  # fmt: skip
        compactor = openai.AsyncOpenAI(base_url=f"{stack.base}/v1", api_key=KEY_B, max_retries=0)
        store = agents.SQLiteSession("responses-compact-40")
        session = OpenAIResponsesCompactionSession(
            "responses-compact-40",
            store,
            client=compactor,  # only its compaction calls come to us
            model=MODEL,
            compaction_mode="input",  # we keep no responses: send the window
        )
        try:
            for turn in range(40):
                result = await agents.Runner.run(
                    agent, f"Task {turn}: fix module {turn}.", session=session
                )
                assert str(result.final_output).startswith("Done")
            return model, await session.get_items()
        finally:
            store.close()
            await compactor.close()

    model, items = asyncio.run(run())

    # every compaction was ours, in one conversation: the session's
    with stack.http(key=KEY_B) as client:
        listed = client.get("/v1/conversations", params={"limit": 100}).json()["conversations"]
    ours = [c["conversation_id"] for c in listed if c["conversation_id"].startswith("responses-")]
    assert len(ours) == 1, ours
    done = [e for e in events_of(stack, ours[0], KEY_B) if e["type"] == "compaction.completed"]
    assert len(done) >= 5 and all(e["trigger"]["kind"] == "requested" for e in done)

    # the model was sent our windows: one summary, tool pairs intact, bounded to the end
    compacted = [i for i in model.inputs if summaries(i)]
    assert compacted and compacted[-1] is model.inputs[-1]
    for inputs in compacted:
        assert len(summaries(inputs)) == 1
        calls = [i["call_id"] for i in inputs if i.get("type") == "function_call"]
        outputs = [i["call_id"] for i in inputs if i.get("type") == "function_call_output"]
        assert sorted(calls) == sorted(outputs)
        assert sum(i.get("role") != "user" for i in inputs) <= 16  # what grows is only users
    assert next(i["content"] for i in model.inputs[-1] if i.get("role") == "user") == (
        "Task 0: fix module 0."
    )
    # 40 tool outputs uncompacted; the model never got more than a handful of them at once
    one_output = len(read_file("src/mod_1.py"))
    assert all(len(json.dumps(i)) < 6 * one_output for i in model.inputs[20:])
    assert len(json.dumps(model.inputs[-1])) < 40 * one_output / 4
    # and the session keeps our window: one readable summary, no encrypted item
    assert len(summaries(items)) == 1 and not any(i.get("type") == "compaction" for i in items)


def read_file(path: str) -> str:
    """The scripted agent's tool: about 600 tokens of a file."""
    return " ".join(f"{path}:{i}: value_{i}" for i in range(120))
