"""Snapshot -> events: evaluate, select the range, summarize, persist, describe.

The steps are plain functions; :func:`run_pipeline` strings them together for the CLI and the
Celery tasks, which differ only in the adapters they pass in (summarizers, the transcript store,
the clock). Nothing here reads the environment or talks to Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from worker import formats
from worker.cache import ContentCache, recording
from worker.client import apply_compaction
from worker.compaction import (
    RangePlan,
    ToolPolicies,
    fit_carried,
    plan_range,
    resolve_tool_policies,
)
from worker.config import Settings
from worker.errors import (
    CompactorError,
    InvalidSnapshot,
    RedisUnavailable,
)
from worker.facts import extract_facts
from worker.memo import (
    StoredMemo,
    decode_memo,
    encode_memo,
    memo_digest,
    preload,
    worth_rewriting,
)
from worker.models import (
    Compaction,
    CompactionEvent,
    EventError,
    Message,
    Summary,
    Trigger,
    canonical_json,
    event_id_for,
)
from worker.projection import (
    COMPRESSED_CACHE,
    CountedProjection,
    Projection,
    ProjectionPolicy,
    compressed_bodies,
    count_message_tokens,
    count_request_tokens,
    project,
    project_and_count,
)
from worker.snapshots import ParsedSnapshot
from worker.summarize import Summarizer, SummaryRequest
from worker.summarize.digest import DigestSummarizer
from worker.tokens import Tokenizer, tokenizer_for
from worker.transcripts import TranscriptStore

log = logging.getLogger(__name__)

SUMMARY_ID_PREFIX = "cws-"
MUST_KEEP_LIMIT = 60


@dataclass(frozen=True)
class Evaluation:
    counted: CountedProjection
    threshold: int | None
    context_window: int | None
    trigger_kind: str

    @property
    def projection(self) -> Projection:
        return self.counted.projection

    @property
    def projected_tokens(self) -> int:
        return self.counted.tokens

    @property
    def over_threshold(self) -> bool:
        return self.threshold is not None and self.projected_tokens > self.threshold

    def trigger(self) -> Trigger:
        return Trigger(
            kind=self.trigger_kind,
            threshold_tokens=self.threshold,
            projected_tokens=self.projected_tokens,
            context_window=self.context_window,
        )


@dataclass(frozen=True)
class PreparedCompaction:
    plan: RangePlan
    policies: ToolPolicies
    request: SummaryRequest
    event_id: str


@dataclass(frozen=True)
class Adapters:
    """What the pipeline needs from the outside world."""

    store: TranscriptStore
    llm: Summarizer | None = None
    digest: Summarizer = field(default_factory=DigestSummarizer)
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    # True when this compaction's event is already out (a redelivered task): skip the work.
    already_published: Callable[[str], bool] = lambda _event_id: False


def tokenizer_of(parsed: ParsedSnapshot) -> Tokenizer:
    estimate = parsed.settings.compaction.token_counting == "estimate"
    return tokenizer_for(parsed.snapshot.model.name or None, estimate=estimate)


def evaluation_caches(tokenizer: Tokenizer) -> dict[str, ContentCache[Any]]:
    """The caches an evaluation reads, by name: what a conversation's memo carries."""
    caches: dict[str, ContentCache[Any]] = {COMPRESSED_CACHE: compressed_bodies()}
    cache = getattr(tokenizer, "cache", None)
    if isinstance(cache, ContentCache):
        caches[cache.name] = cache
    return caches


@dataclass(frozen=True)
class MemoUpdate:
    """After an evaluation: the memo to store (None: keep the stored one), what this process
    then knows of the stored memo, and what the evaluation had to compute itself."""

    blob: bytes | None
    stored: StoredMemo | None
    texts_tokenized: int = 0
    results_compressed: int = 0

    def counters(self) -> dict[str, float]:
        return {
            "texts_tokenized_total": float(self.texts_tokenized),
            "tool_results_compressed_total": float(self.results_compressed),
        }


