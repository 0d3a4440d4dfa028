"""The agent's messages with the compactions applied, how far the session read the stream,
and the session as a JSON-able dict (``state()``, :func:`dump_state`) and back
(``from_state``, :func:`load_state`).

Neither :class:`History` nor :class:`Cursor` is thread-safe: the session calls them under its
lock.

A session as a JSON-able dict (``state()``) and back (``from_state``):

A state holds the history once. Version 1 also held every compaction the session ever applied
as its whole event, so a long session's state grew with its age, not its history: each event
carries its replacement (the carried messages and the summary, which the history holds too
while the compaction is the newest) and its summary's text a second time, and once a later
compaction has replaced that summary in turn, its text lives on only in the later compaction's
transcript, not in the history. Version 2 writes each compaction's replacement where it is:

- ``in_history``: the history holds it at ``index`` (checked by ``replacement_sha256``); only
  the event's other fields are written, and the replacement is read back from the history, and
  so is the summary's text, from the message of the replacement that holds it
  (``summary_text_at``: the message, and the content part when the content is a list);
- ``in_later_transcript``: a later compaction replaced it, so it is in that compaction's
  transcript; the event is written without its replacement and summary text, which resume
  leaves empty. What recall, de-duplication and the revision count use (ids, transcript,
  range, sections' sources) stays.

``from_state`` reads both versions.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.errors import EventMismatch
from worker.wire import formats
from worker.wire.events import CompactionEvent, CompletedEvent, parse_event
from worker.wire.history import apply_compaction, range_digest

from ._setup import Setup, log
from ._threads import SenderState


@dataclass
class Applied:
    event: CompletedEvent
    index: int  # where the replacement starts in the history
    size: int  # len(replacement)


@dataclass
class Cursor:
    """Where the session is in the conversation's event stream."""

    # The first revision the service accepted from this session (its line of history):
    # completed events of older revisions belong to an earlier use of the conversation id.
    floor: int | None = None
    held: list[tuple[str, CompactionEvent]] = field(default_factory=list)  # read before the floor
    seen: set[str] = field(default_factory=set)  # event ids applied or restored
    last_event_id: str = "0"  # the stream id of the newest event drained

    def hold(self, entry_id: str, event: CompactionEvent) -> bool:
        """Keep the event, in order, while no submit has been accepted yet; True when kept."""
        if self.floor is None:
            self.held.append((entry_id, event))
            return True
        self.last_event_id = entry_id
        return False

    def release(self) -> list[tuple[str, CompactionEvent]]:
        """The events held until the floor was known (none while it is not)."""
        if self.floor is None:
            return []
        held, self.held = self.held, []
        return held


