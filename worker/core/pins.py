"""Pinned messages (docs/snapshot.md, "Pins"): carried word for word through every compaction.

Pure functions over a planned range. A pinned message of the range goes into the replacement as
it is, with every message of its group (a call and its results stay together), and out of the
summary's input: never summarized, never stripped by a per-tool hint, never given up or cut to
fit the carried budget (it is taken out of the lists that fitting gives up from).
"""

from __future__ import annotations

from worker.core.groups import group_messages
from worker.core.planning import RangePlan
from worker.wire.models import Message


def carry_pinned(plan: RangePlan, messages: list[Message]) -> set[str]:
    """Carry every pinned message of ``plan``'s range (and its group) as it is, in conversation
    order; ``messages``: the history the plan was made of. Returns the ids carried so."""
    if not any(m.pinned and plan.start <= m.source_index < plan.end for m in messages):
        return set()
    kept: dict[str, Message] = {}
    for group in group_messages(messages):
        members = [messages[i] for i in group.indices()]
        if any(m.pinned for m in members):
            kept.update((m.id, m) for m in members if plan.start <= m.source_index < plan.end)
    order = {m.id: i for i, m in enumerate(messages)}
    carried = {m.id: m for m in plan.carried if m.id not in kept} | kept
    plan.carried = sorted(carried.values(), key=lambda m: order[m.id])
    plan.to_summarize = [m for m in plan.to_summarize if m.id not in kept]
    calls = {c.id for m in kept.values() for c in m.tool_calls}
    plan.user_ids = [i for i in plan.user_ids if i not in kept]
    plan.delegation_calls = [c for c in plan.delegation_calls if c not in calls]
    if plan.task_id in kept:
        plan.task_id = None
    return set(kept)
