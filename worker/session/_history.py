"""The agent's messages with the compactions applied, and how far the session read the stream.

Neither object is thread-safe: the session calls them under its lock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.errors import EventMismatch
from worker.wire import formats
from worker.wire.events import CompactionEvent, CompletedEvent
from worker.wire.history import apply_compaction, range_digest

from ._setup import log


@dataclass
class Applied:
    event: CompletedEvent
    index: int  # where the replacement starts in the history
    size: int  # len(replacement)


@dataclass
class Cursor:
    """Where the session is in the conversation's event stream."""

    # The first revision the service accepted from this session (its line of history):
    # completed events of older revisions belong to an earlier use of the conversation id.
    floor: int | None = None
    held: list[tuple[str, CompactionEvent]] = field(default_factory=list)  # read before the floor
    seen: set[str] = field(default_factory=set)  # event ids applied or restored
    last_event_id: str = "0"  # the stream id of the newest event drained

    def hold(self, entry_id: str, event: CompactionEvent) -> bool:
        """Keep the event, in order, while no submit has been accepted yet; True when kept."""
        if self.floor is None:
            self.held.append((entry_id, event))
            return True
        self.last_event_id = entry_id
        return False

    def release(self) -> list[tuple[str, CompactionEvent]]:
        """The events held until the floor was known (none while it is not)."""
        if self.floor is None:
            return []
        held, self.held = self.held, []
        return held


@dataclass
class History:
    """The messages, bumped ``version`` on every change, and the compactions applied to them."""

    messages: list[dict[str, Any]]
    version: int = 0
    applied: list[Applied] = field(default_factory=list)
    applied_count: int = 0  # compactions applied (an undone one still counts)
    skipped: int = 0  # compactions (or reverts) that no longer fit
    last_skip: str | None = None
    undone: int = 0

    def set(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.version += 1

    def extend(self, messages: list[dict[str, Any]]) -> None:
        self.messages.extend(messages)
        self.version += 1

    def apply(self, event: CompletedEvent, conversation_id: str) -> None:
        """Apply the compaction, or count it as skipped when it no longer fits."""
        before = self.messages
        try:
            compacted = apply_compaction(before, event, conversation_id=conversation_id)
        except EventMismatch as exc:
            self.skip(f"{event.event_id} (revision {event.revision}): {exc}")
            log.info(
                "skipping compaction %s of %s (revision %d): %s; the next snapshot is "
                "compacted instead",
                event.event_id,
                conversation_id,
                event.revision,
                exc,
            )
            return
        index = formats.source_ids(before).index(event.compaction.first_id)
        self.set(compacted)
        self.applied.append(Applied(event, index, len(event.compaction.replacement)))
        self.applied_count += 1
        log.info(
            "applied compaction %s of %s (revision %d): %d -> %d messages",
            event.event_id,
            conversation_id,
            event.revision,
            len(before),
            len(compacted),
        )

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.last_skip = reason

    def newest(self, event_id: str) -> Applied | None:
        """The newest applied compaction, when it is ``event_id``."""
        if self.applied and self.applied[-1].event.event_id == event_id:
            return self.applied[-1]
        return None

    def undo(self, applied: Applied, replaced: list[dict[str, Any]]) -> None:
        """Put ``replaced`` back where the newest compaction's replacement is."""
        if not self.applied or self.applied[-1] is not applied:
            raise EventMismatch("the history changed while undoing")
        i, size = applied.index, applied.size
        if self.messages[i : i + size] != list(applied.event.compaction.replacement):
            raise EventMismatch("the compaction's replacement is no longer in the history")
        self.set([*self.messages[:i], *replaced, *self.messages[i + size :]])
        self.applied.pop()
        self.undone += 1


def replaced_range(applied: Applied, original: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages the compaction replaced, from its transcript (checked by sha256)."""
    compaction = applied.event.compaction
    replaced = original[compaction.start : compaction.end]
    if range_digest(replaced) != compaction.range_sha256:
        raise EventMismatch("the transcript's range does not match the compaction")
    return replaced
