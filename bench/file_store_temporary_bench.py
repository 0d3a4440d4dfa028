"""The file store's write latency through a file without a name (``O_TMPFILE``, the default on
Linux) against a named ``.tmp-`` file (the fallback), alternating write by write in one
directory so that both meet the same disk and the same load.

    .venv/bin/python bench/file_store_temporary_bench.py [--bytes 100000] [--writes 500]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.transcripts import filesystem
from worker.transcripts.filesystem import FileStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=int, default=100_000)
    parser.add_argument("--writes", type=int, default=500, help="per kind")
    parser.add_argument("--dir", default=".", help="where the temporary store goes")
    args = parser.parse_args()
    payload = secrets.token_bytes(args.bytes // 2).hex().encode()[: args.bytes]
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        store = FileStore(Path(root))
        for i in range(args.writes):
            for unnamed in (True, False) if i % 2 else (False, True):  # neither always first
                filesystem.UNNAMED_FILES = unnamed
                started = time.perf_counter()
                store.write("c-bench", 2 * i + unnamed, secrets.token_hex(16), payload)
                times[unnamed].append(time.perf_counter() - started)
    for unnamed, values in times.items():
        values.sort()
        p90 = values[int(len(values) * 0.9)]
        kind = "unnamed" if unnamed else "named"
        print(
            f"{kind:8} {args.bytes} B: p50 {statistics.median(values) * 1000:.2f} ms, "
            f"p90 {p90 * 1000:.2f} ms"
        )


if __name__ == "__main__":
    main()
