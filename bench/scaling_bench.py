"""Horizontal scaling: evaluations per second with 1 and 2 worker processes, beside the
throughput of a no-op Celery task on the same Redis in the same run (the floor); end-to-end
latency from submit to event; and the cost of re-evaluating a grown conversation.

    .venv/bin/python bench/scaling_bench.py [--snapshots 400] [--redis-url URL]
        [--brokers redis,rabbitmq]

``--brokers``: the rows once per broker, in the same run (the runs interleaved): the task
messages on the state's Redis, and on RabbitMQ (a vhost of its own on the machine's server,
``127.0.0.1:5672``, guest/guest; started if it is down), the state in Redis either way.

Each worker process is a ``celery worker --pool solo`` (one process executing tasks). Every
snapshot is a distinct conversation under its threshold, so each costs one full evaluation
(parse, project, count exactly, publish ``compaction.skipped``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import redis  # noqa: E402

from worker.backend import keys  # noqa: E402
from worker.backend.embedded import EmbeddedRedis  # noqa: E402
from worker.client import Client  # noqa: E402
from worker.config import Settings, load_settings, with_broker_url, with_redis_url  # noqa: E402
from worker.runtime.celery_app import make_app  # noqa: E402
from worker.tokens import TiktokenTokenizer  # noqa: E402
from worker.wire.snapshots import parse_snapshot  # noqa: E402


def snapshot(conversation_id: str, n_messages: int, *, revision: int = 1) -> dict[str, Any]:
    """A realistic coding conversation of ``n_messages`` messages (~120 tokens each)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    k = 0
    while len(messages) < n_messages:
        cid = f"call_{k}"
        messages.append(
            {
                "role": "assistant",
                "content": f"Looking at module {k}.",
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": json.dumps({"command": f"sed -n '1,40p' src/m{k}.py"}),
                        },
                    }
                ],
            }
        )
        body = "\n".join(
            f"{i:4}\tdef f{k}_{i}(x): return x * {i}  # {conversation_id}" for i in range(12)
        )
        messages.append({"role": "tool", "tool_call_id": cid, "content": body})
        k += 1
    return {
        "conversation_id": conversation_id,
        "revision": revision,
        "model": {"name": "gpt-4.1", "context_window": 10_000_000},
        "messages": messages[:n_messages],
    }


def start_workers(n: int, app: str, queue: str, env: dict[str, str], logs: Path) -> list[Any]:
    procs = []
    for i in range(n):
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            "-Q",
            queue,
            "--pool",
            "solo",
            "-n",
            f"bench{i}-{queue}@%h",
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "WARNING",
        ]
        with (logs / f"{app}-{queue}-{i}.log").open("ab") as out:
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=ROOT / "bench" if app == "noop_app" else ROOT,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def wait_ready(settings: Settings, n: int) -> None:
    app = make_app(settings)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(app.control.ping(timeout=0.5) or []) >= n:
            app.close()
            return
    app.close()
    raise SystemExit("workers did not start")


def stop(procs: list[Any]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)


class QueueWatch:
    """The messages waiting on a queue, cheaply enough to poll every few ms: the Redis lists
    holding it (kombu adds one per priority level), or a passive declare on RabbitMQ."""

    def __init__(self, r: Any, queue: str, broker: str | None) -> None:
        self.r, self.queue = r, queue
        self.lists = [k for k in r.scan_iter(match=f"{queue}*", count=1000) if r.type(k) == b"list"]
        self.connection: Any = None
        if broker is not None:
            from worker.backend.queues import broker_connection

            self.connection = broker_connection(broker)
            self.channel = self.connection.channel()

    def length(self) -> int:
        if self.connection is not None:
            return int(self.channel.queue_declare(queue=self.queue, passive=True).message_count)
        return sum(int(self.r.llen(k)) for k in self.lists)

    def drained(self) -> bool:
        """Nothing waiting and nothing delivered unacknowledged (Redis' unacked index; RabbitMQ
        does not say: there at most one message per worker may still be running)."""
        if self.connection is not None:
            return self.length() == 0
        return self.length() == 0 and not _unacked(self.r)

    def close(self) -> None:
        if self.connection is not None:
            self.connection.release()


# The drain is watched with a few cheap commands every 5 ms: on 2 shared cores a heavier watcher
# (a keyspace scan, an MGET of every conversation) takes CPU from the workers it measures.
POLL_S = 0.005


@dataclass(frozen=True)
class Drain:
    """One timed drain: tasks per second, and the CPU each task took in the worker processes
    (all together) and in Redis over the same interval."""

    per_s: float
    worker_cpu_ms: float
    redis_cpu_ms: float


