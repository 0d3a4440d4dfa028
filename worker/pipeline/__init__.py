"""The one orchestrator: a snapshot's evaluate -> decide -> compact -> describe.

:class:`Pipeline` owns the sequence for every caller: ``compactor compact`` runs it whole in
process (:meth:`Pipeline.run`); the worker service (:mod:`worker.runtime.service`) calls
:meth:`~Pipeline.parse`, :meth:`~Pipeline.evaluate` and :meth:`~Pipeline.compact` between
the steps it owns itself (the lock, the lease, re-runs and publishing). Nothing here reads the
environment or talks to Redis; the outside world comes in as :class:`Adapters`, and what the
process keeps between snapshots as its :class:`~worker.reuse.Reuse`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from worker.cache import ContentCache
from worker.config import Settings
from worker.core import fidelity, provenance
from worker.core.facts import extract_facts
from worker.core.planning import (
    RangePlan,
    ToolPolicies,
    fit_carried,
    plan_range,
    resolve_tool_policies,
)
from worker.core.projection import (
    COMPRESSED_CACHE,
    REPLY_PRIMING_TOKENS,
    CompressionCache,
    CountedProjection,
    Projection,
    ProjectionPolicy,
    count_message_tokens,
    count_request_tokens,
    project,
    project_and_count,
)
from worker.errors import CompactorError, EventMismatch, RedisUnavailable, StorageError
from worker.reuse import Reuse
from worker.reuse.memo import (
    StoredMemo,
    decode_memo,
    encode_memo,
    memo_digest,
    preload,
    worth_rewriting,
)
from worker.summarize import Summarizer, SummaryRequest
from worker.summarize.digest import DigestSummarizer
from worker.tokens import Tokenizer, counted_by
from worker.transcripts import TranscriptStore
from worker.wire import formats
from worker.wire.composed import ComposedCompaction, apply_composed
from worker.wire.events import (
    Compaction,
    CompactionEvent,
    CompletedEvent,
    ElidedEvent,
    SkippedEvent,
    Summary,
    Trigger,
    completed_event,
    elided_event,
    event_id_for,
    failed_event,
    skipped_event,
)
from worker.wire.history import apply_compaction, range_digest
from worker.wire.media import placeholders
from worker.wire.models import Message, canonical_json
from worker.wire.snapshots import ParsedSnapshot, media_rules, parse_snapshot

log = logging.getLogger(__name__)

SUMMARY_ID_PREFIX = "cws-"
MUST_KEEP_LIMIT = 60


@dataclass(frozen=True)
class Adapters:
    """What the pipeline needs from the outside world."""

    store: TranscriptStore
    llm: Summarizer | None = None
    digest: Summarizer = field(default_factory=DigestSummarizer)
    now: Callable[[], datetime] = lambda: datetime.now(UTC)


@dataclass(frozen=True)
class UsagePrefix:
    """The snapshot's ``usage`` as taken: the provider's ``input_tokens`` for the first
    ``message_count`` wire messages, and our own count of that prefix (``counted``)."""

    input_tokens: int
    message_count: int
    counted: int

    @property
    def offset(self) -> int:
        """What the provider counted beyond our count of the prefix (its tokenizer, tool
        definitions, anything the snapshot does not show)."""
        return self.input_tokens - self.counted


@dataclass(frozen=True)
class Evaluation:
    """The projected request, counted, against the resolved threshold. With a ``usage`` taken,
    the prefix it covers counts as the provider said, and only the messages after it are
    counted by ``tokenizer_counted_by``."""

    counted: CountedProjection
    threshold: int | None
    context_window: int | None
    trigger_kind: str
    tokenizer_counted_by: str = "tiktoken"
    usage: UsagePrefix | None = None
    usage_ignored: str | None = None

    @property
    def projection(self) -> Projection:
        return self.counted.projection

    @property
    def projected_tokens(self) -> int:
        if self.usage is not None:
            return self.counted.tokens + self.usage.offset
        return self.counted.tokens

    @property
    def counted_by(self) -> str:
        prefix = "usage+" if self.usage is not None else ""
        return prefix + self.tokenizer_counted_by

    @property
    def over_threshold(self) -> bool:
        return self.threshold is not None and self.projected_tokens > self.threshold

    def trigger(self) -> Trigger:
        return Trigger(
            kind=self.trigger_kind,
            threshold_tokens=self.threshold,
            projected_tokens=self.projected_tokens,
            context_window=self.context_window,
            counted_by=self.counted_by,
            usage_ignored=self.usage_ignored,
        )


@dataclass(frozen=True)
class StoredBlob:
    """A conversation's memo as the store returned it: its digest, and its bytes unless the
    reader said it knew that digest."""

    digest: str
    blob: bytes | None = None


@dataclass(frozen=True)
class MemoUpdate:
    """After an evaluation: the memo to store (None: keep the stored one), what this process
    then knows of the stored memo, and what the evaluation had to compute itself."""

    blob: bytes | None
    stored: StoredMemo | None
    texts_tokenized: int = 0
    results_compressed: int = 0

    @property
    def digest(self) -> str:
        """The digest to store beside ``blob`` ("" when there is none to store)."""
        return self.stored.digest if self.blob and self.stored else ""

    def counters(self) -> dict[str, float]:
        return {
            "texts_tokenized_total": float(self.texts_tokenized),
            "tool_results_compressed_total": float(self.results_compressed),
        }


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
        return self.evaluation.over_threshold


@dataclass(frozen=True)
class PreparedCompaction:
    plan: RangePlan
    policies: ToolPolicies
    request: SummaryRequest
    event_id: str


class Pipeline:
    """Evaluate -> decide -> compact -> describe, for the CLI and the workers alike."""

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
    ) -> ParsedSnapshot:
        """The validated snapshot (InvalidSnapshot otherwise), evaluated against the compacted
        history: a full history (one that holds what the compactions replaced) gets every
        compaction so far at once (``composed``); any other gets the compactions already
        ``published`` for earlier revisions that it does not contain yet, applied in order.
        The conversation's last parse in this process (by ``conversation_id``) is reused for
        the messages they share."""
        recent = self.reuse.recent
        earlier = recent.get(conversation_id) if conversation_id else None
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

    # --- evaluate and decide -----------------------------------------------------------------

    def tokenizer(self, parsed: ParsedSnapshot) -> Tokenizer:
        return tokenizer_of(parsed, self.reuse)

    def evaluate(
        self, parsed: ParsedSnapshot, *, memo: StoredBlob | None = None, with_memo: bool = False
    ) -> Verdict:
        """Project, count, decide, describe. ``with_memo``: first preload the conversation's
        stored ``memo`` (what earlier evaluations computed, on any process), and say in the
        verdict which memo to store now."""
        recent = self.reuse.recent
        conversation_id = parsed.conversation_id
        prior = recent.counted(conversation_id)
        update = None
        if with_memo:
            known = recent.stored_memo(conversation_id)
            evaluation, update = evaluate_with_memo(parsed, self.reuse, memo, known, prior)
        else:
            tokenizer = self.tokenizer(parsed)
            evaluation = evaluate(parsed, tokenizer, prior, compressed=self.reuse.compressed)
        recent.remember_counted(conversation_id, evaluation.counted)
        now = self.adapters.now()
        elided = None
        if evaluation.projection.elided:
            elided = elided_event(
                conversation_id, parsed.revision, now, elided=evaluation.projection.elided
            )
        skipped = None
        if not evaluation.over_threshold:
            reason = (
                "auto-compaction is off"
                if evaluation.threshold is None
                else f"{evaluation.projected_tokens} tokens <= threshold {evaluation.threshold}"
            )
            skipped = skipped_event(
                conversation_id,
                parsed.revision,
                now,
                why="below",
                reason=reason,
                trigger=evaluation.trigger(),
            )
        return Verdict(evaluation=evaluation, elided=elided, skipped=skipped, memo=update)

    # --- compact and describe ----------------------------------------------------------------

    def compact(
        self,
        parsed: ParsedSnapshot,
        evaluation: Evaluation,
        *,
        already_published: Callable[[str], bool] = lambda _event_id: False,
    ) -> CompactionEvent | None:
        """The outcome event of a snapshot over the threshold, or None when this exact
        compaction was already published (a redelivered task: no second LLM call)."""
        tokenizer = self.tokenizer(parsed)
        trigger = evaluation.trigger()
        now = self.adapters.now
        prepared = prepare(parsed, evaluation, tokenizer)
        if prepared is None:
            return skipped_event(
                parsed.conversation_id,
                parsed.revision,
                now(),
                why="nothing",
                reason="over the threshold, but nothing outside the protected tail",
                trigger=trigger,
            )
        if already_published(prepared.event_id):
            return None
        store = self.adapters.store
        try:
            summary = summarize(prepared, parsed.settings, self.adapters)
            compaction = build_compaction(
                parsed, prepared, summary, evaluation, tokenizer, self.reuse.compressed
            )
            ref = store.write(
                parsed.conversation_id,
                parsed.revision,
                prepared.event_id,
                transcript_payload(parsed, compaction, prepared.event_id),
            )
        except CompactorError as exc:
            if isinstance(exc, RedisUnavailable):
                raise  # the task retries; every other failure is reported in an event
            return failed_event(
                parsed.conversation_id,
                parsed.revision,
                now(),
                code=exc.code,
                message=exc.message,
                trigger=trigger,
            )
        _enforce_retention(store, parsed, ref.uri)
        return completed_event(
            parsed.conversation_id,
            parsed.revision,
            now(),
            event_id=prepared.event_id,
            trigger=trigger,
            compaction=compaction.model_copy(update={"transcript": ref}),
        )

    def run(self, parsed: ParsedSnapshot) -> list[CompactionEvent]:
        """Everything after parsing, in process: the events to publish, in order."""
        verdict = self.evaluate(parsed)
        outcome = verdict.skipped or self.compact(parsed, verdict.evaluation)
        return [e for e in (verdict.elided, outcome) if e is not None]


# --- the steps, as functions ---------------------------------------------------------------


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


def tokenizer_of(parsed: ParsedSnapshot, reuse: Reuse) -> Tokenizer:
    """The process's tokenizer for the snapshot's model (or the estimate, if configured)."""
    estimate = parsed.settings.compaction.token_counting == "estimate"
    return reuse.tokenizer(parsed.snapshot.model.name or None, estimate=estimate)


def evaluate_with_memo(
    parsed: ParsedSnapshot,
    reuse: Reuse,
    memo: StoredBlob | None,
    known: StoredMemo | None = None,
    prior: CountedProjection | None = None,
) -> tuple[Evaluation, MemoUpdate]:
    """:func:`evaluate`, first preloading the conversation's stored ``memo`` (what earlier
    evaluations computed) unless ``known`` says this process already has all of it (the store
    then need not send its bytes).

    When the stored memo has fallen behind, this evaluation writes a new one: it then evaluates
    every message (not reusing ``prior``), so that every entry used is noted."""
    tokenizer = tokenizer_of(parsed, reuse)
    caches = reuse.memo_caches(tokenizer)
    evictions = _evictions(caches)
    stored = _load_memo(memo, known, caches, evictions)
    size = len(parsed.snapshot.messages)
    rewrite = worth_rewriting(size, stored)
    with reuse.recording() as recorded:
        evaluation = evaluate(
            parsed, tokenizer, None if rewrite else prior, compressed=reuse.compressed
        )
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


def projection_policy(parsed: ParsedSnapshot) -> ProjectionPolicy:
    return ProjectionPolicy.from_config(
        parsed.settings.compaction, model=parsed.snapshot.model.name or None
    )


def evaluate(
    parsed: ParsedSnapshot,
    tokenizer: Tokenizer,
    prior: CountedProjection | None = None,
    *,
    compressed: CompressionCache | None = None,
) -> Evaluation:
    """Project the history as the next request would see it, count it, resolve the threshold.

    ``prior``: the conversation's last counted projection in this process, whose messages the
    parse may have reused; those are not projected or counted again."""
    config = parsed.settings.compaction
    window = parsed.snapshot.model.context_window
    counted = project_and_count(
        parsed.messages, projection_policy(parsed), tokenizer, prior, compressed=compressed
    )
    usage, ignored = take_usage(parsed, counted)
    return Evaluation(
        counted=counted,
        threshold=config.auto_compact_threshold(window),
        context_window=window,
        trigger_kind=config.auto_compact_trigger,
        tokenizer_counted_by=counted_by(tokenizer),
        usage=usage,
        usage_ignored=ignored,
    )


# A usage is taken when the provider's count of the prefix is at least half of ours (less means
# it cannot be the request we count: cached input tokens left out, another prefix) and at most
# four times ours plus 32,000 (a tokenizer that needs more tokens, tool definitions and a system
# prompt the snapshot does not show).
USAGE_MIN_SHARE = 0.5
USAGE_MAX_FACTOR = 4
USAGE_MAX_EXTRA = 32_000


def take_usage(
    parsed: ParsedSnapshot, counted: CountedProjection
) -> tuple[UsagePrefix | None, str | None]:
    """The snapshot's ``usage`` as the count of the prefix it covers, or why it is ignored
    (logged). Usage that cannot describe this snapshot (more messages than it has, negative
    numbers) was rejected with the snapshot already."""
    usage = parsed.snapshot.usage
    if usage is None:
        return None, None
    k = usage.message_count
    ours = REPLY_PRIMING_TOKENS + sum(
        n
        for m, n in zip(counted.projection.messages, counted.counts, strict=True)
        if m.source_index < k
    )
    reason = None
    if usage.input_tokens < ours * USAGE_MIN_SHARE:
        reason = (
            f"usage says {usage.input_tokens} input tokens for the first {k} messages, less than "
            f"half of our count of them ({ours}): not that request (were cached input tokens "
            "left out?)"
        )
    elif usage.input_tokens > ours * USAGE_MAX_FACTOR + USAGE_MAX_EXTRA:
        reason = (
            f"usage says {usage.input_tokens} input tokens for the first {k} messages, more "
            f"than {USAGE_MAX_FACTOR} times our count of them ({ours}) plus {USAGE_MAX_EXTRA}"
        )
    if reason is not None:
        log.warning(
            "ignoring usage of %s revision %s: %s", parsed.conversation_id, parsed.revision, reason
        )
        return None, reason
    return UsagePrefix(input_tokens=usage.input_tokens, message_count=k, counted=ours), None


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
        previous_summary_ids=plan.summary_ids,
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
    # What the provider counts beyond our count (usage) is assumed to stay after compaction.
    beyond = max(evaluation.usage.offset, 0) if evaluation.usage is not None else 0
    return evaluation.threshold - count_request_tokens(kept, tokenizer) - summary_room - beyond


def _must_keep(messages: list[Message]) -> list[str]:
    """Paths, the first line of each failure, and a placeholder per image or file: the
    summary names the range's images, so the model knows they existed."""
    facts = extract_facts(messages)
    items = list(facts.paths)
    for action in facts.failing:
        items.extend(action.error_lines[:1])
    items += [name for m in messages for name in placeholders(m.id, m.attachments)]
    return list(dict.fromkeys(items))[:MUST_KEEP_LIMIT]


