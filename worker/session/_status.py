"""``session.status``: what the background threads have done, as one frozen copy."""

from __future__ import annotations

from dataclasses import dataclass

from ._follower import FollowerState
from ._history import Cursor, History
from ._sender import SenderState


@dataclass(frozen=True)
class SessionStatus:
    """What the background threads have done, as of now (a copy; cheap to take)."""

    conversation_id: str
    revision: int  # newest revision given to a snapshot (or learned from the service)
    last_submitted_revision: int | None  # newest revision the service accepted from us
    pending_submits: int  # turns (extend calls) not yet in an accepted snapshot
    retrying: bool  # the sender is backing off after a failed submit
    submit_failures: int  # failed submit attempts so far
    last_error: str | None  # the newest submit error, cleared by the next success
    snapshots_replaced: int  # unsent snapshots replaced by a newer one (only the newest is sent)
    events_received: int  # events the follower has read
    last_outcome_revision: int | None  # newest revision with an outcome event read
    events_applied: int  # compactions applied to the history
    compactions_skipped: int  # compactions that no longer described the history
    last_skip_reason: str | None
    compactions_undone: int
    follower_error: str | None  # the follower's newest read error, cleared when it reads again
    last_event_id: str  # the stream id of the newest event drained into the history
    compactions_failed: int  # compaction.failed events read (the next snapshot tries again)
    snapshots_rejected: int  # compaction.rejected events read: the history is not valid input
    last_rejection: str | None  # the newest rejection's reason ("FIELD: REASON")


def status_of(
    conversation_id: str,
    sender: SenderState,
    follower: FollowerState,
    history: History,
    cursor: Cursor,
) -> SessionStatus:
    return SessionStatus(
        conversation_id=conversation_id,
        revision=sender.revision,
        last_submitted_revision=sender.last_submitted,
        pending_submits=sender.pending,
        retrying=sender.retrying,
        submit_failures=sender.failures,
        last_error=sender.last_error,
        snapshots_replaced=sender.replaced,
        events_received=follower.received,
        last_outcome_revision=follower.last_outcome,
        events_applied=history.applied_count,
        compactions_skipped=history.skipped,
        last_skip_reason=history.last_skip,
        compactions_undone=history.undone,
        follower_error=follower.error,
        last_event_id=cursor.last_event_id,
        compactions_failed=follower.failed,
        snapshots_rejected=follower.rejected,
        last_rejection=follower.last_rejection,
    )
