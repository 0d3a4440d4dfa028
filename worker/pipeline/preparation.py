"""The prepare step: over the threshold, pick the range to summarize and what is carried
verbatim, and the summary request for it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from worker.core.facts import extract_facts
from worker.core.identifiers import CALLS, TEXT, code_names
from worker.core.planning import (
    RangePlan,
    ToolPolicies,
    fit_carried,
    lead_with_user,
    plan_range,
    resolve_tool_policies,
)
from worker.core.projection import count_message_tokens, count_request_tokens
from worker.core.redaction import redact, redact_messages
from worker.pipeline.context import SnapshotContext
from worker.pipeline.evaluation import Evaluation
from worker.summarize import SummaryRequest
from worker.wire import formats
from worker.wire.events import event_id_for
from worker.wire.media import placeholders
from worker.wire.models import Message

MUST_KEEP_LIMIT = 60
# The code names the agent used (its calls and text, best ranked first) that join the LLM's
# checklist after the paths and errors: what the agent most often goes on to use.
MUST_KEEP_NAMES = 40


@dataclass(frozen=True)
class PreparedCompaction:
    plan: RangePlan
    policies: ToolPolicies
    request: SummaryRequest  # its messages and earlier summary redacted
    event_id: str
    redactions: dict[str, int]  # what was redacted from the request, by kind


def prepare(
    context: SnapshotContext, evaluation: Evaluation, *, instructions: str | None = None
) -> PreparedCompaction | None:
    """Pick the range and what is carried; None when there is nothing to compact.
    ``instructions``: the focus a requested compaction was given, for the summarizer."""
    config = context.config
    tokenizer = context.tokenizer
    policies = resolve_tool_policies(context.settings.tools)

    def count(m: Message) -> int:
        return count_message_tokens(m, tokenizer)

    plan = plan_range(context.messages, config, policies, count=count)
    if plan is None or not (plan.to_summarize or plan.previous_summary):
        return None
    budget = _carry_budget(context, evaluation, plan)
    order = {m.id: i for i, m in enumerate(context.messages)}
    fit_carried(plan, budget, count, order)
    if formats.opens_with_user(context.parsed.snapshot.format):
        lead_with_user(plan, context.messages, budget, count, order)
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
    if previous is not None:
        redactions = dict(Counter(redactions) + Counter(previous.counts))
    request = SummaryRequest(
        conversation_id=context.conversation_id,
        revision=context.revision,
        messages=messages,
        previous_summary=previous.text if previous is not None else None,
        previous_summary_ids=plan.summary_ids,
        must_keep=_must_keep(messages),
        max_input_chars=config.summary_max_input_chars,
        max_output_tokens=config.summary_max_output_tokens,
        source_tokens=sum(count(m) for m in plan.to_summarize)
        + (tokenizer.count(plan.previous_summary) if plan.previous_summary else 0),
        model=context.snapshot.model.name or None,
        instructions=instructions,
    )
    return PreparedCompaction(
        plan=plan, policies=policies, request=request, event_id=event_id, redactions=redactions
    )


def _carry_budget(context: SnapshotContext, evaluation: Evaluation, plan: RangePlan) -> int:
    """Tokens the carried messages may use so that the result lands under the threshold."""
    if evaluation.threshold is None:
        return 1 << 62
    kept = [
        m
        for m in evaluation.projection.messages
        if m.source_index < plan.start or m.source_index >= plan.end
    ]
    summary_room = context.config.summary_max_output_tokens + 16
    # What the provider counts beyond our count (usage) is assumed to stay after compaction.
    beyond = max(evaluation.usage.offset, 0) if evaluation.usage is not None else 0
    kept_tokens = count_request_tokens(kept, context.tokenizer)
    return evaluation.threshold - kept_tokens - summary_room - beyond


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
