"""The prepare step: over the threshold, pick the range to summarize and what is carried
verbatim, and the summary request for it."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from worker.config import CompactionConfig
from worker.core.cost import ceiling_tokens
from worker.core.facts import extract_facts
from worker.core.identifiers import CALLS, TEXT, code_names, names_shown
from worker.core.pins import carry_pinned
from worker.core.planning import (
    RangePlan,
    ToolPolicies,
    fit_carried,
    is_summary_message,
    lead_with_user,
    plan_range,
    resolve_tool_policies,
)
from worker.core.projection import REPLY_PRIMING_TOKENS, count_message_tokens
from worker.core.redaction import redact, redact_messages
from worker.pipeline.context import SnapshotContext
from worker.pipeline.evaluate import Evaluation
from worker.summarize import SummaryRequest
from worker.tokens import counted_by
from worker.wire import formats
from worker.wire.events import Floor, event_id_for
from worker.wire.media import placeholders
from worker.wire.models import Message

MUST_KEEP_LIMIT = 60
# The code names the agent used (its calls and text, best ranked first) that join the LLM's
# checklist after the paths and errors: what the agent most often goes on to use.
MUST_KEEP_NAMES = 40


@dataclass(frozen=True)
class PlannedCompaction:
    """The range, what is carried, and the least the compaction would leave (``floor``), with
    the summary's bound: what decides whether a compaction can pay before anything is paid."""

    plan: RangePlan
    policies: ToolPolicies
    floor: Floor
    summary_bound: int
    tokens_before: int
    required_gain: int

    @property
    def pays(self) -> bool:
        """Whether even a summary at its bound leaves the request smaller by the gain a
        compaction must make."""
        return self.tokens_before - self.floor.total >= self.required_gain


@dataclass(frozen=True)
class PreparedCompaction:
    plan: RangePlan
    policies: ToolPolicies
    request: SummaryRequest  # its messages and earlier summary redacted
    event_id: str
    redactions: dict[str, int]  # what was redacted from the request, by kind
    planned: PlannedCompaction


# The summary message's framing beyond its text: the marker line and the message's own.
SUMMARY_FRAMING_TOKENS = 16


def plan_compaction(context: SnapshotContext, evaluation: Evaluation) -> PlannedCompaction | None:
    """Pick the range and what is carried (fitted under the target), and count what the
    compaction would leave; None when there is nothing to compact."""
    config = context.config
    policies = resolve_tool_policies(context.settings.tools)
    count = _counter(context)
    plan = plan_range(context.messages, config, policies, count=count)
    if plan is None:
        return None
    pinned = carry_pinned(plan, context.messages)
    if not (plan.to_summarize or plan.previous_summary):
        return None
    least = config.summary_output_bound(evaluation.threshold)
    kept = _kept_parts(evaluation, plan)
    beyond = max(evaluation.usage.offset, 0) if evaluation.usage is not None else 0
    target = config.target_tokens(evaluation.threshold)
    # What the target leaves once what is kept is counted: the carried messages fit in it
    # beside a summary of at least ``least`` tokens.
    room = (
        None
        if target is None
        else target - kept.system - kept.native_compaction - kept.protected - beyond
    )
    scale = _summary_scale(context)
    least_room = math.ceil(least * scale) + SUMMARY_FRAMING_TOKENS
    budget = 1 << 62 if room is None else room - least_room
    order = {m.id: i for i, m in enumerate(context.messages)}
    fit_carried(plan, budget, count, order)
    if formats.opens_with_user(context.parsed.snapshot.format):
        lead_with_user(plan, context.messages, budget, count, order)
    carried = sum(count(m) for m in plan.carried)
    pins = sum(count(m) for m in plan.carried if m.id in pinned)
    bound = _summary_bound(config, least, room, carried, scale)
    summary_room = math.ceil(bound * scale) + SUMMARY_FRAMING_TOKENS
    parts = {
        "system": kept.system,
        "native_compaction": kept.native_compaction,
        "pinned": pins,
        "carried": carried - pins,
        "protected": kept.protected,
        "beyond": beyond,
        "summary": summary_room,
    }
    before = evaluation.projected_tokens
    floor = Floor(**parts, total=sum(parts.values()))
    return PlannedCompaction(
        plan=plan,
        policies=policies,
        floor=floor,
        summary_bound=bound,
        tokens_before=before,
        required_gain=_required_gain(config, evaluation, before, floor),
    )


