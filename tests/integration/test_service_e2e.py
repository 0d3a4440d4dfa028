"""End to end through a real Redis and real Celery worker processes (no eager mode); the tests
marked ``ON_BOTH_BROKERS`` run twice: task messages on Redis, then on RabbitMQ (the state in
Redis either way); the tests taking ``any_service_env`` also run with the state on a Redis
Cluster.

Worker processes start once per module and way of running them (:class:`RunningStacks`); each
test on them starts from an emptied state (the service's ``cw:*`` keys and the transcripts),
its own conversation ids. A test about starting, stopping or replacing a worker makes its own
(``service_env``)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from support.cluster_support import RedisClusterServers
from support.service_support import (
    BROKERS,
    ServiceEnv,
    Workers,
    client_for,
    conversation,
    rabbitmq_vhost,
    settled_counters,
    wait_for_outcome,
    write_config,
)

from worker.backend import keys
from worker.backend.embedded import EmbeddedRedis
from worker.backend.queues import EVALUATE_QUEUE, broker_connection
from worker.client import Client, EventMismatch, apply_compaction
from worker.config import Settings, load_settings
from worker.pipeline import snapshot_context, tokens_of
from worker.pipeline.evaluate import evaluate
from worker.reuse import Reuse
from worker.tokens import tokenizer_for
from worker.wire.snapshots import parse_snapshot

pytestmark = pytest.mark.slow
ON_BOTH_BROKERS = pytest.mark.parametrize("broker", BROKERS, indirect=True)


STATE_SETTLE_S = 60.0  # how long a test's leftover work may take to finish, at most


@dataclass
class RunningStack:
    """Started workers on a private Redis (the state, or only the queues for a cluster state)."""

    workers: Workers
    transcripts: Path
    state: redis.Redis | redis.RedisCluster

    def reset(self) -> None:
        """An emptied state for the next test: wait until the last test's conversations are
        settled (nothing pending), then delete the service's keys and transcripts. The broker's
        own keys (kombu's bindings, Celery's) stay, so the workers go on consuming."""
        deadline = time.monotonic() + STATE_SETTLE_S
        while self.state.zcard(keys.PENDING):
            assert time.monotonic() < deadline, "the previous test's work never settled"
            time.sleep(0.05)
        for key in list(self.state.scan_iter(match=f"{keys.PREFIX}*")):
            self.state.delete(key)
        shutil.rmtree(self.transcripts, ignore_errors=True)
        for client in self.workers.clients:
            client.close()
        self.workers.clients.clear()


class RunningStacks:
    """One started stack per way of running the workers, made when a test first needs it and
    stopped with the module."""

    def __init__(self, request: pytest.FixtureRequest, root: Path) -> None:
        self.request, self.root = request, root
        self.stacks: dict[str, RunningStack] = {}
        self.exit = contextlib.ExitStack()

    def get(self, kind: str) -> RunningStack:
        if kind not in self.stacks:
            self.stacks[kind] = self._start(kind)
        stack = self.stacks[kind]
        stack.reset()
        return stack

    def _start(self, kind: str) -> RunningStack:
        root = self.root / kind
        (root / "redis").mkdir(parents=True)
        (root / "logs").mkdir()
        private = self.exit.enter_context(EmbeddedRedis(directory=root / "redis"))
        state_url, broker_url = private, None
        if kind == "rabbitmq":  # a vhost of its own: its worker must not take other tests' tasks
            broker_url = self.exit.enter_context(rabbitmq_vhost())
        elif kind == "redis-cluster":
            cluster: RedisClusterServers = self.request.getfixturevalue("redis_cluster")
            cluster.wait_ok()
            cluster.flush()
            state_url, broker_url = cluster.url, private
        transcripts = root / "transcripts"
        config = write_config(root / "compactor.toml", transcripts, broker_url=broker_url)
        workers = Workers(state_url, config, root / "logs", broker=broker_url)
        self.exit.callback(workers.stop_all)
        workers.start("w1")
        owner = Client(workers.settings())  # not one of the workers' clients: reset closes those
        self.exit.callback(owner.close)
        return RunningStack(workers, transcripts, owner.state.client)

    def close(self) -> None:
        self.exit.close()


@pytest.fixture(scope="module")
def running_stacks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, subprocesses: None
) -> Iterator[RunningStacks]:
    stacks = RunningStacks(request, tmp_path_factory.mktemp("e2e-running"))
    try:
        yield stacks
    finally:
        stacks.close()


@pytest.fixture(params=["redis", "rabbitmq", "redis-cluster"])
def any_running(request: pytest.FixtureRequest, running_stacks: RunningStacks) -> Workers:
    """Started workers three ways: all on one Redis; task messages on RabbitMQ (the state on
    Redis); the state on a 3-master Redis Cluster (the queues on a standalone Redis)."""
    return running_stacks.get(request.param).workers


@pytest.fixture
def running(running_stacks: RunningStacks) -> RunningStack:
    """Started workers with everything on one Redis."""
    return running_stacks.get("redis")


def test_over_threshold_yields_one_completed_event_that_applies(any_running: Workers) -> None:
    client = client_for(any_running)
    snap = conversation("c-over", 12)
    assert client.submit(snap).status == "queued"
    events = wait_for_outcome(client, "c-over")
    outcome = events[-1]
    assert outcome.type == "compaction.completed"
    c = outcome.compaction
    # the transcript is whole and matches before anyone could read the event
    data = Path(c.transcript.uri).read_bytes()
    assert hashlib.sha256(data).hexdigest() == c.transcript.sha256
    assert json.loads(data)["messages"] == snap["messages"]
    applied = apply_compaction(snap["messages"], outcome)
    parsed = parse_snapshot(snap, Settings())
    assert tokens_of(applied, parsed, tokenizer_for("gpt-4.1")) == c.tokens_after
    assert c.tokens_after < outcome.trigger.threshold_tokens
    assert client.restore(outcome) == snap["messages"]
    counters = settled_counters(client, "c-over")
    assert counters["compactions_completed_total"] == 1
    assert counters["tokens_before_total"] == c.tokens_before
    assert counters["tokens_after_total"] == c.tokens_after
    assert client.restore("c-over") == snap["messages"]
    assert client.restore("c-over", revision=outcome.revision) == snap["messages"]
    with pytest.raises(EventMismatch, match="no transcript"):
        client.restore("c-over", revision=outcome.revision + 1)
    time.sleep(0.5)
    assert [e.type for _, e in client.events("c-over")] == ["compaction.completed"]


def test_under_threshold_is_skipped(any_running: Workers) -> None:
    client = client_for(any_running)
    client.submit(conversation("c-under", 2, window=100_000))
    events = wait_for_outcome(client, "c-under")
    assert [e.type for e in events] == ["compaction.skipped"]
    assert events[0].trigger.projected_tokens <= events[0].trigger.threshold_tokens
    counters = settled_counters(client, "c-under")
    assert counters["snapshots_evaluated_total"] == 1
    assert counters["compactions_skipped_total"] == 1
    assert counters["queue_lag_samples_total"] == 1
    from worker.ops.metrics import render_prometheus

    text = render_prometheus(counters, {"compactor.evaluate": 0})
    assert "compactor_snapshots_evaluated_total 1" in text


def test_a_grown_conversation_on_a_fresh_worker_counts_only_its_new_messages(
    service_env: ServiceEnv,
) -> None:
    """The conversation's memo travels in Redis: a worker process that never saw it counts
    and compresses only what the new snapshot adds."""
    _, make = service_env
    workers = make()
    workers.start("first")
    client = client_for(workers)
    client.submit(conversation("c-grow", 10, revision=1, window=1_000_000))
    wait_for_outcome(client, "c-grow", revision=1)
    before = settled_counters(client, "c-grow")
    assert before["tool_results_compressed_total"] == 10
    workers.stop("first")

    workers.start("second")  # a new process: empty caches
    grown = conversation("c-grow", 12, revision=2, window=1_000_000)
    client.submit(grown)
    events = wait_for_outcome(client, "c-grow", revision=2)
    after = settled_counters(client, "c-grow")
    assert after["tool_results_compressed_total"] - before["tool_results_compressed_total"] == 2
    # The two new exchanges: an assistant text, its arguments and a tool result each (a new
    # tool name or role would add one); none of the 22 earlier messages' texts.
    assert 0 < after["texts_tokenized_total"] - before["texts_tokenized_total"] <= 6
    parsed = parse_snapshot(grown, load_settings(workers.config, environ={}))
    assert (
        events[-1].trigger.projected_tokens
        == evaluate(snapshot_context(parsed, Reuse())).projected_tokens
    )


def test_invalid_snapshot_through_the_broker_is_rejected(running: RunningStack) -> None:
    transcripts = running.transcripts
    client = client_for(running.workers)
    bad = conversation("c-bad", 2)
    bad["messages"].append({"role": "tool", "tool_call_id": "nope", "content": "orphan"})
    client.submit(bad)
    events = wait_for_outcome(client, "c-bad")
    assert events[-1].type == "compaction.rejected"
    assert "nope" in events[-1].error.message and events[-1].error.field
    assert not transcripts.exists() or not any(transcripts.rglob("*.json"))


@ON_BOTH_BROKERS
def test_broker_message_is_small_whatever_the_snapshot_size(
    broker: str | None, service_env: ServiceEnv
) -> None:
    _, make = service_env
    workers = make()  # not started: the message stays in the queue for inspection
    client = client_for(workers)
    big = conversation("c-big", 40, body=20_000)
    assert len(json.dumps(big)) > 5_000_000
    client.submit(big)
    if workers.broker is None:  # kombu's Redis transport: a list per queue (and priority)
        r = redis.Redis.from_url(workers.url)
        messages = [
            m for key in r.scan_iter(match="compactor.evaluate*") for m in r.lrange(key, 0, -1)
        ]
    else:  # RabbitMQ: the body and headers of what waits on the queue
        with broker_connection(workers.broker) as connection:
            channel = connection.channel()
            message = channel.basic_get(EVALUATE_QUEUE, no_ack=False)
            assert message is not None and channel.basic_get(EVALUATE_QUEUE) is None
            body = message.body  # text or bytes, as the transport hands it over
            body = body if isinstance(body, bytes) else body.encode()
            messages = [body + json.dumps(message.headers).encode()]
    assert len(messages) == 1 and len(messages[0]) < 2048
    client.close()


def test_a_burst_of_submissions_coalesces(any_running: Workers) -> None:
    client = client_for(any_running)  # a worker of concurrency 4
    for rev in range(100):
        snap = conversation("c-burst", 10, revision=rev)
        client.submit(snap)
    events = wait_for_outcome(client, "c-burst", revision=99, timeout_s=60)
    time.sleep(1.0)
    all_events = [e for _, e in client.events("c-burst")]
    completed = [e for e in all_events if e.type == "compaction.completed"]
    assert 1 <= len(completed) <= 2
    assert events[-1].revision == 99


@ON_BOTH_BROKERS
def test_submissions_waiting_in_the_queue_are_evaluated_once_for_the_latest(
    broker: str | None,
    service_env: ServiceEnv,
) -> None:
    """How many of a running burst coalesce depends on how fast evaluations are; submissions
    that arrive while the conversation waits in the queue always do."""
    _, make = service_env
    workers = make()
    client = client_for(workers)
    statuses = [
        client.submit(conversation("c-queued", 10, revision=rev)).status for rev in range(100)
    ]
    assert statuses == ["queued"] + ["coalesced"] * 99
    workers.start("w1")
    wait_for_outcome(client, "c-queued", revision=99, timeout_s=60)
    time.sleep(1.0)
    all_events = [e for _, e in client.events("c-queued")]
    assert [e.revision for e in all_events] == [99] * len(all_events)
    assert [e.type for e in all_events].count("compaction.completed") == 1
    assert settled_counters(client, "c-queued")["snapshots_evaluated_total"] == 1


def test_retention_keeps_exactly_the_configured_number(service_env: ServiceEnv) -> None:
    transcripts, make = service_env
    workers = make("max_persisted_transcripts = 3")
    workers.start("w1")
    client = client_for(workers)
    for k in range(5):  # unrelated histories, so no compaction carries over to the next
        snap = conversation("c-ret", 10 + k * 3, revision=100 + k, id_prefix=f"h{k}-")
        client.submit(snap)
        wait_for_outcome(client, "c-ret", revision=100 + k)
    kept = sorted(p.name for p in (transcripts / "c-ret").glob("*.json"))
    assert len(kept) == 3
    assert [int(n.split("-")[0]) for n in kept] == [102, 103, 104]


def _llm_config(base_url: str, *, mode: str = "remote_only") -> str:
    return f"""mode = "{mode}"
