"""A compaction is made only when it pays, aims at a target under the threshold, and never comes
back on the next turn (docs/configuration.md, "When a compaction pays"): the floor skip, the
minimum gain checked before and after, the derived summary bound, compactions on demand, the
cost policy agreeing with the threshold, and a long session that never compacts twice in a
row."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from worker.config import MIN_DERIVED_SUMMARY_TOKENS, CompactionConfig, Settings
from worker.core.cost import usd
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.summarize import SummaryRequest
from worker.summarize.digest import DigestSummarizer
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompactionEvent, CompletedEvent, SkippedEvent, Summary
from worker.wire.history import apply_compaction
from worker.wire.requests import CompactRequest

SYSTEM_PROMPT = " ".join(
    f"Rule {k}: always check the invariant number {k} before editing." for k in range(520)
)


class CountingDigest:
    """The offline digest, counting the summaries asked of it (to show none was paid for)."""

    def __init__(self) -> None:
        self.calls = 0
        self._digest = DigestSummarizer()

    def summarize(self, request: SummaryRequest) -> Summary:
        self.calls += 1
        return self._digest.summarize(request)


def pipeline(root: Path, digest: CountingDigest | None = None, **config: Any) -> Pipeline:
    settings = Settings(compaction=CompactionConfig(**config))
    adapters = Adapters(store=FileStore(root), digest=digest or CountingDigest())
    return Pipeline(settings, adapters, Reuse())


def turn(k: int, words: int = 60) -> list[dict[str, Any]]:
    """One tool exchange and the agent's note on it."""
    arguments = json.dumps({"command": f"cat src/mod_{k}.py"})
    call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    body = " ".join(f"line{k}_{i}" for i in range(words))
    return [
        {"id": f"a{k}", "role": "assistant", "content": f"Reading mod_{k}.", "tool_calls": [call]},
        {"id": f"r{k}", "role": "tool", "tool_call_id": f"c{k}", "content": body},
        {"id": f"n{k}", "role": "assistant", "content": f"mod_{k} holds parse_{k}."},
    ]


def snapshot(messages: list[dict[str, Any]], revision: int, **config: Any) -> dict[str, Any]:
    return {
        "conversation_id": "pays-1",
        "revision": revision,
        "model": {"name": "gpt-4.1"},
        "messages": messages,
        "config": config,
    }


def outcome(p: Pipeline, snap: dict[str, Any]) -> CompactionEvent:
    return p.run(p.parse(json.dumps(snap).encode()))[-1]


def head() -> list[dict[str, Any]]:
    return [
        {"id": "sys", "role": "system", "content": SYSTEM_PROMPT},
        {"id": "u0", "role": "user", "content": "Fix the failing test in src/pkg/core.py."},
    ]


def test_a_system_prompt_over_the_threshold_is_said_once_per_turn_and_never_compacted(
    tmp_path: Path,
) -> None:
    """The large-system-prompt conversation: one skip naming the floor (no summary paid for, no
    transcript), no compaction for 20 further small turns, and a compaction again once the
    history has grown past the hysteresis: one that pays."""
    digest = CountingDigest()
    p = pipeline(tmp_path, digest, auto_compact_threshold_tokens=3000)
    history = head() + turn(0)
    first = outcome(p, snapshot(history, 1))
    assert isinstance(first, SkippedEvent) and first.why == "floor", first
    assert first.floor is not None and first.floor.system > 3000
    assert first.floor.total == sum(first.floor.model_dump(exclude={"total"}).values())
    assert "system" in first.reason and "waiting for" in first.reason
    assert digest.calls == 0 and not list(tmp_path.rglob("*.json*"))
    for k in range(1, 21):
        history += turn(k, words=4)
        event = outcome(p, snapshot(history, k + 1))
        assert isinstance(event, SkippedEvent) and event.why == "floor", (k, event)
    assert digest.calls == 0
    completed = None
    for k in range(21, 80):
        history += turn(k, words=120)
        event = outcome(p, snapshot(history, k + 1))
        if isinstance(event, CompletedEvent):
            completed = event
            break
        assert isinstance(event, SkippedEvent) and event.why == "floor", (k, event)
    assert completed is not None, "the grown history never compacted"
    c = completed.compaction
    assert c.tokens_before - c.tokens_after >= CompactionConfig().min_gain_tokens(c.tokens_before)