# A summary's bound is in the summarizer's tokens (tiktoken's); a request of a model whose
# tokenizer tiktoken does not know is counted by the calibrated estimate, which makes a
# summary's text up to this many times as many tokens (measured on the corpus's digests: 1.12).
ESTIMATED_SUMMARY_SCALE = 1.15


def _summary_scale(context: SnapshotContext) -> float:
    """What a summary token costs in the request's count."""
    return 1.0 if counted_by(context.tokenizer) == "tiktoken" else ESTIMATED_SUMMARY_SCALE


def _summary_bound(
    config: CompactionConfig, least: int, room: int | None, carried: int, scale: float
) -> int:
    """The summary's bound: ``summary_max_output_tokens`` when it was set; else whatever the
    target leaves once the carried messages are in (``room`` and ``carried`` in the request's
    count; a summary token costs ``scale`` of them), at least ``least`` (the derived bound) and
    at most ``summary_max_output_tokens``: the more a summary may say, the more of the story it
    keeps, and the target is still where the compaction lands."""
    if room is None or "summary_max_output_tokens" in config.model_fields_set:
        return least
    left = room - carried - SUMMARY_FRAMING_TOKENS
    return max(least, min(int(left / scale), config.summary_max_output_tokens))


def _required_gain(
    config: CompactionConfig, evaluation: Evaluation, before: int, floor: Floor
) -> int:
    """The gain a compaction must make (docs/configuration.md, "When a compaction pays"):

    - at least the minimum gain, always;
    - when what it would leave (``floor``) fits the target, enough to land there;
    - when only an exceptionally large newest exchange (over the room between target and
      threshold) keeps it from the target, a whole threshold's worth: it waits a turn for that
      exchange to become compactable, instead of compacting now and again next turn;
    - when the floor lands it over the target but at least half that room under the threshold,
      the minimum gain;
    - when the floor lands it nearer the threshold, the room between target and threshold: the
      hysteresis, so that the history grows by that much between two such compactions instead
      of being compacted on every turn;
    - when what can never be compacted is itself over the threshold (a system prompt larger
      than it), a whole threshold's worth: compacted a threshold at a time;
    - near the model's window (``cost_ceiling_percent`` of it, when the window is known), the
      minimum gain alone: the request must not overflow."""
    gain = config.min_gain_tokens(before)
    threshold = evaluation.threshold
    target = config.target_tokens(threshold)
    if threshold is None or target is None:
        return gain
    window = evaluation.context_window
    if window is not None and before >= ceiling_tokens(threshold, window, config):
        return gain
    if floor.total <= target:
        return max(gain, before - target)
    room = threshold - target
    if floor.protected > room and floor.total - floor.protected <= target:
        # Only an exceptionally large newest exchange keeps the compaction from its target: it
        # is compactable from the next turn on, so wait for it unless a whole threshold's worth
        # goes now (compacting now would compact again on the next turn).
        return max(gain, threshold)
    if floor.total - floor.summary > threshold:
        # What can never be compacted is itself over the threshold: compact a threshold's
        # worth at a time (the threshold is what the conversation may hold besides it).
        return max(gain, threshold)
    if floor.total <= threshold - room // 2:
        return gain  # over its target, but with room for the turns that follow
    return max(gain, room)


