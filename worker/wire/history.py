"""An agent's history in its wire format, and the one edit the service ever asks of it:
applying a completed compaction. Pure: no Redis, no network, no clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from worker.errors import EventMismatch
from worker.wire import formats
from worker.wire.events import Compaction, CompactionEvent, CompletedEvent, parse_event
from worker.wire.models import canonical_array, canonical_json

__all__ = ["apply_compaction", "range_digest", "range_digest_of"]


def range_digest(raw_messages: list[dict[str, Any]]) -> str:
    """sha256 of the canonical JSON of wire messages: what a compaction's range must hash to."""
    return _sha256(canonical_json(raw_messages))


def range_digest_of(message_json: Sequence[str]) -> str:
    """:func:`range_digest` of the wire messages whose canonical JSON texts these are (a
    snapshot's messages are serialized once for both its range digest and its transcript)."""
    return _sha256(canonical_array(message_json))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def apply_compaction(
    messages: list[dict[str, Any]],
    event: CompactionEvent | Compaction | dict[str, Any] | str | bytes,
    *,
    conversation_id: str | None = None,
) -> list[dict[str, Any]]:
    """``messages[:start] + replacement + messages[end:]``, located by ``first_id``/``last_id``
    so that messages the agent appended after the snapshot survive. Returns a new list.

    Refused with :class:`EventMismatch` unless the event describes exactly these messages: the
    range must hash to the event's ``range_sha256`` (and, when ``conversation_id`` is given, the
    event must be that conversation's). ``event`` may be an event, its JSON or dict (a line of
    ``compactor events`` as it is), or a bare :class:`Compaction`."""
    compaction = _compaction_of(event, conversation_id)
    start, last = _located(messages, compaction)
    if compaction.range_sha256 is None:
        raise EventMismatch("the event has no range digest (published by an older version)")
    if range_digest(messages[start : last + 1]) != compaction.range_sha256:
        raise EventMismatch(
            "the compacted range differs from these messages (another conversation, or an "
            "edited history)"
        )
    return [*messages[:start], *compaction.replacement, *messages[last + 1 :]]


def apply_built(messages: list[dict[str, Any]], compaction: Compaction) -> list[dict[str, Any]]:
    """:func:`apply_compaction` for a compaction just built from these very messages: located
    the same way (so an event the agent could not apply is caught here), but not hashed again
    (its digest was just taken of that range)."""
    start, last = _located(messages, compaction)
    if start != compaction.start:
        raise EventMismatch(f"the range is found at {start}, not at {compaction.start}")
    return [*messages[:start], *compaction.replacement, *messages[last + 1 :]]


def _located(messages: list[dict[str, Any]], compaction: Compaction) -> tuple[int, int]:
    """Where the compacted range's first and last messages are, by their ids."""
    if compaction.replacement and compaction.replacement[-1] in messages:
        raise EventMismatch("this compaction is already applied (its summary is present)")
    ids = formats.source_ids(messages)
    try:
        start = ids.index(compaction.first_id)
        last = ids.index(compaction.last_id, start)
    except ValueError:
        raise EventMismatch(
            f"messages {compaction.first_id!r}..{compaction.last_id!r} are not in this history"
        ) from None
    if last - start != compaction.end - 1 - compaction.start:
        raise EventMismatch("the compacted range has a different length in this history")
    return start, last


def _compaction_of(
    event: CompactionEvent | Compaction | dict[str, Any] | str | bytes,
    conversation_id: str | None,
) -> Compaction:
    if isinstance(event, Compaction):
        return event
    if isinstance(event, dict | str | bytes):
        event = parse_event(event)
    if not isinstance(event, CompletedEvent):
        raise EventMismatch(f"a {event.type} event has nothing to apply")
    if conversation_id is not None and event.conversation_id != conversation_id:
        raise EventMismatch(
            f"the event is of conversation {event.conversation_id!r}, not {conversation_id!r}"
        )
    return event.compaction
