"""The orchestrator: :class:`Pipeline` runs the steps in order over one snapshot's context."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from worker.config import Settings
from worker.core.cost import Activity, decide
from worker.errors import CompactorError, EventMismatch, RedisUnavailable, StorageError
from worker.ops.tracing import Telemetry
from worker.pipeline.context import SnapshotContext, snapshot_context
from worker.pipeline.cost import activity_of, estimated_cost, measured_cost, uses_llm
from worker.pipeline.describe import build_compaction, transcript_payload
from worker.pipeline.evaluate import Evaluation, evaluate
from worker.pipeline.memo import MemoUpdate, StoredBlob, evaluate_with_memo
from worker.pipeline.prepare import (
    PlannedCompaction,
    PreparedCompaction,
    plan_compaction,
    prepare,
)
from worker.pipeline.reduce import PreparedReduction, build_reduction, prepare_reduction
from worker.pipeline.summarize import LLMTracing, summarize
from worker.reuse import Reuse
from worker.summarize import Summarizer
from worker.summarize.digest import DigestSummarizer
from worker.transcripts import TranscriptStore
from worker.wire import formats
from worker.wire.composed import ComposedCompaction, apply_composed
from worker.wire.events import (
    HELD_REASON,
    Compaction,
    CompactionEvent,
    CompletedEvent,
    ElidedEvent,
    FailedEvent,
    SkippedEvent,
    completed_event,
    elided_event,
    event_id_for,
    failed_event,
    skipped_event,
)
from worker.wire.history import apply_compaction
from worker.wire.models import canonical_json
from worker.wire.requests import CompactRequest
from worker.wire.snapshots import ParsedSnapshot, decode_json, parse_snapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Adapters:
    """What the pipeline needs from the outside world."""

    store: TranscriptStore
    llm: Summarizer | None = None
    digest: Summarizer = field(default_factory=DigestSummarizer)
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    # The process's telemetry ([otel]): the stages' spans and timings; unconfigured, only timed.
    telemetry: Telemetry = field(default_factory=Telemetry)


@dataclass(frozen=True)
class Verdict:
    """What evaluating a snapshot decided, and the events that describe it: ``elided`` (when
    the projection shortened tool results) and, under the threshold, ``skipped``."""

    evaluation: Evaluation
    elided: ElidedEvent | None
    skipped: SkippedEvent | None
    memo: MemoUpdate | None = None

    @property
    def over_threshold(self) -> bool:
        """Whether it is to be compacted (over the threshold, or as the cost policy decided)."""
        return self.evaluation.should_compact


class Pipeline:
    """Evaluate -> decide -> compact -> describe, for the CLI and the workers alike.

    :meth:`evaluate`, :meth:`compact` and :meth:`run` take a snapshot's context
    (:meth:`context`), which its caller builds once and passes to each; given the parsed
    snapshot instead, each builds the context itself."""

    def __init__(self, settings: Settings, adapters: Adapters, reuse: Reuse | None = None):
        self.settings = settings
        self.adapters = adapters
        self.reuse = reuse if reuse is not None else Reuse()

    # --- parse -------------------------------------------------------------------------------

    def parse(
        self,
        payload: bytes | str | Mapping[str, Any],
        *,
        conversation_id: str | None = None,
        published: Sequence[CompletedEvent] = (),
        composed: ComposedCompaction | None = None,
        request: CompactRequest | None = None,
    ) -> ParsedSnapshot:
        """The validated snapshot (InvalidSnapshot otherwise), evaluated against the compacted
        history: a full history (one that holds what the compactions replaced) gets every
        compaction so far at once (``composed``); any other gets the compactions already
        ``published`` for earlier revisions that it does not contain yet, applied in order.
        The conversation's last parse in this process (by ``conversation_id``) is reused for
        the messages they share. ``request``: a compaction someone asked for, whose ``config``
        and ``tools`` overrides go over the snapshot's own."""
        recent = self.reuse.recent
        earlier = recent.get(conversation_id) if conversation_id else None
        if request is not None and (request.config or request.tools):
            payload = _with_overrides(payload, request, self.settings)
        parsed = parse_snapshot(payload, self.settings, earlier=earlier)
        if not isinstance(payload, Mapping):
            recent.put(parsed, len(payload))
        return self._with_published(parsed, published, composed)

    def _with_published(
        self,
        parsed: ParsedSnapshot,
        published: Sequence[CompletedEvent],
        composed: ComposedCompaction | None = None,
    ) -> ParsedSnapshot:
        messages = _with_composed(parsed, composed)
        changed = messages is not None
        if messages is None:
            messages = parsed.snapshot.messages
            for event in published:
                if event.revision > parsed.revision:
                    continue
                try:
                    messages = apply_compaction(
                        messages, event, conversation_id=parsed.conversation_id
                    )
                    changed = True
                except EventMismatch:
                    continue  # already applied by the agent, or another branch of history
        if not changed:
            return parsed
        raw = parsed.snapshot.model_dump(mode="json") | {"messages": messages}
        if parsed.snapshot.pinned:
            raw["pinned"] = _pins_after(parsed, messages)
        if parsed.snapshot.usage is not None:
            # The usage counted the messages as submitted, not as compacted.
            log.info(
                "ignoring usage of %s revision %s: a published compaction was applied first",
                parsed.conversation_id,
                parsed.revision,
            )
            raw["usage"] = None
        # Validates the ids of the result too; what precedes the compacted range is reused.
        return parse_snapshot(raw, self.settings, earlier=parsed)

    def context(self, parsed: ParsedSnapshot) -> SnapshotContext:
        """What every step of ``parsed`` shares, with this process's tokenizer and caches."""
        return snapshot_context(parsed, self.reuse)

    def _context(self, snapshot: SnapshotContext | ParsedSnapshot) -> SnapshotContext:
        return snapshot if isinstance(snapshot, SnapshotContext) else self.context(snapshot)

    # --- evaluate and decide -----------------------------------------------------------------

    def evaluate(
        self,
        snapshot: SnapshotContext | ParsedSnapshot,
        *,
        memo: StoredBlob | None = None,
        with_memo: bool = False,
        activity: Activity | None = None,
        idle: bool = False,
    ) -> Verdict:
        """Project, count, decide, describe. ``with_memo``: first preload the conversation's
        stored ``memo`` (what earlier evaluations computed, on any process), and say in the
        verdict which memo to store now. ``activity``: the conversation's pace as stored (for
        the cost model); ``idle``: decide against ``idle_threshold_tokens`` (the scheduler's
        idle compaction) instead of the threshold."""
        context = self._context(snapshot)
        recent = self.reuse.recent
        conversation_id = context.conversation_id
        prior = recent.counted(conversation_id)
        update = None
        if with_memo:
            known = recent.stored_memo(conversation_id)
            evaluation, update = evaluate_with_memo(context, self.reuse, memo, known, prior)
        else:
            evaluation = evaluate(context, prior)
        recent.remember_counted(conversation_id, evaluation.counted)
        now = self.adapters.now()
        evaluation = self._decided(context, evaluation, activity_of(context, activity, now), idle)
        elided = None
        if evaluation.projection.elided:
            elided = elided_event(
                conversation_id, context.revision, now, elided=evaluation.projection.elided
            )
        skipped = None
        decision = evaluation.decision
        if decision is not None and not decision.compact:
            skipped = skipped_event(
                conversation_id,
                context.revision,
                now,
                why="cost",
                reason=f"cost policy: {decision.reason}",
                trigger=evaluation.trigger(),
                cost=decision.cost,
            )
        elif not evaluation.should_compact:
            reason = (
                "auto-compaction is off"
                if evaluation.threshold is None
                else f"{evaluation.projected_tokens} tokens <= threshold {evaluation.threshold}"
            )
            skipped = skipped_event(
                conversation_id,
                context.revision,
                now,
                why="idle" if idle else "below",
                reason=reason,
                trigger=evaluation.trigger(),
            )
        elif context.config.reduction == "summary":
            # Decided here, on the fast queue: a compaction that cannot pay is never handed to
            # the summarizer (nor costs an LLM call).
            planned = plan_compaction(context, evaluation)
            if planned is not None and not planned.pays:
                skipped = floor_skipped(context, evaluation, planned, now)
        return Verdict(evaluation=evaluation, elided=elided, skipped=skipped, memo=update)

    def _decided(
        self, context: SnapshotContext, evaluation: Evaluation, activity: Activity, idle: bool
    ) -> Evaluation:
        """The evaluation with its pace, and decided as the settings say: against the idle
        threshold, by the cost policy, or (untouched) by the threshold."""
        config = context.config
        evaluation = replace(evaluation, activity=activity)
        if idle:
            return replace(evaluation, threshold=config.idle_threshold_tokens, trigger_kind="idle")
        if config.policy != "cost" or evaluation.threshold is None:
            return evaluation
        cost = estimated_cost(context, evaluation, activity, has_llm=self._has_llm(context))
        decision = decide(
            cost,
            evaluation.projected_tokens,
            evaluation.threshold,
            evaluation.context_window,
            config,
        )
        return replace(evaluation, decision=decision, trigger_kind="cost")

    def _has_llm(self, context: SnapshotContext) -> bool:
        return uses_llm(context, self.adapters.llm is not None)

    # --- compact and describe ----------------------------------------------------------------

    def compact(
        self,
        snapshot: SnapshotContext | ParsedSnapshot,
        evaluation: Evaluation,
        *,
        already_published: Callable[[str], bool] = lambda _event_id: False,
        timings: dict[str, float] | None = None,
        instructions: str | None = None,
    ) -> CompactionEvent | None:
        """The outcome event of a snapshot over the threshold, or None when this exact
        compaction was already published (a redelivered task: no second LLM call).
        ``timings``: counters to which the latency of the summarize, LLM and store-write
        stages is added (:func:`worker.ops.metrics.latency_counters`). ``instructions``: a
        requested compaction's focus, for the summarizer only."""
        context = self._context(snapshot)
        planned = self._planned(context, evaluation, instructions, timings)
        if isinstance(planned, SkippedEvent):
            return _of_request(planned, planned.why or "skipped", evaluation.request_id)
        event_id, source_tokens, make = planned
        if already_published(event_id):
            return None
        return self._completed(context, evaluation, event_id, make, source_tokens, timings)

    def _planned(
        self,
        context: SnapshotContext,
        evaluation: Evaluation,
        instructions: str | None,
        timings: dict[str, float] | None,
    ) -> tuple[str, int, Callable[[], Compaction]] | SkippedEvent:
        """(event id, tokens summarized, what builds the compaction) of the range, summarized
        or reduced as ``[compaction] reduction`` says; the skip when there is nothing to
        compact or the compaction cannot pay."""
        now = self.adapters.now()
        if context.config.reduction != "summary":
            reduction = prepare_reduction(context, evaluation)
            if reduction is None:
                return _nothing_skipped(context, evaluation, now)
            # Pure and cheap, so made now: a strategy that would not make the request smaller
            # by the minimum gain (its placeholders outweighing what the projection already
            # shortened) is no compaction worth breaking the provider's cache for.
            compaction = self._reduced(context, reduction, evaluation, timings)
            if not _gained(context, compaction):
                return no_gain_skipped(context, evaluation, compaction, now)
            # A strategy summarizes nothing: no summary input to cost.
            return reduction.event_id, 0, lambda: compaction
        planned = plan_compaction(context, evaluation)
        if planned is None:
            return _nothing_skipped(context, evaluation, now)
        if not planned.pays:
            return floor_skipped(context, evaluation, planned, now)
        prepared = prepare(context, evaluation, planned, instructions=instructions)
        make = partial(self._summarized, context, prepared, evaluation, timings)
        return prepared.event_id, prepared.request.source_tokens, make

    def _summarized(
        self,
        context: SnapshotContext,
        prepared: PreparedCompaction,
        evaluation: Evaluation,
        timings: dict[str, float] | None,
    ) -> Compaction:
        """The compaction of the prepared range replaced by its summary (per ``mode``)."""
        telemetry = self.adapters.telemetry
        conversation = {"gen_ai.conversation.id": context.conversation_id}
        with telemetry.stage("summarize", attributes=conversation, into=timings) as stage:
            summary = summarize(
                prepared,
                context.config,
                llm=self.adapters.llm,
                digest=self.adapters.digest,
                traced=LLMTracing(telemetry, self.settings.llm, timings),
            )
            stage.set(
                {
                    "compactor.summary.source": summary.source,
                    "compactor.summary.tokens": summary.tokens,
                    "compactor.summary.fallback_reason": summary.fallback_reason,
                }
            )
        return build_compaction(context, prepared, summary, evaluation)

    def _reduced(
        self,
        context: SnapshotContext,
        prepared: PreparedReduction,
        evaluation: Evaluation,
        timings: dict[str, float] | None,
    ) -> Compaction:
        """The compaction of the range as the configured strategy reduced it (timed as the
        summarize stage: the step that makes the replacement)."""
        telemetry = self.adapters.telemetry
        conversation = {"gen_ai.conversation.id": context.conversation_id}
        with telemetry.stage("summarize", attributes=conversation, into=timings) as stage:
            compaction = build_reduction(context, prepared, evaluation)
            stage.set(
                {
                    "compactor.summary.source": compaction.summary.source,
                    "compactor.summary.tokens": compaction.summary.tokens,
                    "compactor.reduction": compaction.reduction,
                }
            )
        return compaction

    def _completed(
        self,
        context: SnapshotContext,
        evaluation: Evaluation,
        event_id: str,
        make: Callable[[], Compaction],
        source_tokens: int,
        timings: dict[str, float] | None,
    ) -> CompactionEvent:
        """The completed event of the compaction ``make`` builds, its transcript written (or
        the failed event saying why not)."""
        parsed = context.parsed
        trigger = evaluation.trigger()
        now = self.adapters.now
        store = self.adapters.store
        conversation = {"gen_ai.conversation.id": parsed.conversation_id}
        try:
            compaction = make()
            if not _gained(context, compaction):
                # Made (an LLM may have been paid), but it would not pay for breaking the
                # provider's cache: nothing is written or published as a compaction.
                skipped = no_gain_skipped(context, evaluation, compaction, now())
                return _of_request(skipped, "no_gain", evaluation.request_id)
            kind = store_kind(store)
            with self.adapters.telemetry.stage(
                "store_write",
                attributes=conversation | {"compactor.store": kind},
                labels={"store": kind},
                into=timings,
            ) as stage:
                ref = store.write(
                    parsed.conversation_id,
                    parsed.revision,
                    event_id,
                    transcript_payload(
                        parsed,
                        compaction,
                        event_id,
                        redact=self.settings.transcripts.redact,
                    ),
                )
                stage.set({"compactor.transcript.bytes": ref.bytes})
        except CompactorError as exc:
            if isinstance(exc, RedisUnavailable):
                raise  # the task retries; every other failure is reported in an event
            failed = failed_event(
                parsed.conversation_id,
                parsed.revision,
                now(),
                code=exc.code,
                message=exc.message,
                trigger=trigger,
            )
            return _of_request(failed, exc.code, evaluation.request_id)
        _enforce_retention(store, parsed, ref.uri)
        decision = evaluation.decision
        cost = measured_cost(
            context,
            compaction,
            source_tokens,
            evaluation.activity or activity_of(context, None, now()),
            decision=decision,
        )
        return completed_event(
            parsed.conversation_id,
            parsed.revision,
            now(),
            event_id=event_id,
            trigger=trigger,
            compaction=compaction.model_copy(update={"transcript": ref}),
            cost=cost,
        )

    def compact_requested(
        self,
        snapshot: SnapshotContext | ParsedSnapshot,
        request: CompactRequest,
        *,
        already_published: Callable[[str], bool] = lambda _event_id: False,
    ) -> CompactionEvent | None:
        """The outcome of a compaction someone asked for: the snapshot (parsed with the
        request's overrides, :meth:`parse`) compacted whatever the threshold says. Its trigger
        is ``requested``, with the request's id and the SHA-256 of its instructions; the
        instructions themselves go to the summarizer only."""
        context = self._context(snapshot)
        return self.compact(
            context,
            self._requested(context, request),
            already_published=already_published,
            instructions=request.instructions,
        )

    def requested_while_held(
        self, snapshot: SnapshotContext | ParsedSnapshot, request: CompactRequest
    ) -> SkippedEvent:
        """The answer to a compaction asked for while another awaits review: none is made
        until that one is approved or declined, as for the snapshots that reach the
        threshold meanwhile."""
        context = self._context(snapshot)
        skipped = skipped_event(
            context.conversation_id,
            context.revision,
            self.adapters.now(),
            why="held",
            reason=HELD_REASON,
            trigger=self._requested(context, request).trigger(),
        )
        return _of_request(skipped, "held", request.request_id)

    def _requested(self, context: SnapshotContext, request: CompactRequest) -> Evaluation:
        prior = self.reuse.recent.counted(context.conversation_id)
        return evaluate(context, prior).requested(request.request_id, request.instructions_sha256)

    def run(self, snapshot: SnapshotContext | ParsedSnapshot) -> list[CompactionEvent]:
        """Everything after parsing, in process: the events to publish, in order."""
        context = self._context(snapshot)
        verdict = self.evaluate(context)
        outcome = verdict.skipped or self.compact(context, verdict.evaluation)
        return [e for e in (verdict.elided, outcome) if e is not None]


