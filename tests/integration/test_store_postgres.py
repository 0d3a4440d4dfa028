"""The PostgreSQL transcript store against the real server on loopback.

The session gets a database of its own (``compactor_test_<random>``, dropped at the end), and
each test a table of its own in it, so parallel runs and tests never see each other's rows.
The server is ``$COMPACTOR_TEST_POSTGRES_URL`` (an admin URL), else
``postgresql://postgres@127.0.0.1:5432/postgres``; where none answers, the module is skipped
with the reason.

Covered here, beyond the per-store tests that also run on PostgreSQL (test_transcripts.py:
create-only, conflicts, concurrent writers, retention by count, prunes racing each other and a
writer): one row per transcript, 10 MB, writers in processes forked after the parent used the
store, schema creation racing from fresh processes, retention by age and size on exact
``created_at`` values; failures (a closed port, a server that goes away and comes back through a
loopback forwarder, a role without rights) as StorageError and, through the pipeline and a
real worker, as ``compaction.failed`` with ``storage_unavailable``; a real worker whose
``Client.restore`` reads the transcript back from the table, sha256-checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fault_support import ALL_QUEUES, Cluster, tagged, wait_until
from support.service_support import REPO_ROOT

from worker.backend.embedded import restartable_port
from worker.config import Settings
from worker.errors import ConfigError, StorageError
from worker.pipeline import Adapters, Pipeline
from worker.transcripts import TranscriptKey, open_store, transcript_name
from worker.wire.snapshots import parse_snapshot

psycopg = pytest.importorskip("psycopg", reason="needs the postgres extra")
from worker.transcripts.postgres import MIGRATIONS, VERSIONS_TABLE, PostgresStore  # noqa: E402

ADMIN_URL = os.environ.get(
    "COMPACTOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
STORAGE_ERROR = "storage_unavailable"
NOW = 1_800_000_000.0
DAY = 86_400.0


def eid(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()[:32]


def admin(url: str = ADMIN_URL) -> Any:
    return psycopg.connect(url, autocommit=True, connect_timeout=10)


def with_database(url: str, database: str) -> str:
    base, _, _ = url.partition("?")
    return base.rsplit("/", 1)[0] + "/" + database


@pytest.fixture(scope="module")
def database(postgres_database: str) -> str:
    """This session's own database (tests/support/store_support.py)."""
    return postgres_database


@pytest.fixture
def table() -> str:
    return f"t_{secrets.token_hex(4)}"


@pytest.fixture
def store(database: str, table: str) -> Iterator[PostgresStore]:
    opened = open_store(f"{database}?table={table}")
    assert isinstance(opened, PostgresStore)
    yield opened
    opened.close()