def evaluate_with_memo(
    parsed: ParsedSnapshot,
    tokenizer: Tokenizer,
    memo: StoredBlob | None,
    known: StoredMemo | None = None,
    prior: CountedProjection | None = None,
) -> tuple[Evaluation, MemoUpdate]:
    """:func:`evaluate`, first preloading the conversation's stored ``memo`` (what earlier
    evaluations computed) unless ``known`` says this process already has all of it (the store
    then need not send its bytes).

    When the stored memo has fallen behind, this evaluation writes a new one: it then evaluates
    every message (not reusing ``prior``), so that every entry used is noted."""
    caches = evaluation_caches(tokenizer)
    evictions = _evictions(caches)
    stored = _load_memo(memo, known, caches, evictions)
    size = len(parsed.snapshot.messages)
    rewrite = worth_rewriting(size, stored)
    with recording() as recorded:
        evaluation = evaluate(parsed, tokenizer, None if rewrite else prior)
    computed = {
        "texts_tokenized": sum(
            n for name, n in recorded.computed.items() if name != COMPRESSED_CACHE
        ),
        "results_compressed": recorded.computed[COMPRESSED_CACHE],
    }
    if not rewrite:
        return evaluation, MemoUpdate(blob=None, stored=stored, **computed)
    used = {name: recorded.used[name] for name in caches if name in recorded.used}
    blob = encode_memo(used, messages=size)
    # Too big to store: remembered as "none, on purpose" (digest ""), so that the evaluations
    # after this one do not each try again until the conversation has grown.
    digest = memo_digest(blob) if blob is not None else ""
    made = StoredMemo(digest=digest, messages=size, evictions=evictions)
    return evaluation, MemoUpdate(blob=blob, stored=made, **computed)


@dataclass(frozen=True)
class StoredBlob:
    """A conversation's memo as the store returned it: its digest, and its bytes unless the
    reader said it knew that digest."""

    digest: str
    blob: bytes | None = None


def _load_memo(
    memo: StoredBlob | None,
    known: StoredMemo | None,
    caches: dict[str, ContentCache[Any]],
    evictions: int,
) -> StoredMemo | None:
    if memo is None:
        # None stored: the conversation is new, its memo expired, or this process found it too
        # big to store and remembers that.
        return known if known is not None and not known.digest else None
    if known is not None and known.digest == memo.digest:
        if known.evictions != evictions:
            # Some of its entries may have left this process's caches since; those are
            # computed again, and the memo is taken as known from now on.
            return StoredMemo(digest=known.digest, messages=known.messages, evictions=evictions)
        return known  # made or loaded here, and nothing has been evicted since
    if memo.blob is None:
        return None  # the store held back bytes we do not have: evaluate without them
    loaded = decode_memo(memo.blob)
    preload(loaded.entries, caches)
    return StoredMemo(digest=memo.digest, messages=loaded.messages, evictions=_evictions(caches))


def _evictions(caches: dict[str, ContentCache[Any]]) -> int:
    """How many entries the caches have dropped so far: a change means some may be gone."""
    return sum(cache.evictions for cache in caches.values())


def projection_policy(parsed: ParsedSnapshot) -> ProjectionPolicy:
    return ProjectionPolicy.from_config(
        parsed.settings.compaction, model=parsed.snapshot.model.name or None
    )


def evaluate(
    parsed: ParsedSnapshot, tokenizer: Tokenizer, prior: CountedProjection | None = None
) -> Evaluation:
    """Project the history as the next request would see it, count it, resolve the threshold.

    ``prior``: the conversation's last counted projection in this process, whose messages the
    parse may have reused; those are not projected or counted again."""
    config = parsed.settings.compaction
    window = parsed.snapshot.model.context_window
    counted = project_and_count(parsed.messages, projection_policy(parsed), tokenizer, prior)
    return Evaluation(
        counted=counted,
        threshold=config.auto_compact_threshold(window),
        context_window=window,
        trigger_kind=config.auto_compact_trigger,
    )


def prepare(
    parsed: ParsedSnapshot, evaluation: Evaluation, tokenizer: Tokenizer
) -> PreparedCompaction | None:
    """Pick the range and what is carried; None when there is nothing to compact."""
    config = parsed.settings.compaction
    policies = resolve_tool_policies(parsed.settings.tools)

    def count(m: Message) -> int:
        return count_message_tokens(m, tokenizer)

    plan = plan_range(parsed.messages, config, policies, count=count)
    if plan is None or not (plan.to_summarize or plan.previous_summary):
        return None
    fit_carried(
        plan,
        _carry_budget(parsed, evaluation, plan, tokenizer),
        count,
        {m.id: i for i, m in enumerate(parsed.messages)},
    )
    event_id = event_id_for(
        parsed.conversation_id, parsed.revision, "compaction.completed", plan.start, plan.end
    )
    request = SummaryRequest(
        conversation_id=parsed.conversation_id,
        revision=parsed.revision,
        messages=plan.to_summarize,
        previous_summary=plan.previous_summary,
        must_keep=_must_keep(plan.to_summarize),
        max_input_chars=config.summary_max_input_chars,
        max_output_tokens=config.summary_max_output_tokens,
        source_tokens=sum(count(m) for m in plan.to_summarize)
        + (tokenizer.count(plan.previous_summary) if plan.previous_summary else 0),
        model=parsed.snapshot.model.name or None,
    )
    return PreparedCompaction(plan=plan, policies=policies, request=request, event_id=event_id)


