"""The proxy's context window per agent: the agent's ``X-Compactor-Context-Window`` header, else
the window of the request's model in ``[proxy.context_windows]`` and the built-in table, so that
``auto_compact_threshold_percent`` applies per agent. Three agents with different windows (one
by header, one by the built-in table, one by the deployment's table) through one real
``compactor serve`` with its proxy, Redis and worker, driven by the official ``openai`` and
``anthropic`` SDKs against the stand-in provider, each compact at their own threshold; a bad
header is refused with JSON naming it, and nothing goes upstream."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import (
    AssistantMessageParam,
    MessageParam,
    TextBlockParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
    UserMessageParam,
)
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)
from support.http_support import KEY_A, Stack, proxy_agent

from worker.config import MAX_CONTEXT_WINDOW, MIN_CONTEXT_WINDOW, settings_from_mapping
from worker.core.windows import BUILTIN_WINDOWS, ContextWindow, window_for
from worker.errors import ConfigError
from worker.testing.standin_llm import StandinLLM

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
AGENT_KEY = "sk-agent-own-key-0123456789"
PERCENT = 4  # small windows' shares, so that a few turns reach them
ABSOLUTE = 3000  # the threshold of a model with no known window
HEADER_WINDOW = 100_000  # agent A says so; its model's built-in window is 1,047,576
CONFIGURED_WINDOW = 150_000  # the deployment's window for claude-sonnet-4-5 (built in: 200,000)
OUTCOMES = {
    "compaction.skipped",
    "compaction.completed",
    "compaction.failed",
    "compaction.rejected",
}


# --- the lookup (pure) --------------------------------------------------------------------------


def test_a_dated_or_routed_name_finds_its_family_and_another_version_does_not() -> None:
    assert window_for("gpt-4o-2024-08-06", {}) == ContextWindow(128_000, "builtin", "gpt-4o")
    assert window_for("gpt-4o-mini-2024-07-18", {}) == ContextWindow(
        128_000, "builtin", "gpt-4o-mini"
    )
    assert window_for("claude-haiku-4-5@20251001", {}) == ContextWindow(
        200_000, "builtin", "claude-haiku-4-5"
    )
    assert window_for("models/gemini-2.5-pro", {}) == ContextWindow(
        1_048_576, "builtin", "gemini-2.5-pro"
    )
    # a dot or a digit makes another version, a letter another model: unknown, not the wrong one
    assert window_for("gpt-5.3-chat-latest", {}) is None
    assert window_for("gpt-4", {}) is None
    assert window_for("o30", {}) is None
    assert window_for("", {}) is None


def test_the_deployments_table_replaces_and_extends_the_builtin_one() -> None:
    configured = {"claude-sonnet-4-5": 150_000, "gpt-4.1": 300_000, "our-model": 32_768}
    assert window_for("claude-sonnet-4-5-20250929", configured) == ContextWindow(
        150_000, "config", "claude-sonnet-4-5"
    )
    assert window_for("our-model-v2", configured) == ContextWindow(32_768, "config", "our-model")
    # a longer built-in name is the closer one: the deployment's "gpt-4.1" is not gpt-4.1-mini's
    assert window_for("gpt-4.1-mini", configured) == ContextWindow(
        1_047_576, "builtin", "gpt-4.1-mini"
    )
    # builtin_context_windows = false: only the deployment's names
    assert window_for("gpt-4o", configured, builtin=False) is None
    assert window_for("our-model", configured, builtin=False) == ContextWindow(
        32_768, "config", "our-model"
    )


def test_every_builtin_window_could_be_configured() -> None:
    settings = settings_from_mapping({"proxy": {"context_windows": BUILTIN_WINDOWS}})
    assert settings.proxy.context_windows == BUILTIN_WINDOWS
    assert all(MIN_CONTEXT_WINDOW <= w <= MAX_CONTEXT_WINDOW for w in BUILTIN_WINDOWS.values())


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"our-model": 200}, "proxy.context_windows.our-model"),  # 200 meant as 200,000
        ({"our-model": 10**9}, "proxy.context_windows.our-model"),
        ({"our-model": "200000"}, "proxy.context_windows.our-model"),
        ({"our-model": True}, "proxy.context_windows.our-model"),
        ({'our "model"': 200_000}, 'proxy.context_windows.our "model".[key]'),
    ],
)
def test_a_bad_configured_window_is_refused_naming_its_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping({"proxy": {"context_windows": table}})
    assert str(caught.value).startswith(f"{key}: ")


def test_the_documented_table_is_the_builtin_one() -> None:
    text = (REPO_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = text[text.index("### Context windows") :]
    documented: dict[str, int] = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"[0-9,]+", cells[1]):
            for name in re.findall(r"`([^`]+)`", cells[0]):
                documented[name] = int(cells[1].replace(",", ""))
    assert documented == BUILTIN_WINDOWS


# --- through the proxy --------------------------------------------------------------------------


LLM_KEY = AGENT_KEY  # the stand-in demands the agent's own key


def stack_config(llm: StandinLLM) -> str:
    return f"""auto_compact_threshold_tokens = {ABSOLUTE}
