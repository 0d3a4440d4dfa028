"""``policy = "cost"`` against ``policy = "threshold"`` on a replayed corpus conversation.

An agent replays the first TURNS model requests of a real conversation: before each assistant
reply it sends the projected history (``worker.client.project``), and after it submits the
snapshot to the pipeline (in process) and applies any completed compaction at once. Each
request is billed with the documented prices of MODEL (docs/cost.md): the prefix it shares
with the previous request at the cached-input price when the cache is warm and the prefix at
least the model's minimum, the rest at the cache-write price. Summary calls go to the stand-in
LLM (worker.testing) and are billed at the [llm] model's prices on the tokens counted for them
(the ``cost`` object's ``summary_usd``). Output tokens are the same under both policies and
left out. Both runs use the same window and threshold.

    .venv/bin/python bench/cost_policy.py [--turns 60] [--interval-s 30] [--name NAME]

The replay itself (:func:`replay`) also serves tests/unit/test_prefix_stability.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import conversations

from worker.client import project
from worker.config import Settings
from worker.core.cost import Activity, prices_for
from worker.core.projection import count_message_tokens
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.summarize.factory import llm_summarizer
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent, SkippedEvent
from worker.wire.formats import to_messages
from worker.wire.history import apply_compaction
from worker.wire.models import canonical_json

MODEL = "claude-sonnet-4"
TURNS = 60
START = 1_750_000_000.0  # the replay's clock: the first request's time (seconds since the epoch)


@dataclass
class Request:
    """One model request of the replay: its messages, its tokens, how many of its first
    messages it shares with the previous request and their tokens, and what it cost."""

    messages: list[dict[str, Any]]
    tokens: int
    shared_messages: int
    shared_tokens: int
    usd: float


@dataclass
class Replay:
    requests: list[Request] = field(default_factory=list)
    compactions: list[CompletedEvent] = field(default_factory=list)
    cost_skips: list[SkippedEvent] = field(default_factory=list)
    # For each request after a compaction: the wire index where that compaction started.
    compacted_at: dict[int, int] = field(default_factory=dict)
    # The cost policy's decision behind each compaction: (expected net gain, reason).
    decisions: list[tuple[float | None, str]] = field(default_factory=list)

    def under_minimum(self, minimum: float) -> list[str]:
        """The compactions the cost policy made for an expected gain under ``minimum`` while
        the cache was warm (the ceiling, which forces one, excepted)."""
        return [
            reason
            for gain, reason in self.decisions
            if gain is not None
            and gain < minimum
            and "ceiling" not in reason
            and not reason.startswith("cache cold")
        ]

    @property
    def input_usd(self) -> float:
        return sum(r.usd for r in self.requests)

    @property
    def summary_usd(self) -> float:
        return sum((e.cost.summary_usd or 0.0) for e in self.compactions if e.cost)

    @property
    def total_usd(self) -> float:
        return self.input_usd + self.summary_usd


def reply_points(messages: list[dict[str, Any]]) -> list[int]:
    """The index of each assistant message: the request before it held everything earlier."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]


def replay(
    snapshot: dict[str, Any],
    settings: Settings,
    *,
    turns: int = TURNS,
    interval_s: float = 30.0,
    model: str = MODEL,
    root: Path | None = None,
) -> Replay:
    """Replay the first ``turns`` requests of ``snapshot`` under ``settings``."""
    root = root or Path(tempfile.mkdtemp(prefix="cost-policy-"))
    clock = {"now": START}
    from datetime import UTC, datetime

    def now() -> datetime:
        return datetime.fromtimestamp(clock["now"], UTC)

    llm = llm_summarizer(settings)
    pipeline = Pipeline(settings, Adapters(store=FileStore(root), llm=llm, now=now), Reuse())
    full = snapshot["messages"]
    window = snapshot["model"].get("context_window")
    priced = prices_for(model, settings.cost)
    history: list[dict[str, Any]] = []
    taken = 0
    out = Replay()
    previous: list[dict[str, Any]] = []
    tokenizer = pipeline.reuse.tokenizer(model)
    for turn, cut in enumerate(reply_points(full)[:turns]):
        clock["now"] = START + turn * interval_s
        history.extend(full[taken:cut])
        taken = cut
        sent = project(history, config=settings.compaction, model=model)
        counts = _wire_counts(sent, tokenizer)
        shared = _shared_prefix(previous, sent)
        shared_tokens = sum(counts[:shared])
        out.requests.append(
            Request(sent, sum(counts) + 3, shared, shared_tokens, _bill(priced, counts, shared))
        )
        previous = sent
        history.append(full[cut])  # the reply
        taken = cut + 1
        snap = {
            "conversation_id": snapshot["conversation_id"],
            "revision": turn + 1,
            "model": {"name": model, "context_window": window},
            "messages": history,
        }
        parsed = pipeline.parse(json.dumps(snap).encode())
        context = pipeline.context(parsed)
        pace = Activity(snapshots=turn + 1, first_at=START, last_at=clock["now"])
        verdict = pipeline.evaluate(context, activity=pace)
        if verdict.skipped is not None:
            if verdict.skipped.cost is not None:
                out.cost_skips.append(verdict.skipped)
            continue
        event = pipeline.compact(context, verdict.evaluation)
        if isinstance(event, CompletedEvent):
            decision = verdict.evaluation.decision
            if decision is not None:
                out.decisions.append((decision.cost.expected_net_usd, decision.reason))
            history = apply_compaction(history, event)
            out.compactions.append(event)
            out.compacted_at[turn + 1] = event.compaction.start
    if llm is not None:
        llm.close()
    return out


