"""``_Core``: the parts a session is made of, and every step that does not wait on a thread or
a task; ``_LoopSteps``: the steps the sender and follower loops take between their waits; and
``session.status``, what the background threads have done, as one frozen copy.

One lock guards the parts; each part owns one job's state:

- :class:`Setup`: what the session is (fixed);
- :class:`History` and :class:`Cursor`: the messages with compactions applied, and where the
  session is in the event stream;
- :class:`Projection`: the cached projected request;
- :class:`Transcripts`: transcripts read for undo and recall;
- :class:`SenderState` and :class:`FollowerState`: what the background loops have done.

The loop steps take a turn, record what a submit or a read did, log it, and say how long to
wait before trying again. Both sessions' loops, threads and tasks alike, call them and wait by
the one :data:`RETRY` schedule.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.client import Client, SubmitResult
from worker.errors import CompactorError, EventMismatch, PermanentError
from worker.wire import formats
from worker.wire.events import CompactionEvent, CompletedEvent, RevertedEvent

from ._history import Applied, Cursor, History, dump_state, load_state, replaced_range
from ._projection import Projection, own, pinned_key
from ._setup import Setup, SetupView, log
from ._threads import RETRY, FollowerState, Job, SenderState
from ._tools import RECALL_USAGE, Transcripts, recall_id, recall_miss


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


Mail = tuple[int, tuple[Any, ...]]  # (the turn, the messages to snapshot)


# --- the parts and the steps that do not wait -----------------------------------------------------


class _Core(SetupView):
    """The state a session keeps, and every step that does not wait on a thread or a task."""

    def __init__(
        self,
        conversation_id: str,
        *,
        client: Client,
        messages: Iterable[dict[str, Any]] = (),
        **options: Any,
    ) -> None:
        self.setup = Setup.of(conversation_id, client=client, **options)
        self._lock = threading.RLock()
        # Notified when a submit is recorded or an outcome read (``wait_settled``).
        self._status_changed = threading.Condition(self._lock)
        self._history = History([own(m) for m in messages])
        self._cursor = Cursor()
        self._view = Projection(self.setup)
        self._transcripts = Transcripts(client)
        self._sender = SenderState()
        self._follower = FollowerState()
        self._pins: set[str] = set()  # what the pinned messages say (pinned_key), not their ids

    # --- reading ------------------------------------------------------------------------------

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The current history (compactions applied), in the wire format. Treat the messages as
        read-only: the session shares them with the snapshots it sends."""
        with self._lock:
            return list(self._history.messages)

    @property
    def compactions(self) -> list[CompletedEvent]:
        """The compactions applied so far, oldest first (an undone one is removed)."""
        return self._applied_events()

    @property
    def status(self) -> SessionStatus:
        with self._lock:
            return status_of(
                self.conversation_id, self._sender, self._follower, self._history, self._cursor
            )

    def _wait_settled(self, timeout_s: float) -> bool:
        """Until every turn is submitted (or refused) and the outcome event of the newest
        accepted snapshot has been read; False when ``timeout_s`` passes first."""
        with self._status_changed:
            return self._status_changed.wait_for(
                lambda: self._sender.settled(self._follower.last_outcome), timeout=timeout_s
            )

    def _project(self) -> list[dict[str, Any]]:
        """The projected request (see :meth:`Projection.compute`), projected off the lock."""
        with self._lock:
            version = self._history.version
            cached = self._view.cached(version)
            if cached is not None:
                return cached
            history, base = list(self._history.messages), self._view.base
        request = self._view.compute(history, base)
        with self._lock:
            self._view.store(version, history, request)
        return list(request)

    # --- changing the history -----------------------------------------------------------------

    def _append(self, new_messages: Iterable[dict[str, Any]], pin: bool = False) -> Mail:
        """Append copies of the messages (pinned too, with ``pin``); the (turn, messages) to
        snapshot."""
        copies = [own(m) for m in new_messages]
        with self._lock:
            self._history.extend(copies)
            if pin:
                self._pins.update(pinned_key(m) for m in copies)
            return self._changed()

    def _pin(self, messages: tuple[str | dict[str, Any], ...]) -> None:
        """Pin messages given by id (own or derived, in the current history) or as they are;
        KeyError for an id no message of the history has."""
        with self._lock:
            current = self._history.messages
            by_id = dict(zip(formats.source_ids(current), current, strict=True))
            for m in messages:
                if isinstance(m, str):
                    if m not in by_id:
                        raise KeyError(f"no message of the history has the id {m!r}")
                    m = by_id[m]
                self._pins.add(pinned_key(m))

    def _pinned_ids(self, messages: Iterable[dict[str, Any]]) -> list[str]:
        """The ids the pinned messages have among ``messages`` (a derived id changes as
        compactions move a message; what it says does not)."""
        with self._lock:
            pins = set(self._pins)
        if not pins:
            return []
        listed = list(messages)
        ids = formats.source_ids(listed)
        return [mid for mid, m in zip(ids, listed, strict=True) if pinned_key(m) in pins]

    def _replace(self, messages: Iterable[dict[str, Any]]) -> Mail:
        copies = [own(m) for m in messages]
        with self._lock:
            self._history.set(copies)
            return self._changed()

    def _changed(self) -> Mail:
        with self._lock:
            return self._sender.changed(), tuple(self._history.messages)

    def _drain_one(self, entry_id: str, event: CompactionEvent) -> None:
        """Apply one event read from the stream (called in stream order)."""
        if isinstance(event, RevertedEvent):
            self._drain_revert(entry_id, event)
            return
        with self._lock:
            if self._cursor.hold(entry_id, event):  # until the first submit is accepted
                return
            self._sender.learned(event.revision)
            if not isinstance(event, CompletedEvent) or event.event_id in self._cursor.seen:
                return
            self._cursor.seen.add(event.event_id)
            if not self._predates(event):
                self._history.apply(event, self.conversation_id)

    def _predates(self, event: CompletedEvent) -> bool:
        floor = self._cursor.floor
        if floor is None or event.revision >= floor:
            return False
        log.info(
            "ignoring compaction %s of %s: revision %d predates this session (%d)",
            event.event_id,
            self.conversation_id,
            event.revision,
            floor,
        )
        return True

    def _drain_revert(self, entry_id: str, event: RevertedEvent) -> None:
        """A compaction restored on the service (``compaction.reverted``): undone here too
        when it is the newest applied, as :meth:`undo` does (its transcript read, unless
        cached); one not applied yet is never applied now."""
        with self._lock:
            if self._cursor.hold(entry_id, event):
                return
            self._cursor.seen.add(event.reverted_event_id)
            applied = self._revert_plan(event)
        if applied is None:
            return
        try:
            original, _ = self._transcripts.of(applied.event)
            self._undo_apply(applied, original)
        except CompactorError as exc:
            with self._lock:
                self._history.skip(f"revert of {event.reverted_event_id}: {exc.message}")
            log.warning(
                "cannot undo compaction %s of %s, restored on the service: %s",
                event.reverted_event_id,
                self.conversation_id,
                exc.message,
            )

    def _revert_plan(self, event: RevertedEvent) -> Applied | None:
        """The applied compaction ``event`` restores, when it is the newest applied."""
        with self._lock:
            return self._history.newest(event.reverted_event_id)

    def _release_held(self) -> list[tuple[str, CompactionEvent]]:
        with self._lock:
            return self._cursor.release()

    # --- undo and recall ----------------------------------------------------------------------

    def _undo_plan(self) -> Applied:
        with self._lock:
            if not self._history.applied:
                raise EventMismatch("no compaction to undo")
            return self._history.applied[-1]

    def _undo_apply(self, applied: Applied, original: list[dict[str, Any]]) -> None:
        replaced = replaced_range(applied, original)
        with self._lock:
            self._history.undo(applied, replaced)
        log.info("undid compaction %s of %s", applied.event.event_id, self.conversation_id)

    def _applied_events(self) -> list[CompletedEvent]:
        with self._lock:
            return [a.event for a in self._history.applied]

    def _recall(self, message_id: str) -> dict[str, Any]:
        """The original, from the newest applied compaction whose transcript holds it. A
        KeyError says why not: never replaced, or replaced by a compaction whose transcript is
        gone (retention removed it: ``expired``)."""
        gone: list[CompletedEvent] = []
        for event in reversed(self._applied_events()):
            try:
                original, index = self._transcripts.of(event)
            except CompactorError:
                gone.append(event)
                continue
            if message_id in index:
                return copy.deepcopy(original[index[message_id]])
        raise KeyError(recall_miss(message_id, gone))

    def _recallable(self) -> list[str]:
        """The ids the kept transcripts hold (those retention removed are left out)."""
        ids: list[str] = []
        for event in self._applied_events():
            with contextlib.suppress(CompactorError):
                ids.extend(self._transcripts.of(event)[1])
        return ids

    def _recall_text(self, arguments: str | Mapping[str, Any]) -> str:
        """The recall tool's answer to a call's arguments: the message, or why not, in words
        for the model (never a path, a store or an error of ours)."""
        message_id = recall_id(arguments)
        if message_id is None:
            return RECALL_USAGE
        try:
            return json.dumps(self._recall(message_id), ensure_ascii=False)
        except KeyError as exc:
            why = str(exc.args[0]) if exc.args else f"no compacted message has id {message_id!r}"
            if why.startswith("expired"):
                return why
            some = self._recallable()[:50]
            return f"error: {why}; some that can be recalled: {some}"

    # --- state --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """A JSON-able dict to carry the session into another process (``from_state``)."""
        with self._lock:
            return dump_state(self.setup, self._history, self._sender, self._cursor, self._pins)

    def _restore_state(self, state: Mapping[str, Any]) -> bool:
        """Take over the counters of a saved session; True when it had unsent turns."""
        with self._lock:
            return load_state(state, self._history, self._sender, self._cursor, self._pins)


