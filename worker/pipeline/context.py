"""One snapshot as every step of the pipeline sees it, built once per snapshot.

What the steps read besides the parsed snapshot (the tokenizer of its model, the projection
policy and media rules of its settings, the process's cache of compressed tool results) is
derived once here and handed down, instead of each step looking it up again.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.config import CompactionConfig, Settings
from worker.core.projection import CompressionCache
from worker.core.projection_policy import ProjectionPolicy
from worker.reuse import Reuse
from worker.tokens import Tokenizer
from worker.wire.media import MediaRules
from worker.wire.models import Message, Snapshot
from worker.wire.snapshots import ParsedSnapshot, media_rules


@dataclass(frozen=True)
class SnapshotContext:
    """A parsed snapshot with what evaluating and compacting it needs: the tokenizer that
    counts it, how its history is projected (``policy``) and its attachments counted
    (``media``), and the cache of compressed tool results to use (None: none)."""

    parsed: ParsedSnapshot
    tokenizer: Tokenizer
    policy: ProjectionPolicy
    media: MediaRules
    compressed: CompressionCache | None = None

    @classmethod
    def of(
        cls,
        parsed: ParsedSnapshot,
        tokenizer: Tokenizer,
        compressed: CompressionCache | None = None,
    ) -> SnapshotContext:
        """The context of ``parsed`` counted by ``tokenizer``."""
        config = parsed.settings.compaction
        return cls(
            parsed=parsed,
            tokenizer=tokenizer,
            policy=ProjectionPolicy.from_config(config, model=parsed.snapshot.model.name or None),
            media=media_rules(parsed.snapshot.format, config),
            compressed=compressed,
        )

    @property
    def snapshot(self) -> Snapshot:
        return self.parsed.snapshot

    @property
    def settings(self) -> Settings:
        return self.parsed.settings

    @property
    def config(self) -> CompactionConfig:
        return self.parsed.settings.compaction

    @property
    def messages(self) -> list[Message]:
        return self.parsed.messages

    @property
    def conversation_id(self) -> str:
        return self.parsed.conversation_id

    @property
    def revision(self) -> int:
        return self.parsed.revision


def snapshot_context(parsed: ParsedSnapshot, reuse: Reuse) -> SnapshotContext:
    """The context of ``parsed`` with this process's tokenizer and compression cache."""
    return SnapshotContext.of(parsed, tokenizer_of(parsed, reuse), reuse.compressed)


def tokenizer_of(parsed: ParsedSnapshot, reuse: Reuse) -> Tokenizer:
    """The process's tokenizer for the snapshot's model (or the estimate, if configured)."""
    estimate = parsed.settings.compaction.token_counting == "estimate"
    return reuse.tokenizer(parsed.snapshot.model.name or None, estimate=estimate)
