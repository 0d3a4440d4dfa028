"""docs/redis-protocol.md followed to the letter, with plain Redis commands and no worker.client:
what a program in another language does. A real Celery worker process answers."""

from __future__ import annotations

import base64
import hashlib
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
    broker,
    conversation,
    rabbitmq_server,
    redis_server,
    redis_url,
    service_env,
)

from worker.client import apply_compaction
from worker.queues import TaskSender

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = (REPO_ROOT / "docs" / "redis-protocol.md").read_text()
SNAPSHOT_TTL_S = 86400


def documented_submit_script() -> str:
    block = re.search(r"```lua\n(.*?)```", PROTOCOL, re.S)
    assert block is not None
    return "\n".join(line.strip() for line in block.group(1).splitlines())


def submit(r: redis.Redis, snapshot: dict[str, Any]) -> list[Any]:
    """Steps 2 to 5: compress, mark pending, the script with the documented KEYS and ARGV,
    mark pending again."""
    conv, rev = snapshot["conversation_id"], snapshot["revision"]
    payload = zlib.compress(json.dumps(snapshot).encode("utf-8"))
    now = time.time()
    r.execute_command("ZADD", "cw:pending", "NX", now, conv)
    keys = [f"cw:{{{conv}}}:snapshot", f"cw:{{{conv}}}:latest", f"cw:{{{conv}}}:queued"]
    keys.append(f"cw:{{{conv}}}:handled")
    args = [payload, str(rev), SNAPSHOT_TTL_S]
    reply: list[Any] = r.eval(documented_submit_script(), len(keys), *keys, *args)
    status = reply[0].decode()
    if status != "superseded":
        r.execute_command("ZADD", "cw:pending", "NX", now, conv)
    return [status, int(reply[1])]


def documented_message() -> dict[str, Any]:
    """The task message of step 4, as the page shows it."""
    section = PROTOCOL[PROTOCOL.index("<!-- protocol-submit -->") :]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None
    message: dict[str, Any] = json.loads(block.group(1))
    return message


EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def evaluate_message(conversation_id: str) -> bytes:
    """Step 4: the page's message, with the fields its table says to fill in."""
    task_id = str(uuid.uuid4())
    args = [conversation_id, time.time()]
    message = documented_message()
    message["body"] = base64.b64encode(json.dumps([args, {}, EMBED]).encode("utf-8")).decode()
    headers, properties = message["headers"], message["properties"]
    headers["id"] = headers["root_id"] = properties["correlation_id"] = task_id
    headers["argsrepr"] = repr(args)
    headers["origin"] = "4242@another-language"
    properties["delivery_tag"] = str(uuid.uuid4())
    return json.dumps(message).encode()


def test_the_documented_message_is_what_the_python_client_pushes(redis_url: str) -> None:
    documented = documented_message()
    args = json.loads(base64.b64decode(documented["body"]))[0]
    sender = TaskSender(redis_url)
    try:
        task_id = sender.send("compactor.evaluate", args, queue="compactor.evaluate")
    finally:
        sender.close()
    r = redis.Redis.from_url(redis_url)
    [raw] = r.lrange("compactor.evaluate", 0, -1)
    r.close()
    pushed = json.loads(raw)
    assert pushed["body"] == documented["body"]
    assert base64.b64decode(pushed["body"]) == json.dumps([args, {}, EMBED]).encode()
    assert pushed["headers"]["id"] == pushed["headers"]["root_id"] == task_id
    assert pushed["properties"]["correlation_id"] == task_id
    assert re.fullmatch(r"[0-9]+@.+", pushed["headers"]["origin"])
    uuid.UUID(pushed["properties"]["delivery_tag"])
    for part in ("headers", "properties"):
        for varying in ("id", "root_id", "origin", "correlation_id", "delivery_tag"):
            for message in (pushed, documented):
                message[part].pop(varying, None)
    assert pushed == documented


def read_until_outcome(r: redis.Redis, conv: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    """ "Reading events", steps 1-4: XREAD from the last id until an outcome arrives."""
    events: list[dict[str, Any]] = []
    last = "0"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = r.xread({f"cw:{{{conv}}}:events": last}, count=100, block=1000)
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                assert list(fields) == [b"event"]
                events.append(json.loads(fields[b"event"]))
                last = entry_id.decode()
        if events and events[-1]["type"].startswith("compaction."):
            return events
    raise AssertionError(f"no outcome for {conv}: {[e['type'] for e in events]}")


def canonical_json(value: Any) -> str:
    """events.md, "The range digest": the canonical JSON, as the page gives it."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def apply_as_documented(
    messages: list[dict[str, Any]], event: dict[str, Any], conversation_id: str
) -> list[Any]:
    """events.md, "Applying a completed event", for messages that all carry their own ids."""
    assert event["type"] == "compaction.completed"
    assert event["conversation_id"] == conversation_id
    c = event["compaction"]
    assert c["replacement"][-1] not in messages
    ids = [m["id"] for m in messages]
    i = ids.index(c["first_id"])
    j = ids.index(c["last_id"], i)
    assert j - i == c["end"] - 1 - c["start"]
    assert c["range_sha256"] is not None
    digest = hashlib.sha256(canonical_json(messages[i : j + 1]).encode("utf-8")).hexdigest()
    assert digest == c["range_sha256"]
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
    announce.subscribe("cw:{c-protocol}:announce")

    assert submit(r, snapshot) == ["queued", 5]
    assert submit(r, snapshot) == ["coalesced", 5]  # nothing else to do
    assert submit(r, snapshot | {"revision": 4}) == ["superseded", 5]
    r.lpush("compactor.evaluate", evaluate_message("c-protocol"))

    events = read_until_outcome(r, "c-protocol")
    outcome = events[-1]
    assert outcome["type"] == "compaction.completed", outcome
    schema = json.loads((REPO_ROOT / "docs/schemas/compaction.completed.schema.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(outcome)) == []
    applied = apply_as_documented(snapshot["messages"], outcome, "c-protocol")
    assert applied == apply_compaction(snapshot["messages"], outcome, conversation_id="c-protocol")

    announced = []
    deadline = time.monotonic() + 10
    while len(announced) < len(events) and time.monotonic() < deadline:
        message = announce.get_message(timeout=1)
        if message is not None and message["type"] == "message":
            announced.append(json.loads(message["data"]))
    assert announced == events
    assert r.get("cw:{c-protocol}:handled") == b"5"
    # The worker takes the conversation off cw:pending right after it publishes the outcome
    # (a separate command: cw:pending is in no conversation's hash slot).
    deadline = time.monotonic() + 30
    while r.zscore("cw:pending", "c-protocol") is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.zscore("cw:pending", "c-protocol") is None
    assert submit(r, snapshot) == ["superseded", 5]  # handled revisions are never redone
    announce.close()
    r.close()