summary_max_input_chars = 200000
[llm]
provider = "openai"
base_url = "{base_url}"
model = "stand-in"
api_key_env = "COMPACTOR_TEST_UNSET_KEY"
timeout_s = 5.0
deadline_s = 10.0
max_retries = 1
"""


def test_llm_summary_through_the_worker(service_env: ServiceEnv) -> None:
    from worker.testing.standin_llm import StandinLLM

    _, make = service_env
    with StandinLLM(latency_s=0.05) as llm:
        workers = make(_llm_config(llm.openai_base_url))
        workers.start("w1")
        client = client_for(workers)
        client.submit(conversation("c-llm", 12))
        outcome = wait_for_outcome(client, "c-llm")[-1]
        assert outcome.type == "compaction.completed"
        assert outcome.compaction.summary.source == "llm"
        assert outcome.compaction.summary.tokens <= 300
        assert len(llm.requests) == 1
        assert "src/pkg/mod_0.py" in llm.requests[0].user_text


@ON_BOTH_BROKERS
def test_two_workers_never_compact_one_conversation_at_once(
    broker: str | None, service_env: ServiceEnv
) -> None:
    from worker.testing.standin_llm import StandinLLM

    _, make = service_env
    latency = 0.4
    with StandinLLM(latency_s=latency) as llm:
        workers = make(_llm_config(llm.openai_base_url))
        workers.start("w1", concurrency=4)
        workers.start("w2", concurrency=4)
        client = client_for(workers)
        convs = [f"c-pair{i}" for i in range(4)]
        for rev in range(8):  # unrelated histories per revision: each could compact again
            for conv in convs:
                snap = conversation(conv, 10, revision=rev, id_prefix=f"{conv}-{rev}-")
                for m in snap["messages"]:  # tag what the summarizer reads
                    if m["role"] == "tool":
                        m["content"] += f" [{conv}]"
                client.submit(snap)
            time.sleep(0.1)
        for conv in convs:
            wait_for_outcome(client, conv, revision=7, timeout_s=90)
        spans: dict[str, list[float]] = {}
        for req in llm.requests:
            conv = next(c for c in convs if f"[{c}]" in req.user_text)
            spans.setdefault(conv, []).append(req.received_at)
        for conv, starts in spans.items():
            starts.sort()
            gaps = [b - a for a, b in itertools.pairwise(starts)]
            assert all(g >= latency * 0.9 for g in gaps), (conv, gaps)
        for conv in convs:
            done = [e for _, e in client.events(conv) if e.type == "compaction.completed"]
            revisions = [e.revision for e in done]
            assert len(revisions) == len(set(revisions)), revisions