_Outcome = TypeVar("_Outcome", SkippedEvent, FailedEvent)


def _gained(context: SnapshotContext, compaction: Compaction) -> bool:
    """Whether a compaction made saves at least the minimum gain."""
    before = compaction.tokens_before
    return before - compaction.tokens_after >= context.config.min_gain_tokens(before)


def _nothing_skipped(
    context: SnapshotContext, evaluation: Evaluation, now: datetime
) -> SkippedEvent:
    return skipped_event(
        context.conversation_id,
        context.revision,
        now,
        why="nothing",
        reason=_nothing_reason(context, evaluation.request_id),
        trigger=evaluation.trigger(),
    )


def floor_skipped(
    context: SnapshotContext, evaluation: Evaluation, planned: PlannedCompaction, now: datetime
) -> SkippedEvent:
    """The skip of a compaction that cannot pay: what it cannot remove (the floor, by part)
    leaves less than the minimum gain, even with a summary at its bound."""
    floor = planned.floor
    parts = ", ".join(
        f"{name.replace('_', ' ')} {tokens}"
        for name, tokens in floor.model_dump(exclude={"total"}).items()
        if tokens
    )
    short = planned.required_gain - (planned.tokens_before - floor.total)
    why = "requested" if evaluation.request_id else "over the threshold"
    reason = (
        f"{why}, but a compaction cannot pay: what it cannot remove ({parts}: {floor.total} "
        f"tokens) leaves less than the gain of {planned.required_gain} tokens it must make "
        f"from {planned.tokens_before}; waiting for {short} more tokens it can remove"
    )
    return skipped_event(
        context.conversation_id,
        context.revision,
        now,
        why="floor",
        reason=reason,
        trigger=evaluation.trigger(),
        floor=floor,
    )


