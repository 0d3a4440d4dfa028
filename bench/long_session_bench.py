"""A long agent session through the proxy: what each request forwards, turn after turn.

An agent sends its full history every turn through ``POST /proxy/openai/v1/chat/completions``
(the official ``openai`` SDK, as an agent would), with a small threshold so that compactions
come every few turns. Each turn waits for the worker's outcome of the exchange before the
next one (as the model's own latency would), so every compaction has landed by the next
request. Per turn it records the tokens the upstream received (counted as the worker counts
them), the compactions the proxy applied (``X-Compactor-Compactions``; counted from the
events for a version without that header) and the proxy call's latency.

With ``--checkout DIR`` (repeatable) the worker and ``compactor serve`` run from each of those
source trees (``PYTHONPATH``) in turn, in one run, so versions compare side by side: e.g. a
``git worktree`` of an older commit beside this checkout (``.``). Redis (embedded), the
stand-in provider (this checkout's), the worker and the server are private processes on
127.0.0.1, started and stopped here.

    .venv/bin/python bench/long_session_bench.py [--turns 200] [--threshold 2000] \\
        [--checkout /tmp/base --checkout .]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from worker.backend.embedded import EmbeddedRedis
from worker.core.projection import count_request_tokens
from worker.testing.standin_llm import StandinLLM
from worker.tokens import tokenizer_for
from worker.wire import formats
from worker.wire.composed import ComposedCompaction, apply_composed, chain_digest

AGENT_KEY = "sk-bench-agent-key-0123456789"
API_KEY = "bench-compactor-key-0123456789"
OUTCOMES = {
    "compaction.completed",
    "compaction.skipped",
    "compaction.failed",
    "compaction.rejected",
}
MARKS = (10, 25, 50, 100, 150, 200, 300, 500)


@dataclass
class Run:
    label: str
    forwarded: list[int] = field(default_factory=list)  # tokens the upstream received
    applied: list[int] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    completed: int = 0
    first_compacted_turn: int | None = None  # the first turn after the first compaction


def user_turn(k: int) -> dict[str, Any]:
    words = " ".join(f"src/pkg/mod_{k % 9}.py:{i} value_{k}_{i}" for i in range(60))
    return {"role": "user", "content": f"Turn {k}. Here is what I found: {words}"}


def request_tokens(messages: list[dict[str, Any]]) -> int:
    return count_request_tokens(formats.to_messages("openai", messages), tokenizer_for("gpt-4.1"))


def start(cmd: list[str], env: dict[str, str], log: Path, **kw: Any) -> subprocess.Popen[str]:
    with log.open("ab") as out:
        kw.setdefault("stdout", out)
        return subprocess.Popen(cmd, env=env, stderr=out, start_new_session=True, text=True, **kw)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_checkout(checkout: Path, args: argparse.Namespace, llm: StandinLLM) -> Run:
    run = Run(label=str(checkout))
    with tempfile.TemporaryDirectory(prefix="long-bench-") as tmp, EmbeddedRedis() as redis_url:
        root = Path(tmp)
        config = root / "compactor.toml"
        config.write_text(f"""[compaction]
