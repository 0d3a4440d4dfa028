"""Reducing a compacted range by a strategy instead of summarizing it (``[compaction] reduction``).

The range is picked as for a summary. A strategy of :mod:`worker.core.strategies` (or
:class:`Masking`, observation masking) is run over the whole history (leading system messages,
the range, the protected tail), as the strategies expect, and the messages of its result that
lie in the range stand for the range: kept as they were, or rewritten (a tool output replaced
by a placeholder). One marker message follows them, counting what was omitted or replaced so
far (an earlier reduction's marker in the range is taken over), so that the agent and the model
know something was there. A pinned message of the range (and its group) stays as it was,
whatever the strategy did with it. Pure: no LLM, no digest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from worker.config import CompactionConfig, Reduction
from worker.core.groups import group_messages, protected_tail_start
from worker.core.planning import before_first_user, needs_user_lead, user_lead
from worker.core.strategies import (
    CompactionStrategy,
    SelectiveToolResult,
    SelectiveToolResultConfig,
    SlidingWindow,
    SlidingWindowConfig,
    TokenBudget,
    TokenBudgetConfig,
    Truncation,
    TruncationConfig,
)
from worker.tokens import Tokenizer
from worker.wire.events import SUMMARY_MARKER
from worker.wire.models import Message

# token_budget's bound when no threshold is known (auto-compaction off and none configured):
# half of the default threshold, as the bound is half the threshold otherwise.
UNKNOWN_THRESHOLD_BUDGET = 25_000

# The marker message a reduction leaves (:func:`marker_text`), and its two counts.
_MARKER = re.compile(rf"^{re.escape(SUMMARY_MARKER)} Reduced by \w+ at revision \d+: (.*?); no ")
_OMITTED = re.compile(r"(\d+) earlier messages? omitted")
_MASKED = re.compile(r"(\d+) older tool outputs? replaced")


@dataclass(frozen=True)
class ReducedRange:
    """What a strategy made of a range: ``kept`` (in order, each as it was or rewritten; the
    ``rewritten`` ones by id) and ``omitted`` (the range's messages it dropped, and the markers
    of earlier reductions, which the new marker takes over). ``omitted_count``: the wire
    messages omitted so far (an earlier marker counts those it stood for); ``masked_count``:
    the tool outputs replaced by a placeholder so far. ``changed``: the strategy dropped or
    rewrote something (taking over earlier markers alone is no reduction)."""

    kept: list[Message]
    rewritten: frozenset[str]
    omitted: list[Message]
    omitted_count: int
    masked_count: int
    changed: bool


class Masking:
    """Observation masking: the newest ``keep`` tool outputs before the protected tail keep
    their text, every older one is replaced by a placeholder that says how long it was; the
    calls, the reasoning and every other message stay as they were.

    Unlike :class:`~worker.core.strategies.SelectiveToolResult`, ``keep`` counts only the
    outputs the compaction may touch (the protected tail's are always kept and not counted),
    and the placeholder says how much was there. An output no longer than its placeholder is
    left as it is."""

    def __init__(self, keep: int) -> None:
        self.keep = keep

    def compact(self, messages: list[Message]) -> list[Message]:
        groups = group_messages(messages)
        tail = groups[protected_tail_start(groups)].start if groups else 0
        outputs = [i for i, m in enumerate(messages[:tail]) if m.role == "tool"]
        stale = set(outputs[: max(len(outputs) - self.keep, 0)])
        return [_masked(m) if i in stale else m for i, m in enumerate(messages)]


def masked_output(content: str) -> str:
    lines = content.count("\n") + 1
    return f"[tool output masked: {lines} line{'s' if lines != 1 else ''} omitted]"


def _masked(message: Message) -> Message:
    placeholder = masked_output(message.content)
    if len(message.content) <= len(placeholder):
        return message
    return message.model_copy(update={"content": placeholder})


def strategy_for(
    config: CompactionConfig, tokenizer: Tokenizer, threshold: int | None
) -> CompactionStrategy:
    """The strategy ``config.reduction`` names, with its knob (``threshold``: the trigger
    token_budget's default bound is derived from). Not for ``summary``."""
    reduction = config.reduction
    if reduction == "truncation":
        return Truncation(TruncationConfig(max_messages=config.reduction_max_messages))
    if reduction == "sliding_window":
        return SlidingWindow(SlidingWindowConfig(window=config.reduction_window))
    if reduction == "token_budget":
        budget = TokenBudgetConfig(max_tokens=token_budget(config, threshold))
        return TokenBudget(budget, tokenizer)
    if reduction == "selective_tool_result":
        keep = SelectiveToolResultConfig(keep_last=config.reduction_keep_tool_results)
        return SelectiveToolResult(keep)
    if reduction == "masking":
        return Masking(config.reduction_keep_tool_results)
    raise ValueError(f"{reduction!r} is no strategy")


def token_budget(config: CompactionConfig, threshold: int | None) -> int:
    """``reduction_max_tokens``, else half the trigger ``threshold``: landing just under the
    trigger would have the next turn compact again; half leaves room for as many turns."""
    if config.reduction_max_tokens is not None:
        return config.reduction_max_tokens
    if threshold is None:
        return UNKNOWN_THRESHOLD_BUDGET
    return max(threshold // 2, 1)


def reduce_range(
    messages: list[Message],
    start: int,
    end: int,
    strategy: CompactionStrategy,
    *,
    opens_with_user: bool = False,
) -> ReducedRange:
    """``strategy`` run over ``messages``; its part standing for wire messages ``start..end``.
    ``opens_with_user``: the wire format refuses a history that does not open with a user turn
    (Anthropic's), so when the kept part would open it with another role, the newest user turn
    before it is kept too (or, when there is none, what is kept before its first user turn is
    omitted)."""
    result = strategy.compact(messages)
    given = {m.id: m for m in messages}
    ranged = [m for m in messages if start <= m.source_index < end]
    survived = [m for m in result if start <= m.source_index < end]
    kept = _with_pins(messages, ranged, [m for m in survived if marker_counts(m) is None])
    if opens_with_user and needs_user_lead(messages, start, kept):
        lead = user_lead(messages, start, end, kept)
        # With no user turn to lead them, what comes before the first kept one is omitted.
        kept = [lead, *kept] if lead is not None else kept[before_first_user(kept) :]
    rewritten = frozenset(m.id for m in kept if given.get(m.id) is not m)
    left = {m.id for m in kept}
    omitted = [m for m in ranged if m.id not in left]
    omitted_count, masked = _counts(omitted)
    changed = len(survived) < len(ranged) or bool(rewritten)
    return ReducedRange(kept, rewritten, omitted, omitted_count, masked + len(rewritten), changed)


def _with_pins(
    messages: list[Message], ranged: list[Message], kept: list[Message]
) -> list[Message]:
    """``kept`` with every pinned message of the range (and its group) as it was, whatever the
    strategy did with it (docs/snapshot.md, "Pins"), in conversation order."""
    if not any(m.pinned for m in ranged):
        return kept
    pinned = {
        messages[i].id
        for g in group_messages(messages)
        if any(messages[i].pinned for i in g.indices())
        for i in g.indices()
    }
    as_kept = {m.id: m for m in kept}
    return [
        m if m.id in pinned else as_kept[m.id] for m in ranged if m.id in pinned or m.id in as_kept
    ]


def _counts(omitted: list[Message]) -> tuple[int, int]:
    """(wire messages, tool outputs masked) that ``omitted`` stands for: an earlier marker
    counts what it said, any other wire message itself."""
    # One wire message may be several normalized ones (an Anthropic turn): counted once.
    messages: dict[int, int] = {}
    masked = 0
    for m in omitted:
        counts = marker_counts(m)
        if counts is None:
            messages.setdefault(m.source_index, 1)
        else:
            messages[m.source_index] = counts[0]
            masked += counts[1]
    return sum(messages.values()), masked


def marker_counts(message: Message) -> tuple[int, int] | None:
    """(messages omitted, tool outputs replaced) an earlier reduction's marker says; None for
    any other message."""
    found = _MARKER.match(message.content) if message.role == "user" else None
    if found is None:
        return None
    said = found.group(1)
    omitted, masked = _OMITTED.search(said), _MASKED.search(said)
    return int(omitted.group(1)) if omitted else 0, int(masked.group(1)) if masked else 0


def marker_text(reduction: Reduction, revision: int, omitted: int, masked: int) -> str:
    """The message that ends a reduction's replacement: what was omitted or replaced so far,
    by which reduction (read back by :func:`marker_counts` when a later one takes it over).
    The revision makes it unique, which is how an agent tells an applied event."""
    said = []
    if omitted:
        said.append(f"{omitted} earlier message{_s(omitted)} omitted")
    if masked:
        said.append(f"{masked} older tool output{_s(masked)} replaced by a placeholder")
    return (
        f"{SUMMARY_MARKER} Reduced by {reduction} at revision {revision}: "
        f"{', '.join(said)}; no summary of them was made."
    )


def _s(count: int) -> str:
    return "" if count == 1 else "s"
