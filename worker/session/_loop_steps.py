"""The steps the sender and follower loops take between their waits: take a turn, record what
a submit or a read did, log it, and say how long to wait before trying again. Both sessions'
loops, threads and tasks alike, call these and wait by the one :data:`RETRY` schedule."""

from __future__ import annotations

from typing import Any

from worker.client import SubmitResult
from worker.errors import CompactorError, PermanentError
from worker.wire.events import CompactionEvent

from ._backoff import Backoff
from ._core import Mail, _Core
from ._sender import Job
from ._setup import log

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0
RETRY = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)  # no jitter: the schedule docs/session.md gives


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
