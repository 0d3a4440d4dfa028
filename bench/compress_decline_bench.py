"""What ``compress_tool_result`` costs on small tool results, where it usually declines.

    .venv/bin/python bench/compress_decline_bench.py [--runs 5] [--save F | --check F]

Every new tool result a worker evaluates goes through the codecs once, and most do not compress,
so the decline path is on the service's hot path. Sets: the 12-line tool body of
``bench/scaling_bench.py`` for 200 distinct conversations; every corpus tool output under 4 KB
(and those over 200 characters, past the gate's length pre-check); those of 4-64 KB. Each call
is timed warm (the best of 3 per input); each run reports the median over inputs; printed is the
median of the runs. ``--save`` / ``--check`` pickle the outputs, to show that two commits give the
same bytes (run this file from one checkout with ``PYTHONPATH`` at the other's root).
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import conversations

from worker.compress import compress_tool_result

MODEL = "gpt-4.1"


def input_sets() -> dict[str, list[str]]:
    bodies = [
        "\n".join(f"{i:4}\tdef f{k}_{i}(x): return x * {i}  # conv-{k}" for i in range(12))
        for k in range(200)
    ]
    outputs = [
        m["content"]
        for _, conversation in conversations()
        for m in conversation["messages"]
        if m.get("role") == "tool" and isinstance(m.get("content"), str)
    ]
    small = [o for o in outputs if len(o.encode()) < 4096]
    return {
        "12-line body": bodies,
        "corpus < 4 KB": small,
        "  of which > 200 chars": [o for o in small if len(o) > 200],
        "corpus 4-64 KB": [o for o in outputs if 4096 <= len(o.encode()) < 65536],
    }


def median_us(texts: list[str], repeats: int) -> float:
    per_call = []
    for text in texts:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            compress_tool_result("bash", text, model=MODEL)
            best = min(best, time.perf_counter() - start)
        per_call.append(best * 1e6)
    return statistics.median(per_call)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--save", type=Path)
    parser.add_argument("--check", type=Path)
    args = parser.parse_args()
    sets = input_sets()
    outputs = {}
    for name, texts in sets.items():
        outputs[name] = [compress_tool_result("bash", t, model=MODEL) for t in texts]  # warm-up
        runs = [median_us(texts, 3) for _ in range(args.runs)]
        print(
            f"{name:24} n={len(texts):5}  median {statistics.median(runs):7.1f} us per call "
            f"(runs {min(runs):.1f}-{max(runs):.1f})",
            flush=True,
        )
    if args.save:
        args.save.write_bytes(pickle.dumps(outputs))
    if args.check:
        same = pickle.loads(args.check.read_bytes()) == outputs
        print(f"outputs identical to {args.check}: {same}")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
