"""The reply the proxy adds to the history it submits: every tool-call type of Chat
Completions (a custom tool's too), built from the official SDK's own types. (The SDK streams
only function calls: ``ChatCompletionChunk`` has no custom tool-call delta.)"""

from __future__ import annotations

from openai.types.chat import ChatCompletion

from worker.api.proxy import reply_message
from worker.wire import formats


def completion() -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-5",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "refusal": None,
                "tool_calls": [
                    {"id": "call_f", "type": "function",
                     "function": {"name": "grep", "arguments": '{"p": "x"}'}},
                    {"id": "call_c", "type": "custom",
                     "custom": {"name": "apply_patch", "input": "*** Begin Patch"}},
                ]}}],
        }
    )  # fmt: skip


def test_a_json_reply_keeps_function_and_custom_calls() -> None:
    raw = completion().model_dump_json().encode()
    message = reply_message("openai", raw, "application/json")
    assert message is not None
    calls = message["tool_calls"]
    assert calls[0]["function"] == {"name": "grep", "arguments": '{"p": "x"}'}
    assert calls[1] == {"id": "call_c", "type": "custom",
                        "custom": {"name": "apply_patch", "input": "*** Begin Patch"}}  # fmt: skip
    history = [{"role": "user", "content": "patch it"}, message]
    history += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    assert len(formats.to_messages("openai", history)) == 4  # a valid history, paired