# --- the loops' steps between waits ---------------------------------------------------------------


class _LoopSteps(_Core):
    """A session's core with the steps of its two background loops."""

    def _count_replaced(self) -> None:
        with self._lock:
            self._sender.replaced += 1

    def _unsent(self) -> bool:
        """A turn waits to be submitted and the sender is not backing off (``close`` waits)."""
        with self._lock:
            return self._sender.pending > 0 and not self._sender.retrying

    def _job(self, mail: Mail) -> Job:
        turn, messages = mail
        with self._lock:
            return Job(turn, self._sender.next_revision(), messages)

    def _snapshot(self, job: Job) -> dict[str, Any]:
        snapshot = self.setup.snapshot(job.revision, job.messages)
        pinned = self._pinned_ids(job.messages)
        if pinned:
            snapshot["pinned"] = pinned
        return snapshot

    def _submitted(self, job: Job, result: SubmitResult) -> Job | None:
        """Record a submit's result; the job to send again when it was superseded (with a
        revision after the service's newest), else None."""
        with self._lock:
            if result.status == "superseded":
                self._sender.learned(result.revision)
                log.info(
                    "revision %d of %s is older than the service's %d; sending it as a newer one",
                    job.revision,
                    self.conversation_id,
                    result.revision,
                )
                return job._replace(revision=self._sender.next_revision())
            if self._sender.retrying:
                log.warning(
                    "redis is back: submitted %s revision %d", self.conversation_id, job.revision
                )
            self._sender.accepted(job.turn, job.revision)
            if self._cursor.floor is None:
                self._cursor.floor = job.revision
            self._status_changed.notify_all()
            return None

    def _submit_error(self, job: Job, exc: Exception, attempt: int) -> float | None:
        """Record a failed submit (``attempt`` in a row): None when the service refused the
        snapshot for good (it is dropped), else the wait before trying it again."""
        if isinstance(exc, PermanentError):
            with self._lock:
                self._sender.refused(job.turn, exc)
                self._status_changed.notify_all()
            log.error(
                "the service refused %s revision %d: %s", self.conversation_id, job.revision, exc
            )
            return None
        delay = RETRY.delay(attempt)
        if not isinstance(exc, CompactorError):  # a bug must not end the loop silently
            log.exception("submitting %s revision %d failed", self.conversation_id, job.revision)
            return delay
        with self._lock:
            self._sender.failed(exc)
            pending = self._sender.pending
        log.warning(
            "cannot submit %s revision %d (%s); keeping the newest snapshot (%d turns pending), "
            "retrying in %.1fs",
            self.conversation_id,
            job.revision,
            exc.message,
            pending,
            delay,
        )
        return delay

    def _received_event(self, event: CompactionEvent) -> None:
        with self._lock:
            if self._follower.read(event):
                self._status_changed.notify_all()

    def _read_error(self, exc: Exception, attempt: int) -> float:
        """Record a failed read of the stream (``attempt`` in a row); the wait before the next."""
        if not isinstance(exc, CompactorError):
            log.exception("reading events of %s failed", self.conversation_id)
            return RETRY.cap_s
        delay = RETRY.delay(attempt)
        with self._lock:
            self._follower.read_failed(exc)
        log.warning(
            "cannot read events of %s (%s); retrying in %.1fs",
            self.conversation_id,
            exc.message,
            delay,
        )
        return delay