auto_compact_threshold_percent = {PERCENT}
[proxy]
openai_base_url = "{llm.openai_base_url}"
anthropic_base_url = "{llm.anthropic_base_url}"
[proxy.context_windows]
"claude-sonnet-4-5" = {CONFIGURED_WINDOW}
"""


def _id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"  # a fresh proxy revision counter


def _notes(turn: int) -> str:
    """One tool output: about 300 tokens, different every turn."""
    return "\n".join(
        f"Step {turn} note {i}: the handler for /api/v{turn}/items/{i} returns {turn * i + 7} "
        f"records after validation of field_{turn}_{i}."
        for i in range(12)
    )


def openai_history(turns: int) -> list[ChatCompletionMessageParam]:
    history: list[ChatCompletionMessageParam] = [
        ChatCompletionSystemMessageParam(role="system", content="You are a coding agent."),
        ChatCompletionUserMessageParam(role="user", content="Make the items API paginate."),
    ]
    for k in range(turns):
        call = ChatCompletionMessageToolCallParam(
            id=f"call_{k}",
            type="function",
            function={"name": "bash", "arguments": f'{{"command": "curl /api/v{k}/items"}}'},
        )
        history.append(
            ChatCompletionAssistantMessageParam(
                role="assistant", content=f"Step {k}.", tool_calls=[call]
            )
        )
        history.append(
            ChatCompletionToolMessageParam(role="tool", tool_call_id=f"call_{k}", content=_notes(k))
        )
    return history


def anthropic_history(turns: int) -> list[MessageParam]:
    history: list[MessageParam] = [
        UserMessageParam(role="user", content="Make the items API paginate.")
    ]
    for k in range(turns):
        use = ToolUseBlockParam(
            type="tool_use", id=f"toolu_{k}", name="bash", input={"command": f"curl /api/v{k}"}
        )
        text = TextBlockParam(type="text", text=f"Step {k}.")
        history.append(AssistantMessageParam(role="assistant", content=[text, use]))
        result = ToolResultBlockParam(
            type="tool_result", tool_use_id=f"toolu_{k}", content=_notes(k)
        )
        history.append(UserMessageParam(role="user", content=[result]))
    return history


def outcome(stack: Stack, conversation_id: str, revision: int) -> dict[str, Any]:
    """The outcome event of the revision: skipped, completed (or a failure, to be reported)."""
    deadline = time.monotonic() + 60
    with stack.http() as client:
        while time.monotonic() < deadline:
            r = client.get(f"/v1/conversations/{conversation_id}/events")
            if r.status_code == 200:
                found = [e for e in r.json() if e["revision"] == revision and e["type"] in OUTCOMES]
                if found:
                    return dict(found[-1])
            time.sleep(0.1)
    raise AssertionError(f"no outcome of revision {revision} of {conversation_id}")


def turns_until_compacted(
    stack: Stack, conversation_id: str, send: Callable[[int], httpx.Headers]
) -> tuple[list[dict[str, Any]], list[httpx.Headers]]:
    """Sends ``send(turns)`` with one more tool exchange each time, each revision's outcome
    awaited, until one is a completed compaction: the outcomes and the replies' headers."""
    events, headers = [], []
    for turns in range(1, 60):
        headers.append(send(turns))
        event = outcome(stack, conversation_id, revision=turns)
        assert event["type"] in ("compaction.skipped", "compaction.completed"), event
        events.append(event)
        if event["type"] == "compaction.completed":
            return events, headers
    raise AssertionError(f"{conversation_id} never compacted: {events[-1]}")


