"""Sliding window: the leading system message(s) plus the most recent non-system messages."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from worker.core.strategies._base import keep_newest_groups
from worker.wire.models import Message


class SlidingWindowConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    window: StrictInt = Field(ge=1)


def _non_system(message: Message) -> int:
    return 0 if message.role == "system" else 1


class SlidingWindow:
    """Keep the leading system message(s) and the last ``window`` non-system messages.

    Unlike :class:`~worker.core.strategies.truncation.Truncation`, system messages do not count
    against the window; one inside the window (mid-history) is kept with it. Groups are kept or
    dropped whole: when the window's edge falls inside a group, that group is dropped, so at
    most ``window`` non-system messages remain, except that the protected tail (the newest
    group and any tool exchange still waiting for results,
    :func:`worker.core.groups.protected_tail_start`) is always kept, even when it alone holds more
    than ``window``.
    """

    def __init__(self, config: SlidingWindowConfig) -> None:
        self.config = config

    def compact(self, messages: list[Message]) -> list[Message]:
        return keep_newest_groups(messages, budget=self.config.window, cost=_non_system)
