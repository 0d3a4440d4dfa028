"""A compaction and a conversation's history of them, for a person: what the inspector
(``compactor serve``'s ``/ui``) and ``compactor show`` render.

:func:`compaction_view` puts the messages a compaction replaced (from its transcript) beside
what replaced them: the messages carried verbatim and the summary, split into its sections,
each with the messages it was drawn from and each replaced message with the sections that drew
from it. :func:`timeline` reads a conversation's events into the points of its token chart.

Pure: the caller reads the events and the transcript (and checks its sha256); events are read
tolerantly, from their JSON documents, so fields a newer version added (redaction counts, say)
are shown when present and a type this version does not know is still listed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from worker.core.provenance import headings
from worker.errors import CompactorError, EventMismatch
from worker.wire import formats
from worker.wire.events import (
    OUTCOME_TYPES,
    CompletedEvent,
    DroppedItem,
    Fidelity,
    Trigger,
    parse_event,
)
from worker.wire.history import range_digest
from worker.wire.models import WireFormat

__all__ = [
    "CompactionView",
    "Point",
    "ReplacedMessage",
    "Section",
    "Timeline",
    "compaction_view",
    "readable_messages",
    "redactions",
    "timeline",
]

# The event type a held compaction (review before apply) is published as; listed when present.
PROPOSED = "compaction.proposed"


def readable_messages(fmt: WireFormat, wire: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of each message, as normalized for every format (tool calls as
    ``→ NAME ARGUMENTS``); the wire JSON for what does not normalize."""
    try:
        messages = formats.to_messages(fmt, list(wire))
    except CompactorError:
        return [(str(m.get("role", "?")), json.dumps(m, ensure_ascii=False)) for m in wire]
    out = []
    for m in messages:
        role = f"{m.role} ({m.tool_name})" if m.tool_name else str(m.role)
        parts = [m.content] if m.content else []
        parts += [f"→ {call.name} {call.arguments}" for call in m.tool_calls]
        parts += [f"[{a.kind}: {a.label}]" for a in m.attachments]
        out.append((role, "\n".join(parts)))
    return out


@dataclass(frozen=True)
class Section:
    """One section of the summary: its heading (``""`` for the text before the first), its
    text, and the ids of the replaced messages it was drawn from (``omitted_ids`` more were
    not listed)."""

    number: int
    title: str
    text: str
    source_ids: tuple[str, ...] = ()
    omitted_ids: int = 0


@dataclass(frozen=True)
class ReplacedMessage:
    """A message the compaction replaced, whole, and the sections (numbers) drawn from it."""

    id: str
    role: str
    text: str
    sections: tuple[int, ...] = ()


@dataclass(frozen=True)
class CompactionView:
    """One compaction: the replaced messages beside the carried ones and the summary."""

    event: CompletedEvent
    replaced: list[ReplacedMessage]
    transcript_problem: str | None  # why ``replaced`` is empty (pruned, does not match)
    carried: list[tuple[str, str]]  # (role, text) of the replacement's other messages
    sections: list[Section]
    dropped: list[DroppedItem]
    fidelity: Fidelity | None
    redactions: dict[str, int] | None


def compaction_view(
    event: CompletedEvent,
    original: Sequence[dict[str, Any]] | None,
    *,
    raw: Mapping[str, Any] | None = None,
    transcript_problem: str | None = None,
) -> CompactionView:
    """``event`` beside the messages it replaced, taken from ``original`` (its transcript's
    messages, whose sha256 the caller checked; None when it cannot be read, ``transcript_problem``
    saying why). The range must hash to the event's ``range_sha256``. ``raw``: the event's JSON
    document, for fields this version does not model."""
    c = event.compaction
    sections = _sections(c.summary.text, c.summary.sections)
    replaced: list[ReplacedMessage] = []
    problem = transcript_problem
    if original is not None:
        try:
            replaced = _replaced(event, list(original), sections)
        except EventMismatch as exc:
            problem = str(exc)
    carried = [
        (role, text)
        for role, text in readable_messages(c.format, c.replacement)
        if not (c.summary.text and c.summary.text in text)
    ]
    return CompactionView(
        event=event,
        replaced=replaced,
        transcript_problem=problem,
        carried=carried,
        sections=sections,
        dropped=list(c.dropped),
        fidelity=c.summary.fidelity,
        redactions=redactions(raw) if raw is not None else None,
    )


def _sections(text: str, published: Sequence[Any]) -> list[Section]:
    """The summary's text cut at its headings, each piece with the sources its published
    section names (matched by title, in order)."""
    cuts = headings(text)
    pieces: list[tuple[str, str]] = []
    starts = [offset for _title, offset in cuts]
    if not cuts or starts[0] > 0:
        pieces.append(("", text[: starts[0] if cuts else len(text)]))
    for k, (title, offset) in enumerate(cuts):
        end = starts[k + 1] if k + 1 < len(cuts) else len(text)
        pieces.append((title, text[offset:end]))
    unused = list(published)
    out = []
    for number, (title, body) in enumerate(pieces, start=1):
        match = next((s for s in unused if s.title == title), None)
        if match is not None:
            unused.remove(match)
        out.append(
            Section(
                number=number,
                title=title,
                text=body.strip("\n"),
                source_ids=tuple(match.source_ids) if match else (),
                omitted_ids=match.omitted_ids if match else 0,
            )
        )
    return [s for s in out if s.text.strip() or s.source_ids]


