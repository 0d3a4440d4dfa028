"""docs/redis-protocol.md followed to the letter, with plain Redis commands and no worker.client:
what a program in another language does. A real Celery worker process answers. With RabbitMQ as
the broker, step 6 is published with py-amqp's plain AMQP 0-9-1 client (not kombu or Celery)."""

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
from urllib.parse import unquote, urlsplit

import amqp
import pytest
import redis
from amqp import spec
from jsonschema import Draft202012Validator
from support.service_support import ServiceEnv, conversation, purge_queues

from worker.backend.queues import TaskSender
from worker.client import apply_compaction

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
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
    args = [payload, str(rev), SNAPSHOT_TTL_S, uuid.uuid4().hex]
    reply: list[Any] = r.eval(documented_submit_script(), len(keys), *keys, *args)
    status = reply[0].decode()
    if status != "superseded":
        r.execute_command("ZADD", "cw:pending", "NX", now, conv)
    return [status, int(reply[1])]


def documented_message() -> dict[str, Any]:
    """The task message of step 6, as the page shows it."""
    section = PROTOCOL[PROTOCOL.index("<!-- protocol-submit -->") :]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None
    message: dict[str, Any] = json.loads(block.group(1))
    return message


EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def documented_task(conversation_id: str) -> tuple[bytes, dict[str, Any], str]:
    """Step 6's task, as its table says to fill it in: (the body's UTF-8 JSON, the page's
    headers, the task id)."""
    task_id = str(uuid.uuid4())
    args = [conversation_id, time.time()]
    headers = documented_message()["headers"]
    headers["id"] = headers["root_id"] = task_id
    headers["argsrepr"] = repr(args)
    headers["origin"] = "4242@another-language"
    return json.dumps([args, {}, EMBED]).encode("utf-8"), headers, task_id


def evaluate_message(conversation_id: str) -> bytes:
    """Step 6: the page's message, with the fields its table says to fill in."""
    body, headers, task_id = documented_task(conversation_id)
    message = documented_message()
    message["body"] = base64.b64encode(body).decode()
    message["headers"] = headers
    properties = message["properties"]
    properties["correlation_id"] = task_id
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


def assert_completed_and_applies(outcome: dict[str, Any], snapshot: dict[str, Any]) -> None:
    """The outcome is a compaction.completed that validates against docs/schemas and applies to
    the snapshot, as events.md says and as worker.client applies it."""
    conv = snapshot["conversation_id"]
    assert outcome["type"] == "compaction.completed", outcome
    schema = json.loads((REPO_ROOT / "docs/schemas/compaction.completed.schema.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(outcome)) == []
    applied = apply_as_documented(snapshot["messages"], outcome, conv)
    assert applied == apply_compaction(snapshot["messages"], outcome, conversation_id=conv)


def test_a_snapshot_submitted_as_documented_is_compacted_and_its_events_read_as_documented(
    service_env: ServiceEnv,
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
    assert_completed_and_applies(events[-1], snapshot)

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


# "With RabbitMQ as the broker": step 6 as an AMQP 0-9-1 publish.
RABBITMQ_SECTION = " ".join(PROTOCOL[PROTOCOL.index("### With RabbitMQ as the broker") :].split())
EVALUATE = "compactor.evaluate"  # the exchange, the queue and the routing key


def documented_amqp_properties() -> dict[str, Any]:
    """The constant properties of the "Publish" item, read from the page (`name` `text` or
    `name` number); the task id and the headers are the other two it names."""
    found = re.findall(r"`([a-z_]+)` (?:`([^`]+)`|(\d+))", RABBITMQ_SECTION)
    properties = {name: text or int(number) for name, text, number in found}
    assert "`correlation_id` the task id" in RABBITMQ_SECTION
    assert "`headers` the `headers` object above" in RABBITMQ_SECTION
    return properties


def amqp_connection(url: str) -> Any:
    """py-amqp's connection to the vhost of ``amqp://user:password@host:port/vhost``."""
    parts = urlsplit(url)
    connection = amqp.Connection(
        host=f"{parts.hostname}:{parts.port or 5672}",
        userid=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        virtual_host=unquote(parts.path[1:]) or "/",
    )
    connection.connect()
    return connection


def queue_evaluation_on_rabbitmq(url: str, conversation_id: str) -> None:
    """Step 6 on RabbitMQ, as the section says: declare, publish in confirm mode, wait for the
    server's ack."""
    body, headers, task_id = documented_task(conversation_id)
    connection = amqp_connection(url)
    try:
        channel = connection.channel()
        channel.exchange_declare(EVALUATE, "direct", durable=True, auto_delete=False)
        channel.queue_declare(EVALUATE, durable=True, exclusive=False, auto_delete=False)
        channel.queue_bind(EVALUATE, exchange=EVALUATE, routing_key=EVALUATE)
        channel.confirm_select()
        message = amqp.Message(
            body,
            correlation_id=task_id,
            application_headers=headers,  # py-amqp's name for the `headers` property
            **documented_amqp_properties(),
        )
        channel.basic_publish(message, exchange=EVALUATE, routing_key=EVALUATE)
        confirms: list[tuple[Any, ...]] = []
        channel.wait(
            [spec.Basic.Ack, spec.Basic.Nack],
            callback=lambda method, *args: confirms.append((method, *args)),
            timeout=60,
        )
        assert confirms == [(spec.Basic.Ack, 1, False)]  # the first publish on the channel
    finally:
        connection.close()


def test_the_documented_amqp_publish_is_what_the_python_client_publishes(
    rabbitmq_server: str,
) -> None:
    purge_queues(rabbitmq_server)
    documented = documented_message()
    args = json.loads(base64.b64decode(documented["body"]))[0]
    sender = TaskSender(rabbitmq_server)
    try:
        task_id = sender.send(EVALUATE, args, queue=EVALUATE)
    finally:
        sender.close()
    connection = amqp_connection(rabbitmq_server)
    try:
        published = connection.channel().basic_get(EVALUATE, no_ack=True)
    finally:
        connection.close()
    assert published is not None
    assert published.delivery_info["exchange"] == published.delivery_info["routing_key"] == EVALUATE
    body = published.body if isinstance(published.body, bytes) else published.body.encode()
    assert body == json.dumps([args, {}, EMBED]).encode("utf-8")  # no envelope, no Base64
    properties = dict(published.properties)
    headers = properties.pop("application_headers")
    assert properties.pop("correlation_id") == headers["id"] == headers["root_id"] == task_id
    assert properties == documented_amqp_properties()
    for varying in ("id", "root_id", "origin"):
        headers.pop(varying)
        documented["headers"].pop(varying)
    assert headers == documented["headers"]


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_a_snapshot_submitted_as_documented_with_rabbitmq_as_the_broker_is_compacted(
    broker: str | None,
    service_env: ServiceEnv,
    redis_url: str,
) -> None:
    _, make = service_env
    workers = make()
    assert workers.broker is not None and workers.broker.startswith("amqp://")
    workers.start("w1")  # it declares the queue first: the section's declarations must agree
    r = redis.Redis.from_url(redis_url)
    snapshot = conversation("c-protocol-amqp", 12, revision=5)

    assert submit(r, snapshot) == ["queued", 5]  # steps 1-5 unchanged
    assert r.llen(EVALUATE) == 0  # nothing on the state's Redis
    queue_evaluation_on_rabbitmq(workers.broker, "c-protocol-amqp")

    events = read_until_outcome(r, "c-protocol-amqp")
    assert_completed_and_applies(events[-1], snapshot)
    assert r.get("cw:{c-protocol-amqp}:handled") == b"5"
    r.close()
