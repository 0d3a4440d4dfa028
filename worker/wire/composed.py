"""Every compaction of a conversation so far, composed into one edit of its uncompacted history.

An agent that applies compaction events itself sends the compacted history; the proxy, and many
HTTP clients, send the full history every turn instead. Each event describes an edit of the
history *as the previous events left it*, so rebuilding the compacted history of a full one
means replaying every event since the first: a chain that grows with the conversation and breaks
as soon as its oldest link is trimmed. :class:`ComposedCompaction` is that chain folded into
one record of bounded size: "the ``count`` wire messages from position ``start`` (the first is
``first_id``) read as ``replacement``". Each completed compaction folds into it
(:func:`compose`), and :func:`apply_composed` applies it to a full history in one step.

The messages it replaces are checked by a chained digest (each message's canonical JSON hashed,
and the hashes chained in order), so that folding in a later compaction only hashes the messages
it adds: the record never holds a list of the messages it covers, however long the conversation.

Each record also keeps the composition it replaced (``previous``, one level: its own
``previous`` is dropped), so that the newest compaction can be restored (undone) by putting that
back (:func:`without`); its size stays bounded by two compactions' replacements.

Pure: no Redis, no network, no clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict

from worker.errors import EventMismatch
from worker.wire import formats
from worker.wire.events import CompletedEvent, ProposedEvent, Summary, replace_text
from worker.wire.models import WireFormat, canonical_json

__all__ = [
    "ComposedCompaction",
    "HeldProposal",
    "apply_composed",
    "approved_composition",
    "chain_digest",
    "compose",
    "without",
]


class ComposedCompaction(BaseModel):
    """All completed compactions of a conversation, as one edit of its full history: the
    ``count`` wire messages from position ``start`` (the first has the id ``first_id``, and
    their chained digest is ``digest``) read as ``replacement``. ``compactions`` is how many are
    folded in; ``event_id`` and ``revision`` name the newest; ``previous``: the composition
    before the newest was folded in (one level; None for the first, or in records of versions
    before it existed). Stored beside the conversation (``cw:{conv}:composed``), read
    tolerantly like an event."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    conversation_id: str
    format: WireFormat
    start: int
    first_id: str
    count: int
    digest: str
    replacement: list[dict[str, Any]]
    compactions: int
    event_id: str
    revision: int
    previous: ComposedCompaction | None = None

    def to_json(self) -> str:
        return self.model_dump_json()


def chain_digest(prior: str, messages: Iterable[dict[str, Any]]) -> str:
    """``prior`` extended by each message in order: sha256(previous + sha256(canonical JSON))."""
    digest = prior
    for message in messages:
        own = hashlib.sha256(canonical_json(message).encode("utf-8", "surrogatepass")).hexdigest()
        digest = hashlib.sha256((digest + own).encode("ascii")).hexdigest()
    return digest


def apply_composed(
    messages: list[dict[str, Any]], composed: ComposedCompaction
) -> list[dict[str, Any]]:
    """The full history ``messages`` with every compaction applied: ``messages[:start] +
    replacement + messages[start + count:]``. Messages appended since the newest compaction
    survive. :class:`EventMismatch` unless ``messages`` holds, at ``start``, exactly the
    messages the compactions replaced (an already compacted history, an edited one, another
    conversation's)."""
    start, end = composed.start, composed.start + composed.count
    if len(messages) < end:
        raise EventMismatch("the history is shorter than what the compactions replaced")
    if formats.source_ids(messages[: start + 1])[start] != composed.first_id:
        raise EventMismatch(f"message {composed.first_id!r} is not at position {start}")
    if chain_digest("", messages[start:end]) != composed.digest:
        raise EventMismatch("the history differs from what the compactions replaced")
    return [*messages[:start], *composed.replacement, *messages[end:]]


