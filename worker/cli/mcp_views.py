"""What ``compactor mcp``'s tools answer, shaped for a model's context: pure functions from what
the HTTP API returns (events, a transcript, a recalled message) to bounded answers.

Every answer is bounded. A text longer than :data:`PAGE_CHARS` is cut into pages and a list
into pages of at most :data:`MAX_ROWS` rows; each answer names the cursor of its next page in
``more`` (None on the last), which the same tool takes back as ``cursor``.

Nothing opaque and no secret is shown. A field the formats never read (a signature, encrypted
content, inline data, a provider-side id: ``worker.wire.formats.common.is_opaque_field``) or a
``data:`` URL is replaced by :func:`hidden`'s marker, and every text is passed through
``worker.core.redaction`` (the placeholders a summary's secrets get). Events are read
tolerantly: a type or a field this version does not know is skipped or ignored.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.core.inspection import ReplacedMessage, compaction_view, timeline
from worker.core.redaction import redact, redact_json
from worker.errors import InvalidRequest
from worker.wire.events import (
    CompactionEvent,
    CompletedEvent,
    FailedEvent,
    ProposedEvent,
    RejectedEvent,
    RevertedEvent,
    SkippedEvent,
    parse_event,
)
from worker.wire.formats import source_ids
from worker.wire.formats.common import is_data_url, is_opaque_field

PAGE_CHARS = 6000  # a page of text: about 1,500 tokens
MAX_ROWS = 25  # rows of a list page
PREVIEW_CHARS = 240  # of each replaced message in a compaction's page
_OFFSET = re.compile(r"[0-9]{1,18}")
_STREAM_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
_SPACES = re.compile(r"\s+")

# (stream id, event document) as the events route lists them, oldest first
Entry = tuple[str, Mapping[str, Any]]


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True)


# --- pages and cursors ------------------------------------------------------------------------


def text_page(text: str, offset: int) -> tuple[str, int | None]:
    """The page of ``text`` from ``offset``: at most :data:`PAGE_CHARS` characters, ended at a
    line's end when one is near; and where the next page starts (None: this is the last)."""
    if offset > len(text):
        raise InvalidRequest("cursor", f"past the end (the text has {len(text)} characters)")
    end = offset + PAGE_CHARS
    if end >= len(text):
        return text[offset:], None
    newline = text.rfind("\n", offset + PAGE_CHARS * 3 // 4, end)
    end = newline + 1 if newline != -1 else end
    return text[offset:end], end


def offset_of(cursor: str | None) -> int:
    """A text cursor (``more`` of the previous page) as the offset it names; 0 for none."""
    if cursor is None:
        return 0
    if not _OFFSET.fullmatch(cursor):
        raise InvalidRequest("cursor", "not a cursor this tool gave (pass `more` as it came)")
    return int(cursor)


def _stream_key(stream_id: str) -> tuple[int, int]:
    found = _STREAM_ID.fullmatch(stream_id)
    if found is None:
        raise InvalidRequest("cursor", "not a cursor this tool gave (pass `more` as it came)")
    return int(found[1]), int(found[2])


# --- opaque fields and secrets ----------------------------------------------------------------


def hidden(value: Any) -> str:
    """The marker an opaque value is shown as: its size, never a character of it."""
    size = len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False))
    return f"[opaque, {size} characters: not shown]"


