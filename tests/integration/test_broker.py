"""The broker as a worker meets it, in-process against a real Redis.

The kombu workaround in :mod:`worker.backend.broker`: a channel left open after its connection
was collected (what Celery's consumer does when Redis goes away) must fail with a connection
error, which kombu and Celery handle, never with the ``AttributeError`` that made a busy worker
exit. And a task message a worker sends while the broker restarts is sent once it is back."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis
from kombu import Connection, Queue

from worker.backend.broker import TRANSPORT
from worker.backend.embedded import EmbeddedRedis
from worker.backend.queues import EVALUATE_QUEUE, EVALUATE_TASK
from worker.config import load_settings, with_broker_url, with_redis_url
from worker.runtime.celery_app import make_app

# Longer than Celery's own publish retries last (three attempts in 0.6 s), well inside ours.
BROKER_DOWN_S = 2.0


def detached_channel_with_unacked_delivery(url: str, transport: str) -> tuple[Connection, object]:
    conn = Connection(url, transport=transport)
    channel = conn.default_channel
    queue = Queue("compactor.test-broker", channel=channel)
    queue.declare()
    conn.Producer(channel).publish({"n": 1}, routing_key=queue.name)
    message = queue.get(no_ack=False)  # held unacknowledged by the channel's QoS
    assert message is not None
    # What Connection.collect() leaves behind when a channel's close stopped half-way on a
    # connection error: the channel still open, its pools dropped, the transport detached.
    channel._disconnect_pools()
    conn._do_close_transport()
    return conn, channel


def test_a_detached_channel_fails_with_a_connection_error(redis_url: str) -> None:
    conn, channel = detached_channel_with_unacked_delivery(redis_url, TRANSPORT)
    with pytest.raises(redis.exceptions.ConnectionError):
        channel.close()  # restores the unacked delivery: needs a new pool
    assert issubclass(redis.exceptions.ConnectionError, conn.connection_errors)
    conn.close()  # Celery's next step, through ignore_errors: nothing escapes
    # The delivery is still in Redis' unacked index; restore_visible returns it later.
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.hlen("unacked") == 1
    finally:
        client.close()


def test_kombu_itself_still_raises_attribute_error_there(redis_url: str) -> None:
    """The bug the workaround is for. When this fails, kombu handles a detached channel itself:
    remove worker/backend/broker.py and the ``broker_transport`` setting."""
    _, channel = detached_channel_with_unacked_delivery(redis_url, "redis")
    with pytest.raises(AttributeError, match="hostname"):
        channel.close()


def test_a_task_message_sent_while_the_broker_restarts_is_sent_once_it_is_back(
    tmp_path: Path, subprocesses: None
) -> None:
    """What a worker sends (an evaluation handed to summarize, a retry) while its Redis broker
    is down for a restart waits for it instead of failing: with Celery's default retries the
    send failed after 0.6 s, the evaluation that sent it ended as failed and acknowledged, and
    the conversation waited for the reconciler."""
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=True)
    url = server.start()
    settings = with_broker_url(with_redis_url(load_settings(None, environ={}), url), None)
    app = make_app(settings)
    admin = redis.Redis.from_url(url)
    admin.config_set("appendfsync", "always")  # the first message survives the SIGKILL below
    # Set just before the server starts again: a send that returns with it unset was never
    # kept waiting (it cannot have reached a server that was not running).
    restarting = threading.Event()
    restarted = threading.Event()

    def restart_later() -> None:
        restarting.set()
        try:
            server.start()
        finally:
            restarted.set()

    try:
        app.send_task(EVALUATE_TASK, args=["acme:before", 0.0], queue=EVALUATE_QUEUE)
        server.stop(kill=True)
        threading.Timer(BROKER_DOWN_S, restart_later).start()
        app.send_task(EVALUATE_TASK, args=["acme:during", 0.0], queue=EVALUATE_QUEUE)
        assert restarting.is_set(), "the send returned while the broker was still down"
        assert admin.llen(EVALUATE_QUEUE) == 2
    finally:
        restarted.wait(timeout=60)
        admin.close()
        app.close()
        server.stop()
