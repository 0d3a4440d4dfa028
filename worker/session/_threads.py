"""What the two background loops have done, and how long either waits before trying again:

- :class:`SenderState` (and the :class:`Job` it submits): revisions given, turns submitted,
  failures;
- :class:`FollowerState`: events, outcomes, failures and rejections, read errors;
- :class:`Backoff` and :data:`RETRY`: the one retry schedule of all four loops (the sender and
  the follower, threads and tasks alike); pure (no clock, no random of its own).

The two states are not thread-safe: the session calls them under its lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from worker.errors import CompactorError
from worker.wire.events import OUTCOME_TYPES, CompactionEvent, FailedEvent, RejectedEvent

from ._setup import log

_MAX_DOUBLINGS = 64  # far past any cap; keeps 2**n a float that cannot overflow


def _no_jitter() -> float:
    return 0.0


@dataclass(frozen=True)
class Backoff:
    """Delays that start at ``base_s``, double with each attempt and stop at ``cap_s``.

    ``jitter`` is the largest share of a delay taken off at random (0: none, 1: anything down
    to zero) and ``random`` the source of that chance, a callable answering in [0, 1): passed
    in, so that the delays of a given source are known in advance."""

    base_s: float
    cap_s: float
    jitter: float = 0.0
    random: Callable[[], float] = _no_jitter

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(
                f"a backoff needs 0 < base_s <= cap_s, not {self.base_s}, {self.cap_s}"
            )
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"a backoff's jitter is a share in [0, 1], not {self.jitter}")

    def delay(self, attempt: int) -> float:
        """The wait before trying again after ``attempt`` failures in a row (1: the first)."""
        if attempt < 1:
            raise ValueError(f"a backoff counts attempts from 1, not {attempt}")
        doubled = self.base_s * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS)
        return min(doubled, self.cap_s) * (1.0 - self.jitter * self.random())


BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0
RETRY = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)  # no jitter: the schedule docs/session.md gives


# --- the sender -----------------------------------------------------------------------------------


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


# --- the follower ---------------------------------------------------------------------------------


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
