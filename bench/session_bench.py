"""What a CompactingSession costs the agent: the longest, median and p99 ``extend`` and
``request_messages`` call over a 200-turn run, with Redis up (an embedded Redis and one worker
process answering every snapshot) and with Redis stopped before the run, for histories that
start at 50 and at 500 messages.

    .venv/bin/python bench/session_bench.py [--turns 200] [--sizes 50,500] [--pause-ms 10]

A turn is an assistant message with a tool call and its result (two messages), so a history
of N messages ends at N + 2 * turns. The messages are the shared corpus's (real tool outputs,
conversations chained with their ids prefixed) when it is present, else synthetic ones. The
context window is large (no compaction): the history, and so the projection, keeps growing.
The first ``request_messages`` of a session compresses every tool result once; it is reported
apart ("cold"), the run measures the calls after it. Between turns the agent "works" for
``--pause-ms`` (default 10 ms, a thousandth of a real model call): enough for the sender to
submit nearly every turn and the follower to read the worker's events while the calls are
measured (with 0 the 200 turns take about 20 ms and coalesce into a few snapshots).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from corpus import corpus_dir  # noqa: E402

from worker.backend.embedded import EmbeddedRedis  # noqa: E402
from worker.client import Client  # noqa: E402
from worker.config import load_settings, with_redis_url  # noqa: E402
from worker.runtime.celery_app import make_app  # noqa: E402
from worker.runtime.supervisor import celery_command  # noqa: E402
from worker.session import CompactingSession  # noqa: E402

WINDOW = 1_047_576


def corpus_messages(needed: int) -> list[dict[str, Any]] | None:
    """Real messages, conversations chained (system prompts after the first dropped, ids
    prefixed), cut after a complete exchange."""
    d = corpus_dir()
    if d is None:
        return None
    out: list[dict[str, Any]] = []
    for n, path in enumerate(sorted(d.glob("*.json.gz"), key=lambda p: -p.stat().st_size)):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            messages = json.load(f)["messages"]
        for m in messages:
            if n and m["role"] == "system":
                continue
            m = dict(m, id=f"c{n}-{m['id']}")
            if "tool_call_id" in m:
                m["tool_call_id"] = f"c{n}-{m['tool_call_id']}"
            if m.get("tool_calls"):
                m["tool_calls"] = [dict(c, id=f"c{n}-{c['id']}") for c in m["tool_calls"]]
            out.append(m)
        if len(out) >= needed + 200:
            break
    return out


def synthetic_messages(needed: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in src/pkg/core.py."},
    ]
    k = 0
    while len(out) < needed + 2:
        cid = f"call{k}"
        out.append(
            {
                "role": "assistant",
                "content": f"Step {k}.",
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": json.dumps({"command": f"sed -n 1,60p src/m{k}.py"}),
                        },
                    }
                ],
            }
        )
        body = "\n".join(f"{i:4}\tdef f{k}_{i}(x): return x * {i}" for i in range(60))
        out.append({"role": "tool", "tool_call_id": cid, "content": body})
        k += 1
    return out


def split(messages: list[dict[str, Any]], size: int, turns: int) -> tuple[list[Any], list[Any]]:
    """(the first ``size`` messages, ending after a whole exchange; ``turns`` exchanges after)."""
    cut = size
    while cut < len(messages) and messages[cut]["role"] == "tool":
        cut += 1
    head, rest, exchanges = messages[:cut], messages[cut:], []
    k = 0
    while k < len(rest) and len(exchanges) < turns:
        m = rest[k]
        k += 1
        if m["role"] != "assistant" or not m.get("tool_calls"):
            continue
        answers = []
        while k < len(rest) and rest[k]["role"] == "tool":
            answers.append(rest[k])
            k += 1
        if {c["id"] for c in m["tool_calls"]} == {a["tool_call_id"] for a in answers}:
            exchanges.append([m, *answers])
    return head, exchanges


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run(
    size: int, redis_up: bool, messages: list[dict[str, Any]], turns: int, pause_s: float
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="session-bench-"))
    config = work / "compactor.toml"
    config.write_text(
        f'[compaction]\ntranscript_dir = "{work / "transcripts"}"\n[worker]\nlog_format = "text"\n'
    )
    server = EmbeddedRedis(directory=work / "redis")
    url = server.start()
    settings = with_redis_url(load_settings(config, environ={}), url)
    worker = None
    if redis_up:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
        env |= {"COMPACTOR_CONFIG": str(config), "COMPACTOR_REDIS_URL": url}
        cmd = celery_command(
            "worker",
            None,
            queues="compactor.evaluate,compactor.summarize",
            pool="threads",
            concurrency=2,
            name="bench@%h",
            loglevel="WARNING",
        )
        with (work / "worker.log").open("ab") as out:
            worker = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        app = make_app(settings)
        deadline = time.monotonic() + 60
        while not (app.control.ping(timeout=0.5) or []):
            if time.monotonic() > deadline:
                raise SystemExit("the worker did not start")
        app.close()
    client = Client(settings)
    head, exchanges = split(messages, size, turns)
    session = CompactingSession(
        f"bench-{size}-{'up' if redis_up else 'down'}",
        client=client,
        model="gpt-4.1",
        context_window=WINDOW,
        messages=head,
    )
    started = time.perf_counter()
    session.request_messages()
    cold = time.perf_counter() - started
    if not redis_up:
        server.stop()
    extend_s, request_s = [], []
    for turn in exchanges:
        started = time.perf_counter()
        session.extend(turn)
        extend_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        session.request_messages()
        request_s.append(time.perf_counter() - started)
        if pause_s:
            time.sleep(pause_s)
    if redis_up:  # let the sender and the follower catch up: the status says what got through
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            s = session.status
            if not s.pending_submits and s.last_outcome_revision == s.last_submitted_revision:
                break
            time.sleep(0.01)
    status = session.status
    session.close(timeout_s=0)
    client.close()
    if worker is not None:
        worker.terminate()
        worker.wait(timeout=30)
    server.stop()
    return {
        "history": f"{len(head)} -> {len(session.messages)} messages",
        "redis": "up" if redis_up else "stopped",
        "cold_first_request_ms": round(cold * 1000, 1),
        "extend_ms": _figures(extend_s),
        "request_messages_ms": _figures(request_s),
        "submitted_revision": status.last_submitted_revision,
        "pending_submits": status.pending_submits,
        "submit_failures": status.submit_failures,
        "events_received": status.events_received,
    }


def _figures(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "median": round(statistics.median(ms), 3),
        "p99": round(percentile(ms, 99), 3),
        "max": round(max(ms), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--sizes", default="50,500")
    parser.add_argument("--pause-ms", type=float, default=10.0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    needed = max(sizes) + 3 * args.turns
    messages = corpus_messages(needed)
    source = "corpus"
    if messages is None:
        messages, source = synthetic_messages(needed), "synthetic"
    print(json.dumps({"messages": source, "turns": args.turns, "pause_ms": args.pause_ms}))
    for size in sizes:
        for redis_up in (True, False):
            print(json.dumps(run(size, redis_up, messages, args.turns, args.pause_ms / 1000)))


if __name__ == "__main__":
    main()
