"""Selective tool result: blank out all but the most recent tool results."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from worker.core.groups import group_messages, protected_tail_start
from worker.core.strategies._base import OMITTED_TOOL_RESULT
from worker.wire.models import Message


class SelectiveToolResultConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keep_last: StrictInt = Field(ge=0)


class SelectiveToolResult:
    """Replace the content of every tool result but the newest ``keep_last`` with
    :data:`~worker.core.strategies.OMITTED_TOOL_RESULT`; no message is dropped or reordered.

    Results are counted one by one (one ``tool`` message each, whatever the wire format
    grouped together), so the bound never falls inside a group in a way that matters: the
    calls and results all stay, only older result bodies change. Two exceptions keep more
    than ``keep_last`` intact: results in the protected tail (the newest group and any tool
    exchange still waiting for results, :func:`worker.core.groups.protected_tail_start`), which the
    model is about to act on, and results no longer than the marker, which replacing would
    only make longer. Untouched
    messages are returned as the same objects.
    """

    def __init__(self, config: SelectiveToolResultConfig) -> None:
        self.config = config

    def compact(self, messages: list[Message]) -> list[Message]:
        groups = group_messages(messages)
        tail = groups[protected_tail_start(groups)].start if groups else 0
        results = [i for i, m in enumerate(messages) if m.role == "tool"]
        keep = len(results) - self.config.keep_last
        stale = {i for i in results[: max(keep, 0)] if i < tail}
        return [_omitted(m) if i in stale else m for i, m in enumerate(messages)]


def _omitted(message: Message) -> Message:
    if len(message.content) <= len(OMITTED_TOOL_RESULT):
        return message
    return message.model_copy(update={"content": OMITTED_TOOL_RESULT})
