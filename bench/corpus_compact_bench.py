"""`compactor compact` over every conversation in the shared corpus.

Each conversation gets a context window small enough to trigger (threshold = half its projected
tokens, floored at 4,000). Prints: how many completed, how many landed under the threshold, how
many of the file paths in compacted tool calls' arguments survive in the digest or the carried
messages, and timings (in-process pipeline, and the whole CLI process).

    .venv/bin/python bench/corpus_compact_bench.py [--cli-sample N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import ROOT, conversations

from worker.config import Settings
from worker.core.fidelity import carried_text, extract_must_keep, missing_facts
from worker.core.files import call_file_uses
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent
from worker.wire.formats import to_messages

MIN_THRESHOLD = 4000


def with_small_window(snapshot: dict[str, Any]) -> dict[str, Any]:
    probe = Pipeline(Settings(), Adapters(store=FileStore(Path(tempfile.gettempdir()))), Reuse())
    tokens = probe.evaluate(probe.parse(snapshot)).evaluation.projected_tokens
    threshold = max(tokens // 2, MIN_THRESHOLD)
    return {**snapshot, "model": {**snapshot["model"], "context_window": threshold * 4 // 3 + 1}}


def compacted_paths(messages: list[dict[str, Any]], start: int, end: int) -> set[str]:
    """The files the compacted calls used (``worker.core.files``: what the digest lists)."""
    outputs = {
        m.get("tool_call_id"): m.get("content") or "" for m in messages if m["role"] == "tool"
    }
    paths: set[str] = set()
    for m in messages[start:end]:
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            uses = call_file_uses(fn["name"], fn["arguments"], outputs.get(call["id"], ""))
            paths.update(p for p, _ in uses)
    return paths


def run_one(snapshot: dict[str, Any], root: Path) -> dict[str, Any]:
    # A fresh Reuse: the timing is a first evaluation (the encoding itself stays loaded).
    pipeline = Pipeline(Settings(), Adapters(store=FileStore(root)), Reuse())
    t0 = time.perf_counter()
    event = pipeline.run(pipeline.parse(snapshot))[-1]
    elapsed = time.perf_counter() - t0
    row: dict[str, Any] = {
        "type": event.type,
        "seconds": elapsed,
        "messages": len(snapshot["messages"]),
    }
    if not isinstance(event, CompletedEvent):
        return row
    c = event.compaction
    # The fact extraction and check alone, timed apart (they also run inside the pipeline).
    ranged = to_messages("openai", snapshot["messages"][c.start : c.end])
    carried = carried_text(to_messages("openai", c.replacement[:-1]))
    t1 = time.perf_counter()
    facts = extract_must_keep(ranged, ["delegate_task", "task", "agent"])
    missing_facts(facts, c.summary.text, carried)
    row["facts_seconds"] = time.perf_counter() - t1
    fidelity = c.summary.fidelity
    if fidelity is not None:
        row.update(
            checked=fidelity.checked,
            kept=fidelity.kept,
            repaired=fidelity.repaired,
            dropped=sum(fidelity.dropped.values()),
        )
    paths = compacted_paths(snapshot["messages"], c.start, c.end)
    kept_text = c.summary.text + json.dumps(c.replacement[:-1], ensure_ascii=False)
    row.update(
        under=c.tokens_after < (event.trigger.threshold_tokens or 0),
        before=c.tokens_before,
        after=c.tokens_after,
        threshold=event.trigger.threshold_tokens,
        paths=len(paths),
        paths_kept=sum(p in kept_text for p in paths),
        missing=sorted(p for p in paths if p not in kept_text)[:5],
    )
    return row


def cli_time(snapshot: dict[str, Any], workdir: Path) -> tuple[float, int]:
    path = workdir / "snapshot.json"
    path.write_text(json.dumps(snapshot))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "compact", str(path), "--config", "/dev/null"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    return time.perf_counter() - t0, proc.returncode


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli-sample", type=int, default=100, help="conversations run via the CLI")
    args = parser.parse_args()
    rows, cli = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, snapshot) in enumerate(conversations()):
            snap = with_small_window(snapshot)
            row = run_one(snap, Path(tmp) / "t")
            row["name"] = name
            rows.append(row)
            if k < args.cli_sample:
                cli.append(cli_time(snap, Path(tmp)))
    done = [r for r in rows if r["type"] == "compaction.completed"]
    print(
        f"conversations: {len(rows)}; completed: {len(done)}; "
        f"other outcomes: {sorted({r['type'] for r in rows} - {'compaction.completed'})}"
    )
    print(f"tokens_after below threshold: {sum(r['under'] for r in done)}/{len(done)}")
    paths = sum(r["paths"] for r in done)
    kept = sum(r["paths_kept"] for r in done)
    full = sum(r["paths"] == r["paths_kept"] for r in done)
    print(
        f"paths from compacted calls kept in digest or carried messages: {kept}/{paths} "
        f"({kept / max(paths, 1):.1%}); conversations with every path kept: {full}/{len(done)}"
    )
    ratio = [r["after"] / r["before"] for r in done]
    print(f"tokens after/before: median {statistics.median(ratio):.3f}, max {max(ratio):.3f}")
    secs = [r["seconds"] * 1000 for r in rows]
    print(
        f"in-process pipeline per conversation (ms): p50 {pct(secs, 50):.0f}, "
        f"p95 {pct(secs, 95):.0f}, max {max(secs):.0f}"
    )
    facts = [r["facts_seconds"] * 1000 for r in done if "facts_seconds" in r]
    if facts:
        print(
            f"must-keep facts, extraction + check per conversation (ms): p50 {pct(facts, 50):.1f}, "
            f"p95 {pct(facts, 95):.1f}, max {max(facts):.1f}"
        )
        totals = {
            k: sum(r.get(k, 0) for r in done) for k in ("checked", "kept", "repaired", "dropped")
        }
        with_fidelity = sum("checked" in r for r in done)
        print(
            f"summary.fidelity in {with_fidelity}/{len(done)} events; facts checked "
            f"{totals['checked']}, kept {totals['kept']}, repaired {totals['repaired']}, "
            f"dropped {totals['dropped']}"
        )
    if cli:
        wall = [t * 1000 for t, _ in cli]
        codes = sorted({c for _, c in cli})
        print(
            f"`compactor compact` process wall time, {len(cli)} runs (ms): "
            f"p50 {pct(wall, 50):.0f}, p95 {pct(wall, 95):.0f}, max {max(wall):.0f}; "
            f"exit codes {codes}"
        )
    for r in done:
        if r["missing"] or not r["under"]:
            print(
                f"  {r['name']}: under={r['under']} after={r['after']} thr={r['threshold']} "
                f"missing={r['missing']}"
            )
    return 0 if len(done) == len(rows) else 1


if __name__ == "__main__":
    del ROOT
    sys.exit(main())
