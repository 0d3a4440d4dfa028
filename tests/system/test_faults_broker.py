"""Submitting while the broker cannot take the task message.

The state's Redis is up, the broker is not: ``Client.submit`` raises ``BrokerUnavailable``
(``broker_unavailable``: the CLI exits 1 with it as its JSON error line, the HTTP API answers
503 with it), and leaves no ``queued`` flag behind, so the next submission once the broker is
back is ``queued`` (not ``coalesced`` into a task that was never sent) and the conversation
gets its outcome without the reconciler (which never runs here). The broker is a closed
loopback port (RabbitMQ's and Redis' URL forms), then the machine's RabbitMQ reached through
a relay opened on that port; and a RabbitMQ vhost of its own that refuses connections (its
connection limit set to 0), then accepts them again.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from support.fault_support import ALL_QUEUES, Cluster, MakeCluster, small
from support.http_support import KEY_A, Stack
from support.service_support import (
    OUTCOMES,
    RABBITMQ_ADDRESS,
    REPO_ROOT,
    ensure_rabbitmq,
    rabbitmqctl,
)

from worker.backend import keys
from worker.backend.embedded import restartable_port
from worker.client import BrokerUnavailable, Client
from worker.config import with_broker_url

pytestmark = pytest.mark.slow

PASSWORD = "br0ker-pw-7d1e"  # must never show in an error
NO_RECONCILER = {"worker": {"reconcile_after_s": 86400.0}}  # and no beat runs at all


def closed_broker_url(kind: str) -> str:
    """A broker URL on a loopback port nothing listens on (chosen free, and not used)."""
    port = restartable_port()
    if kind == "rabbitmq":
        return f"amqp://guest:{PASSWORD}@127.0.0.1:{port}//"
    return f"redis://:{PASSWORD}@127.0.0.1:{port}/0"


def with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@127.0.0.1:{port}"))


class Relay:
    """A TCP relay from a loopback port to ``upstream``: the broker, as a client sees it
    through that port, comes back."""

    def __init__(self, port: int, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", port))
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return  # closed
            far = socket.create_connection(self.upstream, timeout=30)
            far.settimeout(None)
            self._sockets += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._listener.close()
        self._thread.join(timeout=60)
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def rabbitmq_upstream() -> tuple[str, int]:
    host, _, port = RABBITMQ_ADDRESS.rpartition(":")
    return host, int(port)


@pytest.fixture
def own_vhost() -> Iterator[str]:
    """A RabbitMQ vhost of this test's own (its limits change), deleted afterwards."""
    ensure_rabbitmq()
    vhost = f"compactor-broker-faults-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@{RABBITMQ_ADDRESS}/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


def assert_refused_cleanly(cluster: Cluster, client: Client, snap: dict[str, Any]) -> None:
    """Submitting raises BrokerUnavailable (twice: the first left no flag to coalesce into),
    and the conversation stays pending for the reconciler, with no queued flag."""
    conv = snap["conversation_id"]
    for _ in range(2):
        with pytest.raises(BrokerUnavailable) as failure:
            client.submit(snap)
        assert failure.value.code == "broker_unavailable"
        assert PASSWORD not in str(failure.value)
        assert cluster.raw.exists(keys.queued(conv)) == 0, "a queued flag without its task"
    assert cluster.raw.zscore(keys.PENDING, conv) is not None


def assert_queued_then_outcome(cluster: Cluster, client: Client, snap: dict[str, Any]) -> None:
    """The broker is back: the same snapshot is queued afresh and gets its outcome."""
    result = client.submit(snap)
    assert result.status == "queued", result
    event = cluster.wait_outcome(snap["conversation_id"], snap["revision"], timeout_s=120)
    assert event.type in OUTCOMES


