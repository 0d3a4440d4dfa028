"""Idle SSE followers of ``compactor serve`` with the default settings (``sse_keepalive_s``
15 s): what they receive and what the server does while nothing is published.

``--followers`` (300) SSE streams are opened, one per conversation (each with one event
already, read first), and left idle for ``--idle-s`` (30 s). Counted over that window: the
keep-alive comments and the ``redis unavailable`` comments the followers received, the
WARNING lines the server logged, the connections Redis accepted (``total_connections_received``)
and the latency of ``GET .../events`` (JSON, one every 0.5 s) meanwhile.

Redis (embedded) and ``compactor serve`` are private processes on 127.0.0.1 (no worker, no
LLM is called), started and stopped here.

    .venv/bin/python bench/idle_followers_bench.py [--followers 300] [--idle-s 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import redis
from http_bench import KEY, TENANT, processes, raise_nofile

from worker.backend.connection import connect
from worker.backend.redis_state import RedisState
from worker.config import RedisConfig
from worker.wire.events import skipped_event


async def follower(host: str, port: int, conversation_id: str, seen: dict[str, int]) -> None:
    """An SSE stream read line by line, counting what arrives in ``seen``."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        (
            f"GET /v1/conversations/{conversation_id}/events HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\nAuthorization: Bearer {KEY}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    try:
        while line := await reader.readline():
            text = line.decode(errors="replace").strip()
            if text.startswith(": keep-alive"):
                seen["keep_alive"] += 1
            elif text.startswith(": redis unavailable"):
                seen["redis_unavailable"] += 1
            elif text.startswith("data:"):
                seen["events"] += 1
    finally:
        writer.close()


async def idle(base: str, followers: int, idle_s: float, redis_url: str, log: Path) -> None:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    seen = {"keep_alive": 0, "redis_unavailable": 0, "events": 0}
    tasks = [
        asyncio.create_task(follower(host, int(port), f"idle-{i}", seen)) for i in range(followers)
    ]
    deadline = time.monotonic() + 60
    while seen["events"] < followers and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    print(f"{seen['events']} of {followers} followers read their first event", flush=True)
    admin = redis.Redis.from_url(redis_url)
    connections_before = admin.info("stats")["total_connections_received"]
    logged_before = log.stat().st_size
    counted = dict(seen)
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {KEY}"}) as c:
        end = time.monotonic() + idle_s
        while time.monotonic() < end:
            started = time.perf_counter()
            reply = await c.get("/v1/conversations/idle-0/events")
            latencies.append(time.perf_counter() - started)
            assert reply.status_code == 200, reply.text
            await asyncio.sleep(0.5)
    during = {k: seen[k] - counted[k] for k in seen}
    warnings = log.read_bytes()[logged_before:].decode(errors="replace").count(" WARNING ")
    connections = admin.info("stats")["total_connections_received"] - connections_before
    admin.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    ordered = sorted(latencies)
    print(
        json.dumps(
            {
                "followers": followers,
                "idle_s": idle_s,
                "keep_alives": during["keep_alive"],
                "redis_unavailable_comments": during["redis_unavailable"],
                "server_warnings": warnings,
                "redis_connections_opened": connections,
                "get_events_ms": {
                    "p50": round(statistics.median(ordered) * 1000, 1),
                    "max": round(ordered[-1] * 1000, 1),
                    "requests": len(ordered),
                },
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--followers", type=int, default=300)
    parser.add_argument("--idle-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    print(raise_nofile(2 * args.followers + 256), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with processes(root, None) as (redis_url, _llm, base, _serve, _config):
            state = RedisState(connect(redis_url), RedisConfig())
            now = datetime.now(UTC)
            for i in range(args.followers):
                event = skipped_event(
                    f"{TENANT}:idle-{i}", 1, now, why="bench", reason="bench", trigger=None
                )
                state.publish(event, handled_revision=1)
            state.client.close()
            asyncio.run(idle(base, args.followers, args.idle_s, redis_url, root / "serve.log"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