def no_gain_skipped(
    context: SnapshotContext, evaluation: Evaluation, compaction: Compaction, now: datetime
) -> SkippedEvent:
    """The skip of a compaction that, made, saves less than the minimum gain."""
    before, after = compaction.tokens_before, compaction.tokens_after
    need = context.config.min_gain_tokens(before)
    reason = (
        f"the compaction would take the request from {before} to {after} tokens, less than the "
        f"minimum gain of {need}: not published"
    )
    return skipped_event(
        context.conversation_id,
        context.revision,
        now,
        why="no_gain",
        reason=reason,
        trigger=evaluation.trigger(),
    )


def _nothing_reason(context: SnapshotContext, request_id: str | None) -> str:
    """Why a compaction over the threshold (or requested) was made of nothing."""
    why = "over the threshold" if request_id is None else "requested"
    reduction = context.config.reduction
    if reduction == "summary":
        return f"{why}, but nothing outside the protected tail"
    # A strategy within its bound keeps the range as it is: no event would change anything.
    return (
        f"{why}, but nothing outside the protected tail, or the {reduction} reduction keeps "
        "it or would not make the request smaller"
    )


def _of_request(event: _Outcome, part: str, request_id: str | None) -> _Outcome:
    """A requested compaction's skipped or failed event is its own, by its request (as its
    completed one is): a second request of the same revision is answered, not a duplicate."""
    if request_id is None:
        return event
    own = event_id_for(event.conversation_id, event.revision, event.type, part, request_id)
    return event.model_copy(update={"event_id": own})