def test_a_rabbitmq_broker_on_a_closed_port_then_back(
    make_cluster: MakeCluster, own_vhost: str
) -> None:
    """The client's broker URL names a closed loopback port; later a relay to the machine's
    RabbitMQ opens on that port (the workers reach the vhost directly all along)."""
    cluster = make_cluster(NO_RECONCILER, broker=own_vhost)
    cluster.workers.start("w", queues=ALL_QUEUES, concurrency=2)
    port = restartable_port()  # a relay opens on it later
    client = Client(with_broker_url(cluster.settings, with_port(own_vhost, port)))
    relay: Relay | None = None
    try:
        snap = small("c-broker-port")
        assert_refused_cleanly(cluster, client, snap)
        relay = Relay(port, rabbitmq_upstream())
        assert_queued_then_outcome(cluster, client, snap)
    finally:
        client.close()
        if relay is not None:
            relay.close()


def test_a_rabbitmq_vhost_refusing_connections_then_back(
    make_cluster: MakeCluster, own_vhost: str
) -> None:
    """The real vhost refuses new connections (its connection limit set to 0: the workers'
    connections stay open), then takes them again."""
    cluster = make_cluster(NO_RECONCILER, broker=own_vhost)
    cluster.workers.start("w", queues=ALL_QUEUES, concurrency=2)
    vhost = urlsplit(own_vhost).path.lstrip("/")
    client = Client(cluster.settings)  # not connected to the broker yet
    try:
        snap = small("c-broker-vhost")
        rabbitmqctl("set_vhost_limits", "-p", vhost, '{"max-connections": 0}')
        try:
            assert_refused_cleanly(cluster, client, snap)
        finally:
            rabbitmqctl("set_vhost_limits", "-p", vhost, '{"max-connections": -1}')
        assert_queued_then_outcome(cluster, client, snap)
    finally:
        client.close()


def test_a_redis_broker_on_a_closed_port(make_cluster: MakeCluster) -> None:
    """The queues' own Redis (``[broker] url``) is down while the state's is up."""
    cluster = make_cluster(NO_RECONCILER)
    client = Client(with_broker_url(cluster.settings, closed_broker_url("redis")))
    try:
        assert_refused_cleanly(cluster, client, small("c-broker-redis"))
    finally:
        client.close()


def test_cli_submit_with_the_broker_down(tmp_path: Path, redis_url: str) -> None:
    """``compactor submit``: exit 1, one JSON line naming ``broker_unavailable``, no traceback,
    no password; no queued flag left in Redis."""
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(small("c-broker-cli")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env |= {
        "PYTHONPATH": str(REPO_ROOT),
        "COMPACTOR_REDIS_URL": redis_url,
        "COMPACTOR_BROKER_URL": closed_broker_url("rabbitmq"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "submit", str(snapshot)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and PASSWORD not in proc.stdout + proc.stderr
    error = json.loads(proc.stderr.strip().splitlines()[-1])
    assert error["error"] == "broker_unavailable", error
    assert "broker" in error["message"], error
    state = redis.Redis.from_url(redis_url)
    try:
        assert state.exists(keys.queued("c-broker-cli")) == 0
    finally:
        state.close()


def test_http_submit_with_the_broker_down(tmp_path: Path, redis_url: str) -> None:
    """``POST /v1/conversations/{id}/snapshots``: 503, JSON naming ``broker_unavailable``."""
    stack = Stack(tmp_path, redis_url)
    stack.start(workers=False, env={"COMPACTOR_BROKER_URL": closed_broker_url("rabbitmq")})
    try:
        with stack.http(KEY_A) as http:
            snap = small("c-broker-http")
            reply = http.post(f"/v1/conversations/{snap['conversation_id']}/snapshots", json=snap)
    finally:
        stack.stop()
    assert reply.status_code == 503, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert body["error"] == "broker_unavailable", body
    assert PASSWORD not in reply.text
    state = redis.Redis.from_url(redis_url)
    try:
        assert list(state.scan_iter(match="*:queued")) == []
    finally:
        state.close()
