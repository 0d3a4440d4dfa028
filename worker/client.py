"""What an agent imports: apply events, build the projected request, submit, read events.

``apply_compaction`` and ``project`` are pure: no Redis, no network, no clock.
"""

from __future__ import annotations

from typing import Any

from worker import formats
from worker.config import CompactionConfig
from worker.errors import CompactorError
from worker.models import Compaction, CompactionEvent, WireFormat
from worker.projection import ProjectionPolicy
from worker.projection import project as project_messages


class EventMismatch(CompactorError):
    """The event does not describe these messages (already applied, or another history)."""

    code = "event_mismatch"


def apply_compaction(
    messages: list[dict[str, Any]],
    event: CompactionEvent | Compaction | dict[str, Any],
    *,
    system: Any = None,
) -> list[dict[str, Any]]:
    """``messages[:start] + replacement + messages[end:]``, located by ``first_id``/``last_id``
    so that messages the agent appended after the snapshot survive. Returns a new list."""
    compaction = _compaction_of(event)
    del system  # ids of wire messages do not depend on Anthropic's top-level system
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
    return [*messages[:start], *compaction.replacement, *messages[last + 1 :]]


def _compaction_of(event: CompactionEvent | Compaction | dict[str, Any]) -> Compaction:
    if isinstance(event, Compaction):
        return event
    if isinstance(event, dict):
        event = CompactionEvent.model_validate(event)
    if event.type != "compaction.completed" or event.compaction is None:
        raise EventMismatch(f"a {event.type} event has nothing to apply")
    return event.compaction


def project(
    messages: list[dict[str, Any]],
    *,
    format: WireFormat = "openai",
    config: CompactionConfig | None = None,
    model: str | None = None,
    system: Any = None,
) -> list[dict[str, Any]]:
    """The messages to send: the same projection the worker measures, in the agent's format."""
    normalized = formats.to_messages(format, messages, system=system)
    policy = ProjectionPolicy.from_config(config or CompactionConfig(), model=model)
    projection = project_messages(normalized, policy)
    if not projection.bodies:
        return list(messages)
    return formats.replace_tool_results(format, messages, projection.bodies)
