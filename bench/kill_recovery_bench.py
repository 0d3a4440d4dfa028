"""The time from a worker's SIGKILL mid-summary to its conversation's ``compaction.completed``
event, with the task messages on Redis and on RabbitMQ, the state in Redis either way.

    .venv/bin/python bench/kill_recovery_bench.py [--brokers redis,rabbitmq] [--runs 1]

Every setting at its default (lock lease 30 s, visibility timeout 900 s, reconciler every 15 s
for conversations pending 45 s) and the real scheduler (``celery beat``) running, as
``compactor up`` runs it. The summary waits on the stand-in LLM until the worker is killed; a
new summarize worker is started at once. On Redis the killed worker's message waits for the
visibility timeout, so the reconciler recovers the conversation; on RabbitMQ the message is
back on its queue when the connection drops, and runs once the dead worker's lease lapsed.
Uses the test suite's helpers (a private Redis, a vhost of its own on the machine's RabbitMQ).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.fault_support import (  # noqa: E402
    EVALUATE_QUEUES,
    SUMMARIZE_QUEUE,
    Cluster,
    llm_section,
    tagged,
    wait_until,
)
from support.service_support import ensure_rabbitmq, rabbitmqctl  # noqa: E402

from worker.config import RedisConfig, WorkerConfig  # noqa: E402
from worker.runtime.supervisor import celery_command  # noqa: E402
from worker.testing.standin_llm import StandinLLM  # noqa: E402


def one_run(root: Path, broker: str | None) -> float:
    """Seconds from the SIGKILL to the completed event."""
    worker, state = WorkerConfig(), RedisConfig()
    with StandinLLM(latency_s=0.5) as llm:
        cluster = Cluster(
            root,
            {
                "compaction": {"mode": "remote_only"},
                "llm": llm_section(llm.openai_base_url, timeout_s=3.0, deadline_s=3.5),
                "redis": {
                    "visibility_timeout_s": state.visibility_timeout_s,
                    "lock_lease_s": state.lock_lease_s,
                },
                "worker": {
                    "summarize_time_limit_s": worker.summarize_time_limit_s,
                    "reconcile_after_s": worker.reconcile_after_s,
                    "reconcile_interval_s": worker.reconcile_interval_s,
                },
            },
            broker=broker,
        )
        try:
            workers = cluster.workers
            workers.start("eval", queues=EVALUATE_QUEUES)
            workers.start("sum", queues=SUMMARIZE_QUEUE, concurrency=2)
            with (workers.logs / "beat.log").open("ab") as out:
                workers.procs["beat"] = subprocess.Popen(
                    celery_command("beat", None, workdir=cluster.root),
                    env=workers.env(),
                    cwd=cluster.root,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            llm.hold()
            cluster.client.submit(tagged("c-kill", 1))
            wait_until(lambda: llm.stats()["in_flight"] > 0, timeout_s=60, what="a summary")
            workers.stop("sum", sig=signal.SIGKILL)
            killed_at = time.monotonic()
            llm.release()
            workers.start("sum", queues=SUMMARIZE_QUEUE, concurrency=2)
            outcome = cluster.wait_outcome("c-kill", 1, timeout_s=1200)
            assert outcome.type == "compaction.completed", outcome
            return time.monotonic() - killed_at
        finally:
            cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", default="redis,rabbitmq")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    kinds = args.brokers.split(",")
    vhost = f"compactor-bench-{int(time.time())}"
    amqp = None
    if "rabbitmq" in kinds:
        ensure_rabbitmq()
        rabbitmqctl("add_vhost", vhost)
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        amqp = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            times: dict[str, list[float]] = {kind: [] for kind in kinds}
            for run in range(args.runs):
                for kind in kinds:  # interleaved: a noisy neighbour hits both alike
                    root = Path(tmp) / f"{kind}-{run}"
                    seconds = one_run(root, amqp if kind == "rabbitmq" else None)
                    times[kind].append(seconds)
                    print(f"{kind}: SIGKILL -> compaction.completed {seconds:.1f} s", flush=True)
            for kind, values in times.items():
                print(
                    f"{kind}: median {statistics.median(values):.1f} s over {len(values)} run(s) "
                    f"(defaults: lease {RedisConfig().lock_lease_s:.0f} s, visibility "
                    f"{RedisConfig().visibility_timeout_s} s, reconcile every "
                    f"{WorkerConfig().reconcile_interval_s:.0f} s after "
                    f"{WorkerConfig().reconcile_after_s:.0f} s; beat running)",
                    flush=True,
                )
    finally:
        if amqp is not None:
            rabbitmqctl("delete_vhost", vhost)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
