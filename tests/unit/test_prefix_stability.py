"""The projection keeps the provider's cached prefix stable: replaying a growing conversation,
each request sends byte for byte what the previous request sent, up to where the last
compaction replaced messages (bench/cost_policy.py's replay, on a real corpus conversation and
on one of our own)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from support.service_support import conversation

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from corpus import conversations, corpus_dir
from cost_policy import Replay, pick, replay, reply_points, settings_for


def assert_prefix_stable(run: Replay) -> None:
    previous: list[Any] = []
    for n, request in enumerate(run.requests):
        # Unchanged: everything the previous request sent; after a compaction, what lay
        # before the range it replaced.
        keep = run.compacted_at.get(n, len(previous))
        assert request.shared_messages >= keep, (
            f"request {n} changed message {request.shared_messages} of the previous one "
            f"(kept {keep})"
        )
        previous = request.messages


def test_our_conversation_keeps_its_prefix_through_compactions(tmp_path: Path) -> None:
    snap = conversation("c-prefix", 40, body=300, window=12_000)
    settings = settings_for("threshold", None)
    run = replay(snap, settings, turns=40, root=tmp_path)
    assert len(run.requests) == 40
    assert len(run.compactions) >= 2  # the check spans several compactions
    assert_prefix_stable(run)
    # and the shared prefixes are real: most requests share all but their newest messages
    assert sum(r.shared_messages > 0 for r in run.requests[1:]) >= 35


@pytest.mark.corpus
@pytest.mark.skipif(corpus_dir() is None, reason="corpus absent: set COMPACTOR_CORPUS_DIR")
def test_a_real_conversation_keeps_its_prefix_with_compressed_tool_results(
    tmp_path: Path,
) -> None:
    name, snap = next((n, s) for n, s in conversations() if len(reply_points(s["messages"])) > 40)
    snap = {**snap, "model": {"name": "gpt-4.1", "context_window": 24_000}}
    run = replay(snap, settings_for("threshold", None), turns=40, model="gpt-4.1", root=tmp_path)
    assert run.compactions, f"{name}: no compaction to check across"
    assert_prefix_stable(run)


@pytest.mark.parametrize(
    "setting",
    [{"keep_recent_tool_results": 2}, {"projected_tool_result_budget": {"max_bytes": 4000}}],
    ids=["keep_recent_tool_results", "projected_tool_result_budget"],
)
def test_eliding_settings_change_the_prefix_and_say_so(
    tmp_path: Path, setting: dict[str, Any]
) -> None:
    """The two opt-in elisions rewrite results the previous request sent (that is what they
    are for); docs/cost.md says so. This pins that the check above would see it."""
    snap = conversation("c-elide", 12, body=300, window=1_000_000)
    run = replay(snap, settings_for("threshold", None, **setting), turns=12, root=tmp_path)
    with pytest.raises(AssertionError, match="changed message"):
        assert_prefix_stable(run)


@pytest.mark.corpus
@pytest.mark.skipif(corpus_dir() is None, reason="corpus absent: set COMPACTOR_CORPUS_DIR")
def test_the_cost_policy_spends_less_than_the_threshold_on_a_replayed_corpus_conversation(
    tmp_path: Path,
) -> None:
    """Issue 23: 60 turns of a real conversation, the same window, documented prices (the
    offline digest here; bench/cost_policy.py adds LLM summary calls): total spend lower under
    ``cost``, and no compaction for an expected gain under the minimum."""
    name, snap = pick(60, None)
    snap = {**snap, "model": {"name": "claude-sonnet-4", "context_window": 32_000}}
    runs = {
        policy: replay(snap, settings_for(policy, None), turns=60, root=tmp_path / policy)
        for policy in ("threshold", "cost")
    }
    assert runs["threshold"].compactions, f"{name}: the threshold never fired"
    assert runs["cost"].total_usd < runs["threshold"].total_usd
    assert runs["cost"].decisions and runs["cost"].under_minimum(0.01) == []
    assert all(gain is not None and gain >= 0.01 for gain, _ in runs["cost"].decisions)
    assert_prefix_stable(runs["cost"])


def test_no_compaction_for_a_gain_under_the_minimum(tmp_path: Path) -> None:
    snap = conversation("c-minimum", 30, body=300, window=12_000)
    snap["model"]["name"] = "claude-sonnet-4"
    lenient = replay(snap, settings_for("cost", None), turns=30, root=tmp_path / "a")
    assert lenient.compactions and lenient.under_minimum(0.01) == []
    strict = settings_for("cost", None, cost_min_gain_usd=1.0)
    held = replay(snap, strict, turns=30, root=tmp_path / "b")
    # Only the ceiling (90 % of the window) may force one; none for the gain.
    assert all("ceiling" in reason for _, reason in held.decisions), held.decisions
    assert len(held.cost_skips) > len(lenient.cost_skips)