def assert_compacted_at(events: list[dict[str, Any]], window: int) -> None:
    """Every outcome is of ``window`` and its share; the conversation was skipped while at or
    under it, and compacted once over it."""
    threshold = window * PERCENT // 100
    for event in events:
        assert event["trigger"]["context_window"] == window
        assert event["trigger"]["threshold_tokens"] == threshold
    *skipped, completed = events
    assert skipped and all(e["trigger"]["projected_tokens"] <= threshold for e in skipped)
    assert completed["trigger"]["projected_tokens"] > threshold


def test_agents_with_different_windows_compact_at_their_own_thresholds(
    stack: Stack, llm: StandinLLM
) -> None:
    by_header, by_table, by_config = _id("win-header"), _id("win-table"), _id("win-config")

    def openai_agent(conversation_id: str, model: str, extra: dict[str, str]) -> Any:
        client = openai.OpenAI(
            base_url=f"{stack.base}/proxy/openai/v1",
            api_key=AGENT_KEY,
            max_retries=0,
            default_headers={"X-Compactor-Conversation": conversation_id, "X-Compactor-Key": KEY_A}
            | extra,
        )

        def send(turns: int) -> httpx.Headers:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=openai_history(turns)
            )
            assert raw.parse().choices[0].message.content.startswith("## Goal")
            assert "x-compactor-context-window" not in llm.requests[-1].headers  # never upstream
            return raw.headers

        return client, send

    header_client, header_send = openai_agent(
        by_header, "gpt-4.1", {"X-Compactor-Context-Window": str(HEADER_WINDOW)}
    )
    table_client, table_send = openai_agent(by_table, "gpt-4o-2024-08-06", {})
    claude = anthropic.Anthropic(
        base_url=f"{stack.base}/proxy/anthropic",
        api_key=AGENT_KEY,
        max_retries=0,
        default_headers={"X-Compactor-Conversation": by_config, "X-Compactor-Key": KEY_A},
    )

    def claude_send(turns: int) -> httpx.Headers:
        raw = claude.messages.with_raw_response.create(
            model="claude-sonnet-4-5-20250929", max_tokens=200, messages=anthropic_history(turns)
        )
        assert raw.parse().content[0].type == "text"
        return raw.headers

    try:
        header_events, header_replies = turns_until_compacted(stack, by_header, header_send)
        table_events, table_replies = turns_until_compacted(stack, by_table, table_send)
        config_events, config_replies = turns_until_compacted(stack, by_config, claude_send)
    finally:
        header_client.close()
        table_client.close()
        claude.close()

    assert_compacted_at(header_events, HEADER_WINDOW)  # the header wins over gpt-4.1's 1,047,576
    assert_compacted_at(table_events, 128_000)  # gpt-4o's, a dated name
    assert_compacted_at(config_events, CONFIGURED_WINDOW)  # the deployment's, not 200,000
    # the same history that compacted under the header's window was skipped under gpt-4o's
    same = table_events[len(header_events) - 1]
    assert same["type"] == "compaction.skipped"
    assert same["trigger"]["projected_tokens"] == header_events[-1]["trigger"]["projected_tokens"]
    # and the deployment's window held on past gpt-4o's threshold
    table_threshold = 128_000 * PERCENT // 100
    assert max(e["trigger"]["projected_tokens"] for e in config_events[:-1]) > table_threshold

    # every reply said which window its snapshot carries, and whence
    assert {r["x-compactor-context-window"] for r in header_replies} == {str(HEADER_WINDOW)}
    assert {r["x-compactor-context-window-origin"] for r in header_replies} == {"header"}
    assert {r["x-compactor-context-window"] for r in table_replies} == {"128000"}
    assert {r["x-compactor-context-window-origin"] for r in table_replies} == {
        'builtin;model="gpt-4o"'
    }
    assert {r["x-compactor-context-window"] for r in config_replies} == {str(CONFIGURED_WINDOW)}
    assert {r["x-compactor-context-window-origin"] for r in config_replies} == {
        'config;model="claude-sonnet-4-5"'
    }


