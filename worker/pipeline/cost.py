"""The cost step: the ``cost`` object of a snapshot's compaction, estimated before it exists
(for the ``cost`` policy's decision) or measured after (for the completed event), with the
prices of the conversation's model and of the summarizing one (worker.core.cost)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from worker.core import cost as model
from worker.core.planning import compactable_groups
from worker.core.projection import REPLY_PRIMING_TOKENS
from worker.pipeline.context import SnapshotContext
from worker.pipeline.evaluate import Evaluation
from worker.pipeline.reduce import build_reduction, prepare_reduction
from worker.wire.events import Compaction, Cost

# The summary is estimated at this share (%) of what it summarizes, at most its bound: the
# digest's summaries of the corpus's ranges stay well under it (BENCHMARKS.md), so the estimate
# errs towards a larger result, i.e. a smaller gain.
SUMMARY_SHARE = 25


def uses_llm(context: SnapshotContext, has_llm: bool) -> bool:
    """Whether the summary would come from the LLM (whose call costs money): never under a
    reduction strategy, which calls no summarizer."""
    config = context.config
    return has_llm and config.mode != "local_only" and config.reduction == "summary"


def activity_of(
    context: SnapshotContext, stored: model.Activity | None, now: datetime
) -> model.Activity:
    """The conversation's pace: what the service stored (``cw:{conv}:activity``), with the
    time the agent says it sent its last request when that is later, evaluated ``now``."""
    base = stored or model.Activity()
    last = base.last_at
    usage = context.snapshot.usage
    if usage is not None and usage.requested_at is not None:
        said = usage.requested_at.timestamp()
        last = said if last is None else max(last, said)
    return model.Activity(
        snapshots=base.snapshots, first_at=base.first_at, last_at=last, now=now.timestamp()
    )


def turns_so_far(context: SnapshotContext) -> int:
    """The assistant replies in the history: the turns it has had."""
    return sum(1 for m in context.messages if m.role == "assistant")


def estimated_cost(
    context: SnapshotContext, evaluation: Evaluation, activity: model.Activity, *, has_llm: bool
) -> Cost:
    """The cost of compacting now, before doing it: what would stay (leading system messages,
    the protected tail, the newest user turns up to ``preserve_recent_user_tokens``) plus a
    summary of :data:`SUMMARY_SHARE` % of the rest, at most ``summary_max_output_tokens``.
    Under a reduction strategy, exactly what the strategy would leave."""
    config = context.config
    if config.reduction != "summary":
        return _reduction_cost(context, evaluation, activity)
    messages = evaluation.projection.messages
    counts = evaluation.counted.counts
    groups, first, tail = compactable_groups(messages)
    beyond = evaluation.projected_tokens - evaluation.counted.tokens  # the usage's offset
    if first >= tail:
        ranged, kept, users = 0, evaluation.counted.tokens - REPLY_PRIMING_TOKENS, 0
    else:
        inside = range(groups[first].start, groups[tail].start)
        ranged = sum(counts[i] for i in inside)
        kept = sum(counts) - ranged
        users = sum(counts[i] for i in inside if messages[i].role == "user")
    carried = min(users, config.preserve_recent_user_tokens)
    summarized = max(ranged - carried, 0)
    bound = config.summary_output_bound(evaluation.threshold)
    summary_out = min(bound, summarized * SUMMARY_SHARE // 100)
    after = REPLY_PRIMING_TOKENS + kept + carried + summary_out + max(beyond, 0)
    return _cost(
        context,
        model.CostInputs(
            tokens_before=evaluation.projected_tokens,
            tokens_after=min(after, evaluation.projected_tokens),
            summary_input_tokens=summarized,
            summary_output_tokens=summary_out,
            horizon_turns=model.horizon_turns(turns_so_far(context), config),
            activity=activity,
        ),
        has_llm=has_llm,
    )


def _reduction_cost(
    context: SnapshotContext, evaluation: Evaluation, activity: model.Activity
) -> Cost:
    """A strategy calls no summarizer and is pure, so its compaction is made here and costed
    by its exact tokens after (the same as the compaction that follows, if it is decided)."""
    prepared = prepare_reduction(context, evaluation)
    before = evaluation.projected_tokens
    after = (
        before if prepared is None else build_reduction(context, prepared, evaluation).tokens_after
    )
    inputs = model.CostInputs(
        tokens_before=before,
        tokens_after=after,  # more than before when the strategy's markers outweigh it
        summary_input_tokens=0,
        summary_output_tokens=0,
        horizon_turns=model.horizon_turns(turns_so_far(context), context.config),
        activity=activity,
    )
    return _cost(context, inputs, has_llm=False)


def measured_cost(
    context: SnapshotContext,
    compaction: Compaction,
    summary_input_tokens: int,
    activity: model.Activity,
    *,
    decision: model.CostDecision | None,
) -> Cost:
    """The cost of a compaction made: its real counts and summary."""
    config = context.config
    cost = _cost(
        context,
        model.CostInputs(
            tokens_before=compaction.tokens_before,
            tokens_after=compaction.tokens_after,
            summary_input_tokens=summary_input_tokens,
            summary_output_tokens=compaction.summary.tokens,
            horizon_turns=model.horizon_turns(turns_so_far(context), config),
            activity=activity,
        ),
        has_llm=compaction.summary.source == "llm",
    )
    if decision is None:
        return cost
    # The decision was made on the estimate: both are published, each under its own name.
    estimated = decision.cost.expected_net_usd
    return cost.model_copy(update={"decision": decision.reason, "estimated_net_usd": estimated})


def _cost(context: SnapshotContext, inputs: model.CostInputs, *, has_llm: bool) -> Cost:
    settings = context.settings
    name = context.snapshot.model.name or None
    usage = context.snapshot.usage
    if usage is not None:
        last = model.LastRequest(
            input_tokens=usage.input_tokens,
            cache_reads=usage.cached_input_tokens,
            cache_writes=usage.cache_creation_input_tokens,
        )
        inputs = replace(inputs, last_request=last)
    return model.estimate(
        inputs,
        model.prices_for(name, settings.cost),
        model.prices_for(settings.llm.model, settings.cost),
        policy=context.config.policy,
        llm_summary=has_llm,
        model=name,
    )
