"""The two wire formats we speak to an LLM: OpenAI-compatible Chat Completions, Anthropic Messages.

A provider only builds a request (URL, headers, JSON body) and parses an answer; it never sends
anything. Sending, retrying and converting transport errors live in :mod:`.resilience`, so each
concern has one home.

URL conventions, following each vendor's own SDK:

- ``openai``: ``base_url`` already names the API version (``https://api.openai.com/v1``,
  ``http://localhost:11434/v1`` for Ollama, ``http://host:8000/v1`` for vLLM), and we append
  ``/chat/completions``.
- ``anthropic``: the SDK's ``base_url`` is the bare host (``https://api.anthropic.com``) and the
  path is ``/v1/messages``. A ``base_url`` that already ends in ``/v1`` (gateways often show it
  that way) gets only ``/messages``, so both spellings work.

The output bound goes in ``max_tokens`` for Anthropic (required there). For OpenAI-compatible
servers ``llm.max_tokens_field`` picks ``max_tokens`` (default: understood by every compatible
server) or ``max_completion_tokens`` (required by OpenAI's reasoning models).

Answers are parsed strictly: a body that is not JSON, has no choice or content block, or whose
text is empty is a failure with code ``llm_malformed`` — an empty summary would silently erase
the agent's context, which is worse than no compaction. What the server says about the answer
is read tolerantly: a ``finish_reason`` of ``length`` (``stop_reason`` ``max_tokens``) marks it
cut by the output limit, and ``usage`` gives the tokens as the server counted them (absent or
odd values read as unknown).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from worker.config import LLMConfig
from worker.errors import LLMTransientError

USER_AGENT = "compaction-worker/0.1"


@dataclass(frozen=True)
class Prompt:
    """One request to the model, independent of the wire format."""

    system: str
    user: str
    max_tokens: int


@dataclass(frozen=True)
class HttpCall:
    """What to POST. ``headers`` may hold the API key: never log or repr them."""

    url: str
    headers: dict[str, str]
    body: dict[str, Any]

    def __repr__(self) -> str:  # the default repr would print the key
        return f"HttpCall(url={self.url!r}, headers=<{len(self.headers)} hidden>)"


@dataclass(frozen=True)
class Answer:
    """The model's text and what the server said about it."""

    text: str
    cut: bool = False  # the server stopped it at max_tokens: it may end mid-sentence
    input_tokens: int | None = None  # the server's own counts (its tokenizer, not ours)
    output_tokens: int | None = None


class Provider(Protocol):
    name: str

    def build(self, prompt: Prompt, api_key: str | None) -> HttpCall: ...

    def parse(self, payload: Any) -> Answer: ...


def malformed(reason: str) -> LLMTransientError:
    return LLMTransientError(f"the LLM answer is unusable: {reason}", code="llm_malformed")


class OpenAIChat:
    """``POST {base_url}/chat/completions`` with ``Authorization: Bearer``."""

    name = "openai"

    def __init__(self, config: LLMConfig) -> None:
        self._config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"

    def build(self, prompt: Prompt, api_key: str | None) -> HttpCall:
        cfg = self._config
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": [
                {"role": "system", "content": prompt.system},
                {"role": "user", "content": prompt.user},
            ],
            cfg.max_tokens_field: prompt.max_tokens,
            "stream": False,
        }
        if cfg.temperature is not None:
            body["temperature"] = cfg.temperature
        headers = _base_headers()
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        headers.update(cfg.headers)
        return HttpCall(self.url, headers, body)

    def parse(self, payload: Any) -> Answer:
        choices = _field(payload, "choices", list)
        if not choices:
            raise malformed("no choices")
        message = _field(choices[0], "message", dict)
        content = message.get("content")
        if not isinstance(content, str):
            # A refusal comes back as content null plus a ``refusal`` string.
            raise malformed("refused" if message.get("refusal") else "message has no text")
        usage = payload.get("usage")
        return Answer(
            _non_empty(content),
            cut=choices[0].get("finish_reason") == "length",
            input_tokens=_count(usage, "prompt_tokens"),
            output_tokens=_count(usage, "completion_tokens"),
        )


class AnthropicMessages:
    """``POST {base_url}/v1/messages`` with ``x-api-key`` and ``anthropic-version``."""

    name = "anthropic"

    def __init__(self, config: LLMConfig) -> None:
        self._config = config
        base = config.base_url.rstrip("/")
        self.url = base + ("/messages" if base.endswith("/v1") else "/v1/messages")

    def build(self, prompt: Prompt, api_key: str | None) -> HttpCall:
        cfg = self._config
        body: dict[str, Any] = {
            "model": cfg.model,
            "max_tokens": prompt.max_tokens,
            "system": prompt.system,
            "messages": [{"role": "user", "content": prompt.user}],
        }
        if cfg.temperature is not None:
            body["temperature"] = cfg.temperature
        headers = _base_headers()
        headers["anthropic-version"] = cfg.anthropic_version
        if api_key:
            headers["x-api-key"] = api_key
        headers.update(cfg.headers)
        return HttpCall(self.url, headers, body)

    def parse(self, payload: Any) -> Answer:
        if not isinstance(payload, dict) or payload.get("type") != "message":
            raise malformed("not a message object")
        blocks = _field(payload, "content", list)
        texts = [b.get("text") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise malformed("no text content block")
        usage = payload.get("usage")
        return Answer(
            _non_empty("".join(t for t in texts if isinstance(t, str))),
            cut=payload.get("stop_reason") == "max_tokens",
            input_tokens=_count(usage, "input_tokens"),
            output_tokens=_count(usage, "output_tokens"),
        )


def provider_for(config: LLMConfig) -> Provider:
    if config.provider == "anthropic":
        return AnthropicMessages(config)
    return OpenAIChat(config)


def error_detail(payload: Any) -> str:
    """The provider's machine-readable error type, if any, made safe to show.

    Only the type/code identifier is kept, never the free-text message: OpenAI's 401 message
    quotes part of the key it was given.
    """
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return ""
    for name in ("type", "code"):
        value = error.get(name)
        if isinstance(value, str) and value:
            return re.sub(r"[^A-Za-z0-9_.-]", "", value)[:64]
    return ""


def _base_headers() -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": USER_AGENT,
    }


def _field(obj: Any, name: str, kind: type) -> Any:
    value = obj.get(name) if isinstance(obj, dict) else None
    if not isinstance(value, kind):
        raise malformed(f"missing or invalid {name!r}")
    return value


def _count(usage: Any, name: str) -> int | None:
    value = usage.get(name) if isinstance(usage, dict) else None
    # bool is an int to Python, not a count to anyone
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _non_empty(text: str) -> str:
    if not text.strip():
        raise malformed("empty answer")
    return text