def _wire_counts(messages: list[dict[str, Any]], tokenizer: Any) -> list[int]:
    """Tokens of each wire message of a request (the framing of the reply left out)."""
    counts = [0] * len(messages)
    for m in to_messages("openai", messages):
        counts[m.source_index] += count_message_tokens(m, tokenizer)
    return counts


def _shared_prefix(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> int:
    """How many first messages two requests share byte for byte."""
    n = 0
    for a, b in zip(before, after, strict=False):
        if canonical_json(a) != canonical_json(b):
            break
        n += 1
    return n


def _bill(priced: Any, counts: list[int], shared: int) -> float:
    """One request's input: the shared prefix read from the cache (the replay's turns come
    faster than any cache expires) when long enough to be cached, the rest written to it."""
    if priced is None:
        return 0.0
    p = priced.prices
    cached = sum(counts[:shared])
    if cached < p.min_cacheable_tokens:
        cached = 0
    written = sum(counts) + 3 - cached
    return (cached * p.cached_input + written * p.cache_write_price) / 1_000_000


def settings_for(policy: str, llm_base_url: str | None, **compaction: Any) -> Settings:
    llm = {"base_url": llm_base_url, "model": "gpt-4.1-mini"} if llm_base_url else {}
    return Settings(
        compaction={
            "policy": policy,
            "mode": "remote_only" if llm_base_url else "local_only",
            "transcript_dir": tempfile.gettempdir(),
            **compaction,
        },
        llm=llm,
    )


def pick(turns: int, name: str | None) -> tuple[str, dict[str, Any]]:
    """The named conversation, else the first one of at least ``turns`` requests whose first
    ``turns`` turns are the largest: compaction matters most there."""
    best: tuple[int, str, dict[str, Any]] | None = None
    for found, snap in conversations():
        points = reply_points(snap["messages"])
        if name is not None and found == name:
            return found, snap
        if name is None and len(points) > turns:
            size = sum(len(json.dumps(m)) for m in snap["messages"][: points[turns]])
            if best is None or size > best[0]:
                best = (size, found, snap)
    if best is None:
        raise SystemExit(
            f"no corpus conversation with {turns} turns" + (f" named {name}" if name else "")
        )
    return best[1], best[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--name", default=None)
    parser.add_argument("--window", type=int, default=64_000)
    parser.add_argument("--min-gain-usd", type=float, default=0.01)
    args = parser.parse_args()
    from worker.testing import StandinLLM

    name, snap = pick(args.turns, args.name)
    snap = {**snap, "model": {"name": MODEL, "context_window": args.window}}
    rows = {}
    with StandinLLM() as llm:
        import os

        os.environ.setdefault("OPENAI_API_KEY", "sk-standin")
        for policy in ("threshold", "cost"):
            settings = settings_for(
                policy, llm.openai_base_url, cost_min_gain_usd=args.min_gain_usd
            )
            run = replay(snap, settings, turns=args.turns, interval_s=args.interval_s)
            under_min = run.under_minimum(args.min_gain_usd)
            rows[policy] = {
                "compactions": len(run.compactions),
                "cost_skips": len(run.cost_skips),
                "input_usd": round(run.input_usd, 4),
                "summary_usd": round(run.summary_usd, 4),
                "total_usd": round(run.total_usd, 4),
                "input_tokens": sum(r.tokens for r in run.requests),
                "compactions_under_minimum": len(under_min),
                "decisions": [reason for _, reason in run.decisions],
            }
    print(json.dumps({"conversation": name, "model": MODEL, "turns": args.turns, **rows}, indent=2))


if __name__ == "__main__":
    main()
