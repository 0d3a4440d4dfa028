"""What the sender has done: revisions given, turns submitted, failures. Not thread-safe: the
session calls it under its lock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from worker.errors import CompactorError


class Job(NamedTuple):
    """A snapshot the sender is submitting: the newest turn in it, its revision, its messages."""

    turn: int
    revision: int
    messages: tuple[Any, ...]


@dataclass
class SenderState:
    revision: int = -1  # newest revision given to a snapshot (or learned from the service)
    turns: int = 0  # extend calls (and other changes) that need a snapshot
    submitted_turn: int = 0  # the newest turn in an accepted (or refused) snapshot
    last_submitted: int | None = None  # newest revision the service accepted
    retrying: bool = False
    failures: int = 0  # failed submit attempts so far
    last_error: str | None = None
    replaced: int = 0  # unsent snapshots replaced by a newer one

    @property
    def pending(self) -> int:
        return self.turns - self.submitted_turn

    def changed(self) -> int:
        """A turn that needs a snapshot; its number."""
        self.turns += 1
        return self.turns

    def next_revision(self) -> int:
        self.revision += 1
        return self.revision

    def learned(self, revision: int) -> None:
        """A revision the service knows (an event's, a superseding one): the next goes after."""
        self.revision = max(self.revision, revision)

    def accepted(self, turn: int, revision: int) -> None:
        self.last_submitted = revision
        self.submitted_turn = max(self.submitted_turn, turn)
        self.retrying = False
        self.last_error = None

    def failed(self, exc: CompactorError) -> None:
        self.retrying = True
        self.failures += 1
        self.last_error = f"{exc.code}: {exc.message}"

    def refused(self, turn: int, exc: CompactorError) -> None:
        self.last_error = f"{exc.code}: {exc.message}"
        self.submitted_turn = max(self.submitted_turn, turn)
        self.retrying = False

    def settled(self, last_outcome: int | None) -> bool:
        """Every turn submitted (or refused), and the newest accepted one's outcome read."""
        submitted = self.last_submitted
        return self.pending == 0 and (
            submitted is None or (last_outcome is not None and last_outcome >= submitted)
        )
