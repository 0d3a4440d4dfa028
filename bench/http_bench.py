"""What ``compactor serve`` costs over HTTP, in one run, all on loopback.

1. **Proxy latency**: the same Chat Completions request sent to the stand-in provider directly
   and through ``POST /proxy/openai/v1/chat/completions``, without the conversation header
   (pass-through) and with it (the compaction lookup and the submission of the exchange),
   interleaved; p50/p99 of the whole response, and for ``stream: true`` of the first byte too.
   The difference is the proxy's added latency.
2. **Submit**: snapshots submitted over ``POST /v1/conversations/{id}/snapshots`` against
   ``Client.submit`` (Redis directly), the same snapshots from the same number of threads:
   throughput and p50/p99 latency.
3. **SSE fan-out**: ``--followers`` (1,000) idle SSE followers, one per conversation, then one
   event published for each (as a worker publishes it): delivery latency (publish to the
   follower reading it) p50/p99/max, and the server's RSS before, with the followers idle and
   after the delivery.

Redis (embedded), the stand-in provider and ``compactor serve`` are private processes on
127.0.0.1, started and stopped here; no worker runs (nothing consumes the queued
evaluations, so no compaction is ever applied: the proxy's figure is its lookup, not an
application). Bounded by the counts below and ``--timeout-s`` per phase.

    .venv/bin/python bench/http_bench.py [--requests 300] [--submits 2000] [--followers 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from worker.backend.connection import connect
from worker.backend.embedded import EmbeddedRedis
from worker.backend.redis_state import RedisState
from worker.client import Client
from worker.config import load_settings, with_redis_url
from worker.wire.events import skipped_event

KEY = "bench-key-0123456789abcdef"
TENANT = "bench"
AGENT_KEY = "sk-bench-agent-0123456789"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    return f"{pct(values, 50) * 1000:7.2f} / {pct(values, 99) * 1000:7.2f}"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def raise_nofile(needed: int) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return f"RLIMIT_NOFILE {soft} (enough, not raised)"
    target = hard if hard == resource.RLIM_INFINITY else min(hard, max(needed, soft))
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return f"RLIMIT_NOFILE raised from {soft} to {target} (inherited by compactor serve)"


def history(turns: int, body: int = 400) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in src/pkg/core.py."},
    ]
    for k in range(turns):
        call = {"id": f"call{k}", "type": "function"}
        call["function"] = {"name": "bash", "arguments": json.dumps({"command": f"cat m{k}.py"})}
        messages.append({"role": "assistant", "content": f"Step {k}.", "tool_calls": [call]})
        words = " ".join(f"token{k}_{i}" for i in range(body))
        messages.append({"role": "tool", "tool_call_id": f"call{k}", "content": words})
    return messages


def snapshot(conversation_id: str, revision: int = 1) -> dict[str, Any]:
    messages = [dict(m, id=f"m{i}") for i, m in enumerate(history(4, body=100))]
    return {
        "conversation_id": conversation_id,
        "revision": revision,
        "format": "openai",
        "context_window_tokens": 128000,
        "model": "gpt-4.1",
        "messages": messages,
    }


# --- the processes -----------------------------------------------------------------------


def _read_line(proc: subprocess.Popen[str], timeout_s: float, what: str) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"{what} did not start")
    return line.strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def serve_command(redis_pool: int | None) -> list[str]:
    """``compactor serve`` as it is; or, with ``redis_pool``, with its asyncio Redis clients
    made with that ``max_connections`` (redis-py's default pool holds 100), to measure what the
    followers would cost if the pool did not refuse them. Nothing in ``worker`` is changed."""
    if redis_pool is None:
        return [sys.executable, "-m", "worker", "serve", "--port", "0"]
    patch = f"""
import runpy, sys
import redis.asyncio as ra
_from_url = ra.Redis.from_url
ra.Redis.from_url = lambda url, **kw: _from_url(url, **({{"max_connections": {redis_pool}}} | kw))
sys.argv = ["worker", "serve", "--port", "0"]
runpy.run_module("worker", run_name="__main__", alter_sys=True)
"""
    return [sys.executable, "-c", patch]


@contextmanager
def processes(
    root: Path, redis_pool: int | None
) -> Iterator[tuple[str, str, str, subprocess.Popen[str], Path]]:
    """(redis url, stand-in base URL, serve base URL, the serve process, config path)."""
    with EmbeddedRedis() as redis_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
        llm = subprocess.Popen(
            [sys.executable, "-m", "worker.testing.standin_llm", "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            llm_url = _read_line(llm, 30, "the stand-in").rsplit(" ", 1)[-1]
            config = root / "compactor.toml"
            config.write_text(f"""
[compaction]
transcript_dir = "{root / "transcripts"}"
[proxy]
openai_base_url = "{llm_url}/v1"
[http]
max_body_bytes = 4000000
""")
            env |= {
                "COMPACTOR_CONFIG": str(config),
                "COMPACTOR_REDIS_URL": redis_url,
                "COMPACTOR_API_KEYS": json.dumps({KEY: TENANT}),
            }
            with (root / "serve.log").open("ab") as log:
                serve = subprocess.Popen(
                    serve_command(redis_pool),
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=env,
                    cwd=root,
                    start_new_session=True,
                )
            try:
                base = json.loads(_read_line(serve, 30, "compactor serve"))["http"]
                yield redis_url, llm_url, base, serve, config
            finally:
                _stop(serve)
        finally:
            _stop(llm)


# --- 1. proxy latency --------------------------------------------------------------------


def timed(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """(first byte s, whole response s) of one POST, the body read to its end."""
    start = time.perf_counter()
    first = None
    with client.stream("POST", url, json=body, headers=headers) as r:
        for _ in r.iter_raw():
            if first is None:
                first = time.perf_counter() - start
        r.raise_for_status()
    return first or 0.0, time.perf_counter() - start


def proxy_latency(llm_url: str, base: str, requests: int, deadline: float) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {AGENT_KEY}"}
    conv = auth | {"X-Compactor-Conversation": "lat-1", "X-Compactor-Key": KEY}
    targets = {
        "direct": (f"{llm_url}/v1/chat/completions", auth),
        "proxy": (f"{base}/proxy/openai/v1/chat/completions", auth),
        "proxy+conversation": (f"{base}/proxy/openai/v1/chat/completions", conv),
    }
    messages = history(6)
    results: dict[str, dict[str, list[float]]] = {
        f"{name} {mode}": {"first": [], "whole": []}
        for name in targets
        for mode in ("json", "stream")
    }
    with httpx.Client(timeout=30) as client:
        for i in range(requests + 10):
            if time.monotonic() > deadline:
                break
            for name, (url, headers) in targets.items():  # interleaved: same load for each
                for mode in ("json", "stream"):
                    body = {"model": "gpt-4.1", "messages": messages, "stream": mode == "stream"}
                    first, whole = timed(client, url, body, headers)
                    if i >= 10:  # warm-up
                        results[f"{name} {mode}"]["first"].append(first)
                        results[f"{name} {mode}"]["whole"].append(whole)
    return {"request_bytes": len(json.dumps({"messages": messages})), "results": results}


# --- 2. submit ---------------------------------------------------------------------------


def run_threads(count: int, threads: int, one: Callable[[int], None]) -> tuple[float, list[float]]:
    latencies: list[float] = []
    lock = threading.Lock()

    def task(i: int) -> None:
        start = time.perf_counter()
        one(i)
        took = time.perf_counter() - start
        with lock:
            latencies.append(took)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(task, range(count)))
    return time.perf_counter() - start, latencies


def submit_compare(
    base: str, redis_url: str, config: Path, submits: int, threads: int
) -> dict[str, tuple[float, list[float]]]:
    bodies = [json.dumps(snapshot(f"sub-{i}")) for i in range(submits)]
    settings = with_redis_url(load_settings(config, environ={}), redis_url)
    client = Client(settings)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=threads, max_keepalive_connections=threads)
    http = httpx.Client(base_url=base, headers=headers, timeout=30, limits=limits)

    def over_http(i: int) -> None:
        r = http.post(
            f"/v1/conversations/api-{i}/snapshots",
            content=bodies[i].replace(f'"sub-{i}"', f'"api-{i}"'),
        )
        assert r.status_code == 202, r.text

    def direct(i: int) -> None:
        assert client.submit(bodies[i]).status == "queued"

    try:
        for i in range(20):  # warm-up: connections, the server's first requests
            http.post(
                f"/v1/conversations/warm-{i}/snapshots", content=json.dumps(snapshot(f"warm-{i}"))
            )
            client.submit(snapshot(f"warm-{i}"))
        out = {
            "POST /v1/.../snapshots": run_threads(submits, threads, over_http),
            "Client.submit": run_threads(submits, threads, direct),
        }
    finally:
        http.close()
        client.close()
    return out


# --- 3. SSE fan-out ----------------------------------------------------------------------


async def follower(
    host: str,
    port: int,
    conversation_id: str,
    connected: asyncio.Event,
    counter: list[int],
    total: int,
    received: dict[str, float],
    done: asyncio.Event,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        (
            f"GET /v1/conversations/{conversation_id}/events HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\nAuthorization: Bearer {KEY}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        counter[1] += 1
        if counter[1] == 1:
            print(f"{conversation_id}: {status!r} {await reader.read(400)!r}")
        writer.close()
        if sum(counter) == total:
            connected.set()
        return
    while (await reader.readline()) not in (b"\r\n", b""):
        pass  # the headers
    counter[0] += 1
    if sum(counter) == total:
        connected.set()
    try:
        while not done.is_set():
            line = await reader.readline()
            if not line:
                return
            if line.startswith(b"data:"):
                received.setdefault(conversation_id, time.perf_counter())
                if len(received) == counter[0]:
                    done.set()
    finally:
        writer.close()


async def fan_out(
    base: str, redis_url: str, config: Path, serve_pid: int, followers: int, timeout_s: float
) -> dict[str, Any]:
    settings = with_redis_url(load_settings(config, environ={}), redis_url)
    ids = [f"sse{followers}-{i}" for i in range(followers)]
    client = Client(settings)
    for i in ids:  # a conversation never submitted is a 404
        client.submit(snapshot(f"{TENANT}:{i}"))
    client.close()
    redis_client = connect(redis_url)
    state = RedisState(redis_client, settings.redis)
    host, port = base.removeprefix("http://").rsplit(":", 1)
    rss_before = rss_mb(serve_pid)
    connected, done = asyncio.Event(), asyncio.Event()
    counter = [0, 0]  # connected, refused
    received: dict[str, float] = {}
    start = time.perf_counter()
    tasks = [
        asyncio.create_task(
            follower(host, int(port), i, connected, counter, followers, received, done)
        )
        for i in ids
    ]
    await asyncio.wait_for(connected.wait(), timeout_s)
    connect_s = time.perf_counter() - start
    await asyncio.sleep(2.0)  # idle followers
    rss_idle = rss_mb(serve_pid)
    published: dict[str, float] = {}

    def publish_all() -> None:
        now = datetime.now(UTC)
        for i in ids:
            event = skipped_event(
                f"{TENANT}:{i}", 1, now, why="bench", reason="bench", trigger=None
            )
            published[i] = time.perf_counter()
            state.publish(event, handled_revision=1)

    pub_start = time.perf_counter()
    publisher = asyncio.get_running_loop().run_in_executor(None, publish_all)
    await publisher
    publish_s = time.perf_counter() - pub_start
    with suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout_s)
    all_s = time.perf_counter() - pub_start
    rss_after = rss_mb(serve_pid)
    done.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    redis_client.close()
    delivery = [received[i] - published[i] for i in ids if i in received]
    return {
        "followers": followers,
        "refused": counter[1],
        "connect_s": connect_s,
        "delivered": len(delivery),
        "delivery": delivery,
        "publish_s": publish_s,
        "all_delivered_s": all_s,
        "rss": (rss_before, rss_idle, rss_after),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="per target and mode")
    parser.add_argument("--submits", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--followers", type=int, nargs="+", default=[90, 1000])
    parser.add_argument(
        "--serve-redis-pool",
        type=int,
        default=None,
        help="run serve with its asyncio Redis pool at this max_connections (a patch, see code)",
    )
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per phase")
    args = parser.parse_args(argv)
    print(raise_nofile(max(args.followers) * 2 + 256))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    if args.serve_redis_pool:
        print(f"serve patched: asyncio Redis max_connections={args.serve_redis_pool}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        processes(Path(tmp), args.serve_redis_pool) as running,
    ):
        redis_url, llm_url, base, serve, config = running

        lat = proxy_latency(llm_url, base, args.requests, time.monotonic() + args.timeout_s)
        res = lat["results"]
        count = len(res["direct json"]["whole"])
        print(f"\n# proxy latency: {count} requests each, {lat['request_bytes']} bytes of history")
        print(
            "| target | whole response p50 / p99 (ms) | stream first byte p50 / p99 | "
            "stream whole p50 / p99 |"
        )
        print("|---|---|---|---|")
        for name in ("direct", "proxy", "proxy+conversation"):
            print(
                f"| {name} | {ms(res[f'{name} json']['whole'])} | "
                f"{ms(res[f'{name} stream']['first'])} | {ms(res[f'{name} stream']['whole'])} |"
            )
        for name in ("proxy", "proxy+conversation"):
            added = [
                f"{(pct(res[f'{name} {m}'][k], q) - pct(res[f'direct {m}'][k], q)) * 1000:.2f}"
                for m, k in (("json", "whole"), ("stream", "first"), ("stream", "whole"))
                for q in (50, 99)
            ]
            print(
                f"added by {name} (p50, p99; json whole, stream first, stream whole): "
                + ", ".join(added)
                + " ms"
            )

        sub = submit_compare(base, redis_url, config, args.submits, args.threads)
        print(f"\n# submit: {args.submits} snapshots from {args.threads} threads")
        print("| path | snapshots/s | p50 / p99 (ms) |")
        print("|---|---|---|")
        for name, (took, latencies) in sub.items():
            print(f"| {name} | {len(latencies) / took:8.0f} | {ms(latencies)} |")

        for followers in args.followers:
            fan = asyncio.run(
                fan_out(base, redis_url, config, serve.pid, followers, args.timeout_s)
            )
            before, idle, after = fan["rss"]
            if fan["refused"]:
                log = (Path(tmp) / "serve.log").read_text(errors="replace")
                warned = log.count("event stream: redis unavailable")
                print(f"serve.log: {warned} 'event stream: redis unavailable' warnings so far")
            print(f"\n# SSE fan-out: {fan['followers']} followers, {fan['refused']} refused")
            print(
                f"connected in {fan['connect_s']:.2f} s; {fan['delivered']} of "
                f"{fan['followers']} events delivered"
            )
            if fan["delivery"]:
                d = fan["delivery"]
                print(
                    f"delivery p50 / p99 / max: {pct(d, 50) * 1000:.1f} / {pct(d, 99) * 1000:.1f} "
                    f"/ {max(d) * 1000:.1f} ms; mean {statistics.mean(d) * 1000:.1f} ms"
                )
            print(
                f"publishing took {fan['publish_s']:.2f} s, all delivered "
                f"{fan['all_delivered_s']:.2f} s after the first publish"
            )
            print(
                f"serve RSS: {before:.1f} MB before, {idle:.1f} MB with the followers idle, "
                f"{after:.1f} MB after the delivery "
                f"({(idle - before) * 1024 / fan['followers']:.1f} KB per follower)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