def summarize(prepared: PreparedCompaction, settings: Settings, adapters: Adapters) -> Summary:
    """The summary per ``mode``, checked against the range's must-keep facts and repaired
    (``summary.fidelity``); raises CompactorError when ``remote_only`` cannot get one."""
    config = settings.compaction
    mode = config.mode
    facts, carried = _must_keep_facts(prepared, config.delegation_tools)

    def checked(summary: Summary) -> Summary:
        request = prepared.request
        limit = request.max_output_tokens
        if summary.source == "llm":  # never longer than what it replaces, as llm.py enforces
            limit = min(limit, request.source_tokens)
        summary = fidelity.ensure(summary, facts, carried, limit=limit, model=request.model)
        if summary.source == "llm":  # the digest says what it drew from; the LLM's is read
            summary = provenance.attribute(summary, provenance.anchors(facts, request.messages))
        return summary

    def digest(reason: str | None) -> Summary:
        summary = adapters.digest.summarize(prepared.request)
        summary = summary.model_copy(update={"fallback_reason": reason}) if reason else summary
        return checked(summary)

    if mode == "local_only" or (adapters.llm is None and mode == "prefer_remote"):
        return digest(None if mode == "local_only" else "no LLM configured")
    if adapters.llm is None:
        raise CompactorError(
            "remote_only mode needs an LLM; none is configured", code="llm_not_configured"
        )
    try:
        summary = adapters.llm.summarize(prepared.request)
    except CompactorError as exc:
        if mode == "remote_only":
            raise
        return digest(f"{exc.code}: {exc.message}")
    score = fidelity.score(facts, summary.text, carried)
    if mode == "prefer_remote" and score < config.min_summary_fidelity:
        return digest(
            f"summary_fidelity: the LLM summary kept {score:.0%} of the must-keep facts, "
            f"below min_summary_fidelity {config.min_summary_fidelity:g}"
        )
    return checked(summary)


