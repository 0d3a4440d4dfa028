"""How many calls an evaluation and a compaction make to a real Redis, watched with MONITOR:
an evaluation publishes its elided and its skipped event in one script call, and a compaction
asks whether its revision is handled in the same call that takes the lock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from support.service_support import conversation

from worker.backend import keys
from worker.backend.connection import connect
from worker.backend.redis_state import RedisState
from worker.config import Settings
from worker.pipeline import Adapters, Pipeline
from worker.runtime.service import Service
from worker.transcripts.filesystem import FileStore

MARKER = "end-of-the-watched-calls"
WAIT_S = 120  # a MONITOR reply is due at once; this bounds a read on a loaded machine


def service(url: str, tmp_path: Path) -> Service:
    settings = Settings(compaction={"transcript_dir": str(tmp_path), "keep_recent_tool_results": 1})
    return Service(
        settings=settings,
        state=RedisState(connect(url), settings.redis),
        pipeline=Pipeline(settings, Adapters(store=FileStore(tmp_path))),
        enqueue_summarize=lambda *_: None,
        enqueue_evaluate=lambda *_: None,
    )


@contextmanager
def watched(url: str, conversation_id: str) -> Iterator[list[str]]:
    """The commands clients send while the block runs that name one of the conversation's
    keys (``cw:{<conv>}:...``), in order, lower-cased; not the commands scripts run inside."""
    calls: list[str] = []
    client = redis.Redis.from_url(url, socket_timeout=WAIT_S)
    tag = f"cw:{{{conversation_id}}}:"
    try:
        with client.monitor() as monitor:  # watching once this returns (MONITOR answered)
            yield calls
            client.echo(MARKER)
            while True:
                seen = monitor.next_command()
                if seen["client_type"] == "lua":
                    continue
                command = seen["command"]
                if MARKER in command:
                    break
                if tag in command:
                    calls.append(command.lower())
    finally:
        client.close()


def scripts(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith(("evalsha", "eval "))]


def named(calls: list[str], key: str) -> list[str]:
    """The calls that pass ``key``."""
    return [c for c in calls if f" {key} " in f"{c} "]


def submit(svc: Service, snap: dict[str, Any]) -> None:
    status = svc.state.store_snapshot(snap["conversation_id"], snap["revision"], dumps(snap))
    assert status.status == "queued"


def dumps(snap: dict[str, Any]) -> bytes:
    return json.dumps(snap).encode()


@pytest.fixture
def svc(redis_url: str, tmp_path: Path) -> Iterator[Service]:
    """A service whose scripts have each run once, on other conversations: Redis has them
    cached, so the watched calls hold no first EVALSHA that Redis refused (NOSCRIPT) and its
    retry."""
    svc = service(redis_url, tmp_path)
    submit(svc, conversation("c-warm", 6, window=1_000_000))
    assert svc.evaluate("c-warm") == "skipped"
    big = conversation("c-warm-big", 6, window=2000)
    submit(svc, big)
    assert svc.evaluate("c-warm-big") == "queued"
    assert svc.summarize("c-warm-big", big["revision"]) == "completed"
    yield svc
    svc.state.client.close()


def test_an_evaluation_publishes_its_elided_and_skipped_events_in_one_script_call(
    redis_url: str, svc: Service
) -> None:
    snap = conversation("c-one", 6, window=1_000_000)
    submit(svc, snap)
    before = svc.state.counters()

    with watched(redis_url, "c-one") as calls:
        assert svc.evaluate("c-one") == "skipped"

    # One script takes the work, one publishes both events (it was one per event).
    published = named(calls, keys.events("c-one"))
    assert len(scripts(calls)) == 2 and len(published) == 1, calls
    assert published == scripts(calls)[1:]
    assert len(named(calls, keys.memo("c-one"))) == 2  # read with the work, written with both
    events = [e for _, e in svc.state.read_events("c-one")]
    assert [e["type"] for e in events] == ["tool_results.elided", "compaction.skipped"]
    client = redis.Redis.from_url(redis_url)
    assert client.get(keys.handled("c-one")) == str(snap["revision"]).encode()
    assert client.hget(keys.memo("c-one"), "d")
    assert client.zscore(keys.PENDING, "c-one") is None
    # Both reach the all-conversations stream; the counters are counted once.
    recent = [e["event_id"] for e in svc.state.recent_events(5)]
    assert {e["event_id"] for e in events} <= set(recent)
    after = svc.state.counters()
    assert after["compactions_skipped_total"] == before["compactions_skipped_total"] + 1
    assert after["snapshots_evaluated_total"] == before["snapshots_evaluated_total"] + 1
    client.close()


def test_a_compaction_takes_the_lock_and_checks_its_revision_in_one_call(
    redis_url: str, svc: Service
) -> None:
    snap = conversation("c-lock", 6, window=2000)
    submit(svc, snap)
    assert svc.evaluate("c-lock") == "queued"
    revision = snap["revision"]

    with watched(redis_url, "c-lock") as calls:
        assert svc.summarize("c-lock", revision) == "completed"
    # The first call is the lock script, which reads the handled revision itself: there is no
    # separate read of it (there was one before the lock).
    first = calls[0]
    assert first.startswith("evalsha") and keys.lock("c-lock") in first, calls
    assert keys.handled("c-lock") in first
    assert not [c for c in calls if c.startswith("get ") and keys.handled("c-lock") in c]

    # Delivered again once published: refused in that one call, the lock never taken.
    fence = redis.Redis.from_url(redis_url).get(keys.fence("c-lock"))
    with watched(redis_url, "c-lock") as calls:
        assert svc.summarize("c-lock", revision) == "superseded"
    assert len(calls) == 1 and calls[0].startswith("evalsha"), calls
    client = redis.Redis.from_url(redis_url)
    assert client.get(keys.fence("c-lock")) == fence and not client.exists(keys.lock("c-lock"))
    client.close()
