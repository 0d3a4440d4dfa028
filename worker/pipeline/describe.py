"""The describe step: what a completed compaction event says (the replacement, provenance, the
tokens after) and the transcript written beside it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from worker.core import provenance
from worker.core.projection import CompressionCache, count_request_tokens, project
from worker.core.redaction import redact_json
from worker.pipeline.context import SnapshotContext
from worker.pipeline.evaluate import Evaluation
from worker.pipeline.prepare import PreparedCompaction
from worker.tokens import Tokenizer, counted_by
from worker.wire import formats
from worker.wire.events import Compaction, Summary
from worker.wire.history import apply_built, range_digest_of
from worker.wire.models import canonical_array, canonical_json, canonical_object
from worker.wire.snapshots import ParsedSnapshot

SUMMARY_ID_PREFIX = "cws-"


def build_compaction(
    context: SnapshotContext,
    prepared: PreparedCompaction,
    summary: Summary,
    evaluation: Evaluation,
) -> Compaction:
    """The event's compaction (without its transcript): replacement, provenance (the
    summary's sections by wire id, what was dropped) and exact tokens after."""
    parsed = context.parsed
    snap = parsed.snapshot
    plan = prepared.plan
    ranged = [m for m in parsed.messages if plan.start <= m.source_index < plan.end]
    where = provenance.wire_locations(ranged, parsed.source_ids)
    sections = provenance.published_sections(summary.text, summary.sections, where)
    summary = summary.model_copy(
        update={"sections": sections, "redactions": dict(sorted(prepared.redactions.items()))}
    )
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
        range_sha256=range_digest_of(parsed.message_json[plan.start : plan.end]),
        replacement=replacement,
        summary=summary,
        tool_calls=prepared.policies.default,
        tool_overrides=prepared.policies.overrides,
        tokens_before=evaluation.projected_tokens,
        tokens_after=0,
        tokens_before_counted_by=evaluation.counted_by,
        tokens_after_counted_by=counted_by(context.tokenizer),
        format=snap.format,
        preserved_ids=[m.id for m in plan.carried],
        dropped=provenance.dropped(ranged, plan, prepared.policies, where),
    )
    applied = apply_built(snap.messages, compaction)
    after = history_tokens(applied, context)
    return compaction.model_copy(update={"tokens_after": after})


def tokens_of(
    raw_messages: list[dict[str, Any]],
    parsed: ParsedSnapshot,
    tokenizer: Tokenizer,
    *,
    compressed: CompressionCache | None = None,
) -> int:
    """Projected request tokens of a wire-format history, under the snapshot's settings."""
    return history_tokens(raw_messages, SnapshotContext.of(parsed, tokenizer, compressed))


def history_tokens(raw_messages: list[dict[str, Any]], context: SnapshotContext) -> int:
    """:func:`tokens_of`, with what the snapshot's context has already built."""
    snap = context.snapshot
    messages = formats.to_messages(
        snap.format, raw_messages, system=snap.system, media=context.media
    )
    projection = project(messages, context.policy, compressed=context.compressed)
    return count_request_tokens(projection.messages, context.tokenizer)


def transcript_payload(
    parsed: ParsedSnapshot, compaction: Compaction, event_id: str, *, redact: bool = False
) -> bytes:
    """The full pre-compaction history, deterministic so a redelivered write is identical.
    ``redact`` (``[transcripts] redact``): every string of its system prompt and messages
    redacted as a summarizer's input is, and ``redactions`` counting what was, by kind."""
    snap = parsed.snapshot
    system: Any = snap.system
    # The messages' canonical JSON is the one their range digest was made of (made once).
    messages = parsed.message_json
    counts: Counter[str] = Counter()
    if redact:
        system = redact_json(system, counts)
        messages = [canonical_json(redact_json(raw, counts)) for raw in snap.messages]
    doc: dict[str, Any] = {
        "conversation_id": snap.conversation_id,
        "revision": snap.revision,
        "format": snap.format,
        "model": snap.model.model_dump(),
        "system": system,
        "compacted": {
            "event_id": event_id,
            "start": compaction.start,
            "end": compaction.end,
            "first_id": compaction.first_id,
            "last_id": compaction.last_id,
        },
    }
    if redact:
        doc["redactions"] = dict(sorted(counts.items()))
    fields = {key: canonical_json(value) for key, value in doc.items()}
    fields["messages"] = canonical_array(messages)
    return canonical_object(fields).encode("utf-8")