@dataclass
class History:
    """The messages, bumped ``version`` on every change, and the compactions applied to them."""

    messages: list[dict[str, Any]]
    version: int = 0
    applied: list[Applied] = field(default_factory=list)
    applied_count: int = 0  # compactions applied (an undone one still counts)
    skipped: int = 0  # compactions (or reverts) that no longer fit
    last_skip: str | None = None
    undone: int = 0

    def set(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.version += 1

    def extend(self, messages: list[dict[str, Any]]) -> None:
        self.messages.extend(messages)
        self.version += 1

    def apply(self, event: CompletedEvent, conversation_id: str) -> None:
        """Apply the compaction, or count it as skipped when it no longer fits."""
        before = self.messages
        try:
            compacted = apply_compaction(before, event, conversation_id=conversation_id)
        except EventMismatch as exc:
            self.skip(f"{event.event_id} (revision {event.revision}): {exc}")
            log.info(
                "skipping compaction %s of %s (revision %d): %s; the next snapshot is "
                "compacted instead",
                event.event_id,
                conversation_id,
                event.revision,
                exc,
            )
            return
        index = formats.source_ids(before).index(event.compaction.first_id)
        self.set(compacted)
        self.applied.append(Applied(event, index, len(event.compaction.replacement)))
        self.applied_count += 1
        log.info(
            "applied compaction %s of %s (revision %d): %d -> %d messages",
            event.event_id,
            conversation_id,
            event.revision,
            len(before),
            len(compacted),
        )

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.last_skip = reason

    def newest(self, event_id: str) -> Applied | None:
        """The newest applied compaction, when it is ``event_id``."""
        if self.applied and self.applied[-1].event.event_id == event_id:
            return self.applied[-1]
        return None

    def undo(self, applied: Applied, replaced: list[dict[str, Any]]) -> None:
        """Put ``replaced`` back where the newest compaction's replacement is."""
        if not self.applied or self.applied[-1] is not applied:
            raise EventMismatch("the history changed while undoing")
        i, size = applied.index, applied.size
        if self.messages[i : i + size] != list(applied.event.compaction.replacement):
            raise EventMismatch("the compaction's replacement is no longer in the history")
        self.set([*self.messages[:i], *replaced, *self.messages[i + size :]])
        self.applied.pop()
        self.undone += 1


def replaced_range(applied: Applied, original: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages the compaction replaced, from its transcript (checked by sha256)."""
    compaction = applied.event.compaction
    replaced = original[compaction.start : compaction.end]
    if range_digest(replaced) != compaction.range_sha256:
        raise EventMismatch("the transcript's range does not match the compaction")
    return replaced


# --- the saved state: state() and from_state ------------------------------------------------------


STATE_VERSION = 2
READ_VERSIONS = (1, 2)
IN_HISTORY = "in_history"
IN_LATER_TRANSCRIPT = "in_later_transcript"


def dump_state(
    setup: Setup, history: History, sender: SenderState, cursor: Cursor, pins: set[str]
) -> dict[str, Any]:
    messages = list(history.messages)
    return {
        "version": STATE_VERSION,
        "conversation_id": setup.conversation_id,
        "format": setup.format,
        "model": setup.model,
        "context_window": setup.context_window,
        "config": dict(setup.overrides),
        "tools": dict(setup.tools),
        "system": setup.system,
        "messages": messages,
        "revision": sender.revision,
        "floor": cursor.floor,
        "last_event_id": cursor.last_event_id,
        "pending": sender.pending > 0,
        "compactions": [_saved(applied, messages) for applied in history.applied],
        "seen": sorted(cursor.seen),
        "pinned": sorted(pins),
    }


def _saved(applied: Applied, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One applied compaction, its replacement written where it is (the module's docstring)."""
    replacement = list(applied.event.compaction.replacement)
    live = messages[applied.index : applied.index + applied.size] == replacement
    event = applied.event.model_dump(mode="json")
    del event["compaction"]["replacement"]
    summary = event["compaction"]["summary"]
    text_at = _text_at(replacement, summary["text"]) if live else None
    if not live or text_at is not None:
        summary["text"] = ""
    saved = {
        "event": event,
        "index": applied.index,
        "size": applied.size,
        "replacement": IN_HISTORY if live else IN_LATER_TRANSCRIPT,
        # Checks the history's copy on resume; for one in a later transcript, what the messages
        # an undo of the later compaction puts back must hash to.
        "replacement_sha256": range_digest(replacement),
    }
    return saved | ({"summary_text_at": text_at} if text_at is not None else {})


def _text_at(replacement: list[dict[str, Any]], text: str) -> list[int] | None:
    """Where ``text`` is in ``replacement``: ``[message]`` for a message whose content is the
    text, ``[message, part]`` for a content part whose ``text`` it is; None: nowhere whole."""
    if not text:
        return None
    for k, message in enumerate(replacement):
        content = message.get("content")
        if content == text:
            return [k]
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("text") == text:
                    return [k, j]
    return None


def _text_in(replacement: list[Any], at: list[int]) -> str:
    """The text :func:`_text_at` located (a ValueError when it is not there)."""
    try:
        content = replacement[at[0]]["content"]
        text = content if len(at) == 1 else content[at[1]]["text"]
    except (IndexError, KeyError, TypeError):
        raise ValueError(f"a session state's summary text is not at {at}") from None
    if not isinstance(text, str):
        raise ValueError(f"a session state's summary text is not at {at}")
    return text


def arguments_of(state: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor's arguments a saved session had."""
    if state.get("version") not in READ_VERSIONS:
        raise ValueError(f"not a session state of version {' or '.join(map(str, READ_VERSIONS))}")
    return {
        "format": state["format"],
        "model": state["model"],
        "context_window": state["context_window"],
        "config": state["config"],
        "tools": state["tools"],
        "system": state["system"],
        "messages": state["messages"],
    }


def load_state(
    state: Mapping[str, Any],
    history: History,
    sender: SenderState,
    cursor: Cursor,
    pins: set[str],
) -> bool:
    """Take over the counters (and pins) of a saved session; True when it had unsent turns."""
    pins.update(str(key) for key in state.get("pinned", ()))
    sender.revision = int(state["revision"])
    cursor.floor = state["floor"]
    cursor.last_event_id = str(state["last_event_id"])
    for item in state["compactions"]:
        event = parse_event(_event_of(item, state["messages"], int(state["version"])))
        if not isinstance(event, CompletedEvent):
            raise ValueError("a session state holds a compaction that is not completed")
        history.applied.append(Applied(event, int(item["index"]), int(item["size"])))
        sender.learned(event.revision)
    cursor.seen = set(state.get("seen", ())) | {a.event.event_id for a in history.applied}
    return bool(state.get("pending"))


def _event_of(item: Mapping[str, Any], messages: list[Any], version: int) -> dict[str, Any]:
    """The event JSON of a saved compaction, its replacement put back from the history (version
    2, ``in_history``) or left empty (``in_later_transcript``); version 1 saved it whole."""
    event: dict[str, Any] = copy.deepcopy(dict(item["event"]))
    if version == 1:
        return event
    where = item.get("replacement")
    if where == IN_LATER_TRANSCRIPT:
        event["compaction"]["replacement"] = []
        return event
    if where != IN_HISTORY:
        raise ValueError(f"a session state's compaction has no known replacement: {where!r}")
    start = int(item["index"])
    replacement = copy.deepcopy(messages[start : start + int(item["size"])])
    if range_digest(replacement) != item.get("replacement_sha256"):
        raise ValueError(
            f"the state's history does not hold the replacement of compaction "
            f"{event.get('event_id')!r} at {start}"
        )
    event["compaction"]["replacement"] = replacement
    if item.get("summary_text_at") is not None:
        event["compaction"]["summary"]["text"] = _text_in(replacement, item["summary_text_at"])
    return event