def _replaced(
    event: CompletedEvent, original: list[dict[str, Any]], sections: list[Section]
) -> list[ReplacedMessage]:
    c = event.compaction
    ids = formats.source_ids(original)
    try:
        start = ids.index(c.first_id)
        last = ids.index(c.last_id, start)
    except ValueError:
        raise EventMismatch("the transcript does not hold the replaced range") from None
    wire = original[start : last + 1]
    if c.range_sha256 is not None and range_digest(wire) != c.range_sha256:
        raise EventMismatch("the transcript's range does not match the compaction") from None
    drawn: dict[str, list[int]] = {}
    for section in sections:
        for source in section.source_ids:
            drawn.setdefault(source, []).append(section.number)
    readable = readable_messages(c.format, wire)
    if len(readable) != len(wire):  # a format that pairs items: one text per wire message
        readable = [(str(m.get("role", "?")), json.dumps(m, ensure_ascii=False)) for m in wire]
    return [
        ReplacedMessage(id=mid, role=role, text=text, sections=tuple(drawn.get(mid, ())))
        for mid, (role, text) in zip(ids[start : last + 1], readable, strict=True)
    ]


def redactions(raw: Mapping[str, Any]) -> dict[str, int] | None:
    """Counts of what was redacted, by kind, if the event says (``redactions`` on the event,
    its compaction or its summary: a count, or counts by kind); None when it does not."""
    compaction = raw.get("compaction") if isinstance(raw.get("compaction"), Mapping) else {}
    assert isinstance(compaction, Mapping)
    summary = compaction.get("summary") if isinstance(compaction.get("summary"), Mapping) else {}
    assert isinstance(summary, Mapping)
    for where in (raw, compaction, summary):
        found = where.get("redactions")
        if isinstance(found, bool):
            continue
        if isinstance(found, int):
            return {"total": found}
        if isinstance(found, Mapping):
            counts = {str(k): v for k, v in found.items() if isinstance(v, int)}
            return {k: v for k, v in counts.items() if not isinstance(v, bool)}
    return None


# --- the timeline -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One event of the timeline: its stream id, type and revision; the request's tokens
    before and after it (None: not counted), the threshold, and what a person reads of it."""

    stream_id: str
    event_id: str
    type: str
    revision: int
    created_at: str
    before: int | None = None
    after: int | None = None
    threshold: int | None = None
    note: str = ""
    reverted: bool = False


@dataclass(frozen=True)
class Timeline:
    points: list[Point]
    newest_completed: str | None  # the event id a restore may name
    proposed: list[Point] = field(default_factory=list)  # held for review, not yet decided

    @property
    def outcomes(self) -> list[Point]:
        # A held proposal settles its revision too, but the chart shows what was applied.
        return [p for p in self.points if p.type in OUTCOME_TYPES and p.type != PROPOSED]


def timeline(entries: Sequence[tuple[str, Mapping[str, Any]]]) -> Timeline:
    """The conversation's events (stream id, JSON document; oldest first) as points."""
    reverted = {
        str(doc.get("reverted_event_id"))
        for _sid, doc in entries
        if doc.get("type") == "compaction.reverted"
    }
    decided = {
        str(doc.get("proposal_event_id")) for _sid, doc in entries if doc.get("type") != PROPOSED
    }
    points = [_point(sid, doc, reverted) for sid, doc in entries]
    completed = [p for p in points if p.type == "compaction.completed" and not p.reverted]
    proposed = [p for p in points if p.type == PROPOSED and p.event_id not in decided]
    return Timeline(
        points=points,
        newest_completed=completed[-1].event_id if completed else None,
        proposed=proposed,
    )


def _point(stream_id: str, doc: Mapping[str, Any], reverted: set[str]) -> Point:
    kind = str(doc.get("type", "?"))
    head = Point(
        stream_id=stream_id,
        event_id=str(doc.get("event_id", "")),
        type=kind,
        revision=_int(doc.get("revision")) or 0,
        created_at=str(doc.get("created_at", "")),
    )
    compaction = doc.get("compaction")
    if kind == PROPOSED and isinstance(compaction, Mapping):  # held: what it would do
        # Read as a dict: a proposal is shown however little of it this version can read.
        trigger_doc = doc.get("trigger")
        limit = trigger_doc.get("threshold_tokens") if isinstance(trigger_doc, Mapping) else None
        before = _int(compaction.get("tokens_before"))
        after = _int(compaction.get("tokens_after"))
        return replace(
            head, before=before, after=after, threshold=_int(limit), note="held for review"
        )
    try:
        event = parse_event(dict(doc))
    except ValueError:
        return replace(head, note="(an event this version cannot read)")
    trigger = getattr(event, "trigger", None)
    if not isinstance(trigger, Trigger):  # none, or a newer type's (read as a dict)
        trigger = None
    threshold = trigger.threshold_tokens if trigger is not None else None
    tokens = trigger.projected_tokens if trigger is not None else None
    if isinstance(event, CompletedEvent):
        c = event.compaction
        note = (
            f"{c.end - c.start} messages ({c.first_id} … {c.last_id}) replaced by "
            f"{len(c.replacement)}; summary: {c.summary.source}"
            + (", edited" if c.summary.edited else "")
            + (f"; approved ({event.approved_by})" if event.approved_by else "")
        )
        return replace(
            head,
            before=c.tokens_before,
            after=c.tokens_after,
            threshold=threshold,
            note=note,
            reverted=event.event_id in reverted,
        )
    note = str(getattr(event, "reason", "") or "")
    if kind == "compaction.reverted":
        note = f"restored compaction {doc.get('reverted_event_id')}" + (
            f": {doc['reason']}" if doc.get("reason") else ""
        )
    elif kind == "compaction.declined":
        note = f"declined ({doc.get('declined_by')}) compaction {doc.get('proposal_event_id')}" + (
            f": {doc['reason']}" if doc.get("reason") else ""
        )
    elif kind == "tool_results.elided":
        note = f"{len(doc.get('elided') or [])} tool result(s) shortened in the request"
    return replace(head, before=tokens, after=tokens, threshold=threshold, note=note)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
