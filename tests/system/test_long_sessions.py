"""Long sessions of agents that send their full history every turn: 200 turns through the proxy
(driven by the official ``openai`` SDK) and 200 through the HTTP snapshots route, with a small
threshold, dozens of compactions, and the worker and ``compactor serve`` restarted midway.
After the first compaction, every request that goes to the model stays under the threshold plus
one turn, to the last turn: the compactions so far are applied at once however many there
were (``cw:{conv}:composed``), by any process, after any restart."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.http_support import Stack, proxy_agent, proxy_config, running_stack

from worker.core.projection import count_request_tokens
from worker.testing.standin_llm import StandinLLM
from worker.tokens import tokenizer_for
from worker.wire import formats
from worker.wire.events import OUTCOME_TYPES

pytestmark = pytest.mark.slow

AGENT_KEY = "sk-agent-own-key-0123456789"
THRESHOLD = 2000
TURNS = 200
RESTART_AT = 100
OUTCOME_WAIT_S = 120.0  # generous: the machine is shared
LONG_SESSION_CONFIG = "preserve_recent_user_tokens = 300\nmax_persisted_transcripts = 5\n"


@pytest.fixture(scope="module")
def llm(system_scenario: None) -> Iterator[StandinLLM]:
    with StandinLLM(expected_key=AGENT_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def stack(
    redis_server: str, llm: StandinLLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("long"),
        redis_server,
        proxy_config(llm, threshold_tokens=THRESHOLD, extra=LONG_SESSION_CONFIG),
    ) as s:
        yield s


def user_turn(k: int) -> dict[str, Any]:
    words = " ".join(f"src/pkg/mod_{k % 9}.py:{i} value_{k}_{i}" for i in range(60))
    return {"role": "user", "content": f"Turn {k}. Here is what I found: {words}"}


def request_tokens(messages: list[dict[str, Any]]) -> int:
    """Tokens of a Chat Completions request, counted as the worker counts them (these turns
    have no tool results, so the projection changes nothing)."""
    return count_request_tokens(formats.to_messages("openai", messages), tokenizer_for("gpt-4.1"))


class Outcomes:
    """Follows one conversation's events over HTTP (from wherever ``compactor serve`` now
    listens) and waits for the outcome of a revision."""

    def __init__(self, stack: Stack, conversation_id: str) -> None:
        self.stack, self.conversation_id = stack, conversation_id
        self.after = "0"
        self.completed = 0

    def wait(self, revision: int) -> None:
        deadline = time.monotonic() + OUTCOME_WAIT_S
        while time.monotonic() < deadline:
            with self.stack.http() as client:
                r = client.get(
                    f"/v1/conversations/{self.conversation_id}/events",
                    params={"after": self.after},
                )
            if r.status_code == 200:
                newest = -1
                for event in r.json():
                    self.after = event["stream_id"]
                    if event["type"] in OUTCOME_TYPES:
                        assert event["type"] in ("compaction.completed", "compaction.skipped"), (
                            event
                        )
                        self.completed += event["type"] == "compaction.completed"
                        newest = max(newest, event["revision"])
                if newest >= revision:
                    return
            time.sleep(0.05)
        raise AssertionError(f"no outcome of revision {revision} of {self.conversation_id}")


def restart_midway(stack: Stack) -> None:
    """A new worker process and a new ``compactor serve``: nothing they knew carries over but
    what is in Redis."""
    stack.workers.stop("api-w")
    stack.workers.spawn("api-w")
    stack.workers.wait_ready(["api-w"])
    stack.restart_server()


def assert_bounded(sizes: list[int], applied: list[int], turn_tokens: int) -> None:
    first = next(i for i, n in enumerate(applied) if n > 0)
    bound = THRESHOLD + turn_tokens
    over = [(i, s) for i, s in enumerate(sizes) if i >= first and s > bound]
    assert not over, (bound, over)
    assert applied == sorted(applied)  # each request had every compaction so far
    assert applied[-1] >= 40, applied[-1]
    assert max(sizes) > THRESHOLD // 2  # it did run close to the threshold


def test_200_proxied_turns_stay_under_the_threshold_plus_a_turn(
    stack: Stack, llm: StandinLLM
) -> None:
    cid = "long-proxy"
    outcomes = Outcomes(stack, cid)
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    sizes, applied, turn_tokens = [], [], 0
    client = proxy_agent(stack, cid, AGENT_KEY)
    try:
        for k in range(TURNS):
            if k == RESTART_AT:
                client.close()
                restart_midway(stack)
                client = proxy_agent(stack, cid, AGENT_KEY)
            asked = user_turn(k)
            history.append(asked)
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4.1", messages=history
            )
            reply = raw.parse().choices[0].message.content
            applied.append(int(raw.headers["x-compactor-compactions"]))
            sent = llm.requests[-1].body["messages"]
            assert sent[-1] == asked and sent[0] == history[0]
            sizes.append(request_tokens(sent))
            answer = {"role": "assistant", "content": reply}
            history.append(answer)
            turn_tokens = max(turn_tokens, request_tokens([asked, answer]))
            outcomes.wait(k + 1)  # the proxy submitted the exchange as revision k + 1
    finally:
        client.close()
    assert_bounded(sizes, applied, turn_tokens)
    assert outcomes.completed == applied[-1] or outcomes.completed == applied[-1] + 1
    assert "x-compactor-compaction-id" in raw.headers
    assert 'type="compaction.' in raw.headers["x-compactor-outcome"]


def test_200_full_history_turns_over_http_stay_under_the_threshold_plus_a_turn(
    stack: Stack,
) -> None:
    """An HTTP client that keeps its full history: it submits it after each turn and asks
    ``POST .../compacted`` for the history to send before the next model call."""
    cid = "long-http"
    outcomes = Outcomes(stack, cid)
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    answer_text = " ".join(f"I checked item {i} and it holds." for i in range(40))
    sizes, applied, turn_tokens = [], [], 0
    for k in range(TURNS):
        if k == RESTART_AT:
            restart_midway(stack)
        asked = user_turn(k)
        history.append(asked)
        with stack.http() as client:
            r = client.post(f"/v1/conversations/{cid}/compacted", json={"messages": history})
            assert r.status_code == 200, r.text
            doc = r.json()
            assert int(r.headers["x-compactor-compactions"]) == doc["applied"]
            sizes.append(request_tokens(doc["messages"]))
            applied.append(doc["applied"])
            answer = {"role": "assistant", "content": answer_text}
            history.append(answer)
            turn_tokens = max(turn_tokens, request_tokens([asked, answer]))
            snapshot = {
                "conversation_id": cid,
                "revision": k,
                "model": {"name": "gpt-4.1"},
                "messages": history,
            }
            assert client.post(f"/v1/conversations/{cid}/snapshots", json=snapshot).is_success
        outcomes.wait(k)
    assert_bounded(sizes, applied, turn_tokens)


def test_an_edited_history_is_sent_whole_and_says_so(stack: Stack) -> None:
    """A history that no compaction matches any more goes out as it came, with a warning."""
    cid = "long-edited"
    outcomes = Outcomes(stack, cid)
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    with stack.http() as client:
        for k in range(12):
            history.append(user_turn(k))
            snapshot = {"conversation_id": cid, "revision": k, "messages": history}
            assert client.post(f"/v1/conversations/{cid}/snapshots", json=snapshot).is_success
            outcomes.wait(k)
        assert outcomes.completed >= 1
        edited = [history[0], {"role": "user", "content": "edited"}, *history[2:]]
        r = client.post(f"/v1/conversations/{cid}/compacted", json={"messages": edited})
        assert r.json()["messages"] == edited and r.json()["applied"] == 0
        assert "none of the conversation's" in r.headers["x-compactor-warning"]
        r = client.post(f"/v1/conversations/{cid}/compacted", json={"messages": history})
        assert r.json()["applied"] >= 1
        assert request_tokens(r.json()["messages"]) < request_tokens(history)
        bad = client.post(f"/v1/conversations/{cid}/compacted", json={"messages": "no"})
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"


def test_the_proxy_says_when_its_snapshots_are_rejected(stack: Stack, llm: StandinLLM) -> None:
    """A history the service refuses (a tool call id used twice) is forwarded whole, and the
    reply says why: the newest outcome is the rejection, with its field."""
    cid = "long-rejected"
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "dup", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ],
    }
    result = {"role": "tool", "tool_call_id": "dup", "content": "ok"}
    history = [{"role": "user", "content": "go"}, call, result, call, result]
    client = proxy_agent(stack, cid, AGENT_KEY)
    try:
        client.chat.completions.create(model="gpt-4.1", messages=history)
        deadline = time.monotonic() + OUTCOME_WAIT_S
        while True:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4.1", messages=history
            )
            outcome = raw.headers.get("x-compactor-outcome", "")
            if "rejected" in outcome or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        client.close()
    assert re.fullmatch(
        r'type="compaction\.rejected", revision=\d+, code="invalid_snapshot", '
        r'field="messages\[3\]"',
        outcome,
    ), outcome
    assert raw.headers["x-compactor-compactions"] == "0"