def _with_overrides(
    payload: bytes | str | Mapping[str, Any], request: CompactRequest, settings: Settings
) -> bytes | str | Mapping[str, Any]:
    """The snapshot with a request's ``config`` and ``tools`` overrides over its own (a
    snapshot that is no JSON object is left for the parse to refuse)."""
    raw = (
        payload
        if isinstance(payload, Mapping)
        else decode_json(payload, max_bytes=settings.compaction.max_snapshot_bytes)
    )
    if not isinstance(raw, Mapping):
        return payload
    merged = dict(raw)
    for name, overrides in (("config", request.config), ("tools", request.tools)):
        own = raw.get(name)
        if overrides:
            merged[name] = (dict(own) if isinstance(own, Mapping) else {}) | overrides
    return merged


def _pins_after(parsed: ParsedSnapshot, messages: list[dict[str, Any]]) -> list[str]:
    """The ids the pinned messages have in ``messages`` (the history with compactions
    applied): a message is found by what it says, whatever its id (a derived id changes when
    a compaction moves the message; every compaction carried it word for word)."""
    said = {
        _said(parsed.snapshot.messages[m.source_index])
        for m in parsed.messages
        if m.pinned and m.source_index >= 0
    }
    ids = formats.source_ids(messages)
    return [mid for mid, raw in zip(ids, messages, strict=True) if _said(raw) in said]