transcript_dir = "{root / "transcripts"}"
auto_compact_threshold_tokens = {args.threshold}
auto_compact_threshold_percent = "none"
summary_max_output_tokens = 300
preserve_recent_user_tokens = 300
max_persisted_transcripts = 5
[proxy]
openai_base_url = "{llm.openai_base_url}"
""")
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
        env |= {
            "PYTHONPATH": str(checkout.resolve()),
            "COMPACTOR_CONFIG": str(config),
            "COMPACTOR_REDIS_URL": redis_url,
            "COMPACTOR_API_KEYS": json.dumps({API_KEY: "bench"}),
        }
        worker = start(
            [sys.executable, "-m", "celery", "-A", "worker", "worker", "--pool", "threads",
             "--concurrency", "4", "-Q",
             "compactor.evaluate,compactor.summarize,compactor.maintenance",
             "-n", "bench@%h", "--without-mingle", "--without-gossip", "--loglevel", "WARNING"],
            env, root / "worker.log", cwd=checkout,
        )  # fmt: skip
        serve = start(
            [sys.executable, "-m", "worker", "serve", "--port", "0"],
            env, root / "serve.log", cwd=root, stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            base = listening(serve, root / "serve.log")
            drive(run, base, args, llm)
        finally:
            stop(serve)
            stop(worker)
    return run


def listening(serve: subprocess.Popen[str], log: Path) -> str:
    assert serve.stdout is not None
    ready, _, _ = select.select([serve.stdout], [], [], 60)
    line = serve.stdout.readline() if ready else ""
    if not line:
        raise SystemExit(f"compactor serve did not start: {log.read_text()[-2000:]}")
    url: str = json.loads(line)["http"]
    return url


def drive(run: Run, base: str, args: argparse.Namespace, llm: StandinLLM) -> None:
    cid = "bench-long"
    client = openai.OpenAI(
        base_url=f"{base}/proxy/openai/v1",
        api_key=AGENT_KEY,
        max_retries=0,
        default_headers={"X-Compactor-Conversation": cid, "X-Compactor-Key": API_KEY},
    )
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    after = "0"
    try:
        for k in range(args.turns):
            history.append(user_turn(k))
            started = time.perf_counter()
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4.1", messages=history
            )
            run.latency_ms.append((time.perf_counter() - started) * 1000)
            reply = raw.parse().choices[0].message.content or ""
            run.forwarded.append(request_tokens(llm.requests[-1].body["messages"]))
            history.append({"role": "assistant", "content": reply})
            after = wait_outcome(api, cid, k + 1, after, run, args.timeout_s)
            header = raw.headers.get("x-compactor-compactions")
            run.applied.append(int(header) if header is not None else -1)
    finally:
        client.close()
        api.close()


def wait_outcome(
    api: httpx.Client, cid: str, revision: int, after: str, run: Run, timeout_s: float
) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = api.get(f"/v1/conversations/{cid}/events", params={"after": after})
        newest = -1
        if r.status_code == 200:
            for event in r.json():
                after = event["stream_id"]
                if event["type"] in OUTCOMES:
                    run.completed += event["type"] == "compaction.completed"
                    if run.completed and run.first_compacted_turn is None:
                        run.first_compacted_turn = revision
                    newest = max(newest, event["revision"])
        if newest >= revision:
            return after
        time.sleep(0.02)
    raise SystemExit(f"no outcome of revision {revision} within {timeout_s}s")


def report(runs: list[Run], args: argparse.Namespace) -> None:
    marks = [m for m in MARKS if m <= args.turns]
    print(f"tokens forwarded at turn (threshold {args.threshold}):")
    print("| checkout | " + " | ".join(str(m) for m in marks) + " | max after 1st compaction | "
          "compactions | applied to the last request | proxy call p50 / p95 ms |")  # fmt: skip
    print("|---" * (len(marks) + 5) + "|")
    for run in runs:
        first = run.first_compacted_turn or len(run.forwarded)
        after_first = max(run.forwarded[first:], default=0)
        cuts = statistics.quantiles(run.latency_ms, n=20)
        cells = " | ".join(f"{run.forwarded[m - 1]:,}" for m in marks)
        last = str(run.applied[-1]) if run.applied[-1] >= 0 else "(no header)"
        print(f"| {run.label} | {cells} | {after_first:,} | {run.completed} | {last} | "
              f"{statistics.median(run.latency_ms):.1f} / {cuts[18]:.1f} |")  # fmt: skip


def composed_scaling(sizes: tuple[int, ...] = (1_000, 10_000, 50_000)) -> None:
    """What applying the composed compaction costs per request: a full history of ``n`` short
    messages, all but the newest 10 covered (best of 5)."""
    print("\napply_composed on a full history (best of 5):")
    print("| messages | JSON MB | ms | µs per message |")
    print("|---|---|---|---|")
    for n in sizes:
        history = [user_turn(k) for k in range(n)]
        composed = ComposedCompaction(
            conversation_id="c",
            format="openai",
            start=0,
            first_id=formats.source_ids(history[:1])[0],
            count=n - 10,
            digest=chain_digest("", history[: n - 10]),
            replacement=[{"role": "user", "content": "summary"}],
            compactions=1,
            event_id="e",
            revision=0,
        )
        best = min(_timed(apply_composed, history, composed) for _ in range(5))
        size_mb = len(json.dumps(history)) / 1e6
        print(f"| {n:,} | {size_mb:.1f} | {best * 1000:.1f} | {best * 1e6 / n:.2f} |")


def _timed(action: Any, *args: Any) -> float:
    started = time.perf_counter()
    action(*args)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--threshold", type=int, default=2000)
    parser.add_argument("--checkout", action="append", type=Path)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--scaling-only", action="store_true", help="only the apply_composed scaling table"
    )
    args = parser.parse_args(argv)
    if args.scaling_only:
        composed_scaling()
        return 0
    checkouts = args.checkout or [Path(__file__).resolve().parent.parent]
    runs = []
    with StandinLLM(expected_key=AGENT_KEY) as llm:
        for checkout in checkouts:
            runs.append(run_checkout(checkout, args, llm))
            print(f"done: {checkout}", file=sys.stderr)
    report(runs, args)
    composed_scaling()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
