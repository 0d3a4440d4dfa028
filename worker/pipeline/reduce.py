"""The reduce step: under a ``[compaction] reduction`` strategy, the range (picked as for a
summary) is cut down by the strategy instead of summarized, and described as a summary's
compaction is: replacement, provenance, exact tokens after. No summarizer is called, so the
fidelity gate, its repair and the summary's cost do not apply."""

from __future__ import annotations

from dataclasses import dataclass

from worker.core import provenance
from worker.core.planning import range_bounds
from worker.core.reduction import ReducedRange, marker_text, reduce_range, strategy_for
from worker.pipeline.context import SnapshotContext
from worker.pipeline.describe import SUMMARY_ID_PREFIX, history_tokens
from worker.pipeline.evaluate import Evaluation
from worker.tokens import counted_by
from worker.wire import formats
from worker.wire.events import Compaction, DroppedItem, Summary, SummarySection, event_id_for
from worker.wire.history import apply_built, range_digest_of
from worker.wire.media import placeholders
from worker.wire.models import Message


@dataclass(frozen=True)
class PreparedReduction:
    """A range and what the strategy made of it, under the event id it is published as."""

    start: int
    end: int
    reduced: ReducedRange
    event_id: str


def prepare_reduction(context: SnapshotContext, evaluation: Evaluation) -> PreparedReduction | None:
    """The range reduced by the configured strategy; None when there is no range or the
    strategy leaves it as it is (nothing to compact)."""
    messages = context.messages
    bounds = range_bounds(messages)
    if bounds is None:
        return None
    start, end = bounds
    strategy = strategy_for(context.config, context.tokenizer, evaluation.threshold)
    opens_with_user = formats.opens_with_user(context.parsed.snapshot.format)
    reduced = reduce_range(messages, start, end, strategy, opens_with_user=opens_with_user)
    if not reduced.changed:
        return None
    requested = [evaluation.request_id] if evaluation.request_id else []
    # The reduction is part of the id: a summary of the same range is another edit.
    event_id = event_id_for(
        context.conversation_id,
        context.revision,
        "compaction.completed",
        start,
        end,
        *requested,
        context.config.reduction,
    )
    return PreparedReduction(start=start, end=end, reduced=reduced, event_id=event_id)


def build_reduction(
    context: SnapshotContext, prepared: PreparedReduction, evaluation: Evaluation
) -> Compaction:
    """The event's compaction (without its transcript): the marker (where messages were
    omitted) and the kept messages, provenance, and exact tokens after."""
    parsed = context.parsed
    snap = parsed.snapshot
    start, end, reduced = prepared.start, prepared.end, prepared.reduced
    ranged = [m for m in parsed.messages if start <= m.source_index < end]
    where = provenance.wire_locations(ranged, parsed.source_ids)
    with_ids = any("id" in raw for raw in snap.messages)
    config = context.config
    text = marker_text(
        config.reduction, parsed.revision, reduced.omitted_count, reduced.masked_count
    )
    msg_id = f"{SUMMARY_ID_PREFIX}{prepared.event_id[:16]}" if with_ids else None
    replacement = formats.render(snap.format, reduced.kept, with_ids=with_ids, source=snap.messages)
    # Last, as a summary is: an agent knows an event is applied by its last message.
    replacement.append(formats.text_message(snap.format, "user", text, msg_id=msg_id))
    compaction = Compaction(
        start=start,
        end=end,
        first_id=parsed.source_ids[start],
        last_id=parsed.source_ids[end - 1],
        range_sha256=range_digest_of(parsed.message_json[start:end]),
        replacement=replacement,
        summary=_summary(context, text, reduced, where),
        tokens_before=evaluation.projected_tokens,
        tokens_after=0,
        tokens_before_counted_by=evaluation.counted_by,
        tokens_after_counted_by=counted_by(context.tokenizer),
        format=snap.format,
        preserved_ids=[m.id for m in reduced.kept],
        dropped=_dropped(ranged, reduced, where),
        reduction=context.config.reduction,
    )
    after = history_tokens(apply_built(snap.messages, compaction), context)
    return compaction.model_copy(update={"tokens_after": after})


def _summary(
    context: SnapshotContext,
    text: str,
    reduced: ReducedRange,
    where: dict[str, tuple[int, str]],
) -> Summary:
    """The marker as the event's summary, drawn from the messages it stands for: those
    omitted and those whose output it replaced."""
    ids = [m.id for m in reduced.omitted] + sorted(reduced.rewritten)
    section = SummarySection(title="", source_ids=ids)
    return Summary(
        text=text,
        tokens=context.tokenizer.count(text),
        source="strategy",
        sections=provenance.published_sections(text, [section], where),
    )


def _dropped(
    ranged: list[Message], reduced: ReducedRange, where: dict[str, tuple[int, str]]
) -> list[DroppedItem]:
    """Each omitted wire message once, and each rewritten tool output, in conversation order."""
    names = {c.id: c.name for m in ranged for c in m.tool_calls}
    omitted: dict[str, int] = {}  # wire id -> bytes of its omitted parts
    images: dict[str, list[str]] = {}  # wire id -> its omitted images and files, as named
    for m in reduced.omitted:
        wire_id = where[m.id][1]
        omitted[wire_id] = omitted.get(wire_id, 0) + _size(m)
        images.setdefault(wire_id, []).extend(placeholders(m.id, m.attachments))
    out: list[DroppedItem] = []
    for m in ranged:
        wire_id = where[m.id][1]
        if wire_id in omitted:
            size = omitted.pop(wire_id)
            out.append(DroppedItem(message_id=wire_id, kind="message_omitted", bytes=size))
            out.extend(
                DroppedItem(message_id=wire_id, kind="attachment_dropped", attachment=name)
                for name in images.get(wire_id, [])
            )
        elif m.id in reduced.rewritten:
            tool = names.get(m.tool_call_id or "", m.tool_name or "") or None
            item = DroppedItem(
                message_id=wire_id,
                kind="tool_output_omitted",
                call_id=m.tool_call_id,
                tool=tool,
                bytes=len(m.content.encode("utf-8", "surrogatepass")),
            )
            out.append(item)
    return out


def _size(message: Message) -> int:
    arguments = "".join(c.arguments for c in message.tool_calls)
    return len((message.content + arguments).encode("utf-8", "surrogatepass"))
