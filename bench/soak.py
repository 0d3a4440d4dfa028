"""Soak: thousands of snapshots across hundreds of conversations, with workers killed at random
and LLM faults, ending with a consistency check of every conversation's events and transcripts.

    .venv/bin/python bench/soak.py [--minutes 3] [--conversations 200] [--kill-every-s 7]

Everything runs on this machine: an embedded Redis with AOF, the stand-in LLM (a fraction of its
answers are 429s, 500s, malformed bodies or hangs), an evaluate worker, two summarize workers
(threads pools) and the scheduler (prune, reconcile). A summarize or evaluate worker is killed
with SIGKILL every few seconds and started again. Prints what held.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from worker.backend.embedded import EmbeddedRedis  # noqa: E402
from worker.client import Client  # noqa: E402
from worker.config import load_settings, with_redis_url  # noqa: E402
from worker.runtime.supervisor import celery_command  # noqa: E402
from worker.testing.standin_llm import Fault, StandinLLM  # noqa: E402

FAULT_EVERY_CALLS = 7
OUTCOMES = {
    "compaction.completed",
    "compaction.skipped",
    "compaction.failed",
    "compaction.rejected",
}


def config_text(transcripts: Path, llm_url: str) -> str:
    return f"""
[compaction]
transcript_dir = "{transcripts}"
mode = "prefer_remote"
summary_max_output_tokens = 300
max_persisted_transcripts = 3
[llm]
base_url = "{llm_url}"
api_key_env = "SOAK_UNSET_KEY"
timeout_s = 2.0
deadline_s = 4.0
max_retries = 2
backoff_base_s = 0.05
circuit_failure_threshold = 20
circuit_reset_s = 2.0
[redis]
visibility_timeout_s = 12
lock_lease_s = 3.0
[worker]
summarize_time_limit_s = 10.0
evaluate_time_limit_s = 10.0
reconcile_interval_s = 5.0
reconcile_after_s = 15.0
prune_interval_s = 20.0
log_format = "text"
"""


def conversation(conv: str, turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"id": "s", "role": "system", "content": "You are a coding agent."},
        {"id": "u", "role": "user", "content": f"Fix issue {conv} in src/{conv}/core.py."},
    ]
    for k in range(turns):
        messages.append(
            {
                "id": f"a{k}",
                "role": "assistant",
                "content": f"step {k}",
                "tool_calls": [
                    {
                        "id": f"c{k}",
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": json.dumps({"command": f"cat src/{conv}/m{k}.py"}),
                        },
                    }
                ],
            }
        )
        messages.append(
            {
                "id": f"r{k}",
                "role": "tool",
                "tool_call_id": f"c{k}",
                "content": "\n".join(f"line {i} of m{k} in {conv}" for i in range(60)),
            }
        )
    return {
        "conversation_id": conv,
        "revision": turns,
        "model": {"name": "gpt-4.1", "context_window": 12_000},
        "messages": messages,
    }


class Fleet:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        queues, pool, concurrency = {
            "evaluate": ("compactor.evaluate,compactor.maintenance", "prefork", 2),
            "summarize1": ("compactor.summarize", "threads", 16),
            "summarize2": ("compactor.summarize", "threads", 16),
        }[name]
        self._spawn(
            name,
            celery_command(
                "worker",
                None,
                queues=queues,
                pool=pool,
                concurrency=concurrency,
                name=f"{name}@%h",
                loglevel="WARNING",
            ),
        )

    def start_beat(self) -> None:
        self._spawn("beat", celery_command("beat", None, workdir=self.logs, loglevel="WARNING"))

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with (self.logs / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                cmd,
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def check(client: Client, convs: list[str], latest: dict[str, int]) -> dict[str, Any]:
    """Every conversation: an outcome for its newest revision, at most one completed event per
    revision, and each completed event's transcript whole (sha256) unless retention removed it."""
    report: Counter[str] = Counter()
    problems: list[str] = []
    for conv in convs:
        events = [e for _, e in client.events(conv)]
        outcomes = [e for e in events if e.type in OUTCOMES]
        if not any(e.revision == latest[conv] for e in outcomes):
            problems.append(f"{conv}: no outcome for revision {latest[conv]}")
        completed = [e for e in events if e.type == "compaction.completed"]
        per_revision = Counter(e.revision for e in completed)
        if any(n > 1 for n in per_revision.values()):
            problems.append(f"{conv}: two completed events for one revision {per_revision}")
        for e in completed:
            ref = e.compaction.transcript
            path = Path(ref.uri)
            if path.exists():
                if hashlib.sha256(path.read_bytes()).hexdigest() != ref.sha256:
                    problems.append(f"{conv}: transcript {path.name} does not match")
                report["transcripts_verified"] += 1
            else:
                report["transcripts_pruned"] += 1
        kept = list(path.parent.glob("*.json")) if completed else []
        if len(kept) > 3:
            problems.append(f"{conv}: {len(kept)} transcripts kept, retention is 3")
        for e in events:
            report[e.type] += 1
            if e.compaction and e.compaction.summary.fallback_reason:
                report["digest_fallbacks"] += 1
    return {"counts": dict(report), "problems": problems}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--kill-every-s", type=float, default=7.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    redis_server = EmbeddedRedis(directory=tmp / "redis", appendonly=True)
    (tmp / "redis").mkdir()
    url = redis_server.start()
    with StandinLLM(latency_s=0.3) as llm:
        config = tmp / "soak.toml"
        config.write_text(config_text(tmp / "transcripts", llm.openai_base_url))
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")},
            "COMPACTOR_CONFIG": str(config),
            "COMPACTOR_REDIS_URL": url,
            "PYTHONPATH": str(ROOT),
        }
        fleet = Fleet(env, tmp)
        for name in ("evaluate", "summarize1", "summarize2"):
            fleet.start(name)
        fleet.start_beat()
        client = Client(with_redis_url(load_settings(config, environ={}), url))
        convs = [f"soak-{i}" for i in range(args.conversations)]
        turns = {c: rng.randint(2, 10) for c in convs}
        latest: dict[str, int] = {}
        faults = [
            Fault(status=429, retry_after="0"),
            Fault(status=500),
            Fault(body=b"{oops"),
            Fault(hang=True),
        ]
        submitted = kills = faulted_at = 0
        t_end = time.monotonic() + args.minutes * 60
        next_kill = time.monotonic() + args.kill_every_s
        started = time.monotonic()
        while time.monotonic() < t_end:
            conv = rng.choice(convs)
            turns[conv] += rng.randint(1, 3)
            client.submit(conversation(conv, turns[conv]))
            latest[conv] = turns[conv]
            submitted += 1
            calls = llm.stats()["requests"]
            if calls - faulted_at >= FAULT_EVERY_CALLS:  # about one LLM call in seven fails
                llm.enqueue(rng.choice(faults))
                faulted_at = calls
            if time.monotonic() >= next_kill:
                victim = rng.choice(["summarize1", "summarize2", "evaluate"])
                fleet.kill(victim)
                fleet.start(victim)
                kills += 1
                next_kill = time.monotonic() + args.kill_every_s
            time.sleep(0.01)
        load_s = time.monotonic() - started
        # Let it settle: redeliveries after the visibility timeout, the reconciler's passes.
        deadline = time.monotonic() + 120
        result = check(client, list(latest), latest)
        while result["problems"] and time.monotonic() < deadline:
            time.sleep(3)
            result = check(client, list(latest), latest)
        settle_s = time.monotonic() - started - load_s
        llm_calls = len(llm.requests)
        client.close()
        fleet.stop_all()
    redis_server.stop()
    print(
        f"load {load_s:.0f} s: {submitted} snapshots across {len(latest)} conversations, "
        f"{kills} workers killed (SIGKILL), {llm_calls} LLM calls "
        f"(one in {FAULT_EVERY_CALLS} answered with a fault: 429, 500, malformed, hang)"
    )
    print(f"settled {settle_s:.0f} s after the load stopped")
    print(f"events: {json.dumps(result['counts'], sort_keys=True)}")
    print(f"problems: {len(result['problems'])}")
    for problem in result["problems"][:20]:
        print(f"  {problem}")
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