def compose(
    prior: ComposedCompaction | None, view: list[dict[str, Any]], event: CompletedEvent
) -> ComposedCompaction:
    """``prior`` with ``event`` folded in. ``view`` is the history the event was computed on
    (wire messages): when it holds ``prior``'s replacement at ``prior.start`` (it is ``prior``
    applied to a full history, or an agent's history with the same compactions applied), the
    messages after that replacement up to the event's end are the full history's too, and
    extend what is covered. Otherwise (no prior, another format, a history the agent edited or
    undid) the composition starts afresh from ``event`` alone."""
    c = event.compaction
    before = None if prior is None else prior.model_copy(update={"previous": None})
    if prior is not None and _holds(prior, view, c.format, c.start):
        return _extend(prior, view, event).model_copy(update={"previous": before})
    return ComposedCompaction(
        conversation_id=event.conversation_id,
        format=c.format,
        start=c.start,
        first_id=c.first_id,
        count=c.end - c.start,
        digest=chain_digest("", view[c.start : c.end]),
        replacement=c.replacement,
        compactions=1,
        event_id=event.event_id,
        revision=event.revision,
        previous=before,
    )


def without(composed: ComposedCompaction | None, event_id: str) -> ComposedCompaction | None:
    """The composition with compaction ``event_id`` (the newest) restored: the one before it
    was folded in. None when there is none to go back to: ``composed`` is not that
    compaction's, or it was the first, or its ``previous`` is gone (two restores in a row).
    Without a composition, readers apply the remaining compactions one by one."""
    if composed is None or composed.event_id != event_id:
        return None
    return composed.previous


def _holds(prior: ComposedCompaction, view: list[dict[str, Any]], fmt: str, start: int) -> bool:
    """Whether ``view`` is ``prior`` applied (its replacement in place), and the event's range
    starts no earlier than ``prior``'s (so the raw messages before it are untouched)."""
    end = prior.start + len(prior.replacement)
    return (
        prior.format == fmt
        and prior.start <= start
        and end <= len(view)
        and canonical_json(view[prior.start : end]) == canonical_json(prior.replacement)
    )


def _extend(
    prior: ComposedCompaction, view: list[dict[str, Any]], event: CompletedEvent
) -> ComposedCompaction:
    c = event.compaction
    covered_end = prior.start + len(prior.replacement)  # in ``view``
    new_end = max(covered_end, c.end)
    added = view[covered_end:new_end]  # full-history messages the event's range reaches into
    after = [*view[: c.start], *c.replacement, *view[c.end :]]
    replacement_end = new_end - (c.end - c.start) + len(c.replacement)
    return ComposedCompaction(
        conversation_id=event.conversation_id,
        format=c.format,
        start=prior.start,
        first_id=prior.first_id,
        count=prior.count + len(added),
        digest=chain_digest(prior.digest, added),
        replacement=after[prior.start : replacement_end],
        compactions=prior.compactions + 1,
        event_id=event.event_id,
        revision=event.revision,
    )


class HeldProposal(BaseModel):
    """A compaction held for review (``cw:{conv}:proposal``): its ``compaction.proposed``
    event, the composition it would make once approved (computed with it, as a publish of the
    completed event would), and ``base``: the id of the newest compaction that composition was
    computed on (None: none), so that an approval after a restore is refused, not misapplied.
    A proposal never enters ``cw:{conv}:composed`` or ``cw:{conv}:last`` before approval."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event: ProposedEvent
    composed: ComposedCompaction | None = None
    base: str | None = None

    def to_json(self) -> str:
        return self.model_dump_json()


def approved_composition(
    composed: ComposedCompaction, event_id: str, proposed_text: str, summary: Summary | None
) -> ComposedCompaction:
    """The composition of a held proposal as its approval ``event_id`` publishes it: named by
    that event, and with an edited ``summary`` in place of ``proposed_text``."""
    replacement = composed.replacement
    if summary is not None and summary.text != proposed_text:
        replacement = [replace_text(m, proposed_text, summary.text) for m in replacement]
    return composed.model_copy(update={"event_id": event_id, "replacement": replacement})
