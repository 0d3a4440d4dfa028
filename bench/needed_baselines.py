"""The baselines of the needed-later benchmark, each held to a token budget over a range.

Every baseline takes the compacted range (OpenAI-format wire messages) and a budget in tokens
and returns the messages it keeps of that range, some with their tool output replaced by a
placeholder; nothing returned is larger than the budget (by :class:`Sizer`), except that an
empty list is always within it. Tool exchanges (an assistant message with tool calls and the
tool messages answering them) are kept or dropped whole.

Ours (written here, after the published descriptions):

- ``truncation``: LangChain's ``trim_messages(strategy="last")``: the newest whole groups that
  fit, stopping at the first that does not; the first task message (when the range holds it)
  stays pinned at the front, as the system prompt stays outside the range.
- ``masking``: observation masking ("The Complexity Trap", Lindenbauer et al. 2025): the newest
  tool outputs stay, every older one becomes ``[output omitted]``; as many stay as fit; when
  even none fit, truncation as above.
- ``clearing``: Anthropic's tool-result clearing (``clear_tool_uses``, keep 3): all but the 3
  newest tool results become ``[tool result cleared]``, then truncation to the budget.

The product's strategies (``worker.core.strategies``, imported read-only), run over the whole
history before the cut (they keep its leading system message and protected tail themselves,
and those lie outside the range; the first task is taken out and pinned in front, as above)
with the most generous setting whose part in the range fits:
``Truncation`` (``max_messages``), ``SlidingWindow`` (``window``), ``TokenBudget``
(``max_tokens``) and ``SelectiveToolResult`` (``keep_last``; it never drops a message, so when
even ``keep_last = 0`` is over the budget it is followed by ``TokenBudget``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.core.strategies import (
    SelectiveToolResult,
    SelectiveToolResultConfig,
    SlidingWindow,
    SlidingWindowConfig,
    TokenBudget,
    TokenBudgetConfig,
    Truncation,
    TruncationConfig,
)
from worker.tokens import count_tokens, tokenizer_for
from worker.wire.formats import to_messages
from worker.wire.models import Message

Wire = dict[str, Any]
# What a chat format adds around each message (role, separators): dropping a message saves it.
MESSAGE_OVERHEAD = 4
MASKED = "[output omitted]"
CLEARED = "[tool result cleared]"
CLEARING_KEEP = 3


class Sizer:
    """Tokens of wire messages: ``worker.tokens.count_tokens`` (o200k_base) of each message's
    content, tool-call names and raw arguments, plus :data:`MESSAGE_OVERHEAD`; cached by text."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def text(self, text: str) -> int:
        if not text:
            return 0
        n = self._counts.get(text)
        if n is None:
            n = self._counts[text] = count_tokens(text)
        return n

    def message(self, message: Wire) -> int:
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        n = MESSAGE_OVERHEAD + self.text(content if isinstance(content, str) else "")
        for call in message.get("tool_calls") or []:
            fn = call.get("function") or {}
            n += self.text(str(fn.get("name", ""))) + self.text(str(fn.get("arguments", "")))
        return n

    def history(self, messages: list[Wire]) -> int:
        return sum(self.message(m) for m in messages)


# --- groups and truncation ----------------------------------------------------------------------


def wire_groups(messages: list[Wire]) -> list[list[int]]:
    """Indices of each group: an assistant message with its answering tool messages, or one
    message alone."""
    groups: list[list[int]] = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if m.get("role") == "tool" and m.get("tool_call_id") in open_calls and groups:
            groups[-1].append(i)
            continue
        groups.append([i])
        open_calls = {str(c.get("id")) for c in m.get("tool_calls") or []}
    return groups


def truncate(
    messages: list[Wire], budget: int, sizer: Sizer, pinned: int | None = None
) -> list[Wire]:
    """The newest whole groups within ``budget`` (stopping at the first that does not fit),
    after ``messages[pinned]`` when it fits (the first task)."""
    spent = 0
    head: list[Wire] = []
    if pinned is not None and sizer.message(messages[pinned]) <= budget:
        head = [messages[pinned]]
        spent = sizer.message(messages[pinned])
    kept: list[list[int]] = []
    for group in reversed(wire_groups(messages)):
        if pinned in group:
            continue
        cost = sum(sizer.message(messages[i]) for i in group)
        if spent + cost > budget:
            break
        spent += cost
        kept.append(group)
    return head + [messages[i] for g in reversed(kept) for i in g]


def with_placeholder(message: Wire, placeholder: str) -> Wire:
    content = message.get("content")
    if isinstance(content, str) and len(content) <= len(placeholder):
        return message
    return {**message, "content": placeholder}


def masked(messages: list[Wire], keep: int, placeholder: str) -> list[Wire]:
    """Every tool output but the newest ``keep`` replaced by ``placeholder``."""
    tools = [i for i, m in enumerate(messages) if m.get("role") == "tool"]
    stale = set(tools[: max(len(tools) - keep, 0)])
    return [with_placeholder(m, placeholder) if i in stale else m for i, m in enumerate(messages)]