def rows(database: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with admin(database) as conn:
        return list(conn.execute(query, params).fetchall())


def set_created(database: str, table: str, key: TranscriptKey, epoch: float) -> None:
    with admin(database) as conn:
        conn.execute(
            f"UPDATE {table} SET created_at = to_timestamp(%s)"
            " WHERE conversation_id = %s AND name = %s",
            (epoch, key.conversation_id, key.name),
        )


def fill(store: PostgresStore, cid: str, revisions: range, size: int = 10) -> dict[int, str]:
    return {r: store.write(cid, r, eid(r), f"{r:0{size}d}".encode()).uri for r in revisions}


# --- writing -------------------------------------------------------------------------------------


def test_write_read_and_the_reference(store: PostgresStore, database: str, table: str) -> None:
    payload = b'{"messages": ["\xc3\xa9"]}'
    ref = store.write("c-1", 7, eid(1), payload)
    assert ref.uri == f"postgresql://127.0.0.1:5432/{database.rsplit('/', 1)[1]}/{table}/c-1/" + (
        transcript_name(7, eid(1))
    )
    assert "hunter2" not in ref.uri and "postgres@" not in ref.uri
    assert "hunter2" not in store.display
    assert ref.sha256 == hashlib.sha256(payload).hexdigest() and ref.bytes == len(payload)
    assert store.read(ref.uri) == payload
    assert store.read_revision("c-1", 7) == payload
    assert store.read_revision("c-1", 8) is None
    [(sha, size, revision)] = rows(database, f"SELECT sha256, bytes, revision FROM {table}")
    assert (sha, size, revision) == (ref.sha256, len(payload), 7)


def test_same_bytes_twice_is_one_row(store: PostgresStore, database: str, table: str) -> None:
    first = store.write("c-1", 3, eid(3), b"same")
    assert store.write("c-1", 3, eid(3), b"same") == first
    assert rows(database, f"SELECT count(*) FROM {table}") == [(1,)]


def test_a_10_mb_transcript(store: PostgresStore) -> None:
    payload = os.urandom(5 * 2**20).hex().encode()  # 10 MiB, incompressible
    ref = store.write("c-big", 1, eid(1), payload)
    assert store.read(ref.uri) == payload
    assert [t.bytes for t in store.stored("c-big")] == [len(payload)]


def test_a_missing_transcript_is_a_storage_error(store: PostgresStore) -> None:
    with pytest.raises(StorageError, match="not there"):
        store.get(TranscriptKey("c-1", transcript_name(1, eid(1))))


def test_listing_orders_by_conversation_then_revision(store: PostgresStore) -> None:
    revisions = [999_999_999_999, 5, 1_700_000_000_000, 40]
    for cid in ("b", "B", "a-1", "a"):  # code-point order, whatever the database's collation
        for r in revisions:
            store.write(cid, r, eid(r), b"x")
    listed = [(t.conversation_id, t.revision) for t in store.stored()]
    assert listed == [(c, r) for c in ("B", "a", "a-1", "b") for r in sorted(revisions)]
    assert [t.revision for t in store.stored("a")] == sorted(revisions)


# --- concurrency ---------------------------------------------------------------------------------


_FORKING_PROCESS = """
import json, os, sys
from worker.transcripts import open_store
store = open_store(sys.argv[1])
store.write("c-forked", 0, "%032x" % 0, b"before the fork")
children = []
for i in range(4):
    pid = os.fork()
    if pid == 0:  # the child: the same transcript as every sibling, then one of its own
        code = 0
        try:
            store.write("c-forked", 1, "%032x" % 1, b"the same bytes")
            store.write("c-forked", 100 + i, "%032x" % (100 + i), b"child %d" % i)
        except BaseException as exc:
            print(repr(exc), file=sys.stderr, flush=True)
            code = 1
        finally:
            store.close()
        os._exit(code)
    children.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
store.write("c-forked", 2, "%032x" % 2, b"after the fork")
print(json.dumps({"codes": codes, "revisions": [t.revision for t in store.stored("c-forked")]}))
store.close()
"""


def test_processes_forked_after_use_open_their_own_connections(database: str, table: str) -> None:
    """The parent's pool is open when it forks; each child opens its own and never closes
    the parent's sessions: afterwards the parent's store still works. (In a process of its
    own: forking this test process, with its many threads, could copy a lock some thread
    holds.)"""
    proc = subprocess.run(
        [sys.executable, "-c", _FORKING_PROCESS, f"{database}?table={table}"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["codes"] == [0] * 4, proc.stderr[-3000:]
    assert result["revisions"] == [0, 1, 2, 100, 101, 102, 103]


_FRESH_PROCESS = """
import pathlib, sys, time
from worker.transcripts import open_store
store = open_store(sys.argv[1])
gate = pathlib.Path(sys.argv[3])
(gate / f"ready-{sys.argv[2]}").touch()
deadline = time.monotonic() + 60
while not (gate / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
for r in range(5):
    store.write("c-procs", r, f"{r:032x}", b"the same bytes %d" % r)
store.write("c-procs", 1000 + int(sys.argv[2]), f"{int(sys.argv[2]):032x}", b"own")
store.close()
"""


def test_fresh_processes_creating_the_schema_at_once(
    database: str, table: str, tmp_path: Path
) -> None:
    """Four processes, released together, start on a table that does not exist yet: the
    schema is created once, every write succeeds, the version row says the newest version."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    url = f"{database}?table={table}"
    n = 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _FRESH_PROCESS, url, str(i), str(tmp_path)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    wait_until(
        lambda: len(list(tmp_path.glob("ready-*"))) == n or any(p.poll() for p in procs),
        timeout_s=120,
        what="the processes to be ready",
    )
    (tmp_path / "go").touch()
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * n, errors
    assert rows(database, f"SELECT version FROM {VERSIONS_TABLE} WHERE name = %s", table) == [
        (len(MIGRATIONS),)
    ]
    store = open_store(url)
    try:
        assert [t.revision for t in store.stored("c-procs")] == [*range(5), *range(1000, 1004)]
    finally:
        store.close()


# --- the schema ----------------------------------------------------------------------------------


def test_a_table_at_a_newer_version_is_used_as_it_is(database: str, table: str) -> None:
    """A newer release migrated the table (steps keep older releases working): no DDL, and
    the version row stays."""
    first = open_store(f"{database}?table={table}")
    first.write("c-1", 1, eid(1), b"x")
    first.close()
    with admin(database) as conn:
        conn.execute(f"UPDATE {VERSIONS_TABLE} SET version = 99 WHERE name = %s", (table,))
    later = open_store(f"{database}?table={table}")
    try:
        later.write("c-1", 2, eid(2), b"y")
        assert [t.revision for t in later.stored("c-1")] == [1, 2]
    finally:
        later.close()
    assert rows(database, f"SELECT version FROM {VERSIONS_TABLE} WHERE name = %s", table) == [(99,)]


def test_retention_index_exists(store: PostgresStore, database: str, table: str) -> None:
    store.stored()
    indexes = rows(database, "SELECT indexdef FROM pg_indexes WHERE tablename = %s", table)
    assert any("(created_at)" in d for (d,) in indexes), indexes


@pytest.mark.parametrize(
    "url",
    ["postgresql://h/db?table=Bad-Name", "postgresql://h/db?pool_size=0", "postgresql://h/db?x=1"],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        open_store(url)
    assert caught.value.key == "transcripts.url"


# --- retention -----------------------------------------------------------------------------------


def test_prune_by_age(store: PostgresStore, database: str, table: str) -> None:
    fill(store, "a", range(4))
    for t in store.stored("a"):
        set_created(database, table, t.key, NOW - (10 if t.revision < 2 else 1) * DAY)
    removed = store.prune(
        keep_per_conversation=None, max_age_s=7 * DAY, max_total_bytes=None, now=NOW
    )
    assert len(removed) == 2
    assert [t.revision for t in store.stored()] == [2, 3]


def test_prune_by_total_size_removes_oldest_first(
    store: PostgresStore, database: str, table: str
) -> None:
    a = fill(store, "a", range(3), size=100)
    b = fill(store, "b", range(3), size=100)
    order = [a[0], b[0], a[1], b[1], a[2], b[2]]
    by_uri = {t.uri: t for t in store.stored()}
    for i, uri in enumerate(order):
        set_created(database, table, by_uri[uri].key, NOW - 100 + i)
    removed = store.prune(keep_per_conversation=None, max_age_s=None, max_total_bytes=250, now=NOW)
    assert sorted(removed) == sorted(order[:4])
    assert sum(t.bytes for t in store.stored()) <= 250


def test_prune_all_limits_and_dry_run(store: PostgresStore, database: str, table: str) -> None:
    a = fill(store, "a", range(5), size=100)
    fill(store, "b", range(2), size=100)
    for t in store.stored():
        set_created(database, table, t.key, NOW - (30 if t.uri == a[0] else 1) * DAY)
    before = store.stored()

    def prune(dry_run: bool) -> list[str]:
        return store.prune(
            keep_per_conversation=4,
            max_age_s=7 * DAY,
            max_total_bytes=100_000,
            now=NOW,
            dry_run=dry_run,
        )

    assert prune(dry_run=True) == [a[0]]
    assert store.stored() == before
    assert prune(dry_run=False) == [a[0]]
    assert a[0] not in {t.uri for t in store.stored()}


def free_port() -> int:
    """Outside the ephemeral range: the forwarder stops and serves again on it, and a client
    retrying meanwhile cannot take it as its own local end (nor connect to itself there)."""
    return restartable_port()


class Forwarder:
    """A loopback TCP forwarder to the server: ``stop()`` drops every connection and refuses
    new ones (the server is unreachable), ``start()`` serves again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="module")
def forwarder() -> Iterator[Forwarder]:
    server = psycopg.conninfo.conninfo_to_dict(ADMIN_URL)
    fw = Forwarder((str(server.get("host", "127.0.0.1")), int(server.get("port", 5432))))
    fw.start()
    yield fw
    fw.stop()


def through(url: str, port: int) -> str:
    """``url`` with its server replaced by 127.0.0.1:``port`` (short connect timeout)."""
    scheme, rest = url.split("://", 1)
    credentials, _, location = rest.rpartition("@")
    path = location.split("/", 1)[1]
    joiner = "&" if "?" in path else "?"
    return f"{scheme}://{credentials}@127.0.0.1:{port}/{path}{joiner}connect_timeout=2"


def test_a_closed_port_is_a_storage_error_naming_the_server(database: str) -> None:
    port = free_port()  # nothing listens there
    store = open_store(through(database, port))
    try:
        with pytest.raises(StorageError) as caught:
            store.write("c-1", 1, eid(1), b"x")
    finally:
        store.close()
    message = caught.value.message
    assert f"127.0.0.1:{port}/{database.rsplit('/', 1)[1]}" in message, message
    assert "refused" in message.lower(), message
    assert "hunter2" not in message


def test_a_server_that_goes_away_and_comes_back(
    database: str, table: str, forwarder: Forwarder
) -> None:
    """Pooled connections die with the server; writes fail while it is gone and succeed once
    it is back, on the same store object."""
    store = open_store(through(database, forwarder.port) + f"&table={table}")
    try:
        store.write("c-1", 1, eid(1), b"one")
        forwarder.stop()
        try:
            with pytest.raises(StorageError, match="cannot write transcript"):
                store.write("c-1", 2, eid(2), b"two")
        finally:
            forwarder.start()
        wait_until(
            lambda: _writes(store, 3), timeout_s=60, what="a write after the server came back"
        )
        assert [t.revision for t in store.stored("c-1")] == [1, 3]
    finally:
        store.close()


def _writes(store: Any, revision: int) -> bool:
    try:
        store.write("c-1", revision, eid(revision), b"again")
    except StorageError:
        return False
    return True


@pytest.fixture
def app_role(database: str) -> Iterator[str]:
    """A login role with no rights on anything in the database."""
    role = f"compactor_test_{secrets.token_hex(4)}"
    with admin(database) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    yield role
    with admin(database) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_a_role_without_rights_then_granted(database: str, table: str, app_role: str) -> None:
    """Denied: a StorageError saying so. Granted row rights on a table an administrator
    created (no DDL rights at all): writes, reads and prunes work."""
    setup = open_store(f"{database}?table={table}")
    setup.stored()  # the administrator's store creates the table
    setup.close()
    url = f"{database}?table={table}".replace("postgres:hunter2@", f"{app_role}@")
    store = open_store(url)
    try:
        with pytest.raises(StorageError, match="permission denied"):
            store.write("c-1", 1, eid(1), b"x")
        with admin(database) as conn:
            conn.execute(f"GRANT SELECT ON {VERSIONS_TABLE} TO {app_role}")
            conn.execute(f"GRANT SELECT, INSERT, DELETE ON {table} TO {app_role}")
        store.write("c-1", 1, eid(1), b"x")
        store.write("c-1", 2, eid(2), b"y")
        assert store.enforce_count("c-1", 1) and [t.revision for t in store.stored()] == [2]
    finally:
        store.close()


def _compact(snap: dict[str, Any], store: Any) -> Any:
    parsed = parse_snapshot(snap, Settings())
    return Pipeline(parsed.settings, Adapters(store=store)).run(parsed)[-1]


def test_the_pipeline_fails_with_storage_unavailable_then_recovers(
    database: str, table: str, forwarder: Forwarder
) -> None:
    store = open_store(through(database, forwarder.port) + f"&table={table}")
    try:
        forwarder.stop()
        try:
            failed = _compact(tagged("c-pipe", 1, summary_max_output_tokens=300), store)
        finally:
            forwarder.start()
        assert failed.type == "compaction.failed", failed
        assert failed.error.code == STORAGE_ERROR and "cannot write" in failed.error.message
        done = wait_until(
            lambda: _completed(_compact(tagged("c-pipe", 2, summary_max_output_tokens=300), store)),
            timeout_s=60,
            what="a compaction after the server came back",
        )
        assert [t.revision for t in store.stored("c-pipe")] == [2]
        assert store.read(done.compaction.transcript.uri)
    finally:
        store.close()


def _completed(event: Any) -> Any:
    return event if event.type == "compaction.completed" else None


# --- a real worker -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, database: str, forwarder: Forwarder
) -> Iterator[Cluster]:
    """One worker for the module, whose store is reached through the forwarder."""
    url = through(database, forwarder.port) + "&table=worker_transcripts"
    shared = Cluster(
        tmp_path_factory.mktemp("pg-worker"),
        {
            "compaction": {"mode": "local_only"},
            "transcripts": {"url": url},
            # A store that is down costs up to two connect timeouts (2 s each) before it fails.
            "worker": {"summarize_time_limit_s": 20.0},
            "redis": {"visibility_timeout_s": 30},
        },
    )
    try:
        shared.workers.start("w", queues=ALL_QUEUES, concurrency=2)
        yield shared
    finally:
        shared.close()


def run(cluster: Cluster, snap: dict[str, Any]) -> Any:
    cluster.client.submit(snap)
    return cluster.wait_outcome(snap["conversation_id"], snap["revision"], timeout_s=90)


@pytest.mark.slow
def test_a_worker_writes_and_the_client_restores(cluster: Cluster, database: str) -> None:
    snap = tagged("c-worker", 1)
    event = run(cluster, snap)
    assert event.type == "compaction.completed", event
    ref = event.compaction.transcript
    assert ref.uri.startswith("postgresql://127.0.0.1:") and "/worker_transcripts/c-worker/" in (
        ref.uri
    )
    assert cluster.client.restore(event) == snap["messages"]  # sha256-checked
    assert cluster.client.restore("c-worker", revision=1) == snap["messages"]
    [(payload,)] = rows(
        database, "SELECT payload FROM worker_transcripts WHERE conversation_id = 'c-worker'"
    )
    assert hashlib.sha256(payload).hexdigest() == ref.sha256
    assert json.loads(payload)["messages"] == snap["messages"]


@pytest.mark.slow
def test_a_worker_whose_store_is_down(cluster: Cluster, forwarder: Forwarder) -> None:
    conv = "c-worker-down"
    assert run(cluster, tagged(conv, 1)).type == "compaction.completed"
    forwarder.stop()
    try:
        failed = run(cluster, tagged(conv, 2))
    finally:
        forwarder.start()
    assert failed.type == "compaction.failed", failed
    assert failed.error.code == STORAGE_ERROR, failed.error
    assert "cannot write transcript" in failed.error.message and "hunter2" not in (
        failed.error.message
    )
    completed = [e.revision for e in cluster.events(conv) if e.type == "compaction.completed"]
    assert completed == [1], "published without its transcript"
    after = tagged(conv, 3)
    event = run(cluster, after)
    assert event.type == "compaction.completed", event
    assert cluster.client.restore(event) == after["messages"]