def test_a_model_of_no_known_window_keeps_the_absolute_threshold(
    stack: Stack, llm: StandinLLM
) -> None:
    conversation_id = _id("win-none")
    with proxy_agent(stack, conversation_id, AGENT_KEY) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="our-own-model", messages=openai_history(1)
        )
    assert "x-compactor-context-window" not in raw.headers
    assert raw.headers["x-compactor-compactions"] == "0"
    trigger = outcome(stack, conversation_id, revision=1)["trigger"]
    assert trigger["context_window"] is None
    assert trigger["threshold_tokens"] == ABSOLUTE


@pytest.mark.parametrize(
    "value",
    ["200k", "-5", "+8000", "1e6", "1_000_000", "8000.0", "0", "200", "100000001", "", "8 000"],
)
def test_a_bad_window_header_is_refused_naming_it(
    stack: Stack, llm: StandinLLM, value: str
) -> None:
    before = len(llm.requests)
    r = httpx.post(
        f"{stack.base}/proxy/openai/v1/chat/completions",
        json={"model": "gpt-4.1", "messages": openai_history(1)},
        headers={
            "Authorization": f"Bearer {AGENT_KEY}",
            "X-Compactor-Conversation": _id("win-bad"),
            "X-Compactor-Key": KEY_A,
            "X-Compactor-Context-Window": value,
        },
    )
    assert r.status_code == 422
    assert r.json() == {
        "error": "invalid_request",
        "message": f"X-Compactor-Context-Window: an integer from {MIN_CONTEXT_WINDOW} to "
        f"{MAX_CONTEXT_WINDOW} (ASCII digits)",
    }
    assert len(llm.requests) == before  # nothing went upstream


def test_a_window_header_given_twice_is_refused_and_the_sdk_sees_why(
    stack: Stack, llm: StandinLLM
) -> None:
    before = len(llm.requests)
    headers = [
        ("X-Compactor-Conversation", _id("win-twice")),
        ("X-Compactor-Key", KEY_A),
        ("X-Compactor-Context-Window", "100000"),
        ("X-Compactor-Context-Window", "200000"),
    ]
    r = httpx.post(
        f"{stack.base}/proxy/openai/v1/chat/completions",
        json={"model": "gpt-4.1", "messages": openai_history(1)},
        headers=headers,
    )
    assert r.status_code == 422
    assert r.json()["message"] == "X-Compactor-Context-Window: given more than once"
    with (
        openai.OpenAI(
            base_url=f"{stack.base}/proxy/openai/v1",
            api_key=AGENT_KEY,
            max_retries=0,
            default_headers={
                "X-Compactor-Conversation": _id("win-sdk"),
                "X-Compactor-Key": KEY_A,
                "X-Compactor-Context-Window": "200k",
            },
        ) as client,
        pytest.raises(openai.UnprocessableEntityError) as caught,
    ):
        client.chat.completions.create(model="gpt-4.1", messages=openai_history(1))
    assert caught.value.response.json()["message"].startswith("X-Compactor-Context-Window: ")
    assert len(llm.requests) == before
