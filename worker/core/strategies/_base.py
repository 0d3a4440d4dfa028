"""What the strategies share: their protocol, the omission marker, and the walk over groups.

The protocol and the marker live here rather than in the package ``__init__`` so that the
strategy modules can import them without importing the package that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from worker.core.groups import Group, fixed_head_count, group_messages, protected_tail_start
from worker.wire.models import Message

OMITTED_TOOL_RESULT = "[tool result omitted]"


class CompactionStrategy(Protocol):
    """Reduces a message list to fit some constraint.

    ``compact`` never raises on content: any list yields a retained list. It keeps or drops
    atomic groups (:mod:`worker.core.groups`) whole, keeps the leading system messages, the newest
    group and a tool exchange still waiting for results, and returns the input's own message
    objects, new ones only where it rewrites a message.
    """

    def compact(self, messages: list[Message]) -> list[Message]: ...


def keep_newest_groups(
    messages: list[Message], *, budget: int, cost: Callable[[Message], int]
) -> list[Message]:
    """The leading system groups, the protected tail, and the longest run of groups just before
    the tail whose total ``cost`` (leading systems and tail included) stays within ``budget``.

    The walk stops at the first group that does not fit rather than skipping it, so the result
    is always a contiguous recent history. The mandatory part is kept even when it alone
    exceeds ``budget``: the bound holds wherever it can.
    """
    groups = group_messages(messages)
    lead = fixed_head_count(groups)
    first = max(protected_tail_start(groups), lead)

    def group_cost(group: Group) -> int:
        return sum(cost(messages[i]) for i in group.indices())

    # Costs of the older groups are computed only as far as the walk reaches, which matters
    # when counting tokens of a long history.
    spent = sum(group_cost(g) for g in groups[:lead]) + sum(group_cost(g) for g in groups[first:])
    while first > lead:
        extra = group_cost(groups[first - 1])
        if spent + extra > budget:
            break
        spent += extra
        first -= 1
    kept = groups[:lead] + groups[first:]
    return [messages[i] for g in kept for i in g.indices()]
