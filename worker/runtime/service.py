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

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from worker.backend.redis_state import RedisState, Work
from worker.config import Settings
from worker.errors import InvalidSnapshot, LeaseLost
from worker.ops.metrics import cost_counters
from worker.pipeline import Pipeline, StoredBlob, Verdict
from worker.pipeline.context import SnapshotContext
from worker.transcripts import prune_by_settings
from worker.wire.composed import compose
from worker.wire.events import (
    CompactionEvent,
    CompletedEvent,
    Cost,
    FailedEvent,
    rejected_event,
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
    "failed",
    "duplicate",
    "lease_lost",
]


@dataclass
class Service:
    """The steps around the pipeline that need Redis: taking work, the lock and its lease,
    re-runs, publishing. The pipeline owns everything in between."""

    settings: Settings
    state: RedisState
    pipeline: Pipeline
    enqueue_summarize: Callable[[str, int, float], None]  # (conversation, revision, delay_s)
    enqueue_evaluate: Callable[[str], None]
    # (conversation): an idle compaction; None: the idle scan compacts in its own task.
    enqueue_idle: Callable[[str], None] | None = None

    # --- evaluate ----------------------------------------------------------------------------

    def evaluate(self, conversation_id: str, *, submitted_at: float | None = None) -> Outcome:
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
        memo = verdict.memo
        assert memo is not None
        counters.update(memo.counters())
        if verdict.skipped is not None:
            counters["compactions_skipped_total"] = 1.0
            # The elided event goes ahead of the skipped one in the same step (one round trip).
            # Both are remembered only as long as a redelivery of this evaluation can come: the
            # skipped event settles the revision at once.
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
        wait_s = self.state.lock_ttl_s(conversation_id)
        if wait_s > 0:
            self.state.request_rerun(conversation_id)
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

    def summarize(self, conversation_id: str, revision: int) -> Outcome:
        lease_s = self.settings.redis.lock_lease_s
        claim = self.state.acquire_lock(conversation_id, lease_s, unless_handled=revision)
        if claim.status == "handled":
            return "superseded"
        token = claim.token
        if token is None:
            return self._hand_to_summarize(conversation_id, revision)
        try:
            with self.state.lease(conversation_id, token, lease_s) as lost:
                return self._compact_locked(conversation_id, token, lost.is_set)
        except LeaseLost:
            # Not published; evaluate again: either the new holder has it, or it is ours again.
            log.warning("lease lost on %s; not publishing", conversation_id)
            self.state.incr("leases_lost_total")
            self.enqueue_evaluate(conversation_id)
            return "lease_lost"
        finally:
            self.state.release_lock(conversation_id, token)
            if self.state.take_rerun(conversation_id):
                self.enqueue_evaluate(conversation_id)

    def _compact_locked(
        self, conversation_id: str, token: str, lease_lost: Callable[[], bool]
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
        if verdict.skipped is not None:  # an earlier compaction already brought it under
            self.state.publish(verdict.skipped, fencing_token=token, handled_revision=latest)
            return "skipped"
        return self._publish_compaction(conversation_id, token, lease_lost, work, context, verdict)

    def _publish_compaction(
        self,
        conversation_id: str,
        token: str,
        lease_lost: Callable[[], bool],
        work: Work,
        context: SnapshotContext,
        verdict: Verdict,
    ) -> Outcome:
        """Compact the evaluated snapshot and publish the outcome under the fencing token."""
        latest = work.latest
        parsed = context.parsed
        started = time.monotonic()
        event = self.pipeline.compact(
            context,
            verdict.evaluation,
            already_published=lambda event_id: self.state.is_published(conversation_id, event_id),
        )
        if event is None:
            return "duplicate"  # redelivered after it was published: no second LLM call
        counters = _counters(event, time.monotonic() - started)
        if lease_lost():
            raise LeaseLost(f"lease on {conversation_id} expired during the compaction")
        failed = event.type == "compaction.failed"
        status = self.state.publish(
            event,
            fencing_token=token,
            handled_revision=None if failed else latest,
            counters=counters,  # counted in the same step, and only if really published
            composed=compose(work.composed, parsed.snapshot.messages, event)
            if isinstance(event, CompletedEvent)
            else None,
        )
        if failed:  # reported; not retried by the reconciler (a new submission retries it)
            self.state.settle_pending(conversation_id, latest)
        if status == "duplicate":
            return "duplicate"
        return (
            "completed"
            if event.type == "compaction.completed"
            else ("failed" if event.type == "compaction.failed" else "skipped")
        )

    # --- idle compaction ---------------------------------------------------------------------

    def idle_scan(self) -> list[str]:
        """Hand every conversation idle for ``idle_compact_after_s`` (no snapshot since) to an
        idle compaction; returns them. Off (nothing) when the setting is unset."""
        after_s = self.settings.compaction.idle_compact_after_s
        if after_s is None:
            return []
        found = self.state.take_idle(time.time() - after_s)
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
        worker holds the conversation: the normal path has it."""
        lease_s = self.settings.redis.lock_lease_s
        claim = self.state.acquire_lock(conversation_id, lease_s)
        if claim.token is None:
            return "deferred"
        token = claim.token
        try:
            with self.state.lease(conversation_id, token, lease_s) as lost:
                return self._compact_idle_locked(conversation_id, token, lost.is_set)
        except LeaseLost:
            log.warning(
                "lease lost on %s during an idle compaction; not publishing", conversation_id
            )
            self.state.incr("leases_lost_total")
            return "lease_lost"
        finally:
            self.state.release_lock(conversation_id, token)
            if self.state.take_rerun(conversation_id):
                self.enqueue_evaluate(conversation_id)

    def _compact_idle_locked(
        self, conversation_id: str, token: str, lease_lost: Callable[[], bool]
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
        return self._publish_compaction(conversation_id, token, lease_lost, work, context, verdict)

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
        if c.summary.source == "llm":
            counters["llm_summaries_total"] = 1.0
            counters["llm_seconds_total"] = seconds
        if c.summary.fallback_reason:
            counters["llm_fallbacks_total"] = 1.0
        if event.cost is not None:
            counters |= _cost_counters(event.cost, event.conversation_id)
    if isinstance(event, FailedEvent) and event.error.code.startswith("llm"):
        counters["llm_failures_total"] = 1.0
    return counters
