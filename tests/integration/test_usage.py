"""Provider-reported usage and the calibrated estimate (issue 14 §5): a snapshot's ``usage``
counts the prefix it covers, only later messages are counted by us; usage that cannot be right
is rejected (impossible) or ignored with a logged reason (implausible); events say how their
counts were made."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from worker.config import Settings
from worker.core.projection import count_message_tokens
from worker.errors import InvalidSnapshot
from worker.pipeline import Adapters, Pipeline, SnapshotContext, snapshot_context
from worker.pipeline.evaluate import Evaluation, evaluate
from worker.reuse import Reuse
from worker.tokens import CalibratedEstimateTokenizer, TiktokenTokenizer, tokenizer_for
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent, SkippedEvent
from worker.wire.snapshots import ParsedSnapshot, parse_snapshot

if TYPE_CHECKING:
    from conftest import CliRunner

WORDS = [
    "the",
    "parser",
    "reads",
    "each",
    "price",
    "field",
    "and",
    "rounds",
    "it",
    "before",
    "the",
    "total",
    "is",
    "checked",
]


def _text(k: int, chars: int = 3000) -> str:
    out: list[str] = []
    n = k
    while sum(map(len, out)) + len(out) < chars:
        out.append(f"{WORDS[n % len(WORDS)]}{n % 97}")
        n += 7
    return " ".join(out)


def claude_snapshot(usage: dict[str, Any] | None, *, turns: int = 48) -> dict[str, Any]:
    """An anthropic-format conversation of a Claude model with a 200,000-token window."""
    messages: list[dict[str, Any]] = []
    for k in range(turns):
        role = "user" if k % 2 == 0 else "assistant"
        messages.append({"id": f"m{k}", "role": role, "content": _text(k)})
    messages.append({"id": "new-user", "role": "user", "content": "And the tax field?"})
    messages.append({"id": "new-reply", "role": "assistant", "content": "Checking it now."})
    snap: dict[str, Any] = {
        "conversation_id": "claude-1",
        "revision": 3,
        "model": {"name": "claude-sonnet-4", "context_window": 200_000},
        "format": "anthropic",
        "system": "You are a careful coding agent.",
        "messages": messages,
        "config": {"summary_max_output_tokens": 400},
    }
    if usage is not None:
        snap["usage"] = usage
    return snap


K = 48  # the last request held the 48 conversation messages; two came after it


def _evaluate(snap: dict[str, Any]) -> tuple[ParsedSnapshot, Evaluation]:
    parsed = parse_snapshot(snap, Settings())
    return parsed, evaluate(snapshot_context(parsed, Reuse()))


def test_usage_counts_the_prefix_and_only_later_messages_are_counted() -> None:
    parsed, evaluation = _evaluate(claude_snapshot({"input_tokens": 150_000, "message_count": K}))
    estimate = CalibratedEstimateTokenizer()
    later = [m for m in parsed.messages if m.source_index >= K]
    assert [m.id for m in later] == ["new-user", "new-reply"]
    assert evaluation.projected_tokens == 150_000 + sum(
        count_message_tokens(m, estimate) for m in later
    )
    assert evaluation.counted_by == "usage+estimate"
    assert evaluation.threshold == 150_000  # 75 % of the window
    assert evaluation.over_threshold
    trigger = evaluation.trigger()
    assert (trigger.counted_by, trigger.usage_ignored) == ("usage+estimate", None)


def test_tiktoken_alone_would_count_far_less_and_not_compact() -> None:
    parsed, without = _evaluate(claude_snapshot(None))
    exact = tokenizer_for("gpt-4o")
    assert isinstance(exact, TiktokenTokenizer)
    tiktoken_count = evaluate(SnapshotContext.of(parsed, exact)).projected_tokens
    assert tiktoken_count < 60_000 < 150_000  # "far less"
    assert without.counted_by == "estimate" and not without.over_threshold
    # The calibrated estimate stays near tiktoken's count (BENCHMARKS.md: within ~20 %).
    assert abs(without.projected_tokens - tiktoken_count) / tiktoken_count < 0.35


def test_a_claude_snapshot_over_by_usage_compacts_and_the_event_says_so(tmp_path: Path) -> None:
    snap = claude_snapshot({"input_tokens": 150_000, "message_count": K})
    parsed = parse_snapshot(snap, Settings())
    events = Pipeline(parsed.settings, Adapters(store=FileStore(tmp_path))).run(parsed)
    done = events[-1]
    assert isinstance(done, CompletedEvent), done
    assert done.trigger.counted_by == "usage+estimate"
    assert done.trigger.projected_tokens > 150_000
    assert done.compaction.tokens_before == done.trigger.projected_tokens
    assert done.compaction.tokens_before_counted_by == "usage+estimate"
    assert done.compaction.tokens_after_counted_by == "estimate"
    # The carried part and summary fit under the threshold with what the provider counted
    # beyond our count of the prefix kept aside.
    usage = _evaluate(snap)[1].usage
    assert usage is not None and usage.offset > 0
    assert done.compaction.tokens_after + usage.offset <= 150_000


def test_compactor_compact_reads_usage(run_cli: CliRunner) -> None:
    snap = claude_snapshot({"input_tokens": 150_000, "message_count": K})
    path = run_cli.cwd / "snap.json"
    path.write_text(json.dumps(snap))
    result = run_cli("compact", path)
    assert result.code == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert events[-1]["type"] == "compaction.completed"
    assert events[-1]["trigger"]["counted_by"] == "usage+estimate"
    assert events[-1]["compaction"]["tokens_before_counted_by"] == "usage+estimate"
    # Without usage the same conversation stays under the threshold.
    path.write_text(json.dumps(claude_snapshot(None)))
    result = run_cli("compact", path)
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert events[-1]["type"] == "compaction.skipped"
    assert events[-1]["trigger"]["counted_by"] == "estimate"


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"input_tokens": 1000, "message_count": K + 3}, "usage.message_count"),  # > 50 messages
        ({"input_tokens": -1, "message_count": K}, "usage.input_tokens"),
        ({"input_tokens": 1000, "message_count": 0}, "usage.message_count"),
        ({"input_tokens": "1000", "message_count": K}, "usage.input_tokens"),
        ({"input_tokens": 1000.0, "message_count": K}, "usage.input_tokens"),
        ({"input_tokens": 1000}, "usage.message_count"),
        ({"input_tokens": 1000, "message_count": K, "cached": 5}, "usage.cached"),
    ],
)
def test_impossible_usage_rejects_the_snapshot(usage: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSnapshot) as caught:
        parse_snapshot(claude_snapshot(usage), Settings())
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("input_tokens", "why"),
    [(1_000, "less than half of our count"), (900_000, "more than 4 times our count")],
)
def test_implausible_usage_is_ignored_with_a_logged_reason(
    input_tokens: int, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="worker.pipeline"):
        _, evaluation = _evaluate(
            claude_snapshot({"input_tokens": input_tokens, "message_count": K})
        )
    assert evaluation.usage is None and evaluation.counted_by == "estimate"
    assert evaluation.usage_ignored is not None and why in evaluation.usage_ignored
    assert evaluation.trigger().usage_ignored == evaluation.usage_ignored
    assert any(why in r.getMessage() and "claude-1" in r.getMessage() for r in caplog.records)


def test_usage_does_not_survive_a_published_compaction_applied_first(tmp_path: Path) -> None:
    snap = claude_snapshot({"input_tokens": 150_000, "message_count": K})
    settings = Settings()
    pipeline = Pipeline(settings, Adapters(store=FileStore(tmp_path)))
    done = pipeline.run(pipeline.parse(snap))[-1]
    assert isinstance(done, CompletedEvent)
    later = claude_snapshot({"input_tokens": 150_000, "message_count": K}) | {"revision": 4}
    parsed = pipeline.parse(later, published=[done])
    assert parsed.snapshot.usage is None
    outcome = pipeline.run(parsed)[-1]
    assert isinstance(outcome, SkippedEvent)
    assert outcome.trigger is not None and outcome.trigger.counted_by == "estimate"


def test_openai_models_are_still_counted_exactly() -> None:
    snap = claude_snapshot(None) | {"model": {"name": "gpt-4.1", "context_window": 200_000}}
    parsed, evaluation = _evaluate(snap)
    assert evaluation.counted_by == "tiktoken"
    assert (
        evaluation.projected_tokens
        == evaluate(SnapshotContext.of(parsed, tokenizer_for("gpt-4.1"))).projected_tokens
    )
    with_usage = snap | {"usage": {"input_tokens": 60_000, "message_count": K}}
    assert _evaluate(with_usage)[1].counted_by == "usage+tiktoken"
