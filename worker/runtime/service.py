"""The distributed flow, over the pure pipeline and the Redis adapter.

``evaluate`` runs for a conversation's newest submitted revision (submissions coalesce: one
queued evaluation per conversation at a time). Under the threshold it publishes
``compaction.skipped``; over it, it hands the conversation to ``summarize`` on the slow queue,
unless a compaction of that conversation is already running, in which case it flags a re-run.

``summarize`` holds the conversation's lock (a lease with a fencing token, renewed while it
works) so at most one compaction per conversation runs across all workers. It re-evaluates the
newest revision with the compactions published so far applied (the agent may not have applied
them yet), summarizes, writes the transcript, and publishes; the publish is refused if the lease
was lost. On release, a flagged re-run queues a fresh evaluation, which then sees the compacted
history.

Every effect is safe to repeat (redelivery is the broker's promise): transcripts are
create-only with deterministic names, events carry deterministic ids and are published once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from worker.backend.redis_state import LockStatus, RedisState, RequestedWork, Work
from worker.config import Settings
from worker.errors import InvalidSnapshot, LeaseLost, RedisUnavailable
from worker.ops.metrics import cost_counters
from worker.ops.tracing import AttributeValue, Stage, Telemetry
from worker.pipeline import Pipeline, StoredBlob, Verdict
from worker.pipeline.context import SnapshotContext
from worker.transcripts import prune_by_settings
from worker.wire.composed import ComposedCompaction, HeldProposal, compose
from worker.wire.events import (
    HELD_REASON,
    CompactionEvent,
    CompletedEvent,
    Cost,
    FailedEvent,
    SkippedEvent,
    proposed_event,
    rejected_event,
    skipped_event,
)
from worker.wire.snapshots import ParsedSnapshot

log = logging.getLogger(__name__)

LOCK_RETRY_MARGIN_S = 0.25

Outcome = Literal[
    "expired",
    "superseded",
    "rejected",
    "skipped",
    "queued",
    "deferred",
    "completed",
    "proposed",
    "failed",
    "duplicate",
    "lease_lost",
]


@dataclass
class Hold:
    """What :meth:`Service.holding` got: the conversation's lock with its fencing ``token``
    and ``lost``, true once the lease lapsed meanwhile; or no token, because another worker
    holds the lock (``status`` ``held``) or the revision asked about has an outcome already
    (``handled``). A compaction on demand sets ``taken_request`` to the id of the request it
    took, which the release then does not answer again."""

    status: LockStatus
    token: str | None
    lost: Callable[[], bool]
    taken_request: str = ""


@dataclass
class Service:
    """The steps around the pipeline that need Redis: taking work, the lock and its lease,
    re-runs, publishing. The pipeline owns everything in between."""

    settings: Settings
    state: RedisState
    pipeline: Pipeline
    enqueue_summarize: Callable[[str, int, float], None]  # (conversation, revision, delay_s)
    enqueue_evaluate: Callable[[str], None]
    # (conversation, delay_s): a requested compaction, again once the lock is free
    enqueue_compact: Callable[[str, float], None] = lambda _conversation, _delay_s: None

    @property
    def telemetry(self) -> Telemetry:
        """The process's telemetry, the pipeline's: spans and the stages' timings."""
        return self.pipeline.adapters.telemetry

    # (conversation): an idle compaction; None: the idle scan compacts in its own task.
    enqueue_idle: Callable[[str], None] | None = None

    # --- evaluate ----------------------------------------------------------------------------

    def evaluate(
        self,
        conversation_id: str,
        *,
        submitted_at: float | None = None,
        trace: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Evaluate the conversation's newest revision. ``trace``: the W3C trace context the
        task message carried (the submit's span; ``{}``: none, a new trace)."""
        return self._task(
            "evaluate",
            conversation_id,
            trace,
            lambda stage, timings: self._evaluate(conversation_id, submitted_at, stage, timings),
        )

    def _evaluate(
        self,
        conversation_id: str,
        submitted_at: float | None,
        stage: Stage,
        timings: dict[str, float],
    ) -> Outcome:
        recent = self.pipeline.reuse.recent
        known = recent.stored_memo(conversation_id)
        work = self.state.take_work(conversation_id, known_memo=known.digest if known else "")
        if not work.pending:
            return self._nothing_to_do(conversation_id, work)
        counters = {"snapshots_evaluated_total": 1.0}
        if submitted_at is not None:
            counters["queue_lag_seconds_total"] = max(time.time() - submitted_at, 0.0)
            counters["queue_lag_samples_total"] = 1.0
        parsed = self._parse(conversation_id, work)
        if parsed is None:
            return "expired" if work.payload is None else "rejected"
        stored = StoredBlob(work.memo_digest, work.memo) if work.memo_digest else None
        verdict = self.pipeline.evaluate(
            parsed, memo=stored, with_memo=True, activity=work.activity
        )
        stage.set(_evaluation_attributes(parsed, verdict))
        memo = verdict.memo
        assert memo is not None
        counters.update(memo.counters())
        if verdict.skipped is not None:
            counters["compactions_skipped_total"] = 1.0
            if verdict.skipped.why == "floor":
                counters["compactions_floor_total"] = 1.0
            # The elided event goes ahead of the skipped one in the same step (one round trip).
            # Both are remembered only as long as a redelivery of this evaluation can come: the
            # skipped event settles the revision at once.
            with self._publishing(verdict.skipped, timings):
                self.state.publish(
                    verdict.skipped,
                    ahead=[verdict.elided] if verdict.elided is not None else [],
                    handled_revision=work.latest,
                    counters=counters,
                    memo=memo.blob,
                    memo_digest=memo.digest,
                    dedup_ttl_s=self._evaluation_dedup_ttl_s(),
                )
            recent.remember_memo(conversation_id, memo.stored)
            return "skipped"
        if verdict.elided is not None:
            # Over the threshold the revision stays pending until its compaction, and may be
            # evaluated again meanwhile: its id is kept as long as any event's.
            with self._publishing(verdict.elided, timings):
                self.state.publish(verdict.elided)
        self.state.incr_many(counters)
        return self._hand_to_summarize(conversation_id, parsed.revision)

    def _evaluation_dedup_ttl_s(self) -> int:
        """How long the event ids of an evaluation that ends in ``compaction.skipped`` are kept
        against a second publish: only a redelivered evaluate task (after the visibility
        timeout) or the reconciler (after ``reconcile_after_s``) can evaluate the same revision
        again, and once the skipped event is published the handled revision stops them.
        Keeping the ids for ``stream_ttl_s`` (a week) would hold a key per evaluation for a
        week."""
        redis, worker = self.settings.redis, self.settings.worker
        return int(
            2 * redis.visibility_timeout_s
            + worker.reconcile_after_s
            + worker.reconcile_interval_s
            + worker.evaluate_time_limit_s
        )

    def _hand_to_summarize(self, conversation_id: str, revision: int) -> Outcome:
        """Queue the compaction; while another one runs, flag a re-run for its holder and also
        schedule ours for when its lease would lapse (in case the holder died)."""
        wait_s = self.state.defer_to_holder(conversation_id)
        if wait_s > 0:
            self.enqueue_summarize(conversation_id, revision, wait_s + LOCK_RETRY_MARGIN_S)
            return "deferred"
        self.enqueue_summarize(conversation_id, revision, 0.0)
        return "queued"

    def _nothing_to_do(self, conversation_id: str, work: Work) -> Outcome:
        if work.latest is None:  # the snapshot expired: the reconciler has nothing to retry
            self.state.settle_pending(conversation_id, None)
            return "expired"
        # Handled already. A submission that died (or was refused) between its two steps may
        # have left the conversation in cw:pending with nothing newer: settle it, or the
        # reconciler would queue it again on every run (keys.py).
        self.state.settle_pending(conversation_id, work.handled)
        return "superseded"

    def _parse(self, conversation_id: str, work: Work) -> ParsedSnapshot | None:
        """The snapshot with published compactions applied; None when there is none to
        evaluate (expired: settled; invalid: its rejection published)."""
        assert work.latest is not None
        if work.payload is None:
            self.state.settle_pending(conversation_id, work.latest)
            return None
        try:
            return self.pipeline.parse(
                work.payload,
                conversation_id=conversation_id,
                published=work.compactions,
                composed=work.composed,
            )
        except InvalidSnapshot as exc:
            # The user's input problem, worth seeing in the log: where and why (the same words
            # the rejected event carries; never the snapshot's content).
            log.warning(
                "rejected %s revision %s: %s",
                conversation_id,
                work.latest,
                exc.message,
                extra={
                    "conversation_id": conversation_id,
                    "revision": work.latest,
                    "field": exc.field,
                    "reason": exc.reason,
                },
            )
            event = rejected_event(
                conversation_id,
                work.latest,
                self.pipeline.adapters.now(),
                code=exc.code,
                field=exc.field,
                reason=exc.reason,
                message=exc.message,
            )
            self.state.publish(
                event,
                handled_revision=work.latest,
                counters={"snapshots_rejected_total": 1.0},
            )
            return None

    # --- summarize ---------------------------------------------------------------------------

    def summarize(
        self, conversation_id: str, revision: int, *, trace: Mapping[str, str] | None = None
    ) -> Outcome:
        """Compact the conversation (its newest revision; ``revision`` is the one evaluated
        over the threshold). ``trace``: as for :meth:`evaluate` (the evaluation's span)."""
        return self._task(
            "compact",
            conversation_id,
            trace,
            lambda stage, timings: self._summarize(conversation_id, revision, stage, timings),
        )

    def _summarize(
        self, conversation_id: str, revision: int, stage: Stage, timings: dict[str, float]
    ) -> Outcome:
        # Lease lost: not published; evaluate again (the new holder has it, or it is ours).
        again = functools.partial(self.enqueue_evaluate, conversation_id)
        with self.holding(conversation_id, unless_handled=revision, after_lost=again) as hold:
            if hold.status == "handled":
                return "superseded"
            if hold.token is None:
                return self._hand_to_summarize(conversation_id, revision)
            return self._compact_locked(conversation_id, hold.token, hold.lost, stage, timings)
        return "lease_lost"

    @contextlib.contextmanager
    def holding(
        self,
        conversation_id: str,
        *,
        unless_handled: int | None = None,
        after_lost: Callable[[], None] | None = None,
        during: str = "",
    ) -> Iterator[Hold]:
        """Hold the conversation while the body runs: its lock taken with a fresh fencing
        token and its lease renewed, the one way every compaction holds a conversation.

        The body gets a :class:`Hold` without a token when another worker holds the lock, or
        ``unless_handled`` has an outcome already: then nothing else happens here. Otherwise
        a :class:`LeaseLost` raised by the body (it may not publish) is logged, counted and
        answered with ``after_lost``, and goes no further: the code after the ``with`` block
        runs. Whatever the body does, the lock is released, then a re-run flagged meanwhile
        (a snapshot that came during the compaction) queues an evaluation, which sees the
        compacted history, and a compaction on demand that waits is queued at once (its own
        task found the lock held and waits for the lease), unless it is the one the body took
        (:attr:`Hold.taken_request`): a request a compaction on demand failed on would queue
        itself again at every release."""
        lease_s = self.settings.redis.lock_lease_s
        claim = self.state.acquire_lock(conversation_id, lease_s, unless_handled=unless_handled)
        token = claim.token
        if token is None:
            yield Hold(claim.status, None, lambda: False)
            return
        hold = Hold(claim.status, token, lambda: False)
        try:
            with self.state.lease(conversation_id, token, lease_s) as lost:
                hold.lost = lost.is_set
                yield hold
        except LeaseLost:
            log.warning("lease lost on %s%s; not publishing", conversation_id, during)
            self.state.incr("leases_lost_total")
            if after_lost is not None:
                after_lost()
        finally:
            released = self.state.release_lock(
                conversation_id, token, taken_request=hold.taken_request
            )
            if released.rerun:
                self.enqueue_evaluate(conversation_id)
            if released.requested:
                self.enqueue_compact(conversation_id, 0.0)

    def _compact_locked(
        self,
        conversation_id: str,
        token: str,
        lease_lost: Callable[[], bool],
        stage: Stage,
        timings: dict[str, float],
    ) -> Outcome:
        work = self.state.take_work(conversation_id)
        if not work.pending:
            return self._nothing_to_do(conversation_id, work)
        latest = work.latest
        parsed = self._parse(conversation_id, work)
        if parsed is None:
            return "expired" if work.payload is None else "rejected"
        context = self.pipeline.context(parsed)  # one tokenizer and policy for both steps
        verdict = self.pipeline.evaluate(context, activity=work.activity)
        stage.set(_evaluation_attributes(parsed, verdict))
        if verdict.skipped is not None:  # an earlier compaction already brought it under
            with self._publishing(verdict.skipped, timings):
                self.state.publish(verdict.skipped, fencing_token=token, handled_revision=latest)
            return "skipped"
        if work.held:  # one held compaction at a time: its approval changes what comes next
            held = skipped_event(
                conversation_id,
                parsed.revision,
                self.pipeline.adapters.now(),
                why="held",
                reason=HELD_REASON,
                trigger=verdict.evaluation.trigger(),
            )
            self.state.publish(held, fencing_token=token, handled_revision=latest)
            return "skipped"
        return self._publish_compaction(
            conversation_id, token, lease_lost, work, context, verdict, stage, timings
        )

    def _publish_compaction(
        self,
        conversation_id: str,
        token: str,
        lease_lost: Callable[[], bool],
        work: Work,
        context: SnapshotContext,
        verdict: Verdict,
        stage: Stage,
        timings: dict[str, float],
    ) -> Outcome:
        """Compact the evaluated snapshot and publish the outcome under the fencing token."""
        latest = work.latest
        parsed = context.parsed
        started = time.monotonic()
        event = self.pipeline.compact(
            context,
            verdict.evaluation,
            already_published=lambda event_id: self.state.is_published(conversation_id, event_id),
            timings=timings,
        )
        if event is None:
            return "duplicate"  # redelivered after it was published: no second LLM call
        counters = _counters(event, time.monotonic() - started)
        stage.set(_outcome_attributes(event))
        if lease_lost():
            raise LeaseLost(f"lease on {conversation_id} expired during the compaction")
        failed = event.type == "compaction.failed"
        if isinstance(event, FailedEvent):
            stage.fail(f"{event.error.code}: {event.error.message}")
        composed = (
            compose(work.composed, parsed.snapshot.messages, event)
            if isinstance(event, CompletedEvent)
            else None
        )
        if isinstance(event, CompletedEvent) and context.config.reviews(conversation_id):
            with self._publishing(event, timings):
                return self._propose(event, composed, work, token, counters)
        with self._publishing(event, timings):
            status = self.state.publish(
                event,
                fencing_token=token,
                handled_revision=None if failed else latest,
                counters=counters,  # counted in the same step, and only if really published
                composed=composed,
            )
        if status == "published" and isinstance(event, CompletedEvent):
            c = event.compaction
            self.telemetry.add_tokens_saved(c.tokens_before - c.tokens_after)
        if failed:  # reported; not retried by the reconciler (a new submission retries it)
            self.state.settle_pending(conversation_id, latest)
        if status == "duplicate":
            return "duplicate"
        return (
            "completed"
            if event.type == "compaction.completed"
            else ("failed" if event.type == "compaction.failed" else "skipped")
        )

    # --- telemetry ---------------------------------------------------------------------------

    def _task(
        self,
        name: str,
        conversation_id: str,
        trace: Mapping[str, str] | None,
        run: Callable[[Stage, dict[str, float]], Outcome],
        *,
        idle: bool = False,
    ) -> Outcome:
        """A task's work as one consumer span (``trace``: the parent the task message carried;
        None: a trace of its own), its outcome recorded, its stage timings added once done."""
        timings: dict[str, float] = {}
        attributes: dict[str, AttributeValue | None] = {"gen_ai.conversation.id": conversation_id}
        if idle:
            attributes["compactor.idle"] = True
        try:
            with self.telemetry.stage(
                name, kind="consumer", parent=trace, attributes=attributes, into=timings
            ) as stage:
                outcome = run(stage, timings)
                stage.set({"compactor.outcome": outcome})
                return outcome
        finally:
            self._add_timings(timings)

    def _publishing(
        self, event: CompactionEvent, timings: dict[str, float]
    ) -> contextlib.AbstractContextManager[Stage]:
        """The publish stage of ``event``: a span, and its latency added to ``timings``."""
        attributes: dict[str, AttributeValue | None] = {
            "gen_ai.conversation.id": event.conversation_id,
            "compactor.revision": event.revision,
            "compactor.event.type": event.type,
            "compactor.event.id": event.event_id,
        }
        return self.telemetry.stage("publish", attributes=attributes, into=timings)

    def _add_timings(self, timings: dict[str, float]) -> None:
        """The task's stage latencies into the Prometheus histograms, in one round trip after
        the task (best effort, like every counter: a metric never fails the work)."""
        if timings:
            self.state.incr_many(timings)

    # --- compaction on demand ----------------------------------------------------------------

    def compact_requested(self, conversation_id: str) -> Outcome:
        """Compact the newest snapshot as the conversation's waiting request asks, whatever
        the threshold says: under the lock and lease, published with the fencing token, like
        :meth:`summarize`. While another compaction holds the lock, its release queues this
        again; should the holder die, it runs again when that lease would lapse."""
        again = functools.partial(self.enqueue_compact, conversation_id, 0.0)
        with self.holding(conversation_id, after_lost=again) as hold:
            if hold.token is None:
                wait_s = self.state.lock_ttl_s(conversation_id)
                self.enqueue_compact(conversation_id, wait_s + LOCK_RETRY_MARGIN_S)
                return "deferred"
            return self._compact_requested_locked(conversation_id, hold)
        return "lease_lost"

    # --- idle compaction ---------------------------------------------------------------------

    def idle_scan(self) -> list[str]:
        """Hand every conversation idle for ``idle_compact_after_s`` (no snapshot since) to an
        idle compaction; returns them. Off (nothing) when the setting is unset."""
        after_s = self.settings.compaction.idle_compact_after_s
        if after_s is None:
            return []
        # A hand-out whose compaction has not ended after this was lost (a task is back on its
        # queue after the visibility timeout, and then runs for at most the time limit).
        lost_after_s = (
            self.settings.redis.visibility_timeout_s + self.settings.worker.summarize_time_limit_s
        )
        found = self.state.take_idle(time.time() - after_s, busy_for_s=lost_after_s)
        for conversation_id in found:
            if self.enqueue_idle is not None:
                self.enqueue_idle(conversation_id)
            else:
                self.compact_idle(conversation_id)
        return found

    def compact_idle(self, conversation_id: str) -> Outcome:
        """Compact an idle conversation's newest snapshot, already evaluated, when it is over
        ``idle_threshold_tokens``: trigger kind ``idle``. Nothing is published under it (its
        evaluation already published the skip), nor while a newer snapshot waits or another
        worker holds the conversation: the normal path has it. A trace of its own."""
        return self._task(
            "compact",
            conversation_id,
            None,
            lambda stage, timings: self._compact_idle(conversation_id, stage, timings),
            idle=True,
        )

    def _compact_idle(
        self, conversation_id: str, stage: Stage, timings: dict[str, float]
    ) -> Outcome:
        try:
            return self._compact_idle_claimed(conversation_id, stage, timings)
        finally:
            # The tenant's turn ends whatever the outcome: it may have another handed out. A
            # Redis error here is left to the scan, which forgets the hand-out in time;
            # raising it would run the whole task again.
            try:
                self.state.finish_idle(conversation_id)
            except RedisUnavailable:
                log.warning("could not end the idle compaction of %s", conversation_id)

    def _compact_idle_claimed(
        self, conversation_id: str, stage: Stage, timings: dict[str, float]
    ) -> Outcome:
        with self.holding(conversation_id, during=" during an idle compaction") as hold:
            if hold.token is None:
                return "deferred"
            return self._compact_idle_locked(conversation_id, hold.token, hold.lost, stage, timings)
        return "lease_lost"

    def _compact_requested_locked(self, conversation_id: str, hold: Hold) -> Outcome:
        assert hold.token is not None
        token, lease_lost = hold.token, hold.lost
        work = self.state.take_request(conversation_id)
        request = work.request
        if request is None:
            return "superseded"  # done already (a redelivery), or nothing was asked
        hold.taken_request = request.request_id
        if work.payload is None or work.latest is None:
            self.state.done_request(conversation_id, request.request_id)
            return "expired"  # the snapshot expired since the request was taken
        parsed = self._parse_requested(conversation_id, work)
        if parsed is None:
            self.state.done_request(conversation_id, request.request_id)
            return "rejected"
        if work.held:  # asked for while one awaits review: answered, not made
            held = self.pipeline.requested_while_held(parsed, request)
            self.state.publish(held, fencing_token=token, handled_revision=None)
            self.state.done_request(conversation_id, request.request_id)
            return "skipped"
        context = self.pipeline.context(parsed)
        started = time.monotonic()
        event = self.pipeline.compact_requested(
            context,
            request,
            already_published=lambda event_id: self.state.is_published(conversation_id, event_id),
        )
        if event is None:  # redelivered after it was published: no second LLM call
            self.state.done_request(conversation_id, request.request_id)
            return "duplicate"
        if lease_lost():
            raise LeaseLost(f"lease on {conversation_id} expired during the compaction")
        failed = event.type == "compaction.failed"
        counters = _counters(event, time.monotonic() - started)
        counters["compactions_requested_total"] = 1.0
        composed = (
            compose(work.composed, parsed.snapshot.messages, event)
            if isinstance(event, CompletedEvent)
            else None
        )
        if isinstance(event, CompletedEvent) and context.config.reviews(conversation_id):
            # Held for review like any other: asking for a compaction is no way around it.
            outcome = self._propose(event, composed, work, token, counters)
            self.state.done_request(conversation_id, request.request_id)
            return outcome
        status = self.state.publish(
            event,
            fencing_token=token,
            handled_revision=None if failed else work.latest,
            counters=counters,
            composed=composed,
        )
        self.state.done_request(conversation_id, request.request_id)
        if status == "duplicate":
            return "duplicate"
        outcomes: dict[str, Outcome] = {
            "compaction.completed": "completed",
            "compaction.failed": "failed",
        }
        return outcomes.get(event.type, "skipped")

    def _parse_requested(self, conversation_id: str, work: RequestedWork) -> ParsedSnapshot | None:
        """The newest snapshot with the request's overrides and the published compactions
        applied; None when it is invalid (its rejection published, as for any snapshot)."""
        assert work.request is not None and work.payload is not None and work.latest is not None
        try:
            return self.pipeline.parse(
                work.payload,
                conversation_id=conversation_id,
                published=work.compactions,
                composed=work.composed,
                request=work.request,
            )
        except InvalidSnapshot as exc:
            event = rejected_event(
                conversation_id,
                work.latest,
                self.pipeline.adapters.now(),
                code=exc.code,
                field=exc.field,
                reason=exc.reason,
                message=exc.message,
            )
            self.state.publish(event, counters={"snapshots_rejected_total": 1.0})
            return None

    def _propose(
        self,
        completed: CompletedEvent,
        composed: ComposedCompaction | None,
        work: Work | RequestedWork,
        token: str,
        counters: dict[str, float],
    ) -> Outcome:
        """Hold the compaction for review: publish it as ``compaction.proposed``, stored with
        what its approval publishes; it settles the revision like the completed event would."""
        proposal = proposed_event(completed)
        held = HeldProposal(
            event=proposal,
            composed=composed,
            base=work.composed.event_id if work.composed is not None else None,
        )
        del counters["compactions_completed_total"]
        counters["compactions_proposed_total"] = 1.0
        status = self.state.publish(
            proposal,
            fencing_token=token,
            handled_revision=work.latest,
            counters=counters,
            proposal=held,
        )
        return "duplicate" if status == "duplicate" else "proposed"

    def _compact_idle_locked(
        self,
        conversation_id: str,
        token: str,
        lease_lost: Callable[[], bool],
        stage: Stage,
        timings: dict[str, float],
    ) -> Outcome:
        work = self.state.take_work(conversation_id, idle=True)
        if work.latest is None or work.payload is None:
            return "superseded" if work.pending else "expired"
        parsed = self._parse(conversation_id, work)
        if parsed is None:
            return "rejected"
        context = self.pipeline.context(parsed)
        verdict = self.pipeline.evaluate(context, activity=work.activity, idle=True)
        if verdict.skipped is not None:
            return "skipped"
        return self._publish_compaction(
            conversation_id, token, lease_lost, work, context, verdict, stage, timings
        )

    # --- housekeeping ------------------------------------------------------------------------

    def reconcile(self) -> list[str]:
        """Queue again conversations whose newest snapshot has waited too long for an outcome
        (a lost broker message, a worker that died mid-task, a crashed re-run); returns them.

        A conversation whose lock lease is alive is being compacted (its holder renews the
        lease while it works, and publishes or re-runs when done): it is left alone, and looked
        at again when that lease would lapse, so a holder that died (SIGKILL) is noticed at the
        first run after its lease lapsed. A re-queued conversation waits ``reconcile_after_s``
        again before its next re-queue, so a backlog costs at most one extra evaluation per
        waiting conversation per ``reconcile_after_s`` (and at most 500 per run)."""
        after_s = self.settings.worker.reconcile_after_s
        stale = self.state.stale_pending(after_s)
        if not stale:
            return []
        now = time.time()
        leases = self.state.lease_ttls_s(stale)
        requeued = [c for c, lease_s in zip(stale, leases, strict=True) if lease_s <= 0]
        due = dict.fromkeys(requeued, now)
        due |= {c: now - after_s + s for c, s in zip(stale, leases, strict=True) if s > 0}
        self.state.reschedule_pending(due)
        for conversation_id in requeued:
            self.enqueue_evaluate(conversation_id)
        return requeued

    def prune(self, *, dry_run: bool = False) -> list[str]:
        return prune_by_settings(self.pipeline.adapters.store, self.settings, dry_run=dry_run)


def _evaluation_attributes(
    parsed: ParsedSnapshot, verdict: Verdict
) -> dict[str, AttributeValue | None]:
    """The span attributes of an evaluation: the model (GenAI's name), the revision, and the
    projected tokens against the threshold."""
    evaluation = verdict.evaluation
    return {
        "gen_ai.request.model": parsed.snapshot.model.name or None,
        "compactor.revision": parsed.revision,
        "compactor.tokens": evaluation.projected_tokens,
        "compactor.threshold": evaluation.threshold,
        "compactor.over_threshold": evaluation.over_threshold,
    }


def _outcome_attributes(event: CompactionEvent) -> dict[str, AttributeValue | None]:
    """The span attributes of a compaction's outcome: tokens before and after, when done."""
    if not isinstance(event, CompletedEvent):
        return {"compactor.event.type": event.type}
    c = event.compaction
    return {
        "compactor.event.type": event.type,
        "compactor.tokens_before": c.tokens_before,
        "compactor.tokens_after": c.tokens_after,
        "compactor.summary.source": c.summary.source,
    }


def _cost_counters(cost: Cost, conversation_id: str) -> dict[str, float]:
    """Spent: the summary call and the cache write beyond what the next turn paid anyway;
    saved: the expected saving over the horizon, and the first turn's when it was cheaper."""
    spent = saved = None
    if cost.priced and cost.summary_usd is not None and cost.cache_write_usd is not None:
        per_turn = cost.saving_per_turn_usd or 0.0
        spent = cost.summary_usd + max(cost.cache_write_usd, 0.0)
        saved = per_turn * cost.horizon_turns + max(-cost.cache_write_usd, 0.0)
    tenant, colon, _ = conversation_id.partition(":")
    return cost_counters(spent, saved, cost.saved_tokens_per_turn, tenant if colon else None)


def _counters(event: CompactionEvent, seconds: float) -> dict[str, float]:
    """The metric increments a compaction's outcome event carries."""
    counters = {f"compactions_{event.type.split('.')[1]}_total": 1.0}
    if isinstance(event, CompletedEvent):
        c = event.compaction
        counters["tokens_before_total"] = c.tokens_before
        counters["tokens_after_total"] = c.tokens_after
        counters["tokens_saved_total"] = c.tokens_before - c.tokens_after
        if c.summary.source == "llm":
            counters["llm_summaries_total"] = 1.0
            counters["llm_seconds_total"] = seconds
        if c.summary.fallback_reason:
            counters["llm_fallbacks_total"] = 1.0
        if event.cost is not None:
            counters |= _cost_counters(event.cost, event.conversation_id)
    if isinstance(event, FailedEvent) and event.error.code.startswith("llm"):
        counters["llm_failures_total"] = 1.0
    if isinstance(event, SkippedEvent) and event.why in ("floor", "no_gain"):
        counters[f"compactions_{event.why}_total"] = 1.0
    return counters
