"""What the follower has read: events, outcomes, failures and rejections, read errors. Not
thread-safe: the session calls it under its lock."""

from __future__ import annotations

from dataclasses import dataclass

from worker.errors import CompactorError
from worker.wire.events import OUTCOME_TYPES, CompactionEvent, FailedEvent, RejectedEvent

from ._setup import log

INBOX_SIZE = 10_000  # events read but not yet drained; the follower waits when it is full


@dataclass
class FollowerState:
    received: int = 0
    last_outcome: int | None = None  # newest revision with an outcome event read
    error: str | None = None  # the newest read error, cleared when it reads again
    failed: int = 0  # compaction.failed events read
    rejected: int = 0  # compaction.rejected events read
    last_rejection: str | None = None

    def read(self, event: CompactionEvent) -> bool:
        """Count an event read; True when it is an outcome (a waiter may be settled)."""
        self.received += 1
        self.error = None
        if isinstance(event, FailedEvent):
            self.failed += 1
        elif isinstance(event, RejectedEvent):
            self.rejected += 1
            self.last_rejection = event.reason
            log.warning(
                "%s revision %d was rejected: %s",
                event.conversation_id,
                event.revision,
                event.reason,
            )
        if event.type not in OUTCOME_TYPES:
            return False
        newest = self.last_outcome
        self.last_outcome = event.revision if newest is None else max(newest, event.revision)
        return True

    def read_failed(self, exc: CompactorError) -> None:
        self.error = f"{exc.code}: {exc.message}"
