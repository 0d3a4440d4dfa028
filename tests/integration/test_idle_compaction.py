"""Idle-timed compaction through real processes: Celery workers and the scheduler (``celery
beat``) on a real Redis. A conversation under the threshold but over the idle threshold is
compacted once it has had no snapshot for ``idle_compact_after_s``, never while snapshots keep
coming; its event names the ``idle`` trigger. Times are asserted as order (the compaction after
the newest snapshot plus the idle time), never as speed."""

from __future__ import annotations

import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from support.service_support import client_for, conversation, wait_for_outcome

from worker.backend import keys
from worker.backend.redis_state import NO_TENANT
from worker.client import Client
from worker.runtime.supervisor import celery_command
from worker.wire.events import CompletedEvent

IDLE_S = 3.0
WAIT_S = 90.0  # bounds a wait on a loaded machine; nothing is asserted about it


def start_beat(workers: Any, root: Path, *, interval_s: float = 0.5) -> None:
    """The real scheduler, scanning for idle conversations every ``interval_s``."""
    env = workers.env() | {"COMPACTOR_WORKER_IDLE_SCAN_INTERVAL_S": str(interval_s)}
    with (workers.logs / "beat.log").open("ab") as out:
        workers.procs["beat"] = subprocess.Popen(
            celery_command("beat", None, workdir=root),
            env=env,
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def submitted_at(client: Client, conversation_id: str) -> float:
    """The time of the conversation's newest snapshot, as the service keeps it."""
    return float(client.state.client.hget(keys.activity(conversation_id), "t"))


def completed_events(client: Client, conversation_id: str) -> list[CompletedEvent]:
    return [
        e for _, e in client.events(conversation_id, after="0") if isinstance(e, CompletedEvent)
    ]


def wait_completed(client: Client, conversation_id: str) -> CompletedEvent:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = completed_events(client, conversation_id)
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"{conversation_id}: no idle compaction within {WAIT_S}s")


def test_an_idle_conversation_is_compacted_after_the_idle_time_and_not_before(
    service_env: Any, tmp_path: Path
) -> None:
    _, make = service_env
    workers = make(
        f"idle_compact_after_s = {IDLE_S}\nidle_threshold_tokens = 2000\n"
        "keep_recent_tool_results = 1\n"
    )
    workers.start("w")
    start_beat(workers, tmp_path)
    client = client_for(workers)

    # Active: a snapshot every half idle time, each evaluated (skipped: far under the
    # threshold of a 1M window) and none compacted while they keep coming.
    active = "c-active"
    for turns in range(6, 12):
        snap = conversation(active, turns, window=1_000_000)
        client.submit(snap)
        outcome = wait_for_outcome(client, active, revision=snap["revision"])[-1]
        assert outcome.type == "compaction.skipped"
        time.sleep(IDLE_S / 2)
        assert completed_events(client, active) == [], "compacted while snapshots kept coming"
    last = submitted_at(client, active)

    # Small: under the idle threshold, never compacted (looked at alongside the active one).
    small = "c-small"
    client.submit(conversation(small, 1, body=20, window=1_000_000))
    wait_for_outcome(client, small)

    event = wait_completed(client, active)
    assert event.trigger.kind == "idle"
    assert event.trigger.threshold_tokens == 2000
    assert event.trigger.projected_tokens > 2000
    assert event.revision == conversation(active, 11)["revision"]
    assert event.cost is not None and event.cost.tokens_before > event.cost.tokens_after
    made = event.created_at.timestamp()
    assert made >= last + IDLE_S, f"compacted {made - last:.2f}s after the newest snapshot"
    assert isinstance(event.created_at, datetime)
    assert "compactor.idle_scan" in workers.log("beat")

    # The same idle period is handled once; the small conversation was left alone.
    time.sleep(IDLE_S)
    assert len(completed_events(client, active)) == 1
    assert completed_events(client, small) == []
    assert client.state.client.zscore(keys.idle_conversations(NO_TENANT), active) is None