def prepare(
    context: SnapshotContext,
    evaluation: Evaluation,
    planned: PlannedCompaction,
    *,
    instructions: str | None = None,
) -> PreparedCompaction:
    """The summary request for a planned compaction. ``instructions``: the focus a requested
    compaction was given, for the summarizer."""
    config = context.config
    tokenizer = context.tokenizer
    plan = planned.plan
    # A requested compaction is its own event (by its request), beside any other of the range.
    requested = [evaluation.request_id] if evaluation.request_id else []
    event_id = event_id_for(
        context.conversation_id,
        context.revision,
        "compaction.completed",
        plan.start,
        plan.end,
        *requested,
    )
    # Secrets never reach a summarizer: what it is given (and what the must-keep facts, the
    # fidelity check and its repair are drawn from) is the redacted range.
    messages, redactions = redact_messages(plan.to_summarize)
    previous = redact(plan.previous_summary) if plan.previous_summary else None
    # A requested compaction's instructions are user text for the LLM: redacted as the range.
    focus = redact(instructions) if instructions else None
    for extra in (previous, focus):
        if extra is not None:
            redactions = dict(Counter(redactions) + Counter(extra.counts))
    count = _counter(context)
    request = SummaryRequest(
        conversation_id=context.conversation_id,
        revision=context.revision,
        messages=messages,
        previous_summary=previous.text if previous is not None else None,
        previous_summary_ids=plan.summary_ids,
        # The LLM's checklist: no LLM is asked when the mode is local only.
        must_keep=_must_keep(messages) if config.mode != "local_only" else [],
        shown_beside=frozenset(names_shown(_kept_beside(context.messages, plan))),
        max_input_chars=config.summary_max_input_chars,
        max_output_tokens=planned.summary_bound,
        source_tokens=sum(count(m) for m in plan.to_summarize)
        + (tokenizer.count(plan.previous_summary) if plan.previous_summary else 0),
        model=context.snapshot.model.name or None,
        instructions=focus.text if focus is not None else None,
    )
    return PreparedCompaction(
        plan=plan,
        policies=planned.policies,
        request=request,
        event_id=event_id,
        redactions=redactions,
        planned=planned,
    )


def _counter(context: SnapshotContext) -> Callable[[Message], int]:
    tokenizer = context.tokenizer

    def count(m: Message) -> int:
        return count_message_tokens(m, tokenizer)

    return count


@dataclass(frozen=True)
class _Kept:
    """The projected tokens outside the range: its head (system messages; a native compaction
    and what it superseded) and the protected tail (the reply's priming included)."""

    system: int
    native_compaction: int
    protected: int


def _kept_parts(evaluation: Evaluation, plan: RangePlan) -> _Kept:
    system = native = protected = 0
    for m, n in zip(evaluation.projection.messages, evaluation.counted.counts, strict=True):
        if m.source_index >= plan.end:
            protected += n
        elif m.source_index < plan.start:
            if m.superseded or m.native_compaction:
                native += n
            else:
                system += n
    return _Kept(system, native, protected + REPLY_PRIMING_TOKENS)


def _kept_beside(messages: list[Message], plan: RangePlan) -> list[Message]:
    """The messages that stay verbatim beside the summary: before the range, carried out of
    it, after it (an earlier summary among them is replaced, not kept). The range is in wire
    indices: one wire message may be several messages here (a provider's content blocks)."""
    outside = [m for m in messages if not plan.start <= m.source_index < plan.end]
    return [m for m in [*outside, *plan.carried] if not is_summary_message(m)]


def _must_keep(messages: list[Message]) -> list[str]:
    """Paths, the first line of each failure, and a placeholder per image or file (the
    summary names the range's images, so the model knows they existed); then the code names
    the agent used. The LLM gets them as a checklist before the conversation (the fidelity
    gate checks its own facts, not these)."""
    facts = extract_facts(messages)
    items = list(facts.paths)
    for action in facts.failing:
        items.extend(action.error_lines[:1])
    items += [name for m in messages for name in placeholders(m.id, m.attachments)]
    items = list(dict.fromkeys(items))[:MUST_KEEP_LIMIT]
    listed = set(items)
    names = [n.text for n in code_names(messages) if n.tier in (CALLS, TEXT)]
    return items + [n for n in names if n not in listed][:MUST_KEEP_NAMES]
