"""Shared helpers for the fault-injection tests (issue 6).

Each test gets its own :class:`Cluster`: a private ``redis-server`` on a free loopback port with
its own directory (AOF on unless asked otherwise), a TOML configuration written for the test,
real ``celery -A worker worker`` subprocesses (via :class:`service_support.Workers`) and a
client. Everything is stopped (killed) when the test ends, whatever state it left things in.

The helpers here never sleep without a bound: every wait has a timeout and says what it was
waiting for when it gives up.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
import redis

from support.cluster_support import RedisClusterServers
from support.service_support import OUTCOMES, Workers, conversation, purge_queues
from worker.backend.connection import connect
from worker.backend.embedded import EmbeddedRedis
from worker.client import Client
from worker.config import Settings, load_settings, with_broker_url, with_redis_url
from worker.errors import StorageError
from worker.runtime.celery_app import MAINTENANCE_QUEUE, make_app
from worker.transcripts import TranscriptStore, open_store
from worker.wire.events import CompactionEvent

T = TypeVar("T")

ALL_QUEUES = "compactor.evaluate,compactor.summarize,compactor.maintenance"
EVALUATE_QUEUES = "compactor.evaluate,compactor.maintenance"
SUMMARIZE_QUEUE = "compactor.summarize"
UNSET_KEY_ENV = "COMPACTOR_TEST_UNSET_KEY"  # the workers' environment drops COMPACTOR_*

# Small timeouts so the tests stay fast; visibility must outlast the summarize time limit.
DEFAULT_SECTIONS: dict[str, dict[str, Any]] = {
    "compaction": {
        "summary_max_output_tokens": 300,
        "summary_max_input_chars": 200_000,  # one LLM call per summary
        "max_persisted_transcripts": 1000,  # retention never hides a transcript we check
    },
    "redis": {"visibility_timeout_s": 6, "lock_lease_s": 2.0},
    "worker": {
        "log_format": "text",
        "summarize_time_limit_s": 4.0,
        "evaluate_time_limit_s": 4.0,
        "reconcile_after_s": 2.0,
    },
}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # a TOML basic string for what we write
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def write_config(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    lines: list[str] = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in table.items())
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def merged(*layers: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for name, table in (layer or {}).items():
            out.setdefault(name, {}).update(table)
    return out


def llm_section(base_url: str, **overrides: Any) -> dict[str, Any]:
    """``[llm]`` for the stand-in: no key, short timeouts, few retries, a lenient breaker."""
    return {
        "provider": "openai",
        "base_url": base_url,
        "model": "stand-in",
        "api_key_env": UNSET_KEY_ENV,
        "timeout_s": 2.0,
        "connect_timeout_s": 0.5,
        "deadline_s": 5.0,
        "max_retries": 1,
        "backoff_base_s": 0.05,
        "backoff_max_s": 0.2,
        "circuit_failure_threshold": 1000,
        "circuit_reset_s": 30.0,
    } | overrides


def wait_until(
    predicate: Callable[[], T], *, timeout_s: float, what: str, every_s: float = 0.05
) -> T:
    """The first truthy value of ``predicate()``; AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


