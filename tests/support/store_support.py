"""Every transcript store, on real servers on loopback, for the tests that run once per store.

``store_url`` (a fixture) is a fresh, empty store of each kind in :data:`STORE_KINDS`, as the
URL ``[transcripts] url`` takes; ``store`` is that store opened. To run every per-store test
against another kind, add its name to :data:`STORE_KINDS` and a branch to :func:`fresh_store_url`
that returns an empty store's URL.

PostgreSQL is the machine's (``$COMPACTOR_TEST_POSTGRES_URL``, else 127.0.0.1:5432 as
``postgres``): one database per test session, created and dropped here, and a table per test.

The S3-compatible server is moto's (``moto[server]``), one process per test session on a free
port. moto checks ``If-None-Match: *`` and then stores, without a lock, so two concurrent
conditional writes could both succeed; the server here handles one request at a time, which
makes each request atomic, as AWS S3 is. Its objects live in memory: a restarted server is
empty (the fault tests that restart it create their bucket again).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from worker.backend.embedded import restartable_port
from worker.transcripts import TranscriptStore, open_store

#: The stores every per-store test runs against ("postgresql" joins here with its branch below).
STORE_KINDS = ["file", "s3", "postgresql"]

POSTGRES_ADMIN_URL = os.environ.get(
    "COMPACTOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

#: What the tests' S3 clients use (and the workers they start inherit): moto accepts any key.
S3_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "compactor-test",
    "AWS_SECRET_ACCESS_KEY": "compactor-test-secret",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
S3_UNSET = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def free_port() -> int:
    """Outside the ephemeral range: a server stopped and started again on it (S3 going away and
    coming back) cannot find it taken by some connection's local end meanwhile."""
    return restartable_port()


class S3Server:
    """moto's S3 in its own process on ``127.0.0.1:port``; :meth:`stop` and :meth:`start` again
    keep the port (an unavailable store that comes back). ``authenticate``: every request must
    carry credentials moto's IAM knows, and none are known, so each is refused (403)."""

    def __init__(self, logs: Path, *, authenticate: bool = False) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.logs = logs
        self.authenticate = authenticate
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        env = dict(os.environ)
        if self.authenticate:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        with (self.logs / f"s3-{self.port}.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(self.port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the S3 server exited: {self.log()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the S3 server did not listen within {timeout_s}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def log(self) -> str:
        return (self.logs / f"s3-{self.port}.log").read_text(errors="replace")

    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client("s3", endpoint_url=self.endpoint)

    def new_bucket(self, name: str | None = None) -> str:
        """A fresh, empty bucket (its name)."""
        bucket = name or f"t-{uuid.uuid4().hex[:16]}"
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        finally:
            client.close()
        return bucket

    def url(self, bucket: str, prefix: str = "transcripts") -> str:
        return f"s3://{bucket}/{prefix}?endpoint={self.endpoint}"


@pytest.fixture(scope="session")
def s3_environment() -> Iterator[None]:
    """Test credentials and region for boto3 in this process and every process it starts; no
    real AWS configuration leaks in."""
    saved = {k: os.environ.get(k) for k in (*S3_ENVIRONMENT, *S3_UNSET)}
    os.environ.update(S3_ENVIRONMENT)
    for k in S3_UNSET:
        os.environ.pop(k, None)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory, s3_environment: None) -> Iterator[S3Server]:
    """The session's S3-compatible server (moto), shared by every test: each uses its own
    bucket (:meth:`S3Server.new_bucket`)."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A database of this session's own on the machine's PostgreSQL; its URL, with a password
    that trust auth ignores (so tests can check it never shows). Skips where none answers."""
    psycopg = pytest.importorskip("psycopg", reason="needs the postgres extra")
    try:
        conn = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL at {POSTGRES_ADMIN_URL.rsplit('@', 1)[-1]}: {exc}")
    name = f"compactor_test_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE DATABASE {name}")
    base = POSTGRES_ADMIN_URL.partition("?")[0].rsplit("/", 1)[0]
    url = f"{base}/{name}".replace("://postgres@", "://postgres:hunter2@", 1)
    try:
        yield url
    finally:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
        conn.close()


def fresh_store_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a new, empty store of ``kind``."""
    if kind == "file":
        return (tmp_path / "transcripts").as_uri()
    if kind == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        return server.url(server.new_bucket())
    if kind == "postgresql":
        database: str = request.getfixturevalue("postgres_database")
        return f"{database}?table=t_{uuid.uuid4().hex[:8]}"
    raise ValueError(f"no test store of kind {kind!r}")


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of each kind (the test runs once per kind), as its URL."""
    return fresh_store_url(request.param, request, tmp_path)


@pytest.fixture
def store(store_url: str) -> Iterator[TranscriptStore]:
    """The store ``store_url`` names, opened (and closed after the test)."""
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()


def store_kind(url: str) -> str:
    return url.split("://", 1)[0]


# --- the S3 server process --------------------------------------------------------------------


def _serve(port: int) -> None:
    """moto's S3, one request at a time (see the module docstring), until killed."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    one_at_a_time = threading.Lock()

    def serialized(environ: Any, start_response: Any) -> list[bytes]:
        with one_at_a_time:
            body = app(environ, start_response)
            try:
                return [b"".join(body)]
            finally:
                getattr(body, "close", lambda: None)()

    server = make_server(
        "127.0.0.1", port, serialized, threaded=True, request_handler=MotoRequestHandler
    )
    server.serve_forever()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
