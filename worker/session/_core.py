"""``_Core``: the parts a session is made of, and every step that does not wait on a thread or
a task. One lock guards the parts; each part owns one job's state:

- :class:`Setup`: what the session is (fixed);
- :class:`History` and :class:`Cursor`: the messages with compactions applied, and where the
  session is in the event stream;
- :class:`Projection`: the cached projected request;
- :class:`Transcripts`: transcripts read for undo and recall;
- :class:`SenderState` and :class:`FollowerState`: what the background loops have done.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from worker.client import Client, SubmitResult
from worker.errors import CompactorError, EventMismatch, PermanentError
from worker.wire.events import CompactionEvent, CompletedEvent, RevertedEvent

from . import _state
from ._backoff import Backoff
from ._follower import FollowerState
from ._history import Applied, Cursor, History, replaced_range
from ._messages import own
from ._projection import Projection
from ._recall import RECALL_USAGE, Transcripts, recall_id
from ._sender import Job, SenderState
from ._setup import Setup, SetupView, log
from ._status import SessionStatus, status_of

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0
# The one schedule of both sessions' sender and follower, threads and tasks alike.
RETRY = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)

Mail = tuple[int, tuple[Any, ...]]  # (the turn, the messages to snapshot)


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

    def _append(self, new_messages: Iterable[dict[str, Any]]) -> Mail:
        """Append copies of the messages; the (turn, messages) to snapshot."""
        copies = [own(m) for m in new_messages]
        with self._lock:
            self._history.extend(copies)
            return self._changed()

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
        for event in reversed(self._applied_events()):
            original, index = self._transcripts.of(event)
            if message_id in index:
                return copy.deepcopy(original[index[message_id]])
        raise KeyError(message_id)

    def _recallable(self) -> list[str]:
        return [i for event in self._applied_events() for i in self._transcripts.of(event)[1]]

    def _recall_text(self, arguments: str | Mapping[str, Any]) -> str:
        """The recall tool's answer to a call's arguments."""
        message_id = recall_id(arguments)
        if message_id is None:
            return RECALL_USAGE
        try:
            return json.dumps(self._recall(message_id), ensure_ascii=False)
        except KeyError:
            some = self._recallable()[:50]
            return f"error: no compacted message has id {message_id!r}; some that do: {some}"
        except CompactorError as exc:
            return f"error: the transcript cannot be read: {exc.message}"

    # --- the steps of the sender and the follower ---------------------------------------------

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
        return self.setup.snapshot(job.revision, job.messages)

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

    # --- state --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """A JSON-able dict to carry the session into another process (``from_state``)."""
        with self._lock:
            return _state.dump(self.setup, self._history, self._sender, self._cursor)

    def _restore_state(self, state: Mapping[str, Any]) -> bool:
        """Take over the counters of a saved session; True when it had unsent turns."""
        with self._lock:
            return _state.load(state, self._history, self._sender, self._cursor)
