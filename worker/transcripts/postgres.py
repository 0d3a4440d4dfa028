"""The PostgreSQL store (``postgresql://user@host:5432/db``): one row per transcript.

Rows live in one table (``?table=``, default ``compactor_transcripts``) that the store creates
and migrates itself on first use in each process: the schema version of each table is a row of
``compactor_store_versions``, and a migration runs in one transaction under a transaction-level
advisory lock, so workers starting at once apply each step exactly once (DDL is transactional
in PostgreSQL: a step is applied whole or not at all). A process whose table is already at the
current version only reads that row, so a role that may only read and write rows works.

A write is one ``INSERT ... ON CONFLICT DO NOTHING`` committed on its own: create-only through
the primary key (conversation, name), and a reader sees the row whole or not at all. Sessions
run with ``synchronous_commit = on`` whatever the server's default, so the commit returns only
after its WAL record is flushed (durable unless the server itself runs with ``fsync = off``).
Listings select metadata only; the primary key orders them (columns in the "C" collation, so
the order is the code-point order the other stores list in) and an index on ``created_at``
serves the age limit.

Driver: psycopg 3, the maintained PostgreSQL adapter (its binary wheel bundles libpq), with
psycopg-pool, the same project's connection pool; the pool is thread-safe (``compactor serve``
reads from threads) and is opened lazily in each process, so a store built before a fork is
never shared with the child. Every psycopg error is converted here, once, into
:class:`~worker.errors.StorageError`, with a message naming the server and database (never
the password).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from worker.errors import ConfigError, StorageError, TranscriptConflict

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError:  # the optional extra is not installed: a configuration error, said once
    raise ConfigError(
        "transcripts.url", "postgresql:// needs the postgres extra (pip install '.[postgres]')"
    ) from None
from worker.transcripts import (
    StoredTranscript,
    TranscriptKey,
    TranscriptStore,
    valid_conversation_id,
)

__all__ = ["MIGRATIONS", "PostgresStore"]

DEFAULT_TABLE = "compactor_transcripts"
VERSIONS_TABLE = "compactor_store_versions"
DEFAULT_POOL_SIZE = 4
DEFAULT_CONNECT_TIMEOUT_S = 10
# Bounds every statement (a 10 MB transcript takes well under a second on a LAN); the URL's own
# ``options=-c statement_timeout=...`` comes later on the command line and wins.
STATEMENT_TIMEOUT = "60s"
DELETE_BATCH = 1000
_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")
# One lock for every store's schema work: migrations are rare, and one key also serializes
# creating the shared versions table.
_SCHEMA_LOCK = int.from_bytes(hashlib.sha256(b"compactor store schema").digest()[:8], "big") >> 1

#: Schema steps: ``MIGRATIONS[i]`` takes a table from version ``i`` to ``i + 1``. A shipped step
#: is never edited; the next one is appended. Steps must leave the previous release working
#: (add columns with defaults, add indexes), since workers of both run during an upgrade.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE IF NOT EXISTS {table} (
            conversation_id text COLLATE "C" NOT NULL,
            name text COLLATE "C" NOT NULL,
            revision bigint NOT NULL,
            payload bytea NOT NULL,
            sha256 text NOT NULL,
            bytes bigint NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (conversation_id, name)
        )""",
        "CREATE INDEX IF NOT EXISTS {created_index} ON {table} (created_at)",
    ),
)

# A pool opened in a parent process: its connections' sockets are shared with the parent, and
# closing (or garbage-collecting) them in a child would end the parent's sessions. A child
# keeps a reference to it and opens its own.
_INHERITED: list[ConnectionPool[Any]] = []