def truncation(messages: list[Wire], budget: int, sizer: Sizer, pinned: int | None) -> list[Wire]:
    return truncate(messages, budget, sizer, pinned)


def masking(messages: list[Wire], budget: int, sizer: Sizer, pinned: int | None) -> list[Wire]:
    tools = sum(m.get("role") == "tool" for m in messages)
    keep = largest(0, tools, lambda k: sizer.history(masked(messages, k, MASKED)) <= budget)
    if keep is not None:
        return masked(messages, keep, MASKED)
    return truncate(masked(messages, 0, MASKED), budget, sizer, pinned)


def clearing(messages: list[Wire], budget: int, sizer: Sizer, pinned: int | None) -> list[Wire]:
    return truncate(masked(messages, CLEARING_KEEP, CLEARED), budget, sizer, pinned)


OURS: dict[str, Callable[[list[Wire], int, Sizer, int | None], list[Wire]]] = {
    "truncation": truncation,
    "masking": masking,
    "clearing": clearing,
}


def largest(lo: int, hi: int, fits: Callable[[int], bool]) -> int | None:
    """The largest ``x`` in ``[lo, hi]`` with ``fits(x)``, ``fits`` being monotone (true up to
    some point); None when not even ``lo`` fits."""
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


# --- the product's strategies -------------------------------------------------------------------


@dataclass
class History:
    """The history before the cut as wire messages, where the compacted range lies in it, and
    the first task message when the range holds it (``task``, a wire index: pinned)."""

    wire: list[Wire]
    start: int
    end: int
    task: int | None = None
    messages: list[Message] = field(init=False)
    _originals: set[int] = field(init=False)

    def __post_init__(self) -> None:
        # The strategies see the history without the pinned task; it is put back in front.
        everything = to_messages("openai", self.wire)
        self.messages = [m for m in everything if m.source_index != self.task]
        self._originals = {id(m) for m in self.messages}

    def range_part(self, kept: list[Message]) -> list[Wire]:
        """The kept messages of the range, as wire messages (a rewritten tool output is the
        strategy's text)."""
        out: list[Wire] = []
        for m in kept:
            if not self.start <= m.source_index < self.end:
                continue
            raw = self.wire[m.source_index]
            if id(m) not in self._originals and m.role == "tool":
                raw = {**raw, "content": m.content}
            out.append(raw)
        return out


class StrategyBaselines:
    """The product's strategies held to budgets over one history (token counts cached). The
    first task stays pinned in front when it fits, as for the other baselines."""

    def __init__(self, history: History, sizer: Sizer) -> None:
        self.history = history
        self.sizer = sizer
        self.tokenizer = tokenizer_for(None)
        self.tools = sum(m.role == "tool" for m in history.messages)

    def size(self, kept: list[Message]) -> int:
        return self.sizer.history(self.history.range_part(kept))

    def run(self, name: str, budget: int) -> list[Wire]:
        compact = {
            "Truncation": self._truncation,
            "SlidingWindow": self._sliding_window,
            "TokenBudget": self._token_budget,
            "SelectiveToolResult": self._selective,
        }[name]
        h = self.history
        head = [h.wire[h.task]] if h.task is not None else []
        if head and self.sizer.history(head) > budget:
            head = []
        rest = budget - self.sizer.history(head)
        return head + h.range_part(compact(h.messages, rest))

    def _fitted(
        self, make: Callable[[int], list[Message]], hi: int, budget: int
    ) -> list[Message] | None:
        best = largest(1, hi, lambda n: self.size(make(n)) <= budget)
        return make(best) if best is not None else None

    def _truncation(self, messages: list[Message], budget: int) -> list[Message]:
        def make(n: int) -> list[Message]:
            return Truncation(TruncationConfig(max_messages=n)).compact(messages)

        return self._fitted(make, len(messages), budget) or []

    def _sliding_window(self, messages: list[Message], budget: int) -> list[Message]:
        def make(n: int) -> list[Message]:
            return SlidingWindow(SlidingWindowConfig(window=n)).compact(messages)

        return self._fitted(make, len(messages), budget) or []

    def _token_budget(self, messages: list[Message], budget: int) -> list[Message]:
        def make(n: int) -> list[Message]:
            return TokenBudget(TokenBudgetConfig(max_tokens=n), self.tokenizer).compact(messages)

        hi = self.sizer.history(self.history.wire) * 2 + 16
        return self._fitted(make, hi, budget) or []

    def _selective(self, messages: list[Message], budget: int) -> list[Message]:
        def make(k: int) -> list[Message]:
            return SelectiveToolResult(SelectiveToolResultConfig(keep_last=k)).compact(messages)

        keep = largest(0, self.tools, lambda k: self.size(make(k)) <= budget)
        if keep is not None:
            return make(keep)
        return self._token_budget(make(0), budget)


STRATEGIES = ("Truncation", "SlidingWindow", "TokenBudget", "SelectiveToolResult")