class Cluster:
    """A private Redis (own port and directory), worker subprocesses and a client. The task
    messages go through that Redis, or through ``broker`` (a RabbitMQ vhost's URL: the
    ``broker`` fixture of :mod:`service_support`), purged here.

    ``topology="redis-cluster"``: the state on a private 3-master Redis Cluster (AOF on) and
    the queues on a private standalone Redis (``[broker] url``) unless ``broker`` is given;
    ``restart_redis`` then kills and restarts every master."""

    def __init__(
        self,
        root: Path,
        sections: dict[str, dict[str, Any]] | None = None,
        *,
        appendonly: bool = True,
        broker: str | None = None,
        topology: Literal["standalone", "redis-cluster"] = "standalone",
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        configured = (sections or {}).get("compaction", {}).get("transcript_dir")
        self.transcripts = Path(configured) if configured else root / "transcripts"
        self.logs = root / "logs"
        self.logs.mkdir(exist_ok=True)
        redis_dir = root / "redis"
        redis_dir.mkdir(exist_ok=True)
        self.topology = topology
        self.redis: Any
        self.queues_redis: EmbeddedRedis | None = None  # the cluster's queues, when no broker
        own: dict[str, dict[str, Any]] = {"compaction": {"transcript_dir": self.transcripts}}
        if topology == "redis-cluster":
            self.redis = RedisClusterServers(redis_dir)
            if broker is None:
                self.queues_redis = EmbeddedRedis(directory=root / "broker", appendonly=True)
                broker = self.queues_redis.url
        else:
            self.redis = EmbeddedRedis(directory=redis_dir, appendonly=appendonly)
        self.url = self.redis.url  # its ports are chosen already; it starts once all is valid
        self.config = write_config(root / "compactor.toml", merged(DEFAULT_SECTIONS, own, sections))
        self.broker = broker
        self.settings: Settings = with_broker_url(
            with_redis_url(load_settings(self.config, environ={}), self.url), broker
        )
        if self.queues_redis is not None:
            self.queues_redis.start()
        elif broker:
            purge_queues(broker)
        self.redis.start()
        self.workers = Workers(self.url, self.config, self.logs, broker=broker)
        self.client = Client(self.settings)
        self.raw: redis.Redis = connect(self.url)  # retries: survives our own restarts
        self._app: Any = None

    # --- Redis ----------------------------------------------------------------------------

    def restart_redis(self, *, kill: bool = True, down_s: float = 0.0) -> None:
        """Stop the server (SIGKILL by default) and start it again on the same port and dir
        (on a Redis Cluster: every master, each from its own AOF and nodes.conf)."""
        self.redis.stop(kill=kill)
        if down_s:
            time.sleep(down_s)
        if isinstance(self.redis, RedisClusterServers):
            self.redis.restart()
        else:
            self.redis.start()
        # Kombu pools broker connections process-wide: the first broadcast (a worker ping) after
        # a restart meets a dead pooled connection. Flush them here, in the test process.
        for _ in range(5):
            try:
                self.app().control.ping(timeout=0.1)
                break
            except Exception:  # kombu raises its own and redis-py's connection errors
                continue

    # --- tasks ----------------------------------------------------------------------------

    def app(self) -> Any:
        if self._app is None:
            self._app = make_app(self.settings)
        return self._app

    def send_task(self, name: str, *, queue: str = MAINTENANCE_QUEUE) -> None:
        self.app().send_task(name, queue=queue)

    def reconcile(self) -> None:
        """Run the scheduled reconciler now, through a worker (what beat does every interval)."""
        self.send_task("compactor.reconcile")

    # --- events ---------------------------------------------------------------------------

    def events(self, conversation_id: str) -> list[CompactionEvent]:
        return [e for _, e in self.client.events(conversation_id)]

    def outcome(self, conversation_id: str, revision: int) -> CompactionEvent | None:
        for event in self.events(conversation_id):
            if event.type in OUTCOMES and event.revision == revision:
                return event
        return None

    def wait_outcome(
        self, conversation_id: str, revision: int, *, timeout_s: float = 20.0
    ) -> CompactionEvent:
        return wait_until(
            lambda: self.outcome(conversation_id, revision),
            timeout_s=timeout_s,
            what=f"an outcome for {conversation_id}@{revision}",
        )

    def counters(self) -> dict[str, float]:
        return self.client.state.counters()

    def close(self) -> None:
        for name in list(self.workers.procs):
            self.workers.stop(name, sig=signal.SIGKILL, timeout_s=5)  # a stopped (SIGSTOP) one too
        if self._app is not None:
            self._app.close()
        self.client.close()
        self.raw.close()
        self.redis.stop(kill=True)
        if self.queues_redis is not None:
            self.queues_redis.stop(kill=True)


# What the ``make_cluster`` fixture gives: ``make_cluster(...)`` starts a Cluster.
MakeCluster = Callable[..., Cluster]


@pytest.fixture(name="make_cluster")
def make_cluster_fixture(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(
        sections: dict[str, dict[str, Any]] | None = None,
        *,
        appendonly: bool = True,
        name: str = "cluster",
        broker: str | None = None,
        topology: Literal["standalone", "redis-cluster"] = "standalone",
    ) -> Cluster:
        cluster = Cluster(
            tmp_path / name, sections, appendonly=appendonly, broker=broker, topology=topology
        )
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


# --- snapshots ------------------------------------------------------------------------------


def tagged(
    conversation_id: str,
    revision: int,
    *,
    turns: int = 10,
    body: int = 300,
    window: int = 8000,
    fresh: bool = True,
    **config: Any,
) -> dict[str, Any]:
    """A snapshot over the threshold whose tool results carry ``[conversation_id@revision]`` (so
    an LLM request can be attributed). ``fresh``: an unrelated history per revision, so every
    revision compacts afresh; otherwise the history grows with ``turns``."""
    prefix = f"{conversation_id}-{revision}-" if fresh else f"{conversation_id}-"
    snap = conversation(
        conversation_id, turns, revision=revision, window=window, body=body, id_prefix=prefix
    )
    for m in snap["messages"]:
        if m["role"] == "tool":
            m["content"] += f" [{conversation_id}@{revision}]"
    if config:
        snap["config"] = config
    return snap


def small(conversation_id: str, revision: int = 1) -> dict[str, Any]:
    """A snapshot well under the threshold: evaluated and skipped, never summarized."""
    return conversation(conversation_id, 2, revision=revision, window=100_000, body=20)


_TAG = re.compile(r"\[([A-Za-z0-9._:-]+)@(\d+)\]")


def attribution(request: Any) -> tuple[str, int] | None:
    """(conversation, revision) that a stand-in LLM request summarized (see :func:`tagged`)."""
    match = _TAG.search(request.user_text)
    return (match.group(1), int(match.group(2))) if match else None


def requests_for(requests: list[Any], conversation_id: str) -> list[Any]:
    return [r for r in requests if (attribution(r) or ("",))[0] == conversation_id]


# --- consistency ----------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_consistency(
    cluster: Cluster, submitted: dict[str, dict[int, dict[str, Any]]]
) -> dict[str, list[CompactionEvent]]:
    """The end-state guarantees, for ``submitted[conversation][revision] = snapshot`` (only the
    revisions listed are checked against their transcripts):

    - each conversation has an outcome for its newest submitted revision;
    - no event id twice, no revision with two ``compaction.completed`` events;
    - every completed event's transcript exists whole in the cluster's store (bytes and sha256
      as the event says) and holds exactly the submitted messages of that revision;
    - no temporary transcript file is left behind (anywhere in the store: one a worker is
      writing now, say for a conversation not checked here, must go once that write ends);
      no conversation is still pending in Redis unless its newest outcome is
      ``compaction.failed`` (the reconciler retries those).

    Returns the completed events per conversation.
    """
    completed: dict[str, list[CompactionEvent]] = {}
    store = open_store(cluster.settings)  # the cluster's store, whichever kind
    try:
        _check_conversations(cluster, store, submitted, completed)
    finally:
        store.close()

    def leftovers() -> list[Path]:
        return [p for p in cluster.transcripts.rglob("*") if p.name.startswith(".tmp-")]

    # A write in flight ends within moments (its file goes with it); a leftover stays.
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not leftovers(), timeout_s=60, what="writes in flight to end")
    assert not leftovers(), f"temporary transcript files left behind: {leftovers()}"
    return completed


