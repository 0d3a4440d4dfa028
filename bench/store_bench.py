"""Transcript write and read latency per store: p50/p99 of ``TranscriptStore.write`` (create-only,
durable) and ``read`` for 100 KB and 10 MB payloads.

    .venv/bin/python bench/store_bench.py file:///tmp/bench-transcripts \
        's3://bucket/prefix?endpoint=http://127.0.0.1:9000' [--runs 200] [--big-runs 10]

Each store URL is benchmarked in turn (credentials for S3 from the environment, as the service
takes them); every write uses a fresh name, so each is a real create, and what the run wrote
is removed at the end. Without URLs it starts moto's S3 server (tests/support/store_support.py) on
loopback and compares it with a temporary file store.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.transcripts import TranscriptStore, open_store


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(store: TranscriptStore, size: int, runs: int) -> dict[str, object]:
    payload = secrets.token_bytes(size // 2).hex().encode()[:size]
    conversation = f"bench-{secrets.token_hex(4)}"
    writes, reads = [], []
    for revision in range(runs):
        started = time.perf_counter()
        ref = store.write(conversation, revision, secrets.token_hex(16), payload)
        writes.append(time.perf_counter() - started)
        started = time.perf_counter()
        data = store.read(ref.uri)
        reads.append(time.perf_counter() - started)
        assert data == payload
    store.delete(store.stored(conversation))
    ms = 1000.0
    return {
        "bytes": size,
        "runs": runs,
        "write_p50_ms": round(statistics.median(writes) * ms, 2),
        "write_p99_ms": round(percentile(writes, 0.99) * ms, 2),
        "read_p50_ms": round(statistics.median(reads) * ms, 2),
        "read_p99_ms": round(percentile(reads, 0.99) * ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "urls",
        nargs="*",
        help="store URLs (default: a file store, moto's S3 and a PostgreSQL database)",
    )
    parser.add_argument("--runs", type=int, default=200, help="writes of 100 KB per store")
    parser.add_argument("--big-runs", type=int, default=10, help="writes of 10 MB per store")
    parser.add_argument(
        "--postgres-admin",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="without URLs: a PostgreSQL where a database of the bench's own is made ('' skips)",
    )
    args = parser.parse_args()
    server = None
    database = None
    urls = list(args.urls)
    if not urls and args.postgres_admin:
        database = _bench_database(args.postgres_admin)
    if not urls:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from support.store_support import S3_ENVIRONMENT, S3Server

        os.environ.update(S3_ENVIRONMENT)
        logs = Path(tempfile.mkdtemp(prefix="store-bench-"))
        server = S3Server(logs)
        server.start()
        urls = [(logs / "files").as_uri(), server.url(server.new_bucket())]
        if database is not None:
            urls.append(database[1])
    try:
        for url in urls:
            store = open_store(url)
            try:
                for size, runs in ((100_000, args.runs), (10_000_000, args.big_runs)):
                    row = {"store": store.display} | measure(store, size, runs)
                    print(json.dumps(row), flush=True)
            finally:
                store.close()
    finally:
        if server is not None:
            server.stop()
        if database is not None:
            _drop_database(args.postgres_admin, database[0])


def _bench_database(admin_url: str) -> tuple[str, str]:
    """A fresh database for the run: (its name, its URL)."""
    import psycopg

    name = f"compactor_bench_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return name, admin_url.rsplit("/", 1)[0] + "/" + name


def _drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