def _carry_budget(
    parsed: ParsedSnapshot, evaluation: Evaluation, plan: RangePlan, tokenizer: Tokenizer
) -> int:
    """Tokens the carried messages may use so that the result lands under the threshold."""
    if evaluation.threshold is None:
        return 1 << 62
    kept = [
        m
        for m in evaluation.projection.messages
        if m.source_index < plan.start or m.source_index >= plan.end
    ]
    summary_room = parsed.settings.compaction.summary_max_output_tokens + 16
    return evaluation.threshold - count_request_tokens(kept, tokenizer) - summary_room


def _must_keep(messages: list[Message]) -> list[str]:
    facts = extract_facts(messages)
    items = list(facts.paths)
    for action in facts.failing:
        items.extend(action.error_lines[:1])
    return list(dict.fromkeys(items))[:MUST_KEEP_LIMIT]


def summarize(prepared: PreparedCompaction, settings: Settings, adapters: Adapters) -> Summary:
    """The summary per ``mode``; raises CompactorError when ``remote_only`` cannot get one."""
    mode = settings.compaction.mode
    if mode == "local_only" or (adapters.llm is None and mode == "prefer_remote"):
        reason = None if mode == "local_only" else "no LLM configured"
        summary = adapters.digest.summarize(prepared.request)
        return summary.model_copy(update={"fallback_reason": reason}) if reason else summary
    if adapters.llm is None:
        raise CompactorError(
            "remote_only mode needs an LLM; none is configured", code="llm_not_configured"
        )
    try:
        return adapters.llm.summarize(prepared.request)
    except CompactorError as exc:
        if mode == "remote_only":
            raise
        fallback = adapters.digest.summarize(prepared.request)
        return fallback.model_copy(update={"fallback_reason": f"{exc.code}: {exc.message}"})


def build_compaction(
    parsed: ParsedSnapshot,
    prepared: PreparedCompaction,
    summary: Summary,
    evaluation: Evaluation,
    tokenizer: Tokenizer,
) -> Compaction:
    """The event's compaction (without its transcript): replacement and exact tokens after."""
    snap = parsed.snapshot
    plan = prepared.plan
    with_ids = any("id" in raw for raw in snap.messages)
    replacement = formats.render(snap.format, plan.carried, with_ids=with_ids)
    replacement.append(
        formats.text_message(
            snap.format,
            "user",
            summary.text,
            msg_id=f"{SUMMARY_ID_PREFIX}{prepared.event_id[:16]}" if with_ids else None,
        )
    )
    compaction = Compaction(
        start=plan.start,
        end=plan.end,
        first_id=parsed.source_ids[plan.start],
        last_id=parsed.source_ids[plan.end - 1],
        replacement=replacement,
        summary=summary,
        tool_calls=prepared.policies.default,
        tool_overrides=prepared.policies.overrides,
        tokens_before=evaluation.projected_tokens,
        tokens_after=0,
        format=snap.format,
        preserved_ids=[m.id for m in plan.carried],
    )
    after = tokens_of(
        apply_compaction(snap.messages, compaction, system=snap.system), parsed, tokenizer
    )
    return compaction.model_copy(update={"tokens_after": after})


def tokens_of(
    raw_messages: list[dict[str, Any]], parsed: ParsedSnapshot, tokenizer: Tokenizer
) -> int:
    """Projected request tokens of a wire-format history, under the snapshot's settings."""
    messages = formats.to_messages(
        parsed.snapshot.format, raw_messages, system=parsed.snapshot.system
    )
    return count_request_tokens(project(messages, projection_policy(parsed)).messages, tokenizer)


def transcript_payload(parsed: ParsedSnapshot, compaction: Compaction, event_id: str) -> bytes:
    """The full pre-compaction history, deterministic so a redelivered write is identical."""
    snap = parsed.snapshot
    doc = {
        "conversation_id": snap.conversation_id,
        "revision": snap.revision,
        "format": snap.format,
        "model": snap.model.model_dump(),
        "system": snap.system,
        "messages": snap.messages,
        "compacted": {
            "event_id": event_id,
            "start": compaction.start,
            "end": compaction.end,
            "first_id": compaction.first_id,
            "last_id": compaction.last_id,
        },
    }
    return canonical_json(doc).encode("utf-8")


