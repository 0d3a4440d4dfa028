"""What ``compactor up --submit`` (``make demo``) prints: each event for a person, with what
the next request holds instead of the range a compaction replaces, and a line per
conversation at the end."""

from __future__ import annotations

from typing import Any

from worker.core.inspection import readable_messages
from worker.wire.events import OUTCOME_TYPES


def describe_event(event: Any) -> str:
    """An event for a person: what happened, and for a compaction what the next request holds
    instead of the range it replaces, every message whole."""
    head = f"{event.conversation_id} revision {event.revision}: {event.type}"
    if event.type == "compaction.completed":
        return "\n".join([head, *_describe_compaction(event.compaction)])
    if event.type == "compaction.skipped":
        return f"{head}: {event.reason}"
    if event.type == "compaction.failed":
        return f"{head}: {event.reason} ({event.error.code})"
    if event.type == "compaction.rejected":
        where = f"{event.error.field}: " if event.error.field else ""
        return f"{head}: {where}{event.reason}"
    if event.type == "compaction.reverted":
        why = f": {event.reason}" if event.reason else ""
        return f"{head}: compaction {event.reverted_event_id} was restored{why}"
    if event.type == "tool_results.elided":
        shortened = ", ".join(
            f"{e.call_id} ({e.tool}) {e.bytes_before:,} → {e.bytes_after:,} bytes"
            for e in event.elided
        )
        return f"{head}: the next request shortens {len(event.elided)} tool result(s): {shortened}"
    return head


def _describe_compaction(c: Any) -> list[str]:
    replaced = c.end - c.start
    lines = [
        f"  {c.tokens_before:,} → {c.tokens_after:,} tokens: messages {c.first_id} … {c.last_id} "
        f"({replaced}) are replaced; the next request holds instead these {len(c.replacement)}:"
    ]
    s = c.summary
    for role, text in readable_messages(c.format, c.replacement):
        lines.append(f"  ┌ {role}" + (" (the summary)" if s.text and s.text in text else ""))
        lines += [f"  │ {line}" for line in text.splitlines() or [""]]
    facts = f", {s.fidelity.kept} of {s.fidelity.checked} facts kept" if s.fidelity else ""
    lines.append(f"  └ summary: {s.source}, {s.tokens:,} tokens{facts}")
    if c.transcript is not None:
        lines.append(f"    the replaced messages are kept in {c.transcript.uri}")
    return lines


def conversation_totals(events: list[Any]) -> list[str]:
    """One line per conversation, in order of first event: its request's tokens before the
    first event and after the last (``c-1: 12,345 → 2,345 tokens (1 compaction)``)."""
    first: dict[str, int | None] = {}
    last: dict[str, int | None] = {}
    compactions: dict[str, int] = {}
    outcome: dict[str, Any] = {}
    for event in events:
        conv = event.conversation_id
        before, after = _token_counts(event)
        if first.get(conv) is None:
            first[conv] = before
        if after is not None:
            last[conv] = after
        compactions[conv] = compactions.get(conv, 0) + (event.type == "compaction.completed")
        if event.type in OUTCOME_TYPES:
            outcome[conv] = event
    lines = []
    for conv in first:
        n = compactions[conv]
        count = f"({n} compaction{'' if n == 1 else 's'})"
        before, after = first[conv], last.get(conv)
        if before is None or after is None:
            what = outcome.get(conv)
            said = f"{what.type}: {what.reason}" if what is not None else "no outcome"
            lines.append(f"{conv}: no token count {count}; {said}")
        else:
            lines.append(f"{conv}: {before:,} → {after:,} tokens {count}")
    return lines


def _token_counts(event: Any) -> tuple[int | None, int | None]:
    """The request's tokens before and after what ``event`` describes (None: not counted)."""
    if event.type == "compaction.completed":
        return event.compaction.tokens_before, event.compaction.tokens_after
    trigger = getattr(event, "trigger", None)
    tokens = trigger.projected_tokens if trigger is not None else None
    return tokens, tokens
