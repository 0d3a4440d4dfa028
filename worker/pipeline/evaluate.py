"""The evaluate step: project the history as the next request would see it, count it, and
resolve the threshold it is decided against."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from worker.core.cost import Activity, CostDecision
from worker.core.projection import (
    REPLY_PRIMING_TOKENS,
    CountedProjection,
    Projection,
    project_and_count,
)
from worker.pipeline.context import SnapshotContext
from worker.tokens import counted_by
from worker.wire.events import Trigger
from worker.wire.requests import REQUESTED_TRIGGER
from worker.wire.snapshots import ParsedSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UsagePrefix:
    """The snapshot's ``usage`` as taken: the provider's ``input_tokens`` for the first
    ``message_count`` wire messages, and our own count of that prefix (``counted``)."""

    input_tokens: int
    message_count: int
    counted: int

    @property
    def offset(self) -> int:
        """What the provider counted beyond our count of the prefix (its tokenizer, tool
        definitions, anything the snapshot does not show)."""
        return self.input_tokens - self.counted


@dataclass(frozen=True)
class Evaluation:
    """The projected request, counted, against the resolved threshold. With a ``usage`` taken,
    the prefix it covers counts as the provider said, and only the messages after it are
    counted by ``tokenizer_counted_by``."""

    counted: CountedProjection
    threshold: int | None
    context_window: int | None
    trigger_kind: str
    tokenizer_counted_by: str = "tiktoken"
    usage: UsagePrefix | None = None
    usage_ignored: str | None = None
    # A compaction someone asked for: its request, and the SHA-256 of its instructions.
    request_id: str | None = None
    instructions_sha256: str | None = None
    # The conversation's pace (worker.core.cost), and the cost policy's verdict when it decided.
    activity: Activity | None = None
    decision: CostDecision | None = None

    @property
    def projection(self) -> Projection:
        return self.counted.projection

    @property
    def projected_tokens(self) -> int:
        if self.usage is not None:
            return self.counted.tokens + self.usage.offset
        return self.counted.tokens

    @property
    def counted_by(self) -> str:
        prefix = "usage+" if self.usage is not None else ""
        suffix = "+opaque-estimate" if self._estimated_opaque else ""
        return prefix + self.tokenizer_counted_by + suffix

    @property
    def _estimated_opaque(self) -> bool:
        """Whether an opaque payload outside the usage prefix was counted by the estimate."""
        after = self.usage.message_count if self.usage is not None else 0
        return any(
            a.kind == "opaque"
            for m in self.counted.source
            if m.source_index >= after and not m.superseded
            for a in m.attachments
        )

    @property
    def unknown_types(self) -> dict[str, int]:
        """Block and item types the formats do not know, counted in the request."""
        found: dict[str, int] = {}
        for m in self.counted.source:
            if not m.superseded:
                for kind in m.unknown_types:
                    found[kind] = found.get(kind, 0) + 1
        return dict(sorted(found.items()))

    @property
    def native_compaction(self) -> bool:
        return any(m.native_compaction for m in self.counted.source)

    @property
    def over_threshold(self) -> bool:
        return self.threshold is not None and self.projected_tokens > self.threshold

    def requested(self, request_id: str, instructions_sha256: str | None) -> Evaluation:
        """This evaluation as the trigger of a compaction someone asked for."""
        return replace(
            self,
            trigger_kind=REQUESTED_TRIGGER,
            request_id=request_id,
            instructions_sha256=instructions_sha256,
        )

    @property
    def should_compact(self) -> bool:
        """The decision: the cost policy's when it decided, else over the threshold."""
        if self.decision is not None:
            return self.decision.compact
        return self.over_threshold

    def trigger(self) -> Trigger:
        return Trigger(
            kind=self.trigger_kind,
            threshold_tokens=self.threshold,
            projected_tokens=self.projected_tokens,
            context_window=self.context_window,
            counted_by=self.counted_by,
            usage_ignored=self.usage_ignored,
            request_id=self.request_id,
            instructions_sha256=self.instructions_sha256,
            unknown_types=self.unknown_types,
            native_compaction=self.native_compaction,
        )


def evaluate(context: SnapshotContext, prior: CountedProjection | None = None) -> Evaluation:
    """Project the history as the next request would see it, count it, resolve the threshold.

    ``prior``: the conversation's last counted projection in this process, whose messages the
    parse may have reused; those are not projected or counted again."""
    config = context.config
    window = context.snapshot.model.context_window
    counted = project_and_count(
        context.messages,
        context.policy,
        context.tokenizer,
        prior,
        compressed=context.compressed,
    )
    usage, ignored = take_usage(context.parsed, counted)
    return Evaluation(
        counted=counted,
        threshold=config.auto_compact_threshold(window),
        context_window=window,
        trigger_kind=config.auto_compact_trigger,
        tokenizer_counted_by=counted_by(context.tokenizer),
        usage=usage,
        usage_ignored=ignored,
    )


# A usage is taken when the provider's count of the prefix is at least half of ours (less means
# it cannot be the request we count: cached input tokens left out, another prefix) and at most
# four times ours plus 32,000 (a tokenizer that needs more tokens, tool definitions and a system
# prompt the snapshot does not show).
USAGE_MIN_SHARE = 0.5
USAGE_MAX_FACTOR = 4
USAGE_MAX_EXTRA = 32_000


def take_usage(
    parsed: ParsedSnapshot, counted: CountedProjection
) -> tuple[UsagePrefix | None, str | None]:
    """The snapshot's ``usage`` as the count of the prefix it covers, or why it is ignored
    (logged). Usage that cannot describe this snapshot (more messages than it has, negative
    numbers) was rejected with the snapshot already."""
    usage = parsed.snapshot.usage
    if usage is None:
        return None, None
    k = usage.message_count
    ours = REPLY_PRIMING_TOKENS + sum(
        n
        for m, n in zip(counted.projection.messages, counted.counts, strict=True)
        if m.source_index < k
    )
    reason = None
    if usage.input_tokens < ours * USAGE_MIN_SHARE:
        reason = (
            f"usage says {usage.input_tokens} input tokens for the first {k} messages, less than "
            f"half of our count of them ({ours}): not that request (were cached input tokens "
            "left out?)"
        )
    elif usage.input_tokens > ours * USAGE_MAX_FACTOR + USAGE_MAX_EXTRA:
        reason = (
            f"usage says {usage.input_tokens} input tokens for the first {k} messages, more "
            f"than {USAGE_MAX_FACTOR} times our count of them ({ours}) plus {USAGE_MAX_EXTRA}"
        )
    if reason is not None:
        log.warning(
            "ignoring usage of %s revision %s: %s", parsed.conversation_id, parsed.revision, reason
        )
        return None, reason
    return UsagePrefix(input_tokens=usage.input_tokens, message_count=k, counted=ours), None
