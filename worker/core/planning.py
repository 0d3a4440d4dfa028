"""Planning a summary compaction: which range, what is carried verbatim, what is summarized.

Pure functions over normalized messages. When the trigger fires: leading system messages stay;
the range ends before the protected tail (the newest group, and an unfinished tool exchange);
the newest user turn, the task (the range's first user turn, when it fits
``preserve_recent_user_tokens`` beside the newest), the newer user turns that fit too (a turn
repeating a newer one word for word once) and the last ``preserve_recent_delegation_results``
delegation results are carried verbatim into the replacement, in order, before the summary. A
carried turn too large for the room left is cut cleanly (at line breaks outside code fences,
the cut marked with how much it removed); what a cut removes is never summarized. Per-tool
hints are resolved here, once, and frozen into the event (docs/configuration.md, "Per-tool
hints"): ``keep`` carries a call whole, ``strip*`` carries it with parts replaced by markers,
``omit`` drops it from the replacement and from the summary input.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.config import CompactionConfig, ToolConfig, ToolHint
from worker.core.groups import Group, fixed_head_count, group_messages, protected_tail_start
from worker.wire.events import SUMMARY_MARKER, ToolCallPolicy
from worker.wire.models import Message, ToolCall

STRIPPED_ARGUMENTS = '{"_compacted": "arguments stripped"}'
STRIPPED_RESPONSE = "[compacted: tool output stripped]"

_HINT_POLICIES: dict[ToolHint, ToolCallPolicy] = {
    "keep": ToolCallPolicy(policy="strip", request=False, response=False),
    "strip": ToolCallPolicy(policy="strip", request=True, response=True),
    "strip-requests": ToolCallPolicy(policy="strip", request=True, response=False),
    "strip-responses": ToolCallPolicy(policy="strip", request=False, response=True),
    "omit": ToolCallPolicy(policy="omit"),
}


@dataclass(frozen=True)
class ToolPolicies:
    """Frozen at creation: ``default`` for tools without a hint (None: summarize them)."""

    default: ToolCallPolicy | None = None
    overrides: dict[str, ToolCallPolicy] = field(default_factory=dict)

    def for_tool(self, name: str) -> ToolCallPolicy | None:
        return self.overrides.get(name, self.default)


def resolve_tool_policies(tools: dict[str, ToolConfig]) -> ToolPolicies:
    """``[conversation.tools.NAME] compaction`` hints -> policies; ``"*"`` sets the default."""
    overrides = {
        name: _HINT_POLICIES[cfg.compaction]
        for name, cfg in sorted(tools.items())
        if name != "*" and cfg.compaction is not None
    }
    star = tools.get("*")
    default = _HINT_POLICIES[star.compaction] if star and star.compaction else None
    return ToolPolicies(default=default, overrides=overrides)


@dataclass
class RangePlan:
    start: int  # wire index of the first message compacted
    end: int  # wire index after the last message compacted
    carried: list[Message]  # verbatim (or stripped) into the replacement, in order
    to_summarize: list[Message]  # the summarizer's input, policies applied, in order
    previous_summary: str | None
    summary_ids: list[str] = field(default_factory=list)  # the earlier summaries' messages
    user_ids: list[str] = field(default_factory=list)  # carried user turns, oldest first
    task_id: str | None = None  # the carried task (the range's first user turn), if carried
    delegation_calls: list[str] = field(default_factory=list)  # carried delegations, oldest first


def is_summary_message(m: Message) -> bool:
    return m.role == "user" and m.content.startswith(SUMMARY_MARKER)


TokenCount = Callable[[Message], int]


def compactable_groups(messages: list[Message]) -> tuple[list[Group], int, int]:
    """(groups, first compactable group, first protected group)."""
    groups = group_messages(messages)
    return groups, fixed_head_count(groups), protected_tail_start(groups)


def plan_range(
    messages: list[Message],
    config: CompactionConfig,
    policies: ToolPolicies,
    *,
    count: TokenCount,
) -> RangePlan | None:
    """The compaction of ``messages``, or None when nothing outside the protected parts remains."""
    groups, first, tail = compactable_groups(messages)
    bounds = _bounds(messages, groups, first, tail)
    if bounds is None:
        return None
    start, end = bounds
    in_range = groups[first:tail]
    users, task = _preserved_users(messages, in_range, config.preserve_recent_user_tokens, count)
    delegations = _preserved_delegations(messages, in_range, config, policies)
    plan = _assemble(messages, in_range, policies, start, end, users, delegations)
    plan.task_id = messages[task].id if task is not None else None
    return plan


def range_bounds(messages: list[Message]) -> tuple[int, int] | None:
    """The wire range ``start..end`` a compaction of ``messages`` replaces (what
    :func:`plan_range` picks), or None when nothing outside the protected parts remains."""
    return _bounds(messages, *compactable_groups(messages))


def _bounds(
    messages: list[Message], groups: list[Group], first: int, tail: int
) -> tuple[int, int] | None:
    if first >= tail:
        return None
    start = messages[groups[first].start].source_index
    end = messages[groups[tail].start].source_index
    if start < 0 or start >= end:
        return None
    return start, end


def _preserved_users(
    messages: list[Message], groups: list[Group], budget: int, count: TokenCount
) -> tuple[set[int], int | None]:
    """The user turns to carry, and which of them is the task: always the newest turn; then the
    task, the range's first user turn (the conversation's first, or the copy an earlier
    compaction carried), when it fits ``budget`` tokens beside the newest; then the newer turns,
    newest first, while they fit. The task is what every later turn works on, so it goes before
    the turns between. A turn that repeats a newer one's text word for word (a harness's format
    reminder, a "continue") is not carried again: it says nothing the newer copy does not, and
    goes to the summary input with the rest of the range."""
    turns = [
        i for g in groups if g.kind == "user" for i in g.indices() if _a_user_turn(messages[i])
    ]
    if not turns:
        return set(), None
    newest = turns[-1]
    chosen = {newest}
    said = {messages[newest].content}
    spent = count(messages[newest])
    task = _task_turn(messages, groups)
    if task is not None and task != newest:
        m = messages[task]
        cost = count(m)
        if spent + cost > budget or (not m.attachments and m.content in said):
            task = None
        else:
            chosen.add(task)
            said.add(m.content)
            spent += cost
    for i in reversed(turns[:-1]):
        m = messages[i]
        if i == task or (not m.attachments and m.content in said):
            continue
        cost = count(m)
        if spent + cost > budget:
            break
        chosen.add(i)
        said.add(m.content)
        spent += cost
    return chosen, task


def _task_turn(messages: list[Message], groups: list[Group]) -> int | None:
    """The range's first user turn, when no earlier summary comes before it: the task as the
    user stated it, or the copy of it that an earlier compaction carried (it stays in front of
    that compaction's summary)."""
    for g in groups:
        for i in g.indices():
            m = messages[i]
            if is_summary_message(m):
                return None
            if g.kind == "user" and _a_user_turn(m):
                return i
    return None


def _preserved_delegations(
    messages: list[Message], groups: list[Group], config: CompactionConfig, policies: ToolPolicies
) -> list[str]:
    """Call ids of the last N delegation results (tools in ``delegation_tools``) with no hint."""
    delegation = set(config.delegation_tools)
    calls = [
        c.id
        for g in groups
        for i in g.indices()
        for c in messages[i].tool_calls
        if c.name in delegation and policies.for_tool(c.name) is None
    ]
    n = config.preserve_recent_delegation_results
    return calls[-n:] if n else []


def _assemble(
    messages: list[Message],
    groups: list[Group],
    policies: ToolPolicies,
    start: int,
    end: int,
    users: set[int],
    delegations: list[str],
) -> RangePlan:
    plan = RangePlan(
        start=start,
        end=end,
        carried=[],
        to_summarize=[],
        previous_summary=None,
        delegation_calls=list(delegations),
    )
    policy_of = {
        c.id: policies.for_tool(c.name)
        for g in groups
        for i in g.indices()
        for c in messages[i].tool_calls
    }
    carry = set(delegations)
    summaries = []
    for g in groups:
        for i in g.indices():
            m = messages[i]
            if is_summary_message(m):
                summaries.append(m.content)
                plan.summary_ids.append(m.id)
            elif i in users:
                plan.user_ids.append(m.id)
                plan.carried.append(m)
            elif m.role == "tool":
                _route_result(m, policy_of.get(m.tool_call_id or ""), carry, plan)
            else:
                _route_calls(m, policy_of, carry, plan)
    plan.previous_summary = "\n\n".join(summaries) if summaries else None
    return plan


def _route_result(
    m: Message, policy: ToolCallPolicy | None, carry: set[str], plan: RangePlan
) -> None:
    if m.tool_call_id in carry:
        plan.carried.append(m)
    elif policy is None:
        plan.to_summarize.append(m)
    elif policy.policy == "strip":
        body = STRIPPED_RESPONSE if policy.response else m.content
        plan.carried.append(m.model_copy(update={"content": body}))
    # omit: in neither list


def _route_calls(
    m: Message, policy_of: dict[str, ToolCallPolicy | None], carry: set[str], plan: RangePlan
) -> None:
    """An assistant message's hinted and delegation calls are carried (stripped as their policy
    says); its text and its other calls go to the summary; omitted calls go nowhere."""
    carried: list[ToolCall] = []
    summarized: list[ToolCall] = []
    for c in m.tool_calls:
        policy = policy_of[c.id]
        if c.id in carry:
            carried.append(c)
        elif policy is None:
            summarized.append(c)
        elif policy.policy == "strip":
            stripped = c.model_copy(update={"arguments": STRIPPED_ARGUMENTS})
            carried.append(stripped if policy.request else c)
    if carried:
        plan.carried.append(
            m.model_copy(update={"content": "", "reasoning": "", "tool_calls": tuple(carried)})
        )
    if m.content.strip() or m.reasoning.strip() or summarized or not m.tool_calls:
        plan.to_summarize.append(m.model_copy(update={"tool_calls": tuple(summarized)}))


# --- fitting the carried messages under the threshold ------------------------------------------


def carried_tokens(plan: RangePlan, count: TokenCount) -> int:
    return sum(count(m) for m in plan.carried)


def fit_carried(
    plan: RangePlan, budget_tokens: int, count: TokenCount, order: dict[str, int]
) -> None:
    """Give up carried items until they fit ``budget_tokens``: delegation results first (oldest
    first), then the user turns between the task and the newest (oldest first); what is given
    up goes to the summary input instead, in conversation order. Then the task is cut to the
    room the newest turn leaves it (to no less than :data:`TASK_LEAST_TOKENS`), and the newest
    last (cut if it must). What a cut removes goes nowhere (:func:`shortened`): the turn's whole
    text is in the transcript, and a summary of part of a message would read as conversation."""
    carried = _Carried(plan.carried, count)
    while carried.total > budget_tokens and plan.delegation_calls:
        _demote_delegation(plan, carried, plan.delegation_calls.pop(0))
    newest = plan.user_ids[-1] if plan.user_ids else None
    task = plan.task_id if plan.task_id != newest else None
    given_up: set[str] = set()
    for message_id in plan.user_ids:
        if carried.total <= budget_tokens:
            break
        if message_id not in (task, newest):
            _demote_message(plan, carried, message_id)
            given_up.add(message_id)
    plan.user_ids = [u for u in plan.user_ids if u not in given_up]
    plan.carried = carried.messages()
    over = carried.total - budget_tokens
    if over > 0 and task is not None:
        over -= _cut_user_turn(plan, task, over, count, least=TASK_LEAST_TOKENS)
    if over > 0 and newest is not None:
        _cut_user_turn(plan, newest, over, count)
    plan.to_summarize.sort(key=lambda m: order.get(m.id, 0))


def lead_with_user(
    plan: RangePlan,
    messages: list[Message],
    budget_tokens: int,
    count: TokenCount,
    order: dict[str, int],
) -> None:
    """For a wire format whose history must open with a user turn (Anthropic's Messages API
    refuses any other): when the carried messages would open it with another role (a carried
    call), the newest user turn of the range before them is carried first, cut to what is left
    of ``budget_tokens`` as the newest user turn would be. When the range has no such turn
    before them (only earlier summaries), the carried messages before their first user turn go
    to the summary instead: a kept call is summarized rather than the history refused."""
    if not needs_user_lead(messages, plan.start, plan.carried):
        return
    lead = user_lead(messages, plan.start, plan.end, plan.carried)
    if lead is None:
        _summarize_until_user(plan, order)
        return
    plan.carried.insert(0, lead)
    plan.user_ids.insert(0, lead.id)
    plan.to_summarize = [m for m in plan.to_summarize if m.id != lead.id]
    over = carried_tokens(plan, count) - budget_tokens
    if over > 0:
        _cut_user_turn(plan, lead.id, over, count)
    plan.to_summarize.sort(key=lambda m: order.get(m.id, 0))


def needs_user_lead(messages: list[Message], start: int, kept: list[Message]) -> bool:
    """Whether ``kept`` (what stays of the wire range from ``start``) would open the history
    with a role other than the user's: it opens with another role, and the range opens the
    history (after its system messages)."""
    if not kept or kept[0].role == "user":
        return False
    return start == next((m.source_index for m in messages if m.role != "system"), start)


def user_lead(messages: list[Message], start: int, end: int, kept: list[Message]) -> Message | None:
    """The user turn to put before ``kept`` (what stays of the wire range ``start..end``) where
    it would otherwise open the history with another role (:func:`needs_user_lead`, which the
    caller asked): the newest one of the range before it that says something (not empty, not an
    earlier summary or a reduction's marker). None when there is no such turn."""
    ranged = [m for m in messages if start <= m.source_index < end]
    position = next((k for k, m in enumerate(ranged) if m.id == kept[0].id), 0)
    return next((m for m in reversed(ranged[:position]) if _a_user_turn(m)), None)


def before_first_user(kept: list[Message]) -> int:
    """How many of ``kept`` come before its first user turn (all of them when it has none):
    what must go where no user turn can lead them. Calls and their results stay together, as
    a result comes before the next user turn."""
    return next((k for k, m in enumerate(kept) if m.role == "user"), len(kept))


def _summarize_until_user(plan: RangePlan, order: dict[str, int]) -> None:
    given_up = before_first_user(plan.carried)
    plan.to_summarize.extend(plan.carried[:given_up])
    plan.carried = plan.carried[given_up:]
    still = {c.id for m in plan.carried for c in m.tool_calls}
    plan.delegation_calls = [c for c in plan.delegation_calls if c in still]
    plan.to_summarize.sort(key=lambda m: order.get(m.id, 0))


def _a_user_turn(m: Message) -> bool:
    said = bool(m.content.strip() or m.attachments)
    return m.role == "user" and said and not is_summary_message(m)


class _Carried:
    """The carried messages while items are given up one at a time: each message counted once
    and the total kept current, each message and call found by id, so that giving up every
    carried item costs time linear in them (not a recount and a scan per item)."""

    def __init__(self, messages: list[Message], count: TokenCount) -> None:
        self._count = count
        self.slots: list[Message | None] = list(messages)
        self.sizes = [count(m) for m in messages]
        self.total = sum(self.sizes)
        self.by_id: dict[str, list[int]] = {}
        self.by_call: dict[str, list[int]] = {}  # the call's message and its result's
        for k, m in enumerate(messages):
            self.by_id.setdefault(m.id, []).append(k)
            ids = [m.tool_call_id] if m.role == "tool" and m.tool_call_id is not None else []
            for call_id in dict.fromkeys([*ids, *(c.id for c in m.tool_calls)]):
                self.by_call.setdefault(call_id, []).append(k)

    def replace(self, k: int, m: Message | None) -> None:
        """Slot ``k`` now holds ``m`` (None: given up)."""
        self.total -= self.sizes[k]
        self.slots[k] = m
        self.sizes[k] = 0 if m is None else self._count(m)
        self.total += self.sizes[k]

    def messages(self) -> list[Message]:
        return [m for m in self.slots if m is not None]


def _demote_delegation(plan: RangePlan, carried: _Carried, call_id: str) -> None:
    for k in carried.by_call.get(call_id, ()):
        m = carried.slots[k]
        if m is None:
            continue
        if m.role == "tool" and m.tool_call_id == call_id:
            plan.to_summarize.append(m)
            carried.replace(k, None)
            continue
        calls = tuple(c for c in m.tool_calls if c.id == call_id)
        if calls:
            plan.to_summarize.append(m.model_copy(update={"tool_calls": calls}))
            rest = tuple(c for c in m.tool_calls if c.id != call_id)
            carried.replace(k, m.model_copy(update={"tool_calls": rest}) if rest else None)


def _demote_message(plan: RangePlan, carried: _Carried, message_id: str) -> None:
    for k in carried.by_id.get(message_id, ()):
        m = carried.slots[k]
        if m is not None:
            plan.to_summarize.append(m)
            carried.replace(k, None)


# The least a cut keeps of a carried turn's text, in tokens: of the task, enough to say what it
# asks; of the newest turn, its opening words.
TASK_LEAST_TOKENS = 64
TURN_LEAST_TOKENS = 32


def _cut_user_turn(
    plan: RangePlan, message_id: str, over: int, count: TokenCount, least: int = TURN_LEAST_TOKENS
) -> int:
    """Cut a carried user turn by about ``over`` tokens (keeping at least ``least`` of its
    text), cleanly (:func:`shortened`); the tokens it saved. Its images and files stay whole."""
    for k, m in enumerate(plan.carried):
        if m.id != message_id:
            continue
        text_tokens = max(count(m) - m.attachment_tokens, 1)
        keep = max(text_tokens - over - 16, least)
        chars = max(len(m.content) * keep // text_tokens, 64)
        cut = shortened(m.content, chars)
        if len(cut) >= len(m.content):
            return 0
        short = m.model_copy(update={"content": cut})
        plan.carried[k] = short
        return count(m) - count(short)
    return 0


# The line that stands where a carried turn was cut; a turn cut again keeps one, its count summed.
SHORTENED_NOTE = (
    "[… user message shortened by compaction: {removed} characters left out, the whole message "
    "is in the transcript …]"
)
_SHORTENED = re.compile(
    r"\[… user message shortened by compaction: (\d+) characters left out[^\n]*…\]\n?"
)
_FENCE = re.compile(r"[ \t]*(?:```|~~~)")


def shortened(text: str, keep: int) -> str:
    """``text`` cut to about ``keep`` characters, cleanly: its head (two thirds of them: a task
    says what it asks first) and its tail (the last instructions), each ending or starting at a
    line break outside a code fence where there is one in the second half of its part (else at
    a line break or a space, a fence opened or closed again so that none is left open), and
    between them one line saying how many characters were left out. A text already cut so is
    cut again around its note, and the note counts what both cuts removed."""
    note = _SHORTENED.search(text)
    head_end, tail_start = (len(text), 0) if note is None else (note.start(), note.end())
    earlier = int(note.group(1)) if note is not None else 0
    head_goal = min(keep * 2 // 3, head_end)
    tail_goal = max(len(text) - (keep - head_goal), tail_start)
    if note is None and head_goal >= tail_goal:
        return text
    lines = _line_starts(text)
    head, head_fenced = _break_before(text, lines, head_goal)
    tail, tail_fenced = _break_after(text, lines, tail_goal)
    kept_head, kept_tail = text[:head], text[tail:].lstrip("\n")
    # What the text held beyond what stays, its earlier note aside, and what that note counted.
    span = tail_start - head_end if note is not None else 0
    removed = earlier + len(text) - span - len(kept_head) - len(kept_tail)
    if kept_head and not kept_head.endswith("\n"):
        kept_head += "\n"
    if head_fenced:
        kept_head += "```\n"
    kept_tail = ("```\n" if tail_fenced else "") + kept_tail
    note_line = SHORTENED_NOTE.format(removed=removed)
    return f"{kept_head}{note_line}\n{kept_tail}" if kept_tail else f"{kept_head}{note_line}"


def _line_starts(text: str) -> list[tuple[int, bool]]:
    """(offset, inside a code fence) of each line's start, and of the text's end."""
    starts: list[tuple[int, bool]] = []
    fenced = False
    at = 0
    for line in text.splitlines(keepends=True):
        starts.append((at, fenced))
        if _FENCE.match(line):
            fenced = not fenced
        at += len(line)
    starts.append((at, fenced))
    return starts


def _break_before(text: str, lines: list[tuple[int, bool]], goal: int) -> tuple[int, bool]:
    """Where a head cut near ``goal`` (not after it) ends, and whether a fence is open there."""
    window = [(at, fenced) for at, fenced in lines if goal // 2 <= at <= goal]
    clean = [at for at, fenced in window if not fenced]
    if clean:
        return clean[-1], False
    if window:
        return window[-1]
    space = text.rfind(" ", goal // 2, goal)
    at = space if space > 0 else goal
    return at, _fenced_at(lines, at)


def _break_after(text: str, lines: list[tuple[int, bool]], goal: int) -> tuple[int, bool]:
    """Where a tail cut near ``goal`` (not before it) starts, and whether a fence is open there."""
    last = goal + (len(text) - goal) // 2
    window = [(at, fenced) for at, fenced in lines if goal <= at <= last]
    clean = [at for at, fenced in window if not fenced]
    if clean:
        return clean[0], False
    if window:
        return window[0]
    space = text.find(" ", goal, last)
    at = space + 1 if space >= 0 else goal
    return at, _fenced_at(lines, at)


def _fenced_at(lines: list[tuple[int, bool]], at: int) -> bool:
    """Whether offset ``at`` lies inside a code fence (the state of the line holding it)."""
    state = False
    for start, fenced in lines:
        if start > at:
            break
        state = fenced
    return state
