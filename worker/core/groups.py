"""History -> atomic groups: the units that are kept or dropped whole.

A group is a system message, a user turn, an assistant reply, or a tool exchange: an assistant
message that calls tools together with every result that answers it (and anything that sits
between them). Messages that came from one wire message (Anthropic) always share a group, and
a message marked ``joins_next`` (a Responses ``reasoning`` item) shares the group of the message
after it: reasoning travels with the call (and so the results) or the reply it produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from worker.wire.models import Message

GroupKind = Literal["system", "user", "assistant", "tool_exchange"]


@dataclass(frozen=True)
class Group:
    start: int  # index of the first message (inclusive)
    end: int  # index after the last message (exclusive)
    kind: GroupKind
    complete: bool  # every tool call in the group has its result in the group
    # Holds a provider-native compaction or what it superseded: never compacted again.
    native: bool = False

    def indices(self) -> range:
        return range(self.start, self.end)


def group_messages(messages: list[Message]) -> list[Group]:
    """Maximal runs of messages that must stay together, in order."""
    reach = _reach(messages)
    groups: list[Group] = []
    start = 0
    while start < len(messages):
        end = reach[start]
        i = start
        while i < end:
            end = max(end, reach[i])
            i += 1
        groups.append(_group(messages, start, end))
        start = end
    return groups


def _reach(messages: list[Message]) -> list[int]:
    """For each index, the end of the longest span that must stay together starting there."""
    reach = [i + 1 for i in range(len(messages))]
    result_at = {m.tool_call_id: i for i, m in enumerate(messages) if m.role == "tool"}
    last_of_source: dict[int, int] = {}
    first_of_source: dict[int, int] = {}
    for i, m in enumerate(messages):
        last_of_source[m.source_index] = i
        first_of_source.setdefault(m.source_index, i)
        if m.joins_next and i + 1 < len(messages):
            reach[i] = max(reach[i], i + 2)
        for call in m.tool_calls:
            j = result_at.get(call.id)
            if j is not None and j >= i:
                reach[i] = max(reach[i], j + 1)
    for source, first in first_of_source.items():
        reach[first] = max(reach[first], last_of_source[source] + 1)
    return reach


def _group(messages: list[Message], start: int, end: int) -> Group:
    part = messages[start:end]
    calls = {c.id for m in part for c in m.tool_calls}
    answered = {m.tool_call_id for m in part if m.role == "tool"}
    kind: GroupKind
    if calls:
        kind = "tool_exchange"
    elif part[0].role == "system":
        kind = "system"
    elif any(m.role == "user" for m in part):
        kind = "user"
    else:
        kind = "assistant"
    native = any(m.superseded or m.native_compaction for m in part)
    return Group(start=start, end=end, kind=kind, complete=calls <= answered, native=native)


def fixed_head_count(groups: list[Group]) -> int:
    """How many groups at the front always stay: system messages, and a provider-native
    compaction with everything before it (the provider reads only the compaction; we never
    compact either again)."""
    n = 0
    while n < len(groups) and (groups[n].kind == "system" or groups[n].native):
        n += 1
    return n


def protected_tail_start(groups: list[Group]) -> int:
    """Index of the first group of the protected tail: the newest group, and before it any
    unfinished tool exchanges (calls still waiting for results: the agent is mid-turn).

    A call left unanswered earlier in the history, with the conversation moving on after it,
    is abandoned rather than unfinished, and may be compacted like anything else.
    """
    start = max(len(groups) - 1, 0)
    while (
        start > 0 and groups[start - 1].kind == "tool_exchange" and not groups[start - 1].complete
    ):
        start -= 1
    return start
