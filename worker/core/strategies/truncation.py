"""Truncation: keep the most recent messages, up to a count."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from worker.core.strategies._base import keep_newest_groups
from worker.wire.models import Message


class TruncationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_messages: StrictInt = Field(ge=1)


class Truncation:
    """Keep the most recent ``max_messages`` messages, leading system message(s) included in
    the count and always kept.

    Groups are kept or dropped whole, newest first. When the bound falls inside a group, that
    group and everything older is dropped, so the result never exceeds ``max_messages``, except
    that the leading systems and the protected tail (the newest group and any tool exchange
    still waiting for results, :func:`worker.core.groups.protected_tail_start`) are always kept:
    if they alone exceed the bound, the result is exactly them.
    """

    def __init__(self, config: TruncationConfig) -> None:
        self.config = config

    def compact(self, messages: list[Message]) -> list[Message]:
        return keep_newest_groups(messages, budget=self.config.max_messages, cost=lambda _: 1)