def test_a_compaction_on_demand_that_would_not_shrink_the_history_is_a_skip(tmp_path: Path) -> None:
    p = pipeline(tmp_path, auto_compact_threshold_tokens=50_000)
    history = [*head()[1:], *[m for k in range(30) for m in turn(k)]]
    context = p.context(p.parse(json.dumps(snapshot(history, 1)).encode()))
    request = CompactRequest(request_id="1" * 32, instructions="keep the parser")
    done = p.compact_requested(context, request)
    assert isinstance(done, CompletedEvent), done
    # At once again, on the compacted history: only the first summary would be summarized.
    again = apply_compaction(history, done) + turn(30, words=4)
    context = p.context(p.parse(json.dumps(snapshot(again, 2)).encode()))
    skipped = p.compact_requested(context, CompactRequest(request_id="2" * 32))
    assert isinstance(skipped, SkippedEvent), skipped
    assert skipped.why == "floor" and skipped.reason.startswith("requested, but")
    assert skipped.trigger is not None and skipped.trigger.request_id == "2" * 32
    assert skipped.event_id != outcome(p, snapshot(again, 2)).event_id  # its own, by request


@pytest.mark.parametrize("threshold", [3000, 6000, 12_000, 50_000])
def test_the_summary_bound_derives_from_the_threshold_unless_it_is_set(threshold: int) -> None:
    derived = CompactionConfig(auto_compact_threshold_tokens=threshold)
    bound = derived.summary_output_bound(threshold)
    assert MIN_DERIVED_SUMMARY_TOKENS <= bound <= 2000
    target = threshold * 70 // 100
    assert bound == min(max(target // 4, MIN_DERIVED_SUMMARY_TOKENS), 2000)
    explicit = CompactionConfig(summary_max_output_tokens=1800)
    assert explicit.summary_output_bound(threshold) == 1800
    # a snapshot's override of another setting keeps the bound derived
    settings = Settings().with_overrides({"auto_compact_threshold_tokens": threshold}, None)
    assert settings.compaction.summary_output_bound(threshold) == bound


def _session(
    p: Pipeline, turns: int, make: Callable[[int], list[dict[str, Any]]], **config: Any
) -> list[tuple[int, CompactionEvent]]:
    """Submit after every turn, apply each compaction, go on from the applied history."""
    history = head()[1:]
    outcomes = []
    for k in range(turns):
        history += make(k)
        event = outcome(p, snapshot(history, k + 1, **config))
        outcomes.append((k, event))
        if isinstance(event, CompletedEvent):
            history = apply_compaction(history, event)
    return outcomes


def test_three_hundred_turns_with_a_small_window_never_compact_on_consecutive_turns(
    tmp_path: Path,
) -> None:
    """A new user's small window: every compaction pays, lands at or under the target where
    the floor allows, and the next one waits for the history to grow (never the next turn)."""
    threshold = 4000
    p = pipeline(tmp_path)
    outcomes = _session(
        p, 300, lambda k: turn(k, words=40 + k % 5 * 20), auto_compact_threshold_tokens=threshold
    )
    done = [(k, e) for k, e in outcomes if isinstance(e, CompletedEvent)]
    assert len(done) >= 12, "dozens of compactions are the point"
    target = CompactionConfig().target_tokens(threshold)
    assert target is not None
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(done)]
    assert min(gaps) > 1, gaps
    for _k, e in done:
        c = e.compaction
        assert c.tokens_before - c.tokens_after >= CompactionConfig().min_gain_tokens(
            c.tokens_before
        )
        assert c.tokens_after <= target, (c.tokens_after, target)
        assert c.summary.tokens <= CompactionConfig().summary_max_output_tokens


def test_the_cost_policy_needs_the_minimum_gain_too(tmp_path: Path) -> None:
    """Under ``policy = "cost"`` a compaction the numbers call for still needs the minimum gain:
    the large system prompt is skipped for its floor, never compacted."""
    p = pipeline(tmp_path, auto_compact_threshold_tokens=3000, policy="cost")
    history = head() + [m for k in range(3) for m in turn(k, words=8)]
    snap = snapshot(history, 1) | {"model": {"name": "gpt-4.1", "context_window": 8000}}
    event = outcome(p, snap)
    assert isinstance(event, SkippedEvent) and event.why in ("floor", "cost"), event
    assert not isinstance(event, CompletedEvent)


def test_dollars_are_written_with_the_sign_first() -> None:
    assert usd(-0.0045) == "-$0.0045"
    assert usd(0.047, 6) == "$0.047000"
    assert usd(0.0) == "$0.0000"