def _must_keep_facts(
    prepared: PreparedCompaction, delegation_tools: list[str]
) -> tuple[list[fidelity.Fact], str]:
    """The range's must-keep facts (summarized and carried messages, in order) and the text of
    the carried messages they may be found in."""
    plan = prepared.plan
    request = prepared.request  # its messages: the very objects the digest and _must_keep saw
    facts = fidelity.extract_must_keep(request.messages, delegation_tools, plan.carried)
    return facts, fidelity.carried_text(plan.carried)


def build_compaction(
    parsed: ParsedSnapshot,
    prepared: PreparedCompaction,
    summary: Summary,
    evaluation: Evaluation,
    tokenizer: Tokenizer,
    compressed: CompressionCache | None = None,
) -> Compaction:
    """The event's compaction (without its transcript): replacement, provenance (the
    summary's sections by wire id, what was dropped) and exact tokens after."""
    snap = parsed.snapshot
    plan = prepared.plan
    ranged = [m for m in parsed.messages if plan.start <= m.source_index < plan.end]
    where = provenance.wire_locations(ranged, parsed.source_ids)
    sections = provenance.published_sections(summary.text, summary.sections, where)
    summary = summary.model_copy(update={"sections": sections})
    with_ids = any("id" in raw for raw in snap.messages)
    replacement = formats.render(snap.format, plan.carried, with_ids=with_ids, source=snap.messages)
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
        range_sha256=range_digest(snap.messages[plan.start : plan.end]),
        replacement=replacement,
        summary=summary,
        tool_calls=prepared.policies.default,
        tool_overrides=prepared.policies.overrides,
        tokens_before=evaluation.projected_tokens,
        tokens_after=0,
        tokens_before_counted_by=evaluation.counted_by,
        tokens_after_counted_by=counted_by(tokenizer),
        format=snap.format,
        preserved_ids=[m.id for m in plan.carried],
        dropped=provenance.dropped(ranged, plan, prepared.policies, where),
    )
    applied = apply_compaction(snap.messages, compaction)
    after = tokens_of(applied, parsed, tokenizer, compressed=compressed)
    return compaction.model_copy(update={"tokens_after": after})


def tokens_of(
    raw_messages: list[dict[str, Any]],
    parsed: ParsedSnapshot,
    tokenizer: Tokenizer,
    *,
    compressed: CompressionCache | None = None,
) -> int:
    """Projected request tokens of a wire-format history, under the snapshot's settings."""
    snap = parsed.snapshot
    messages = formats.to_messages(
        snap.format,
        raw_messages,
        system=snap.system,
        media=media_rules(snap.format, parsed.settings.compaction),
    )
    projection = project(messages, projection_policy(parsed), compressed=compressed)
    return count_request_tokens(projection.messages, tokenizer)


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