def _said(raw: dict[str, Any]) -> str:
    return canonical_json({k: v for k, v in raw.items() if k != "id"})


def _with_composed(
    parsed: ParsedSnapshot, composed: ComposedCompaction | None
) -> list[dict[str, Any]] | None:
    """The snapshot's messages with every compaction so far applied, when they are a full
    history those compactions replaced part of; None otherwise."""
    snap = parsed.snapshot
    if composed is None or composed.format != snap.format or composed.revision > snap.revision:
        return None
    try:
        return apply_composed(snap.messages, composed)
    except EventMismatch:
        return None  # a compacted history (the agent applies events itself), or an edited one


def store_kind(store: TranscriptStore) -> str:
    """``file``, ``s3`` or ``postgresql``: the scheme a store shows itself with (a bounded
    label of the store-write histogram)."""
    scheme, found, _ = store.display.partition("://")
    return scheme if found else "other"


def _enforce_retention(store: TranscriptStore, parsed: ParsedSnapshot, written: str) -> None:
    """Retention after a write. A failure here costs disk, not correctness: the scheduled
    prune retries it, so the compaction still completes."""
    try:
        store.enforce_count(
            parsed.conversation_id,
            parsed.settings.compaction.max_persisted_transcripts,
            protect=written,
        )
    except (OSError, StorageError):
        log.warning(
            "retention after write failed for %s; prune will retry",
            parsed.conversation_id,
            exc_info=True,
        )
