"""Secret redaction (worker/core/redaction.py): its cost and its finds over the real corpus, and
its cost on adversarial megabytes.

    .venv/bin/python bench/redaction_bench.py [--runs N]

Prints Markdown (paste it into BENCHMARKS.md): every string of every message of
``../shared/corpus`` (or ``$COMPACTOR_CORPUS_DIR``) redacted as a summarizer's input is, with
the CPU time, the throughput and what was found by kind; each conversation's messages redacted
as one compaction's range is (``redact_messages``); then 1 MB of ordinary text and of inputs
built to make a pattern rescan or backtrack, as one text and as a range's one message, best of
``--runs``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import conversations

from worker.config import Settings
from worker.core.redaction import redact, redact_json, redact_messages
from worker.wire.models import Message
from worker.wire.snapshots import parse_snapshot

_MB = 1 << 20
_WORDS = "the parser reads src/app.py line 42 and returns 17 items; "
_NEEDLES = " sk- PRIVATE KEY AKIA ghp_ xoxb- AIza eyJ _live_ :// "
INPUTS = {
    "ordinary text (every pattern runs)": (_NEEDLES + _WORDS * (_MB // len(_WORDS)))[:_MB],
    "`sk-` repeated": "sk-" * (_MB // 3),
    "PEM header without an end": "-----BEGIN PRIVATE KEY-----" + "A" * _MB,
    "`token=` repeated": "token=" * (_MB // 6),
    "`a://b:` repeated": "a://b:" * (_MB // 6),
    "`Authorization: Bearer ` repeated": "Authorization: Bearer " * (_MB // 22),
    "one run of 1 MB": "a" * _MB,
}


def corpus_table() -> list[str]:
    counts: Counter[str] = Counter()
    chars = sessions = 0
    cpu = 0.0
    for _name, snap in conversations():
        sessions += 1
        for message in snap["messages"]:
            chars += sum(len(v) for v in _strings(message))
            start = time.process_time()
            redact_json(message, counts)
            cpu += time.process_time() - start
    found = ", ".join(f"`{k}` {v}" for k, v in counts.most_common()) or "none"
    return [
        "| sessions | characters | CPU s | MB/s | found |",
        "|---|---|---|---|---|",
        f"| {sessions} | {chars:,} | {cpu:.2f} | {chars / cpu / 1e6:.1f} | {found} |",
    ]


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def range_table(runs: int) -> list[str]:
    """Each conversation's messages as one range, the best of ``runs`` each."""
    ranges = [parse_snapshot(snap, Settings()).messages for _, snap in conversations()]
    cpu = sorted(min(_cpu(redact_messages, r) for _ in range(runs)) * 1000 for r in ranges)
    return [
        "| ranges | CPU ms per range, p50 | p95 | max |",
        "|---|---|---|---|",
        f"| {len(cpu)} | {cpu[len(cpu) // 2]:.2f} | {cpu[len(cpu) * 95 // 100]:.2f} "
        f"| {cpu[-1]:.2f} |",
    ]


def adversarial_table(runs: int) -> list[str]:
    rows = [
        "| 1 MB of | `redact` CPU ms (best) | against ordinary text | as a range's message |",
        "|---|---|---|---|",
    ]
    baseline = 0.0
    for name, text in INPUTS.items():
        best = min(_cpu(redact, text) for _ in range(runs))
        baseline = baseline or best
        message = [Message(id="m", role="tool", content=text, tool_call_id="c", source_index=0)]
        in_range = min(_cpu(redact_messages, message) for _ in range(runs))
        rows.append(
            f"| {name} | {best * 1000:.0f} | {best / baseline:.2f}x | {in_range * 1000:.0f} |"
        )
    return rows


def _cpu(redactor: Callable[[Any], object], value: Any) -> float:
    start = time.process_time()
    redactor(value)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(corpus_table()))
    print()
    print("\n".join(range_table(args.runs)))
    print()
    print("\n".join(adversarial_table(args.runs)))


if __name__ == "__main__":
    main()
