"""Small schema checks for the request bodies each provider documents (what we send).

Not a full JSON Schema: the required fields, their types and ranges, and no unknown top-level
keys. The stand-in server answers 400 to a body that fails them, as the real providers would,
and tests assert every recorded body passes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["anthropic_messages_errors", "openai_chat_errors"]

_OPENAI_KEYS = {
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stream",
    "stop",
    "n",
    "seed",
    "user",
}
_OPENAI_ROLES = {"system", "developer", "user", "assistant", "tool"}
_ANTHROPIC_KEYS = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "stream",
    "metadata",
}


def openai_chat_errors(body: Any) -> list[str]:
    """What is wrong with ``body`` as an OpenAI Chat Completions request ([] when valid)."""
    if not isinstance(body, dict):
        return ["body must be a JSON object"]
    errors = _unknown(body, _OPENAI_KEYS)
    errors += _model(body)
    bounds = [k for k in ("max_tokens", "max_completion_tokens") if k in body]
    if len(bounds) > 1:
        errors.append("send either max_tokens or max_completion_tokens, not both")
    errors += [e for k in bounds for e in _positive_int(body, k)]
    errors += _number(body, "temperature", 0.0, 2.0)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*errors, "messages must be a non-empty array"]
    for i, message in enumerate(messages):
        errors += _openai_message(i, message)
    return errors


def anthropic_messages_errors(body: Any) -> list[str]:
    """What is wrong with ``body`` as an Anthropic Messages request ([] when valid)."""
    if not isinstance(body, dict):
        return ["body must be a JSON object"]
    errors = _unknown(body, _ANTHROPIC_KEYS)
    errors += _model(body)
    if "max_tokens" not in body:
        errors.append("max_tokens is required")
    errors += _positive_int(body, "max_tokens")
    errors += _number(body, "temperature", 0.0, 1.0)
    if "system" in body and not isinstance(body["system"], str | list):
        errors.append("system must be a string or an array of text blocks")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*errors, "messages must be a non-empty array"]
    if isinstance(messages[0], dict) and messages[0].get("role") != "user":
        errors.append("the first message must have role user")
    for i, message in enumerate(messages):
        errors += _anthropic_message(i, message)
    return errors


def _unknown(body: dict[str, Any], known: set[str]) -> list[str]:
    return [f"unknown field {k!r}" for k in sorted(set(body) - known)]


def _model(body: dict[str, Any]) -> list[str]:
    model = body.get("model")
    return [] if isinstance(model, str) and model else ["model must be a non-empty string"]


def _positive_int(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key)
    if key in body and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        return [f"{key} must be a positive integer"]
    return []


def _number(body: dict[str, Any], key: str, low: float, high: float) -> list[str]:
    if key not in body:
        return []
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        return [f"{key} must be a number in [{low}, {high}]"]
    return []


def _openai_message(i: int, message: Any) -> list[str]:
    if not isinstance(message, dict):
        return [f"messages[{i}] must be an object"]
    errors = []
    if message.get("role") not in _OPENAI_ROLES:
        errors.append(f"messages[{i}].role is invalid")
    if not isinstance(message.get("content"), str | list):
        errors.append(f"messages[{i}].content must be a string or an array of parts")
    return errors


def _anthropic_message(i: int, message: Any) -> list[str]:
    if not isinstance(message, dict):
        return [f"messages[{i}] must be an object"]
    errors = []
    if message.get("role") not in ("user", "assistant"):
        errors.append(f"messages[{i}].role must be user or assistant (system is top-level)")
    content = message.get("content")
    if not isinstance(content, str | list) or not content:
        errors.append(f"messages[{i}].content must be a non-empty string or array of blocks")
    return errors
