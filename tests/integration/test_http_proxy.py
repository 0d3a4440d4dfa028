"""The proxy, driven by the official ``openai`` and ``anthropic`` SDKs against the stand-in
provider on loopback, through a real ``compactor serve``, Redis and worker: untouched without
the conversation header; with it, once a compaction has arrived, the upstream receives fewer
tokens than the agent sent, tool-call pairs intact, and the SDK sees ordinary responses,
streamed or not."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from support.http_support import KEY_A, KEY_B, Stack, proxy_config, wait_events
from support.pairs_support import anthropic_pairs_intact, openai_pairs_intact
from support.service_support import conversation

from worker.testing.standin_llm import Fault, StandinLLM
from worker.tokens import count_tokens

pytestmark = pytest.mark.slow

AGENT_KEY = "sk-agent-own-key-0123456789"


LLM_KEY = AGENT_KEY  # the stand-in demands the agent's own key


def stack_config(llm: StandinLLM) -> str:
    return proxy_config(llm, anthropic=True)


_CLIENTS: list[Any] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def openai_client(stack: Stack, conversation_id: str | None, key: str = KEY_A) -> openai.OpenAI:
    headers = {"X-Compactor-Conversation": conversation_id, "X-Compactor-Key": key}
    return _keep(
        openai.OpenAI(
            base_url=f"{stack.base}/proxy/openai/v1",
            api_key=AGENT_KEY,
            max_retries=0,
            default_headers=headers if conversation_id else None,
        )
    )


def _keep(client: Any) -> Any:
    _CLIENTS.append(client)
    return client


def anthropic_client(stack: Stack, conversation_id: str) -> anthropic.Anthropic:
    return _keep(
        anthropic.Anthropic(
            base_url=f"{stack.base}/proxy/anthropic",
            api_key=AGENT_KEY,
            max_retries=0,
            default_headers={"X-Compactor-Conversation": conversation_id, "X-Compactor-Key": KEY_A},
        )
    )


def openai_history(turns: int) -> list[dict[str, Any]]:
    """An agent's Chat Completions history as an SDK user keeps it: no ids."""
    messages = conversation("x", turns)["messages"][:-1]
    for m in messages:
        m.pop("id")
    return messages


def anthropic_history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix the failing test in src/pkg/core.py."}
    ]
    for k in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{k}", "name": "bash"}
        use["input"] = {"command": f"cat src/pkg/mod_{k}.py"}
        messages.append(
            {"role": "assistant", "content": [{"type": "text", "text": f"Step {k}."}, use]}
        )
        words = " ".join(f"token{k}_{i}" for i in range(400))
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": words}
        messages.append({"role": "user", "content": [result]})
    return messages


def tokens(messages: list[dict[str, Any]]) -> int:
    return count_tokens(json.dumps(messages), "gpt-4.1")


def last_body(llm: StandinLLM) -> dict[str, Any]:
    body: dict[str, Any] = llm.requests[-1].body
    return body


def wait_completed(stack: Stack, conversation_id: str) -> dict[str, Any]:
    with stack.http() as client:
        events = wait_events(client, conversation_id, until="compaction.completed", timeout_s=40)
    return next(e for e in events if e["type"] == "compaction.completed")


def wait_revision(stack: Stack, conversation_id: str, revision: int) -> None:
    deadline = time.monotonic() + 30
    with stack.http() as client:
        while time.monotonic() < deadline:
            r = client.get(f"/v1/conversations/{conversation_id}/events")
            if r.status_code == 200 and any(e["revision"] == revision for e in r.json()):
                return
            time.sleep(0.1)
    raise AssertionError(f"no event of revision {revision} of {conversation_id}")


