"""Request bodies valid per each provider's documented schema, URL and header conventions,
strict answer parsing, and the API key never leaking anywhere."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from worker.config import LLMConfig
from worker.errors import CompactorError, ConfigError, LLMTransientError
from worker.summarize import SummaryRequest
from worker.summarize.llm import LLMSummarizer
from worker.summarize.providers import Answer, AnthropicMessages, OpenAIChat, Prompt
from worker.testing.llm_schema import anthropic_messages_errors, openai_chat_errors
from worker.testing.standin_llm import Fault, StandinLLM
from worker.wire.models import Message, ToolCall

KEY_ENV = "TEST_LLM_KEY"
PLANTED = "sk-PLANTED-4f9c2d7e1b8a6035-secret"


@pytest.fixture
def llm(sockets: None) -> Iterator[StandinLLM]:
    with StandinLLM(expected_key=PLANTED) as server:
        yield server


def summarizer(
    llm: StandinLLM, provider: str, *, key: str | None = PLANTED, **overrides: Any
) -> LLMSummarizer:
    base = llm.anthropic_base_url if provider == "anthropic" else llm.openai_base_url
    fields: dict[str, Any] = {
        "provider": provider,
        "base_url": base,
        "api_key_env": KEY_ENV,
        "timeout_s": 2.0,  # a healthy answer never takes it, even on a loaded machine
        "deadline_s": 5.0,
        "backoff_base_s": 0.01,
        "max_retries": 1,
    }
    fields.update(overrides)
    environ = {KEY_ENV: key} if key is not None else {}
    return LLMSummarizer(LLMConfig.model_validate(fields), environ=environ)


def request(turns: int = 2, max_input_chars: int = 2000) -> SummaryRequest:
    messages: list[Message] = []
    for i in range(turns):
        call = ToolCall(id=f"c{i}", name="bash", arguments=f'{{"cmd": "pytest tests/t{i}.py"}}')
        messages += [
            Message(id=f"a{i}", role="assistant", tool_calls=(call,), source_index=2 * i),
            Message(
                id=f"t{i}",
                role="tool",
                content="F" * 600,
                tool_call_id=f"c{i}",
                tool_name="bash",
                source_index=2 * i + 1,
            ),
        ]
    return SummaryRequest(
        conversation_id="c",
        revision=1,
        messages=messages,
        max_input_chars=max_input_chars,
        max_output_tokens=150,
        source_tokens=100_000,
    )


SCHEMAS = {"openai": openai_chat_errors, "anthropic": anthropic_messages_errors}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("turns", [1, 12])  # one call, and chunks plus merges
def test_every_request_body_is_valid_for_the_provider(
    llm: StandinLLM, provider: str, turns: int
) -> None:
    with summarizer(llm, provider) as s:
        s.summarize(request(turns))
    assert llm.requests
    for recorded in llm.requests:
        assert SCHEMAS[provider](recorded.body) == []
        assert recorded.auth_valid is True
        assert recorded.body["model"] == "gpt-4.1-mini"
        assert recorded.body["temperature"] == 0.0
    if turns > 1:
        assert len(llm.requests) > 2


def test_the_openai_body_and_headers(llm: StandinLLM) -> None:
    with summarizer(llm, "openai", headers={"X-Team": "infra"}) as s:
        s.summarize(request())
    (sent,) = llm.requests
    assert sent.path == "/v1/chat/completions"
    assert [m["role"] for m in sent.body["messages"]] == ["system", "user"]
    assert sent.body["max_tokens"] == 150 and sent.body["stream"] is False
    assert sent.headers["authorization"] == "[redacted]" and sent.headers["x-team"] == "infra"
    assert sent.headers["content-type"] == "application/json"


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_the_anthropic_body_headers_and_url_conventions(llm: StandinLLM, suffix: str) -> None:
    with summarizer(llm, "anthropic", base_url=llm.url + suffix, temperature=None) as s:
        s.summarize(request())
    (sent,) = llm.requests
    assert sent.path == "/v1/messages"
    assert sent.body["messages"] == [{"role": "user", "content": sent.user_text}]
    assert isinstance(sent.body["system"], str) and "continuity summaries" in sent.body["system"]
    assert "temperature" not in sent.body
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["x-api-key"] == "[redacted]" and "authorization" not in sent.headers


def test_no_key_sends_no_credential(llm: StandinLLM) -> None:
    with summarizer(llm, "openai", key=None) as s, pytest.raises(CompactorError):
        s.summarize(request())  # this stand-in expects a key: 401
    assert llm.requests[0].auth_present is False


def test_the_schema_checks_can_fail() -> None:
    assert openai_chat_errors({"model": "m", "messages": []})
    assert openai_chat_errors(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}
    )
    assert anthropic_messages_errors({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert anthropic_messages_errors(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}
    )
    assert anthropic_messages_errors(
        {
            "model": "m",
            "max_tokens": 5,
            "temperature": 1.5,
            "messages": [{"role": "user", "content": "x"}],
        }
    )


def test_the_stand_in_rejects_an_invalid_body_like_a_provider(llm: StandinLLM) -> None:
    import httpx

    with httpx.Client() as client:
        answer = client.post(
            llm.url + "/v1/messages",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            headers={"x-api-key": PLANTED, "anthropic-version": "2023-06-01"},
        )
    assert answer.status_code == 400
    assert "max_tokens is required" in answer.json()["error"]["message"]


def test_anthropic_temperature_above_one_is_a_configuration_error() -> None:
    cfg = LLMConfig(provider="anthropic", base_url="http://127.0.0.1:9", temperature=1.5)
    with pytest.raises(ConfigError):
        LLMSummarizer(cfg)


PROMPT = Prompt(system="s", user="u", max_tokens=10)


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [],
        {},
        {"choices": None},
        {"choices": [{}]},
        {"choices": [{"message": {"content": 3}}]},
        {"choices": [{"message": {"content": "   "}}]},
        {"choices": [{"message": {"content": None, "refusal": "no"}}]},
    ],
)
def test_openai_answers_are_parsed_strictly(payload: Any) -> None:
    with pytest.raises(LLMTransientError) as caught:
        OpenAIChat(LLMConfig()).parse(payload)
    assert caught.value.code == "llm_malformed"


@pytest.mark.parametrize(
    "payload",
    [
        None,
        {"content": [{"type": "text", "text": "x"}]},  # no type: message
        {"type": "message", "content": []},
        {"type": "message", "content": [{"type": "text", "text": None}]},
        {"type": "message", "content": [{"type": "thinking", "thinking": "hmm"}]},
        {"type": "message", "content": [{"type": "text", "text": "\n"}]},
    ],
)
def test_anthropic_answers_are_parsed_strictly(payload: Any) -> None:
    with pytest.raises(LLMTransientError) as caught:
        AnthropicMessages(LLMConfig(provider="anthropic")).parse(payload)
    assert caught.value.code == "llm_malformed"


def test_good_answers_parse() -> None:
    answer = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
    assert OpenAIChat(LLMConfig()).parse(answer) == Answer("ok")
    blocks = [
        {"type": "thinking", "thinking": "x"},
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]
    parsed = AnthropicMessages(LLMConfig()).parse({"type": "message", "content": blocks})
    assert parsed == Answer("ab")


def test_the_stop_reason_and_usage_are_read() -> None:
    answer = {
        "choices": [{"message": {"content": "ok"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 400, "total_tokens": 1600},
    }
    assert OpenAIChat(LLMConfig()).parse(answer) == Answer("ok", True, 1200, 400)
    message = {
        "type": "message",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 900, "output_tokens": 300},
    }
    assert AnthropicMessages(LLMConfig()).parse(message) == Answer("ok", True, 900, 300)
    odd = {
        "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": "many", "completion_tokens": True},
    }
    assert OpenAIChat(LLMConfig()).parse(odd) == Answer("ok", False, None, None)  # tolerant


def test_the_api_key_never_leaks(llm: StandinLLM, caplog: pytest.LogCaptureFixture) -> None:
    """Plant a key, drive success and every failure path, and grep everything we produce."""
    caplog.set_level(logging.DEBUG)  # httpx and httpcore log at DEBUG too
    seen: list[str] = []
    leaky = StandinLLM(expected_key="sk-another-key-entirely", echo_key_in_errors=True)
    with leaky, summarizer(leaky, "openai") as s:
        seen += _failure_texts(s, "llm_auth_failed")  # 401 whose body quotes our key
    with summarizer(llm, "anthropic") as s:
        agent_printed_it = Message(
            id="u", role="user", content=f"my key is {PLANTED} ok", source_index=0
        )
        req = request().model_copy(update={"messages": [agent_printed_it]})
        llm.enqueue(Fault(status=503), Fault(body=f'{{"leak": "{PLANTED}"'.encode()))
        seen += _failure_texts(s, "llm_malformed")
        summary = s.summarize(req)
        seen += [summary.model_dump_json(), repr(summary)]
        llm.default_fault = Fault(hang=True)
        seen += _failure_texts(s, "llm_timeout")
        seen.append(repr(s))
    with summarizer(llm, "openai", base_url="http://127.0.0.1:9/v1") as s:
        seen += _failure_texts(s, "llm_connection_error")
    seen += [record.getMessage() for record in caplog.records]
    seen += [f"{r.headers!r} {r.body!r}" for r in llm.requests + leaky.requests]  # what we sent
    assert caplog.records, "nothing was logged: the log check would prove nothing"
    for text in seen:
        assert PLANTED not in text
        assert PLANTED[3:19] not in text  # not even a fragment
    # The agent's own transcript had it: the provider got it scrubbed, too.
    assert any("my key is [redacted] ok" in r.user_text for r in llm.requests)


def _failure_texts(s: LLMSummarizer, code: str) -> list[str]:
    with pytest.raises(CompactorError) as caught:
        s.summarize(request())
    error = caught.value
    assert error.code == code
    return [
        str(error),
        repr(error),
        str(error.to_dict()),
        "".join(traceback.format_exception(error)),
    ]