def without_opaque(value: Any) -> Any:
    """``value`` (a message, a block, a part of one) with every opaque field's value, at any
    depth, and every ``data:`` URL replaced by :func:`hidden`'s marker."""
    if isinstance(value, Mapping):
        return {
            key: hidden(item) if is_opaque_field(str(key)) else without_opaque(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [without_opaque(item) for item in value]
    if is_data_url(value):
        return hidden(value)
    return value


def shown_message(message: Any) -> tuple[str, dict[str, int]]:
    """A recalled message as the text a model is shown (indented JSON, opaque values hidden,
    secrets redacted), and how many secrets of each kind were redacted."""
    counts: Counter[str] = Counter()
    shown = redact_json(without_opaque(message), counts)
    return json.dumps(shown, ensure_ascii=False, indent=1), dict(counts)


# --- recall -----------------------------------------------------------------------------------


class RecalledMessage(_Answer):
    """A page of the original of a message a compaction replaced."""

    conversation_id: str
    message_id: str
    revision: int = Field(description="the revision whose compaction replaced the message")
    event_id: str = Field(description="the compaction (its compaction.completed event)")
    text: str = Field(description="the message as JSON, opaque values and secrets masked")
    offset: int = Field(description="where this page starts in the whole text")
    total_chars: int
    redacted: dict[str, int] = Field(description="secrets replaced by a placeholder, by kind")
    more: str | None = Field(description="cursor of the next page; null on the last")


def recalled(found: Mapping[str, Any], cursor: str | None) -> RecalledMessage:
    """A page of what the recall route found (read tolerantly)."""
    whole, counts = shown_message(found.get("message"))
    offset = offset_of(cursor)
    page, following = text_page(whole, offset)
    return RecalledMessage(
        conversation_id=str(found.get("conversation_id", "")),
        message_id=str(found.get("message_id", "")),
        revision=_int(found.get("revision")),
        event_id=str(found.get("event_id", "")),
        text=page,
        offset=offset,
        total_chars=len(whole),
        redacted=counts,
        more=None if following is None else str(following),
    )


def render_recalled(r: RecalledMessage) -> str:
    head = (
        f"The original of message {r.message_id}, replaced by the compaction of revision "
        f"{r.revision} (event {r.event_id}); characters {r.offset}-{r.offset + len(r.text)} "
        f"of {r.total_chars}. Opaque values are shown as markers"
        + (f"; secrets redacted: {_counts(r.redacted)}" if r.redacted else "")
        + "."
    )
    return _with_more(f"{head}\n\n{r.text}", r.more, "recall_message")


# --- the conversation's compactions -----------------------------------------------------------


class CompactionRow(_Answer):
    """One compaction: what it replaced and what it saved."""

    event_id: str
    revision: int
    created_at: str
    trigger: str = Field(
        description="what compacted it: thresholds (the auto-compaction trigger), requested "
        "(compact_now), idle, cost, ... (docs/events.md)"
    )
    request_id: str | None = None
    first_id: str = Field(description="the id of the first message it replaced")
    last_id: str = Field(description="the id of the last message it replaced")
    messages_replaced: int
    tokens_before: int
    tokens_after: int
    summary: str = Field(description="who wrote the summary: llm, digest or strategy")
    reverted: bool = Field(description="restored (undone) since: no longer applied")


class CompactionList(_Answer):
    """A page of the conversation's compactions, newest first."""

    conversation_id: str
    compactions: list[CompactionRow]
    total: int = Field(description="how many compactions the conversation has")
    more: str | None = Field(description="cursor of the next (older) page; null on the last")


def event_of(doc: Mapping[str, Any]) -> CompactionEvent | None:
    """The event a JSON document holds; None for one this version cannot read."""
    try:
        return parse_event(dict(doc))
    except (ValidationError, ValueError):
        return None


def parsed(entries: Sequence[Entry]) -> list[tuple[str, CompactionEvent]]:
    """The entries' events, in order; one this version cannot read is skipped."""
    events = [(stream_id, event_of(doc)) for stream_id, doc in entries]
    return [(stream_id, e) for stream_id, e in events if e is not None]


def reverted_ids(events: Sequence[tuple[str, CompactionEvent]]) -> set[str]:
    return {e.reverted_event_id for _sid, e in events if isinstance(e, RevertedEvent)}


def completed(events: Sequence[tuple[str, CompactionEvent]]) -> list[tuple[str, CompletedEvent]]:
    return [(sid, e) for sid, e in events if isinstance(e, CompletedEvent)]


def compaction_row(event: CompletedEvent, reverted: set[str]) -> CompactionRow:
    c = event.compaction
    return CompactionRow(
        event_id=event.event_id,
        revision=event.revision,
        created_at=event.created_at.isoformat(),
        trigger=event.trigger.kind,
        request_id=event.trigger.request_id,
        first_id=c.first_id,
        last_id=c.last_id,
        messages_replaced=c.end - c.start,
        tokens_before=c.tokens_before,
        tokens_after=c.tokens_after,
        summary=c.summary.source,
        reverted=event.event_id in reverted,
    )


def compaction_list(
    conversation_id: str, entries: Sequence[Entry], cursor: str | None, limit: int
) -> CompactionList:
    """A page of at most ``limit`` compactions, newest first, older than ``cursor``."""
    events = parsed(entries)
    done = completed(events)[::-1]
    total = len(done)
    if cursor is not None:
        older = _stream_key(cursor)
        done = [(sid, e) for sid, e in done if _stream_key(sid) < older]
    page = done[: min(limit, MAX_ROWS)]
    reverted = reverted_ids(events)
    return CompactionList(
        conversation_id=conversation_id,
        compactions=[compaction_row(e, reverted) for _sid, e in page],
        total=total,
        more=page[-1][0] if len(done) > len(page) else None,
    )


def render_list(answer: CompactionList) -> str:
    if not answer.total:
        return f"Conversation {answer.conversation_id} has no compaction."
    lines = [f"Compactions of {answer.conversation_id}, newest first ({answer.total} in all):"]
    lines += [_row_line(row) for row in answer.compactions]
    lines.append("Show one (its summary and each message it replaced) with show_compaction.")
    return _with_more("\n".join(lines), answer.more, "list_compactions")


def _row_line(row: CompactionRow) -> str:
    asked = f" (request {row.request_id})" if row.request_id else ""
    undone = "; reverted" if row.reverted else ""
    return (
        f"- {row.event_id}: revision {row.revision}, {row.created_at}, {row.trigger}{asked}: "
        f"{row.messages_replaced} messages {row.first_id} … {row.last_id} replaced, "
        f"{row.tokens_before:,} → {row.tokens_after:,} tokens, summary by {row.summary}{undone}"
    )


# --- one compaction ---------------------------------------------------------------------------


class CompactionPage(_Answer):
    """A page of one compaction: its summary and the messages it replaced."""

    conversation_id: str
    compaction: CompactionRow
    text: str = Field(description="the summary, then each replaced message's id and opening")
    offset: int
    total_chars: int
    more: str | None = Field(description="cursor of the next page; null on the last")


def chosen(
    events: Sequence[tuple[str, CompactionEvent]], event_id: str | None, revision: int | None
) -> CompletedEvent | None:
    """The compaction named by its event id or revision (the newest of that revision), else
    the newest; None when there is none."""
    done = [e for _sid, e in completed(events)]
    if event_id is not None:
        done = [e for e in done if e.event_id == event_id]
    if revision is not None:
        done = [e for e in done if e.revision == revision]
    return done[-1] if done else None


def show_cursor(cursor: str | None) -> tuple[str | None, int]:
    """A compaction page's cursor (``EVENT_ID@OFFSET``) as the event it pages and the offset."""
    if cursor is None:
        return None, 0
    event_id, at, offset = cursor.rpartition("@")
    if not at or not event_id:
        raise InvalidRequest("cursor", "not a cursor this tool gave (pass `more` as it came)")
    return event_id, offset_of(offset)


def compaction_page(
    conversation_id: str,
    event: CompletedEvent,
    reverted: bool,
    original: Sequence[dict[str, Any]] | None,
    problem: str | None,
    offset: int,
) -> CompactionPage:
    """A page of the compaction beside the messages it replaced, from ``original`` (its
    transcript's messages; None when it cannot be read, ``problem`` saying why)."""
    row = compaction_row(event, {event.event_id} if reverted else set())
    whole = redact(compaction_text(event, row, original, problem)).text
    page, following = text_page(whole, offset)
    return CompactionPage(
        conversation_id=conversation_id,
        compaction=row,
        text=page,
        offset=offset,
        total_chars=len(whole),
        more=None if following is None else f"{event.event_id}@{following}",
    )


def compaction_text(
    event: CompletedEvent,
    row: CompactionRow,
    original: Sequence[dict[str, Any]] | None,
    problem: str | None,
) -> str:
    """The whole text a compaction's pages are cut from."""
    view = compaction_view(event, original, transcript_problem=problem)
    c = event.compaction
    parts = [_row_line(row).removeprefix("- ")]
    if c.preserved_ids:
        parts.append("Carried verbatim, still in the conversation: " + ", ".join(c.preserved_ids))
    parts += ["", "## The summary that replaced them", "", c.summary.text.strip() or "(empty)", ""]
    parts.append("## The messages it replaced (recall_message gives any of them whole)")
    parts.append("")
    if view.transcript_problem:
        parts.append(f"Not shown: {view.transcript_problem}.")
    wire = _by_id(original)
    parts += [_preview(m, wire.get(m.id)) for m in view.replaced]
    if view.dropped:
        parts += ["", "## Removed outright (names and sizes only)", ""]
        parts += [
            f"- {d.message_id}: {d.kind}"
            + (f" ({d.tool})" if d.tool else "")
            + (f", {d.bytes:,} bytes" if d.bytes is not None else "")
            for d in view.dropped
        ]
    return "\n".join(parts) + "\n"


def _by_id(original: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    if original is None:
        return {}
    return dict(zip(source_ids(list(original)), original, strict=True))


def _preview(message: ReplacedMessage, wire: dict[str, Any] | None) -> str:
    """One line: the message's id, role and the opening of its text. A message the formats
    could not read into text comes back as its wire JSON: it is shown with its opaque values
    hidden, as a recalled message is."""
    text = message.text
    if wire is not None and text == json.dumps(wire, ensure_ascii=False):
        text = json.dumps(without_opaque(wire), ensure_ascii=False)
    text = _SPACES.sub(" ", text).strip()
    if len(text) > PREVIEW_CHARS:
        text = text[:PREVIEW_CHARS].rstrip() + " …"
    drawn = (
        f" (summary sections {', '.join(map(str, message.sections))})" if message.sections else ""
    )
    return f"- [{message.id}] {message.role}{drawn}: {text}"


def render_page(answer: CompactionPage) -> str:
    end = answer.offset + len(answer.text)
    head = f"Characters {answer.offset}-{end} of {answer.total_chars}."
    return _with_more(f"{head}\n\n{answer.text}", answer.more, "show_compaction")


# --- a compaction on demand -------------------------------------------------------------------


class Outcome(_Answer):
    """What became of a compaction asked for now."""

    conversation_id: str
    request_id: str
    revision: int = Field(description="the snapshot it compacts")
    status: str = Field(
        description="completed, skipped, failed, held_for_review, rejected, or pending "
        "(no outcome within wait_s: it may still come)"
    )
    event_id: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    messages_replaced: int | None = None
    reason: str | None = Field(default=None, description="why it was skipped, failed or refused")
    note: str | None = Field(default=None, description="what the summary did with instructions")


_STATUS = {
    "compaction.completed": "completed",
    "compaction.skipped": "skipped",
    "compaction.failed": "failed",
    "compaction.proposed": "held_for_review",
    "compaction.rejected": "rejected",
}


def is_outcome_of(request_id: str, doc: Mapping[str, Any]) -> bool:
    """Whether the event (a JSON document) answers the request ``request_id``."""
    trigger = doc.get("trigger")
    return isinstance(trigger, Mapping) and trigger.get("request_id") == request_id


def outcome(
    conversation_id: str, requested: Mapping[str, Any], doc: Mapping[str, Any] | None
) -> Outcome:
    """The request's outcome from its event (None: none came in time)."""
    base = Outcome(
        conversation_id=conversation_id,
        request_id=str(requested.get("request_id", "")),
        revision=_int(requested.get("revision")),
        status="pending",
    )
    if doc is None:
        return base
    status = _STATUS.get(str(doc.get("type")), str(doc.get("type")))
    found = event_of(doc)
    more: dict[str, Any] = {"status": status, "event_id": doc.get("event_id")}
    if isinstance(found, CompletedEvent | ProposedEvent):
        c = found.compaction
        more |= {
            "tokens_before": c.tokens_before,
            "tokens_after": c.tokens_after,
            "messages_replaced": c.end - c.start,
            "note": c.summary.instructions_note,
        }
    elif isinstance(found, SkippedEvent):
        more["reason"] = found.reason
    elif isinstance(found, FailedEvent | RejectedEvent):
        more["reason"] = f"{found.error.code}: {found.reason}"
    return base.model_copy(update=more)


def render_outcome(o: Outcome) -> str:
    if o.status == "pending":
        return (
            f"Compaction requested (request {o.request_id}, revision {o.revision}); no outcome "
            "within the wait. It is still queued or running: list_compactions or "
            "compaction_status shows it once it lands (or call compact_now again to wait "
            "longer: a new request replaces one still waiting)."
        )
    head = f"Compaction of revision {o.revision} (request {o.request_id}): {o.status}"
    if o.tokens_before is not None:
        head += (
            f"; {o.messages_replaced} messages replaced, {o.tokens_before:,} → "
            f"{o.tokens_after:,} tokens (event {o.event_id})"
        )
    lines = [head + "."]
    lines += [f"Reason: {o.reason}"] if o.reason else []
    lines += [f"Instructions: {o.note}"] if o.note else []
    if o.status == "completed":
        lines.append("show_compaction gives its summary and the messages it replaced.")
    return "\n".join(lines)


# --- status -----------------------------------------------------------------------------------


class ServiceStatus(_Answer):
    """The service as ``/readyz`` sees it."""

    url: str
    ready: bool
    workers: dict[str, int] = Field(description="workers answering, by kind")
    missing_kinds: list[str]
    problem: str | None = None


class Newest(_Answer):
    type: str
    revision: int
    event_id: str
    note: str


class ConversationStatus(_Answer):
    """A conversation as its events tell it."""

    conversation_id: str
    events: int
    compactions: int = Field(description="applied compactions (not reverted)")
    reverted: int
    held_for_review: int
    newest_outcome: Newest | None
    tokens: int | None = Field(description="the next request's size after the newest outcome")
    threshold: int | None = Field(description="the tokens over which it compacts")


class Status(_Answer):
    service: ServiceStatus
    conversation: ConversationStatus | None


def service_status(url: str, ready: Mapping[str, Any] | None, problem: str | None) -> ServiceStatus:
    """``/readyz``'s document (None: it did not answer, ``problem`` saying why)."""
    doc = ready or {}
    kinds = doc.get("kinds")
    kinds = kinds if isinstance(kinds, Mapping) else {}
    missing = doc.get("missing_kinds")
    return ServiceStatus(
        url=url,
        ready=doc.get("ready") is True,
        workers={str(k): len(v) for k, v in kinds.items() if isinstance(v, list)},
        missing_kinds=[str(k) for k in missing] if isinstance(missing, list) else [],
        problem=problem or (None if doc.get("redis", True) else "Redis does not answer"),
    )


def conversation_status(conversation_id: str, entries: Sequence[Entry]) -> ConversationStatus:
    line = timeline(list(entries))
    done = [p for p in line.points if p.type == "compaction.completed"]
    outcomes = line.outcomes
    newest = outcomes[-1] if outcomes else None
    return ConversationStatus(
        conversation_id=conversation_id,
        events=len(entries),
        compactions=sum(not p.reverted for p in done),
        reverted=sum(p.reverted for p in done),
        held_for_review=len(line.proposed),
        newest_outcome=None
        if newest is None
        else Newest(
            type=newest.type,
            revision=newest.revision,
            event_id=newest.event_id,
            note=redact(newest.note).text,
        ),
        tokens=newest.after if newest else None,
        threshold=newest.threshold if newest else None,
    )


def render_status(s: Status) -> str:
    svc = s.service
    workers = ", ".join(f"{kind}: {n}" for kind, n in sorted(svc.workers.items())) or "none"
    lines = [
        f"Service {svc.url}: {'ready' if svc.ready else 'NOT ready'} (workers {workers}"
        + (f"; missing: {', '.join(svc.missing_kinds)}" if svc.missing_kinds else "")
        + ")"
        + (f"; {svc.problem}" if svc.problem else "")
        + "."
    ]
    c = s.conversation
    if c is None:
        return "\n".join(lines)
    lines.append(
        f"Conversation {c.conversation_id}: events {c.events}; compactions applied "
        f"{c.compactions}, reverted {c.reverted}, held for review {c.held_for_review}."
    )
    if c.newest_outcome is not None:
        n = c.newest_outcome
        size = f"; the request is {c.tokens:,} tokens" if c.tokens is not None else ""
        limit = f" (compacts over {c.threshold:,})" if c.threshold is not None else ""
        lines.append(f"Newest outcome: {n.type}, revision {n.revision}: {n.note}{size}{limit}.")
    return "\n".join(lines)


# --- helpers ----------------------------------------------------------------------------------


def _with_more(text: str, more: str | None, tool: str) -> str:
    if more is None:
        return text
    return f"{text}\n\n(More: call {tool} again with the same arguments and cursor={more!r}.)"


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
