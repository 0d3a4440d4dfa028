"""Secret redaction's cost per compaction range, and how it grows with the range's size.

    .venv/bin/python bench/redaction_scaling_bench.py [--runs N]

Prints Markdown (paste it into BENCHMARKS.md). Each conversation of ``../shared/corpus`` (or
``$COMPACTOR_CORPUS_DIR``; read in place) is redacted as one compaction's range is
(``redact_messages``: text, reasoning, tool-call arguments, file names), the best of ``--runs``
CPU times each; then the median conversation's range repeated 1 to 32 times (each copy's ids
made unique) shows whether the cost grows linearly with the input: the CPU time per 100 KB
should stay flat. Runs against any tree that has ``worker.core.redaction.redact_messages``, so
that the tree before a change can be measured with the same script.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import conversations

from worker.config import Settings
from worker.core.redaction import redact_messages
from worker.wire.models import Message
from worker.wire.snapshots import parse_snapshot

SCALES = (1, 2, 4, 8, 16, 32)


def _size(messages: list[Message]) -> int:
    return sum(
        len(m.content)
        + len(m.reasoning)
        + sum(len(c.arguments) for c in m.tool_calls)
        + sum(len(a.label) for a in m.attachments)
        for m in messages
    )


def _best_cpu(messages: list[Message], runs: int) -> float:
    """The least CPU seconds of ``runs`` redactions of ``messages`` as one range."""
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        redact_messages(messages)
        best = min(best, time.process_time() - start)
    return best


def range_rows(ranges: list[list[Message]], runs: int) -> list[str]:
    cpu = sorted(_best_cpu(r, runs) * 1000 for r in ranges)
    sizes = sorted(_size(r) for r in ranges)
    n = len(cpu)
    return [
        "| ranges | median size KB | CPU ms per range, p50 | p95 | max |",
        "|---|---|---|---|---|",
        f"| {n} | {sizes[n // 2] / 1000:.0f} | {cpu[n // 2]:.2f} | {cpu[n * 95 // 100]:.2f} "
        f"| {cpu[-1]:.2f} |",
    ]


def scaling_rows(median: list[Message], runs: int) -> list[str]:
    rows = [
        "| copies of the median range | size KB | CPU ms (best) | CPU ms per 100 KB | "
        "against 1 copy |",
        "|---|---|---|---|---|",
    ]
    base = 0.0
    for k in SCALES:
        messages = [
            m.model_copy(update={"id": f"{m.id}~{copy}"}) for copy in range(k) for m in median
        ]
        size = _size(messages)
        cpu = _best_cpu(messages, runs)
        per = cpu * 1000 / (size / 100_000)
        base = base or per
        rows.append(
            f"| {k} | {size / 1000:,.0f} | {cpu * 1000:.1f} | {per:.2f} | {per / base:.2f}x |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ranges = [parse_snapshot(snap, Settings()).messages for _, snap in conversations()]
    by_size = sorted(ranges, key=_size)
    print("\n".join(range_rows(ranges, args.runs)))
    print()
    print("\n".join(scaling_rows(by_size[len(by_size) // 2], args.runs)))


if __name__ == "__main__":
    main()
