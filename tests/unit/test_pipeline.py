"""The pipeline's steps share one context per snapshot: its tokenizer is looked up and its
projection policy built once, however many steps (evaluate, prepare, describe) use them."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support.service_support import conversation

from worker.config import Settings
from worker.core.projection_policy import ProjectionPolicy
from worker.pipeline import Adapters, Pipeline, SnapshotContext, tokens_of
from worker.reuse import Reuse
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent
from worker.wire.history import apply_compaction

SETTINGS = Settings(compaction={"keep_recent_tool_results": 1})


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often a tokenizer is looked up and a projection policy built (the real ones)."""
    counts: Counter[str] = Counter()
    lookup = Reuse.tokenizer
    policy = ProjectionPolicy.from_config.__func__  # type: ignore[attr-defined]

    def counted_lookup(self: Reuse, *args: Any, **kwargs: Any) -> Any:
        counts["tokenizer"] += 1
        return lookup(self, *args, **kwargs)

    def counted_policy(cls: type[ProjectionPolicy], *args: Any, **kwargs: Any) -> Any:
        counts["policy"] += 1
        return policy(cls, *args, **kwargs)

    monkeypatch.setattr(Reuse, "tokenizer", counted_lookup)
    monkeypatch.setattr(ProjectionPolicy, "from_config", classmethod(counted_policy))
    return counts


def pipeline(root: Path) -> Pipeline:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    return Pipeline(SETTINGS, Adapters(store=FileStore(root), now=lambda: now), Reuse())


def test_a_snapshot_evaluated_and_compacted_builds_its_tokenizer_and_policy_once(
    tmp_path: Path, builds: Counter[str]
) -> None:
    snap = conversation("c-once", 8, window=2000)
    runner = pipeline(tmp_path)
    parsed = runner.parse(json.dumps(snap).encode())
    events = runner.run(parsed)
    assert [e.type for e in events] == ["tool_results.elided", "compaction.completed"]
    assert builds == {"tokenizer": 1, "policy": 1}
    # tokens_after was counted (describe) with that same context
    completed = events[-1]
    assert isinstance(completed, CompletedEvent)
    applied = apply_compaction(snap["messages"], completed)
    tokenizer = runner.reuse.tokenizer("gpt-4.1")
    assert tokens_of(applied, parsed, tokenizer) == completed.compaction.tokens_after


def test_an_evaluation_with_the_memo_builds_them_once_too(
    tmp_path: Path, builds: Counter[str]
) -> None:
    runner = pipeline(tmp_path)
    parsed = runner.parse(json.dumps(conversation("c-memo", 8, window=1_000_000)).encode())
    verdict = runner.evaluate(parsed, with_memo=True)
    assert verdict.skipped is not None and verdict.elided is not None
    assert verdict.memo is not None and verdict.memo.blob is not None
    assert builds == {"tokenizer": 1, "policy": 1}


def test_the_steps_given_one_context_publish_what_they_do_given_the_parsed_snapshot(
    tmp_path: Path,
) -> None:
    """The service builds the context once and passes it to evaluate and compact; a caller
    that passes the parsed snapshot to each gets the very same events."""
    snap = json.dumps(conversation("c-same", 8, window=2000)).encode()
    shared = pipeline(tmp_path)
    parsed = shared.parse(snap)
    context = shared.context(parsed)
    assert isinstance(context, SnapshotContext) and context.parsed is parsed
    verdict = shared.evaluate(context)
    outcome = shared.compact(context, verdict.evaluation)
    separate = pipeline(tmp_path)  # the same store: a transcript is written once
    again = separate.parse(snap)
    events = separate.run(again)
    assert outcome is not None and verdict.elided is not None
    assert [e.to_json() for e in (verdict.elided, outcome)] == [e.to_json() for e in events]
