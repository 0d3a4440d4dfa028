"""CPU time of ``Pipeline.run`` per corpus conversation (the minimum of N repetitions), p50 and
p95: steadier than wall time on a shared machine. Runs the ``worker`` package first on
``sys.path``, so an older tree can be measured with the same script:

    .venv/bin/python bench/pipeline_cpu_bench.py 3
    git archive REV | tar -x -C /tmp/old && cd /tmp/old && \\
        PYTHONPATH=/tmp/old /path/to/.venv/bin/python /path/to/bench/pipeline_cpu_bench.py 3

Each snapshot is given to ``Pipeline.parse`` as Python data, as an in-process caller gives it;
``--bytes`` gives it as the JSON bytes a worker reads from its queue instead.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import conversations

import worker
from worker.config import Settings
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.transcripts.filesystem import FileStore

MIN_THRESHOLD = 4000


def with_small_window(snapshot: dict[str, Any]) -> dict[str, Any]:
    """As bench/corpus_compact_bench.py (repeated here so that older trees run this too)."""
    probe = Pipeline(Settings(), Adapters(store=FileStore(Path(tempfile.gettempdir()))), Reuse())
    tokens = probe.evaluate(probe.parse(snapshot)).evaluation.projected_tokens
    threshold = max(tokens // 2, MIN_THRESHOLD)
    return {**snapshot, "model": {**snapshot["model"], "context_window": threshold * 4 // 3 + 1}}


def _clear_parse_cache() -> None:
    try:
        import worker.core.files as files
    except ImportError:  # a tree before issue 14
        return
    files._parse_cached.cache_clear()  # a first evaluation: no command parsed before


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--bytes"]
    repeats = int(args[0]) if args else 3
    snaps: list[Any] = [with_small_window(s) for _, s in conversations()]
    if "--bytes" in sys.argv:
        snaps = [json.dumps(s, ensure_ascii=False).encode("utf-8") for s in snaps]
    cpu = [float("inf")] * len(snaps)
    wall = [float("inf")] * len(snaps)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for i, snap in enumerate(snaps):
                _clear_parse_cache()
                pipeline = Pipeline(Settings(), Adapters(store=FileStore(Path(tmp))), Reuse())
                c0, w0 = time.process_time(), time.perf_counter()
                pipeline.run(pipeline.parse(snap))
                cpu[i] = min(cpu[i], time.process_time() - c0)
                wall[i] = min(wall[i], time.perf_counter() - w0)

    def q(values: list[float], k: int) -> float:
        return statistics.quantiles(values, n=100)[k - 1] * 1000

    print(
        f"{worker.__file__}: cpu p50 {q(cpu, 50):.1f} p95 {q(cpu, 95):.1f} ms; "
        f"wall p50 {q(wall, 50):.1f} p95 {q(wall, 95):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