def _event(
    parsed: ParsedSnapshot, kind: str, now: datetime, *id_parts: object, **fields: Any
) -> CompactionEvent:
    return CompactionEvent(
        type=kind,
        event_id=event_id_for(parsed.conversation_id, parsed.revision, kind, *id_parts),
        conversation_id=parsed.conversation_id,
        revision=parsed.revision,
        created_at=now,
        **fields,
    )


def rejected_event(
    error: InvalidSnapshot, *, conversation_id: str, revision: int, now: datetime
) -> CompactionEvent:
    return CompactionEvent(
        type="compaction.rejected",
        event_id=event_id_for(
            conversation_id, revision, "compaction.rejected", error.field, error.reason
        ),
        conversation_id=conversation_id,
        revision=revision,
        created_at=now,
        reason=error.message,
        error=EventError(code=error.code, message=error.reason, field=error.field or None),
    )


def run_pipeline(parsed: ParsedSnapshot, adapters: Adapters) -> list[CompactionEvent]:
    """Everything after parsing, in process. Returns the events to publish, in order."""
    tokenizer = tokenizer_of(parsed)
    evaluation = evaluate(parsed, tokenizer)
    elided = elided_event(parsed, evaluation, adapters.now())
    outcome = compact_if_needed(parsed, evaluation, tokenizer, adapters)
    return [e for e in (elided, outcome) if e is not None]


def elided_event(
    parsed: ParsedSnapshot, evaluation: Evaluation, now: datetime
) -> CompactionEvent | None:
    """The ``tool_results.elided`` record of a projection that changed something."""
    elided = evaluation.projection.elided
    if not elided:
        return None
    return _event(parsed, "tool_results.elided", now, len(elided), elided=elided)


def skipped_event(parsed: ParsedSnapshot, evaluation: Evaluation, now: datetime) -> CompactionEvent:
    reason = (
        "auto-compaction is off"
        if evaluation.threshold is None
        else f"{evaluation.projected_tokens} tokens <= threshold {evaluation.threshold}"
    )
    return _event(
        parsed, "compaction.skipped", now, "below", trigger=evaluation.trigger(), reason=reason
    )


def failed_event(
    parsed: ParsedSnapshot, error: CompactorError, now: datetime, trigger: Trigger | None = None
) -> CompactionEvent:
    return _event(
        parsed,
        "compaction.failed",
        now,
        error.code,
        trigger=trigger,
        reason=error.message,
        error=EventError(code=error.code, message=error.message),
    )


def compact_if_needed(
    parsed: ParsedSnapshot, evaluation: Evaluation, tokenizer: Tokenizer, adapters: Adapters
) -> CompactionEvent | None:
    """The outcome event, or None when this exact compaction was already published."""
    trigger = evaluation.trigger()
    if not evaluation.over_threshold:
        return skipped_event(parsed, evaluation, adapters.now())
    prepared = prepare(parsed, evaluation, tokenizer)
    if prepared is None:
        return _event(
            parsed,
            "compaction.skipped",
            adapters.now(),
            "nothing",
            trigger=trigger,
            reason="over the threshold, but nothing outside the protected tail",
        )
    if adapters.already_published(prepared.event_id):
        return None
    try:
        summary = summarize(prepared, parsed.settings, adapters)
        compaction = build_compaction(parsed, prepared, summary, evaluation, tokenizer)
        ref = adapters.store.write(
            parsed.conversation_id,
            parsed.revision,
            prepared.event_id,
            transcript_payload(parsed, compaction, prepared.event_id),
        )
    except CompactorError as exc:
        if isinstance(exc, RedisUnavailable):
            raise  # the task retries; every other failure is reported in an event
        return failed_event(parsed, exc, adapters.now(), trigger)
    _enforce_retention(adapters.store, parsed, Path(ref.uri))
    return CompactionEvent(
        type="compaction.completed",
        event_id=prepared.event_id,
        conversation_id=parsed.conversation_id,
        revision=parsed.revision,
        created_at=adapters.now(),
        trigger=trigger,
        compaction=compaction.model_copy(update={"transcript": ref}),
    )


def _enforce_retention(store: TranscriptStore, parsed: ParsedSnapshot, written: Path) -> None:
    """Retention after a write. A failure here costs disk, not correctness: the scheduled
    prune retries it, so the compaction still completes."""
    try:
        store.enforce_count(
            parsed.conversation_id,
            parsed.settings.compaction.max_persisted_transcripts,
            protect=written,
        )
    except OSError:
        log.warning(
            "retention after write failed for %s; prune will retry",
            parsed.conversation_id,
            exc_info=True,
        )
