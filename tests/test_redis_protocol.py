"""docs/redis-protocol.md followed to the letter, with plain Redis commands and no worker.client:
what a program in another language does. A real Celery worker process answers."""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis
from jsonschema import Draft202012Validator
from service_support import (  # noqa: F401 - fixtures: a real Redis and real workers
    conversation,
    redis_server,
    redis_url,
    service_env,
)

from worker.client import apply_compaction

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = (REPO_ROOT / "docs" / "redis-protocol.md").read_text()
SNAPSHOT_TTL_S = 86400


def documented_submit_script() -> str:
    block = re.search(r"```lua\n(.*?)```", PROTOCOL, re.S)
    assert block is not None
    return "\n".join(line.strip() for line in block.group(1).splitlines())


def submit(r: redis.Redis, snapshot: dict[str, Any]) -> list[Any]:
    """Steps 2 and 3: compress, then the script with the documented KEYS and ARGV."""
    conv, rev = snapshot["conversation_id"], snapshot["revision"]
    payload = zlib.compress(json.dumps(snapshot).encode("utf-8"))
    keys = [
        f"cw:snap:{conv}:{rev}",
        f"cw:latest:{conv}",
        f"cw:queued:{conv}",
        "cw:pending",
        f"cw:handled:{conv}",
    ]
    args = [payload, str(rev), SNAPSHOT_TTL_S, time.time(), conv, f"cw:snap:{conv}:"]
    reply: list[Any] = r.eval(documented_submit_script(), len(keys), *keys, *args)
    return [reply[0].decode(), int(reply[1])]


def evaluate_message(conversation_id: str) -> bytes:
    """Step 4: the Celery message, built by hand as the page shows it."""
    task_id = str(uuid.uuid4())
    args = [conversation_id, time.time()]
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    body = json.dumps([args, {}, embed]).encode()
    message = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": "compactor.evaluate",
            "id": task_id,
            "root_id": task_id,
            "parent_id": None,
            "group": None,
            "group_index": None,
            "shadow": None,
            "eta": None,
            "expires": None,
            "retries": 0,
            "timelimit": [None, None],
            "argsrepr": repr(args),
            "kwargsrepr": "{}",
            "origin": "another-language",
            "ignore_result": None,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": "compactor.evaluate"},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(message).encode()


def read_until_outcome(r: redis.Redis, conv: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    """ "Reading events", steps 1-4: XREAD from the last id until an outcome arrives."""
    events: list[dict[str, Any]] = []
    last = "0"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = r.xread({f"cw:events:{conv}": last}, count=100, block=1000)
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                assert list(fields) == [b"event"]
                events.append(json.loads(fields[b"event"]))
                last = entry_id.decode()
        if events and events[-1]["type"].startswith("compaction."):
            return events
    raise AssertionError(f"no outcome for {conv}: {[e['type'] for e in events]}")


def apply_as_documented(messages: list[dict[str, Any]], event: dict[str, Any]) -> list[Any]:
    """events.md, "Applying a completed event", for messages that all carry their own ids."""
    c = event["compaction"]
    assert c["replacement"][-1] not in messages
    ids = [m["id"] for m in messages]
    i = ids.index(c["first_id"])
    j = ids.index(c["last_id"], i)
    assert j - i == c["end"] - 1 - c["start"]
    return [*messages[:i], *c["replacement"], *messages[j + 1 :]]


def test_a_snapshot_submitted_as_documented_is_compacted_and_its_events_read_as_documented(
    service_env,  # type: ignore[no-untyped-def]
    redis_url: str,
) -> None:
    _, make = service_env
    workers = make()
    workers.start("w1")
    r = redis.Redis.from_url(redis_url)
    snapshot = conversation("c-protocol", 12, revision=5)
    announce = r.pubsub()
    announce.subscribe("cw:announce:c-protocol")

    assert submit(r, snapshot) == ["queued", 5]
    assert submit(r, snapshot) == ["coalesced", 5]  # nothing else to do
    assert submit(r, snapshot | {"revision": 4}) == ["superseded", 5]
    r.lpush("compactor.evaluate", evaluate_message("c-protocol"))

    events = read_until_outcome(r, "c-protocol")
    outcome = events[-1]
    assert outcome["type"] == "compaction.completed", outcome
    schema = json.loads((REPO_ROOT / "docs/schemas/compaction.completed.schema.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(outcome)) == []
    applied = apply_as_documented(snapshot["messages"], outcome)
    assert applied == apply_compaction(snapshot["messages"], outcome)

    announced = []
    deadline = time.monotonic() + 10
    while len(announced) < len(events) and time.monotonic() < deadline:
        message = announce.get_message(timeout=1)
        if message is not None and message["type"] == "message":
            announced.append(json.loads(message["data"]))
    assert announced == events
    assert r.get("cw:handled:c-protocol") == b"5"
    assert r.zscore("cw:pending", "c-protocol") is None
    assert submit(r, snapshot) == ["superseded", 5]  # handled revisions are never redone
    announce.close()
    r.close()
