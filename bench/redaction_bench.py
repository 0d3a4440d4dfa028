"""Secret redaction (worker/core/redaction.py): its cost and its finds over the real corpus, and
its cost on adversarial megabytes.

    .venv/bin/python bench/redaction_bench.py [--runs N]

Prints Markdown (paste it into BENCHMARKS.md): every string of every message of
``../shared/corpus`` (or ``$COMPACTOR_CORPUS_DIR``) redacted as a summarizer's input is, with
the CPU time, the throughput and what was found by kind; then 1 MB of ordinary text and of
inputs built to make a pattern rescan or backtrack, best of ``--runs``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import conversations

from worker.core.redaction import redact, redact_json

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


def adversarial_table(runs: int) -> list[str]:
    rows = ["| 1 MB of | CPU ms (best) | against ordinary text |", "|---|---|---|"]
    baseline = 0.0
    for name, text in INPUTS.items():
        best = min(_cpu(text) for _ in range(runs))
        baseline = baseline or best
        rows.append(f"| {name} | {best * 1000:.0f} | {best / baseline:.2f}x |")
    return rows


def _cpu(text: str) -> float:
    start = time.process_time()
    redact(text)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(corpus_table()))
    print()
    print("\n".join(adversarial_table(args.runs)))


if __name__ == "__main__":
    main()
