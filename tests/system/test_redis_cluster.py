"""The state on a Redis Cluster and behind Redis Sentinel (issue 15): the URL forms, the
cluster refusing what crosses slots, announcements reaching subscribers on any node, a master
killed and restarted from its AOF mid-load, and a Sentinel failover under a running service.

The state tests (integration/test_redis_state.py), three end-to-end tests (test_service_e2e.py) and
the AOF restart test (test_faults_redis.py) run on the cluster too.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster
from support.cluster_support import SentinelServers, wait_for
from support.fault_support import (
    EVALUATE_QUEUES,
    SUMMARIZE_QUEUE,
    MakeCluster,
    check_consistency,
    llm_section,
    reconcile_until,
    small,
    tagged,
    wait_until,
)
from support.http_support import Stack
from support.service_support import client_for, service_env_on, wait_for_outcome

from worker.backend import keys
from worker.backend.connection import connect, redis_errors
from worker.backend.queues import broker_url
from worker.backend.redis_state import RedisState
from worker.backend.redis_target import parse_redis_url
from worker.config import RedisConfig, Settings, mask_url
from worker.errors import ConfigError, RedisUnavailable
from worker.testing.standin_llm import StandinLLM
from worker.wire.events import skipped_event

# --- the URL forms (pure) ---------------------------------------------------------------------


def test_the_url_forms_name_a_standalone_redis_a_cluster_or_a_sentinel_master() -> None:
    assert parse_redis_url("redis://:pw@10.0.0.1:6379/2").kind == "standalone"
    assert parse_redis_url("unix:///run/redis.sock?db=1").kind == "standalone"
    cluster = parse_redis_url("redis+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2:7001")
    assert cluster.kind == "cluster"
    assert cluster.nodes == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert cluster.auth() == {"username": "app", "password": "s@cret"}
    assert parse_redis_url("rediss+cluster://[::1]:7000/0").auth() == {"ssl": True}
    sentinel = parse_redis_url("redis+sentinel://:pw@s1:26379,s2:26379/mymaster/3")
    assert sentinel.kind == "sentinel" and sentinel.service == "mymaster" and sentinel.db == 3
    assert sentinel.nodes == [("s1", 26379), ("s2", 26379)]
    assert sentinel.auth() == {"password": "pw"}
    assert parse_redis_url("redis+sentinel://s1:26379/mymaster").db == 0
    assert mask_url("redis+cluster://app:secret@h1:1,h2:2") == "redis+cluster://app:***@h1:1,h2:2"


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://",
        "redis+cluster://h1",  # no port
        "redis+cluster://h1:99999",
        "redis+cluster://h1:7000/1",  # a cluster has database 0 only
        "redis+sentinel://s1:26379",  # no service name
        "redis+sentinel://s1:26379/mymaster/x",
        "no-scheme",
    ],
)
def test_a_malformed_url_is_a_config_error_that_does_not_echo_it(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_redis_url(url.replace("//", "//user:hunter2@", 1) if "//" in url else url)
    assert caught.value.key == "redis.url"
    assert "hunter2" not in str(caught.value)


def test_a_cluster_or_sentinel_state_needs_a_broker_of_its_own() -> None:
    for url in ("redis+cluster://h1:7000", "redis+sentinel://s1:26379/m"):
        with pytest.raises(ConfigError) as caught:
            broker_url(Settings(redis={"url": url}))
        assert caught.value.key == "broker.url"
        given = Settings(redis={"url": url}, broker={"url": "redis://q:6379/0"})
        assert broker_url(given) == "redis://q:6379/0"
    assert broker_url(Settings(redis={"url": "redis://h:6379/1"})) == "redis://h:6379/1"


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.TryAgainError("TRYAGAIN"),
        redis.exceptions.MovedError("3999 127.0.0.1:6381"),
        redis.exceptions.AskError("3999 127.0.0.1:6381"),
        redis.exceptions.SlotNotCoveredError("slot 3999 not covered"),
    ],
)
def test_cluster_errors_are_transient(error: Exception) -> None:
    with pytest.raises(RedisUnavailable) as caught, redis_errors("testing"):
        raise error
    assert caught.value.code == "redis_unavailable"


# --- on a real cluster ------------------------------------------------------------------------


def test_the_cluster_refuses_a_script_whose_keys_are_in_two_slots(
    cluster_url: str, redis_cluster: Any
) -> None:
    """What makes running the state tests on the cluster a proof: a script (or MULTI) that
    touched the keys of two conversations, or one and a global key, would fail there."""
    client = connect(cluster_url)
    try:
        assert isinstance(client, redis.cluster.RedisCluster)
        one, other = keys.latest("c-a"), keys.PENDING
        assert client.keyslot(one) != client.keyslot(other)
        assert client.keyslot(keys.events("c-a")) == client.keyslot(one)  # the hash tag
        node = client.get_node_from_key(one)
        direct = redis.Redis(host=node.host, port=node.port)
        try:
            with pytest.raises(redis.exceptions.ResponseError, match="same slot"):
                direct.eval("return redis.call('GET', KEYS[1])", 2, one, other)
        finally:
            direct.close()
    finally:
        client.close()


def test_announcements_reach_a_subscriber_on_any_node_and_async_readers_follow(
    cluster_url: str, redis_cluster: Any
) -> None:
    """PUBLISH from inside the publish script is cluster-wide: a subscriber connected to
    every node (one per node: none is the slot's own for all) hears each event once; and the
    asyncio client (``Client.aevents``) reads the stream through the cluster."""
    from worker.client import Client

    state = RedisState(connect(cluster_url), RedisConfig())
    conv = "c-announce"
    subscribers = []
    for index in range(len(redis_cluster.nodes)):
        pubsub = redis_cluster.node_client(index).pubsub()
        pubsub.subscribe(keys.announce(conv))
        pubsub.get_message(timeout=5)  # the subscribe confirmation
        subscribers.append(pubsub)
    event = skipped_event(conv, 1, datetime.now(UTC), why="test", reason="announced", trigger=None)
    assert state.publish(event, handled_revision=1) == "published"
    try:
        for pubsub in subscribers:
            message = None
            deadline = time.monotonic() + 60
            while message is None and time.monotonic() < deadline:
                message = pubsub.get_message(timeout=1)
            assert message is not None and json.loads(message["data"])["event_id"] == event.event_id
        client = Client(Settings(redis={"url": cluster_url}, broker={"url": "redis://unused:1/0"}))

        async def read() -> list[str]:
            return [e.event_id async for _, e in client.aevents(conv)]

        try:
            assert asyncio.run(read()) == [event.event_id]
        finally:
            client.close()
        assert [e["type"] for e in state.recent_events()] == ["compaction.skipped"]
    finally:
        for pubsub in subscribers:
            pubsub.close()
        state.client.close()


@pytest.mark.slow
def test_a_cluster_master_killed_mid_load_and_restarted_loses_no_pending_work(
    make_cluster: MakeCluster,
) -> None:
    """SIGKILL one of the three masters while summaries are in flight, start it again from
    its AOF and nodes.conf: every conversation, those in its slots too, gets its outcome
    (retried by the workers, or re-queued by the reconciler), with whole transcripts and no
    compaction twice. Submissions meanwhile either succeed or fail with RedisUnavailable: once
    the other masters see one is gone, the cluster refuses every command (CLUSTERDOWN) until
    all slots are served again, and a submission that half happened is settled later."""
    with StandinLLM(latency_s=0.3) as llm:
        env = make_cluster(
            {
                "compaction": {"mode": "remote_only"},
                "llm": llm_section(llm.openai_base_url, timeout_s=3.0, deadline_s=4.0),
                "worker": {"summarize_time_limit_s": 5.0, "reconcile_after_s": 2.0},
            },
            topology="redis-cluster",
        )
        env.workers.start("eval", queues=EVALUATE_QUEUES, concurrency=2)
        env.workers.start("sum", queues=SUMMARIZE_QUEUE, concurrency=4)
        servers = env.redis
        victim = 1
        victim_port = servers.nodes[victim].port
        convs = [f"c-node{i}" for i in range(12)]
        on_victim = [
            c for c in convs if env.raw.get_node_from_key(keys.latest(c)).port == victim_port
        ]
        assert on_victim, "no conversation in the victim's slots: pick more"
        submitted = {c: {1: tagged(c, 1)} for c in convs}
        for conv in convs:
            env.client.submit(submitted[conv][1])
        wait_until(lambda: llm.stats()["in_flight"] > 0, timeout_s=60, what="summaries in flight")
        servers.kill_node(victim)
        others = [c for c in convs if c not in on_victim]
        late: dict[str, dict[int, dict[str, Any]]] = {}
        errors: list[BaseException] = []

        def submit_to_the_others() -> None:
            for conv in others[:3]:  # their masters are up: the cluster still takes them
                snapshot = tagged(conv, 2)
                try:
                    env.client.submit(snapshot)
                except BaseException as exc:  # the assertion below names it
                    errors.append(exc)
                else:
                    late[conv] = {2: snapshot}

        submitter = threading.Thread(target=submit_to_the_others)
        submitter.start()
        time.sleep(1.0)
        servers.start_node(victim)
        servers.wait_ok()
        submitter.join(timeout=120)
        assert not submitter.is_alive()
        for conv, revisions in late.items():
            submitted[conv] |= revisions
        newest = {c: max(r) for c, r in submitted.items()}
        # A submission refused halfway leaves its conversation in cw:pending: the reconciler
        # settles it (after reconcile_after_s), so wait for that too.
        reconcile_until(
            env,
            lambda: (
                all(env.outcome(c, newest[c]) for c in convs) and env.raw.zcard(keys.PENDING) == 0
            ),
            timeout_s=120,
            what="an outcome for every conversation, and nothing left pending",
        )
        check_consistency(env, submitted)
        assert env.workers.procs["eval"].poll() is None
        assert env.workers.procs["sum"].poll() is None
        assert all(isinstance(e, RedisUnavailable) for e in errors), errors


@pytest.mark.slow
def test_the_service_keeps_working_through_a_sentinel_failover(
    tmp_path: Path,
    redis_url: str,
) -> None:
    """Workers and client reach the state through ``redis+sentinel://``; after ``SENTINEL
    FAILOVER`` the replica is the master, and a new submission still gets its outcome."""
    servers = SentinelServers(tmp_path / "sentinel")
    servers.start()
    envs = service_env_on(tmp_path, servers.url, broker_url=redis_url)
    try:
        _, make = next(envs)
        workers = make()
        workers.start("w1")
        client = client_for(workers)
        client.submit(small("c-sentinel", 1))
        assert wait_for_outcome(client, "c-sentinel", revision=1, timeout_s=60)[-1].revision == 1
        old_port = servers.master_port()
        assert old_port == servers.master.port
        servers.sentinel_client().execute_command("SENTINEL", "FAILOVER", servers.SERVICE)
        wait_for(
            lambda: servers.master_port() == servers.replica.port,
            timeout_s=60,
            what="the Sentinel to promote the replica",
        )
        wait_for(
            lambda: servers.replica_client().info("replication")["role"] == "master",
            timeout_s=60,
            what="the replica to take the master role",
        )
        # Until the Sentinel has turned the old master into a replica, a client may still
        # write there (what that node then drops when it resyncs: asynchronous replication).
        demoted = redis.Redis(host="127.0.0.1", port=old_port, socket_timeout=5)
        wait_for(
            lambda: demoted.info("replication").get("master_link_status") == "up",
            timeout_s=60,
            what="the old master to follow the new one",
        )
        demoted.close()
        client.submit(small("c-sentinel", 2))
        events = wait_for_outcome(client, "c-sentinel", revision=2, timeout_s=90)
        assert events[-1].type == "compaction.skipped"
        promoted = servers.replica_client()
        assert promoted.get(keys.handled("c-sentinel")) == b"2"  # written on the new master
        promoted.close()
    finally:
        next(envs, None)  # stops the workers, closes the clients
        servers.stop()


@pytest.mark.slow
def test_the_http_api_on_a_cluster_submits_streams_and_counts(
    tmp_path: Path, cluster_url: str, redis_url: str
) -> None:
    """``compactor serve`` with the state on the cluster: a snapshot submitted over HTTP, its
    events followed over SSE (the asyncio cluster client's XREAD BLOCK), read as JSON, and
    /metrics and /readyz answered (queue lengths from the broker's own Redis)."""
    stack = Stack(
        tmp_path, cluster_url, extra="[http]\nsse_keepalive_s = 1.0", broker_url=redis_url
    )
    stack.start()
    try:
        with stack.http() as client:
            snap = small("c-http", 3)
            r = client.post("/v1/conversations/c-http/snapshots", content=json.dumps(snap))
            assert r.status_code == 202, r.text
            seen: list[dict[str, Any]] = []
            headers = {"Accept": "text/event-stream"}
            with client.stream(
                "GET", "/v1/conversations/c-http/events", headers=headers, timeout=90
            ) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[len("data: ") :]))
                        if seen[-1]["type"] == "compaction.skipped":
                            break
            assert seen[-1]["conversation_id"] == "c-http" and seen[-1]["revision"] == 3
            listed = client.get("/v1/conversations/c-http/events").json()
            assert [e["event_id"] for e in listed] == [e["event_id"] for e in seen]
        with stack.http(key=None) as client:
            assert client.get("/readyz").json()["ready"] is True
            # The counters follow the event (commands of their own): wait for them.
            deadline = time.monotonic() + 30
            text = client.get("/metrics").text
            while "compactor_snapshots_evaluated_total 1" not in text:
                assert time.monotonic() < deadline, text
                time.sleep(0.1)
                text = client.get("/metrics").text
            assert 'compactor_queue_length{queue="compactor.evaluate"} 0' in text
    finally:
        stack.stop()
