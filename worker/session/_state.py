"""A session as a JSON-able dict (``state()``) and back (``from_state``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.wire.events import CompletedEvent, parse_event

from ._history import Applied, Cursor, History
from ._sender import SenderState
from ._setup import Setup

STATE_VERSION = 1


def dump(
    setup: Setup, history: History, sender: SenderState, cursor: Cursor, pins: set[str]
) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "conversation_id": setup.conversation_id,
        "format": setup.format,
        "model": setup.model,
        "context_window": setup.context_window,
        "config": dict(setup.overrides),
        "tools": dict(setup.tools),
        "system": setup.system,
        "messages": list(history.messages),
        "revision": sender.revision,
        "floor": cursor.floor,
        "last_event_id": cursor.last_event_id,
        "pending": sender.pending > 0,
        "compactions": [
            {"event": a.event.model_dump(mode="json"), "index": a.index, "size": a.size}
            for a in history.applied
        ],
        "seen": sorted(cursor.seen),
        "pinned": sorted(pins),
    }


def arguments_of(state: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor's arguments a saved session had."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"not a session state of version {STATE_VERSION}")
    return {
        "format": state["format"],
        "model": state["model"],
        "context_window": state["context_window"],
        "config": state["config"],
        "tools": state["tools"],
        "system": state["system"],
        "messages": state["messages"],
    }


def load(
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
        event = parse_event(item["event"])
        if not isinstance(event, CompletedEvent):
            raise ValueError("a session state holds a compaction that is not completed")
        history.applied.append(Applied(event, int(item["index"]), int(item["size"])))
        sender.learned(event.revision)
    cursor.seen = set(state.get("seen", ())) | {a.event.event_id for a in history.applied}
    return bool(state.get("pending"))