class PostgresStore(TranscriptStore):
    def __init__(self, conninfo: str, *, table: str = DEFAULT_TABLE, pool_size: int = 4) -> None:
        if not _TABLE_NAME.fullmatch(table):
            raise ConfigError(
                "transcripts.url", "table must be a lower-case SQL name of at most 48 characters"
            )
        if pool_size < 1:
            raise ConfigError("transcripts.url", "pool_size must be at least 1")
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.Error as exc:
            raise ConfigError("transcripts.url", f"not a PostgreSQL URL: {_reason(exc)}") from None
        self.conninfo = conninfo
        self.table = table
        self.pool_size = pool_size
        self.connect_timeout = int(params.get("connect_timeout") or DEFAULT_CONNECT_TIMEOUT_S)
        self._options = " ".join(
            (
                "-c synchronous_commit=on",
                f"-c statement_timeout={STATEMENT_TIMEOUT}",
                str(params.get("options") or ""),
            )
        ).strip()
        host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
        port = str(params.get("port") or os.environ.get("PGPORT") or 5432)
        database = str(params.get("dbname") or os.environ.get("PGDATABASE") or "")
        self.display = f"postgresql://{host}:{port}/{database}"
        self.uri_prefix = f"{self.display}/{table}"
        self._sql = {
            name: sql.SQL(text).format(table=sql.Identifier(table))
            for name, text in _STATEMENTS.items()
        }
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Any] | None = None
        self._pool_pid = 0
        self._schema_ready = False

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """``postgresql://[user[:password]@]host[:port]/db[?table=...&pool_size=...&<libpq>]``:
        ``table`` and ``pool_size`` are the store's; every other parameter goes to libpq
        (``sslmode``, ``connect_timeout``, ``options``...)."""
        parts = urlsplit(url)
        ours: dict[str, str] = {}
        theirs: list[tuple[str, str]] = []
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name in ("table", "pool_size"):
                ours[name] = value
            else:
                theirs.append((name, value))
        conninfo = urlunsplit(parts._replace(query=urlencode(theirs)))
        try:
            pool_size = int(ours.get("pool_size", DEFAULT_POOL_SIZE))
        except ValueError:
            raise ConfigError("transcripts.url", "pool_size must be a whole number") from None
        return cls(conninfo, table=ours.get("table", DEFAULT_TABLE), pool_size=pool_size)

    def uri_of(self, key: TranscriptKey) -> str:
        return f"{self.uri_prefix}/{key}"

    # --- primitives --------------------------------------------------------------------------

    def create(self, key: TranscriptKey, payload: bytes, digest: str) -> str:
        row = (key.conversation_id, key.name, key.revision, payload, digest, len(payload))
        with self._session("write transcript to") as conn:
            # Twice at most: a row that was there at the INSERT may be pruned before the SELECT.
            for _ in range(2):
                # Committed on its own (autocommit): durable once execute returns.
                if conn.execute(self._sql["insert"], row).rowcount == 1:
                    return self.uri_of(key)
                found = conn.execute(
                    self._sql["digest"], (key.conversation_id, key.name)
                ).fetchone()
                if found is not None:
                    break
        if found is None:
            raise StorageError(f"cannot write transcript to {self.uri_prefix}: removed meanwhile")
        if found[0] != digest:
            raise TranscriptConflict.of(key.name)
        return self.uri_of(key)

    def get(self, key: TranscriptKey) -> bytes:
        with self._session(f"read transcript {key} from") as conn:
            cursor = conn.cursor(binary=True)  # bytea as bytes on the wire, not hex text
            found = cursor.execute(self._sql["payload"], (key.conversation_id, key.name))
            row = found.fetchone()
        if row is None:
            raise StorageError(f"cannot read transcript {key} from {self.uri_prefix}: not there")
        return bytes(row[0])

    def stored(self, conversation_id: str | None = None) -> list[StoredTranscript]:
        with self._session("list transcripts in") as conn:
            if conversation_id is None:
                rows = conn.execute(self._sql["list_all"]).fetchall()
            else:
                valid_conversation_id(conversation_id)
                rows = conn.execute(self._sql["list_one"], (conversation_id,)).fetchall()
        found = []
        for cid, name, size, created in rows:
            key = TranscriptKey(cid, name)
            found.append(StoredTranscript(key, self.uri_of(key), int(size), float(created)))
        return found

    def delete(self, items: Iterable[StoredTranscript]) -> list[StoredTranscript]:
        wanted = {t.key: t for t in items}
        keys = list(wanted)
        removed: list[StoredTranscript] = []
        with self._session("remove transcripts from") as conn:
            for start in range(0, len(keys), DELETE_BATCH):
                batch = keys[start : start + DELETE_BATCH]
                # RETURNING names only the rows this statement removed: a racing prune that
                # removed one first gets it back, so each removal is reported once.
                rows = conn.execute(
                    self._sql["delete"],
                    ([k.conversation_id for k in batch], [k.name for k in batch]),
                ).fetchall()
                removed.extend(wanted[TranscriptKey(cid, name)] for cid, name in rows)
        return removed

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.close()

    # --- connections and the schema -----------------------------------------------------------

    @contextlib.contextmanager
    def _session(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection whose psycopg errors become one StorageError saying what
        could not be done where (``action`` reads ``cannot {action} {where}: ...``)."""
        try:
            pool = self._pool_for_this_process()
            with pool.connection(timeout=self.connect_timeout) as conn:
                if not self._schema_ready:
                    self._migrate(conn)
                yield conn
        except PoolTimeout:
            why = self._why_no_connection()
            raise StorageError(f"cannot {action} {self.uri_prefix}: {why}") from None
        except psycopg.Error as exc:
            raise StorageError(f"cannot {action} {self.uri_prefix}: {_reason(exc)}") from None

    def _why_no_connection(self) -> str:
        """Why the pool had no connection to give: its own attempts run in the background and
        only log their errors, so one direct attempt here finds the reason to report."""
        try:
            psycopg.connect(self.conninfo, **self._connect_kwargs()).close()
        except psycopg.Error as exc:
            return _reason(exc)
        return f"all {self.pool_size} connections stayed busy for {self.connect_timeout} s"

    def _connect_kwargs(self) -> dict[str, Any]:
        return {
            "autocommit": True,
            "connect_timeout": self.connect_timeout,
            "options": self._options,
        }

    def _pool_for_this_process(self) -> ConnectionPool[Any]:
        with self._lock:
            if self._pool is not None and self._pool_pid != os.getpid():
                _INHERITED.append(self._pool)
                self._pool, self._schema_ready = None, False
            if self._pool is None:
                self._pool = ConnectionPool(
                    self.conninfo,
                    kwargs=self._connect_kwargs(),
                    min_size=1,
                    max_size=self.pool_size,
                    timeout=self.connect_timeout,
                    # A connection broken while idle (a server restart) is replaced, not used.
                    check=ConnectionPool.check_connection,
                    num_workers=1,
                    name=f"compactor-transcripts-{self.table}",
                    open=True,
                )
                self._pool_pid = os.getpid()
            return self._pool

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Bring the table to the newest schema version (once per process)."""
        if self._version(conn) < len(MIGRATIONS):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {versions} (name text PRIMARY KEY,"
                        " version integer NOT NULL, migrated_at timestamptz NOT NULL)"
                    ).format(versions=sql.Identifier(VERSIONS_TABLE))
                )
                current = self._version(conn)  # again, under the lock: another may have won
                for step in MIGRATIONS[current:]:
                    for statement in step:
                        conn.execute(
                            sql.SQL(statement).format(
                                table=sql.Identifier(self.table),
                                created_index=sql.Identifier(f"{self.table}_created_at"),
                            )
                        )
                if current < len(MIGRATIONS):
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {versions} (name, version, migrated_at)"
                            " VALUES (%s, %s, now()) ON CONFLICT (name) DO UPDATE"
                            " SET version = EXCLUDED.version, migrated_at = now()"
                        ).format(versions=sql.Identifier(VERSIONS_TABLE)),
                        (self.table, len(MIGRATIONS)),
                    )
        self._schema_ready = True

    def _version(self, conn: psycopg.Connection[Any]) -> int:
        """The table's schema version (0: not created yet). Newer than this release knows is
        fine: steps keep the previous release working."""
        try:
            with conn.transaction():
                row = conn.execute(
                    sql.SQL("SELECT version FROM {versions} WHERE name = %s").format(
                        versions=sql.Identifier(VERSIONS_TABLE)
                    ),
                    (self.table,),
                ).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
        return int(row[0]) if row is not None else 0