def _cpu_s(procs: list[Any]) -> float:
    """User + system CPU seconds the processes used so far (Linux /proc)."""
    total = 0
    for p in procs:
        fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _redis_cpu_s(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _drain_rate(r: Any, queue: str, count: int, start: Any, done: Any, broker: str | None) -> Drain:
    """The queue is full before the workers start; time from the first message taken to the
    last one done: the workers' own throughput, without submitting or start-up in it."""
    watch = QueueWatch(r, queue, broker)
    procs = start()
    while watch.length() >= count:
        time.sleep(0.001)
    t0, cpu0, redis0 = time.perf_counter(), _cpu_s(procs), _redis_cpu_s(r)
    while not done(watch):
        time.sleep(POLL_S)
    elapsed = time.perf_counter() - t0
    cpu1, redis1 = _cpu_s(procs), _redis_cpu_s(r)
    watch.close()
    stop(procs)
    return Drain(
        per_s=count / elapsed,
        worker_cpu_ms=(cpu1 - cpu0) / count * 1000,
        redis_cpu_ms=(redis1 - redis0) / count * 1000,
    )


def run_evaluations(
    settings: Settings,
    env: dict[str, str],
    logs: Path,
    workers: int,
    size: int,
    count: int,
    tag: str,
    *,
    grown_by: int = 0,
) -> Drain:
    """Evaluations per second: new conversations (``grown_by`` = 0), or conversations each
    evaluated before (by the same processes: their caches are warm) and now ``grown_by``
    messages longer (an agent's next turn). Either way the workers have evaluated something
    before the timing starts, so a process's one-time start (imports, loading the tokenizer)
    is not in it; they stay up, paused, while the queue is filled."""
    client = Client(settings)
    r = redis.Redis.from_url(env["COMPACTOR_REDIS_URL"])
    queue = "compactor.evaluate"
    procs = start_workers(workers, "worker", queue, env, logs)
    wait_ready(settings, workers)
    warm = [(f"warm-{tag}-{i}", 0) for i in range(4 * workers)]
    if grown_by:
        warm += [(f"{tag}-{i}", size - grown_by) for i in range(count)]
    for conv, messages in warm:
        client.submit(json.dumps(snapshot(conv, messages or size, revision=0)).encode())
    while not all(v is not None for v in r.mget([keys.handled(conv) for conv, _ in warm])):
        time.sleep(0.005)
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    for i in range(count):
        client.submit(json.dumps(snapshot(f"{tag}-{i}", size, revision=1)).encode())

    def start() -> list[Any]:
        for p in procs:
            p.send_signal(signal.SIGCONT)
        return procs

    evaluated = _evaluated(r)
    polls = itertools.count(1)

    def done(_watch: QueueWatch) -> bool:
        # The counter first (one HGET); every conversation's handled revision once it is reached,
        # and every 20th poll anyway (a rejected or expired snapshot is not counted as evaluated).
        counted = _evaluated(r) >= evaluated + count
        return (counted or next(polls) % 20 == 0) and _all_handled(r, tag, count, 1)

    drain = _drain_rate(r, queue, count, start, done, _broker(env))
    client.close()
    r.close()
    return drain


def _evaluated(r: Any) -> float:
    return float(r.hget("cw:metrics", "snapshots_evaluated_total") or 0)


def _all_handled(r: Any, tag: str, count: int, revision: int) -> bool:
    values = r.mget([keys.handled(f"{tag}-{i}") for i in range(count)])
    return all(v is not None and int(v) >= revision for v in values)


def run_noop(
    settings: Settings, env: dict[str, str], logs: Path, workers: int, count: int
) -> Drain:
    r = redis.Redis.from_url(env["COMPACTOR_REDIS_URL"])
    sender = make_app(settings)  # bench/noop_app.py's task, on this run's broker
    for i in range(count):
        sender.send_task("bench.noop", args=[f"n{i}", time.time()], queue="bench.noop")
    sender.close()

    def start() -> list[Any]:
        return start_workers(
            workers, "noop_app", "bench.noop", {**env, "PYTHONPATH": str(ROOT)}, logs
        )

    def done(watch: QueueWatch) -> bool:
        return watch.drained()

    drain = _drain_rate(r, "bench.noop", count, start, done, _broker(env))
    r.close()
    return drain


def _broker(env: dict[str, str]) -> str | None:
    return env.get("COMPACTOR_BROKER_URL")


def _unacked(r: Any) -> int:
    return int(r.zcard("unacked_index") or 0)


def latency(settings: Settings, env: dict[str, str], logs: Path, n: int) -> list[float]:
    client = Client(settings)
    procs = start_workers(1, "worker", "compactor.evaluate", env, logs)
    wait_ready(settings, 1)
    out = []
    for i in range(n):
        conv = f"lat-{i}"
        t0 = time.perf_counter()
        client.submit(snapshot(conv, 50))
        while True:
            if client.state.read_events(conv, block_ms=1000):
                break
        out.append((time.perf_counter() - t0) * 1000)
    stop(procs)
    client.close()
    return out


def regrowth(size: int, grow: int) -> dict[str, float]:
    """ms to parse and evaluate a conversation of ``size`` messages grown by ``grow``, as a
    worker does (from the payload bytes): cold (a process that never saw it, no memo); in the
    process that evaluated it before (its last parse and counted projection reused); and in
    another process that has only the conversation's memo from Redis."""
    from worker.pipeline import StoredBlob, evaluate_with_memo, snapshot_context
    from worker.reuse import Reuse

    base = json.dumps(snapshot("g", size)).encode()
    grown = json.dumps(snapshot("g", size + grow, revision=2)).encode()
    settings = Settings()

    reuse = Reuse()

    def fresh() -> None:
        nonlocal reuse
        reuse = Reuse()

    def timed(call: Any) -> float:
        t0 = time.perf_counter()
        call()
        return (time.perf_counter() - t0) * 1000

    def cold() -> float:
        fresh()
        return timed(lambda: evaluate_with_memo(*_parsed(grown, settings, None, reuse), None))

    def warm() -> float:
        fresh()
        earlier = parse_snapshot(base, settings)
        first, update = evaluate_with_memo(snapshot_context(earlier, reuse), reuse, None)

        def again() -> None:
            parsed = parse_snapshot(grown, settings, earlier=earlier)
            assert update.stored is not None
            known = StoredBlob(update.stored.digest)  # the store sends only the digest
            context = snapshot_context(parsed, reuse)
            evaluate_with_memo(context, reuse, known, update.stored, first.counted)

        return timed(again)

    def other_process() -> float:
        fresh()
        earlier = parse_snapshot(base, settings)
        _, update = evaluate_with_memo(snapshot_context(earlier, reuse), reuse, None)
        fresh()
        assert update.blob is not None and update.stored is not None
        memo = StoredBlob(update.stored.digest, update.blob)
        return timed(lambda: evaluate_with_memo(*_parsed(grown, settings, None, reuse), memo))

    TiktokenTokenizer("gpt-4.1")  # load the encoding outside the timings
    return {
        name: statistics.median(measure() for _ in range(7))
        for name, measure in (("cold", cold), ("warm", warm), ("memo", other_process))
    }


def tokenize_only_ms(size: int) -> float:
    """ms that exact counting alone takes for a new conversation of ``size`` messages: every
    text it holds through tiktoken once, no caches, nothing else."""
    from worker.tokens import get_encoding

    encoding = get_encoding("o200k_base")
    texts: list[str] = []
    for m in snapshot("t", size)["messages"]:
        texts.append(m["content"] or "")
        texts += [c["function"]["arguments"] for c in m.get("tool_calls", [])]

    def once() -> float:
        t0 = time.perf_counter()
        for text in texts:
            encoding.encode(text, disallowed_special=())
        return (time.perf_counter() - t0) * 1000

    return statistics.median(once() for _ in range(21))


def _parsed(payload: bytes, settings: Settings, earlier: Any, reuse: Any) -> tuple[Any, Any]:
    """The snapshot's context and the process's reuse: the first arguments of
    ``evaluate_with_memo``."""
    from worker.pipeline import snapshot_context

    parsed = parse_snapshot(payload, settings, earlier=earlier)
    return snapshot_context(parsed, reuse), reuse


def scaling_rows(
    brokers: dict[str, tuple[Settings, dict[str, str]]],
    logs: Path,
    size: int,
    count: int,
    repeat: int,
) -> None:
    """Floor, new and growing, measured one after the other ``repeat`` times on each broker
    (interleaved, so that a noisy neighbour hits all of them alike); medians printed."""
    for workers in (1, 2):
        runs: dict[str, list[tuple[Drain, Drain, Drain]]] = {name: [] for name in brokers}
        for r in range(repeat):
            for name, (settings, env) in brokers.items():
                floor = run_noop(settings, env, logs, workers, count * 5)
                tag = f"{name}{size}w{workers}r{r}"
                new = run_evaluations(settings, env, logs, workers, size, count, f"s{tag}")
                grown = run_evaluations(
                    settings, env, logs, workers, size, count, f"g{tag}", grown_by=2
                )
                runs[name].append((floor, new, grown))
        for name, rows in runs.items():
            if len(brokers) > 1:
                print(f"  broker {name}:", flush=True)
            _print_row(size, workers, rows)


def _print_row(size: int, workers: int, runs: list[tuple[Drain, Drain, Drain]]) -> None:
    """Medians over the runs (floor, new, growing), the spread of the growing ratio, and where
    the CPU went."""

    def med(pick: Any) -> float:
        return float(statistics.median(pick(*run) for run in runs))

    ratios = sorted(grown.per_s / floor.per_s for floor, _, grown in runs)
    print(
        f"{size:4}-message snapshots, {workers} worker process(es), median of {len(runs)}: "
        f"no-op floor {med(lambda f, n, g: f.per_s):7.1f} tasks/s; new conversations "
        f"{med(lambda f, n, g: n.per_s):6.1f}/s ({med(lambda f, n, g: n.per_s / f.per_s):.2f} "
        f"of floor); growing conversations {med(lambda f, n, g: g.per_s):6.1f}/s "
        f"({med(lambda f, n, g: g.per_s / f.per_s):.2f} of floor; runs "
        f"{ratios[0]:.2f}-{ratios[-1]:.2f})",
        flush=True,
    )
    cpu = [
        f"{name} {statistics.median(run[i].worker_cpu_ms for run in runs):.2f} + "
        f"{statistics.median(run[i].redis_cpu_ms for run in runs):.2f}"
        for i, name in enumerate(("no-op", "new", "growing"))
    ]
    print("      CPU ms per task, worker processes + Redis: " + "; ".join(cpu), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--snapshots", type=int, default=400)
    parser.add_argument("--redis-url")
    parser.add_argument(
        "--sizes", default="50,500", help="snapshot sizes in messages, comma-separated"
    )
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per row")
    parser.add_argument(
        "--brokers", default="redis", help="comma-separated: redis (the state's), rabbitmq"
    )
    args = parser.parse_args()
    kinds = args.brokers.split(",")
    if set(kinds) - {"redis", "rabbitmq"}:
        raise SystemExit(f"--brokers: redis and/or rabbitmq, not {args.brokers}")
    vhost = f"compactor-bench-{os.getpid()}"
    if "rabbitmq" in kinds:
        sys.path.insert(0, str(ROOT / "tests"))
        from support.service_support import ensure_rabbitmq, rabbitmqctl

        ensure_rabbitmq()
        rabbitmqctl("add_vhost", vhost)
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    try:
        return _run(args, kinds, vhost)
    finally:
        if "rabbitmq" in kinds:
            rabbitmqctl("delete_vhost", vhost)


def _run(args: Any, kinds: list[str], vhost: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        embedded = None
        url = args.redis_url
        if url is None:
            embedded = EmbeddedRedis(directory=Path(tmp))
            url = embedded.start()
        env = {
            **os.environ,
            "COMPACTOR_REDIS_URL": url,
            "PYTHONPATH": str(ROOT),
            "COMPACTOR_TRANSCRIPT_DIR": str(Path(tmp) / "t"),
            "COMPACTOR_CONFIG": "/dev/null",
        }
        settings = with_redis_url(load_settings("/dev/null", environ={}), url)
        brokers = {"redis": (settings, env)}
        if "rabbitmq" in kinds:
            amqp = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
            brokers["rabbitmq"] = (
                with_broker_url(settings, amqp),
                {**env, "COMPACTOR_BROKER_URL": amqp},
            )
        brokers = {name: brokers[name] for name in kinds}
        logs = Path(tmp)
        try:
            sizes = [int(x) for x in args.sizes.split(",")]
            counts = {50: args.snapshots, 500: max(args.snapshots // 5, 20)}
            for size in sizes:
                count = counts.get(size, args.snapshots)
                scaling_rows(brokers, logs, size, count, args.repeat)
            if not args.skip_latency:
                lat = latency(settings, env, logs, 100)
                q = statistics.quantiles(lat, n=100)
                print(
                    f"submit -> skipped event, 50 messages, idle system (ms): p50 {q[49]:.1f}, "
                    f"p99 {q[98]:.1f}",
                    flush=True,
                )
            for size in sizes:
                print(
                    f"tiktoken alone, every text of a new {size}-message conversation once: "
                    f"{tokenize_only_ms(size):.2f} ms",
                    flush=True,
                )
            for size, grow in ((50, 2), (500, 10)):
                ms = regrowth(size, grow)
                print(
                    f"parse + evaluate {size} messages grown by {grow}, from the payload (ms): "
                    f"cold {ms['cold']:.2f}; in the process that saw it {ms['warm']:.2f} "
                    f"({ms['warm'] / ms['cold']:.2f} of cold); in another process, with the "
                    f"memo {ms['memo']:.2f} ({ms['memo'] / ms['cold']:.2f} of cold)",
                    flush=True,
                )
        finally:
            if embedded is not None:
                embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