def _check_conversations(
    cluster: Cluster,
    store: TranscriptStore,
    submitted: dict[str, dict[int, dict[str, Any]]],
    completed: dict[str, list[CompactionEvent]],
) -> None:
    for conv, revisions in submitted.items():
        events = cluster.events(conv)
        newest = max(revisions)
        assert any(e.type in OUTCOMES and e.revision == newest for e in events), (
            conv,
            newest,
            [(e.type, e.revision) for e in events],
        )
        ids = [e.event_id for e in events]
        assert len(ids) == len(set(ids)), f"{conv}: an event published twice"
        done = [e for e in events if e.type == "compaction.completed"]
        twice = [rev for rev, n in Counter(e.revision for e in done).items() if n > 1]
        assert not twice, f"{conv}: two different compactions for revisions {twice}"
        for event in done:
            if event.revision not in revisions:
                continue  # not ours to check (its transcript was removed on purpose)
            assert event.compaction is not None and event.compaction.transcript is not None
            ref = event.compaction.transcript
            try:
                data = store.read(ref.uri)
            except StorageError as exc:
                raise AssertionError(
                    f"{conv}@{event.revision}: transcript {ref.uri}: {exc}"
                ) from None
            assert len(data) == ref.bytes, f"{ref.uri}: partial transcript"
            assert hashlib.sha256(data).hexdigest() == ref.sha256, f"{ref.uri}: sha256 differs"
            assert json.loads(data)["messages"] == revisions[event.revision]["messages"]
        completed[conv] = done
        newest_outcome = [e for e in events if e.type in OUTCOMES and e.revision == newest][-1]
        if newest_outcome.type != "compaction.failed":  # a failure stays pending: retried later
            # The publishing worker removes the entry just after the event is out (its next
            # round trip): wait for that, not for a slow machine to have got there already.
            with contextlib.suppress(AssertionError):
                wait_until(
                    lambda conv=conv: cluster.raw.zscore("cw:pending", conv) is None,
                    timeout_s=60,
                    what=f"{conv} to leave cw:pending",
                )
            assert cluster.raw.zscore("cw:pending", conv) is None, f"{conv} still pending"


def reconcile_until(
    cluster: Cluster, done: Callable[[], bool], *, timeout_s: float, what: str
) -> None:
    """Run the reconciler (as beat would, every second) until ``done()``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        cluster.reconcile()
        wait_end = min(time.monotonic() + 1.0, deadline)
        while time.monotonic() < wait_end and not done():
            time.sleep(0.05)


# --- file-system faults ---------------------------------------------------------------------


def mount_tmpfs(target: Path, *, size: str = "64k", read_only: bool = False) -> None:
    """Mount a small tmpfs on ``target`` (skips the test when mounting is not permitted)."""
    target.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700" + (",ro" if read_only else "")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}); "
            "the storage-full/read-only fault needs CAP_SYS_ADMIN"
        )


def unmount(target: Path) -> None:
    if os.path.ismount(target):
        proc = subprocess.run(["umount", str(target)], capture_output=True, check=False)
        if proc.returncode != 0:
            subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)
