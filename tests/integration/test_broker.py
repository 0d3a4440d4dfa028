"""The kombu workaround in :mod:`worker.backend.broker`, in-process against a real Redis: a channel
left open after its connection was collected (what Celery's consumer does when Redis goes
away) must fail with a connection error, which kombu and Celery handle, never with the
``AttributeError`` that made a busy worker exit."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection, Queue

from worker.backend.broker import TRANSPORT


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