def test_without_the_header_requests_pass_untouched(stack: Stack, llm: StandinLLM) -> None:
    history = openai_history(3)
    reply = openai_client(stack, None).chat.completions.create(model="gpt-4.1", messages=history)
    assert reply.choices[0].message.content.startswith("## Goal")
    assert last_body(llm) == {"model": "gpt-4.1", "messages": history}
    assert llm.requests[-1].auth_valid is True  # the agent's own key, passed through
    assert "x-compactor-key" not in llm.requests[-1].headers
    streamed = openai_client(stack, None).chat.completions.create(
        model="gpt-4.1", messages=history, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == reply.choices[0].message.content


def test_upstream_errors_come_back_as_they_came(stack: Stack, llm: StandinLLM) -> None:
    llm.enqueue(Fault(status=429, retry_after="7"))
    with pytest.raises(openai.RateLimitError) as caught:
        openai_client(stack, "p-err").chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "7"
    assert "injected fault" in str(caught.value)
    wrong = _keep(openai.OpenAI(base_url=f"{stack.base}/proxy/openai/v1", api_key="sk-wrong-00000"))
    with pytest.raises(openai.AuthenticationError):
        wrong.with_options(max_retries=0).chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]
        )
    # a Responses request whose input is a plain string goes upstream untouched (the stand-in
    # has no such route: its 404 comes back as it came)
    r = httpx.post(
        f"{stack.base}/proxy/openai/v1/responses",
        json={"model": "gpt-4.1", "input": "hi"},
        headers={"X-Compactor-Conversation": "p-resp", "X-Compactor-Key": KEY_A},
    )
    assert r.status_code == 404 and "no such route" in r.text


def test_a_conversation_header_needs_a_valid_compactor_key(stack: Stack, llm: StandinLLM) -> None:
    before = len(llm.requests)
    with pytest.raises(openai.AuthenticationError) as caught:
        openai_client(stack, "p-key", key="not-a-key-0123456789").chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 401
    assert len(llm.requests) == before  # nothing went upstream


def test_openai_history_is_compacted_once_a_compaction_arrived(
    stack: Stack, llm: StandinLLM
) -> None:
    client = openai_client(stack, "p-oa")
    history = openai_history(12)
    first = client.chat.completions.create(model="gpt-4.1", messages=history)
    assert last_body(llm)["messages"] == history  # nothing to apply yet
    history.append({"role": "assistant", "content": first.choices[0].message.content})
    done = wait_completed(stack, "p-oa")
    assert done["revision"] == 1

    history.append({"role": "user", "content": "Now run the tests."})
    second = client.chat.completions.create(model="gpt-4.1", messages=history)
    assert isinstance(second, openai.types.chat.ChatCompletion)
    assert second.choices[0].message.content.startswith("## Goal")
    sent = last_body(llm)["messages"]
    assert tokens(sent) < tokens(history) / 2
    assert sent[-1] == history[-1] and sent[0] == history[0]
    openai_pairs_intact(sent)
    assert done["compaction"]["replacement"][-1] in sent

    history.append({"role": "assistant", "content": second.choices[0].message.content})
    history.append({"role": "user", "content": "And commit."})
    stream = client.chat.completions.create(model="gpt-4.1", messages=history, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("## Goal")
    sent = last_body(llm)["messages"]
    assert tokens(sent) < tokens(history) / 2
    openai_pairs_intact(sent)
    wait_revision(stack, "p-oa", 3)  # each exchange was submitted as the next revision
    # another tenant naming the same conversation gets nothing applied
    other = openai_client(stack, "p-oa", key=KEY_B)
    other.chat.completions.create(model="gpt-4.1", messages=history)
    assert last_body(llm)["messages"] == history


def test_anthropic_history_is_compacted_streamed_and_not(stack: Stack, llm: StandinLLM) -> None:
    client = anthropic_client(stack, "p-an")
    system = "You are a coding agent."
    history = anthropic_history(12)
    first = client.messages.create(
        model="claude-x", max_tokens=300, system=system, messages=history
    )
    assert last_body(llm)["messages"] == history
    history.append(
        {"role": "assistant", "content": [{"type": "text", "text": first.content[0].text}]}
    )
    wait_completed(stack, "p-an")

    history.append({"role": "user", "content": "Now run the tests."})
    second = client.messages.create(
        model="claude-x", max_tokens=300, system=system, messages=history
    )
    assert isinstance(second, anthropic.types.Message)
    assert second.content[0].text.startswith("## Goal")
    body = last_body(llm)
    assert body["system"] == system
    assert tokens(body["messages"]) < tokens(history) / 2
    assert body["messages"][-1] == history[-1]
    anthropic_pairs_intact(body["messages"])

    history.append(
        {"role": "assistant", "content": [{"type": "text", "text": second.content[0].text}]}
    )
    history.append({"role": "user", "content": "And commit."})
    with client.messages.stream(
        model="claude-x", max_tokens=300, system=system, messages=history
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("## Goal") and final.stop_reason == "end_turn"
    body = last_body(llm)
    assert tokens(body["messages"]) < tokens(history) / 2
    anthropic_pairs_intact(body["messages"])
    wait_revision(stack, "p-an", 3)