_STATEMENTS = {
    "insert": (
        "INSERT INTO {table} (conversation_id, name, revision, payload, sha256, bytes)"
        " VALUES (%s, %s, %s, %b, %s, %s) ON CONFLICT (conversation_id, name) DO NOTHING"
    ),
    "digest": "SELECT sha256 FROM {table} WHERE conversation_id = %s AND name = %s",
    "payload": "SELECT payload FROM {table} WHERE conversation_id = %s AND name = %s",
    "list_all": (
        "SELECT conversation_id, name, bytes, extract(epoch FROM created_at)"
        " FROM {table} ORDER BY conversation_id, name"
    ),
    "list_one": (
        "SELECT conversation_id, name, bytes, extract(epoch FROM created_at)"
        " FROM {table} WHERE conversation_id = %s ORDER BY name"
    ),
    "delete": (
        "DELETE FROM {table} WHERE (conversation_id, name) IN"
        " (SELECT * FROM unnest(%s::text[], %s::text[])) RETURNING conversation_id, name"
    ),
}


def _reason(exc: psycopg.Error) -> str:
    """The server's or libpq's message, first line (never the connection string)."""
    diag = getattr(exc, "diag", None)
    primary = diag.message_primary if diag is not None else None
    text = primary or str(exc) or type(exc).__name__
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
