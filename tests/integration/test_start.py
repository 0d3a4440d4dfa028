"""What the commands say when they start, and what ``compactor serve`` refuses to start with.

Every long-running command (``serve``, ``worker``, ``beat``; ``up`` in test_up.py) says on
stderr, in one JSON line, which Redis and broker it uses (passwords masked) and where each URL
came from; the one-shot commands say it with ``--verbose`` only (their output is read by
scripts). ``serve`` with no API keys refuses to start unless authentication is explicitly off,
and then says so loudly and serves every request as one tenant. Real processes throughout: the
CLI in subprocesses, a real Redis with a password, HTTP over loopback."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from support.service_support import conversation

from worker.backend.embedded import EmbeddedRedis, free_port

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PASSWORD = "start-line-pw-7f3a"
KEY = "a-key-of-sixteen-chars-or-more"


@pytest.fixture(scope="module")
def protected(tmp_path_factory: pytest.TempPathFactory, subprocesses: None) -> Iterator[str]:
    """A Redis that wants a password; its URL, password included."""
    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis"), password=PASSWORD)
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


def clean_env(tmp_path: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    return env | {"PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp_path)} | more


def compactor(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=tmp_path,
        env=clean_env(tmp_path, **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@contextlib.contextmanager
def running(tmp_path: Path, *args: str, **env: str) -> Iterator[subprocess.Popen[str]]:
    """``python -m worker ARGS`` in its own session (stderr in ``tmp_path/err``), killed with
    everything it started at the end."""
    with (tmp_path / "err").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", *args],
            cwd=tmp_path,
            env=clean_env(tmp_path, **env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def start_line(tmp_path: Path, command: str) -> dict[str, Any]:
    """The start line ``command`` wrote to ``tmp_path/err`` (waiting for it)."""
    from support.fault_support import wait_until

    def found() -> dict[str, Any] | None:
        for line in (tmp_path / "err").read_text().splitlines():
            if line.startswith('{"command"'):
                doc: dict[str, Any] = json.loads(line)
                assert doc["command"] == command, doc
                return doc
        return None

    return wait_until(found, timeout_s=60, what=f"the start line of {command}", every_s=0.05)


# --- serve: no keys, no service --------------------------------------------------------------


def test_serve_without_api_keys_refuses_to_start(tmp_path: Path, protected: str) -> None:
    port = free_port()
    done = compactor(tmp_path, "serve", "--port", str(port), COMPACTOR_REDIS_URL=protected)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # it never listened
    (error,) = json_lines(done.stderr)
    assert error == {
        "error": "invalid_config",
        "key": "http.api_keys",
        "message": error["message"],
    }
    assert "COMPACTOR_API_KEYS" in error["message"] and "--no-auth" in error["message"]
    with contextlib.closing(redis.Redis.from_url(protected)) as client:
        assert client.dbsize() == 0  # nothing was written


def test_serve_refuses_keys_and_no_auth_together(tmp_path: Path, protected: str) -> None:
    keys = json.dumps({KEY: "acme"})
    done = compactor(
        tmp_path, "serve", "--no-auth", COMPACTOR_REDIS_URL=protected, COMPACTOR_API_KEYS=keys
    )
    assert done.returncode == 2, done.stderr
    (error,) = json_lines(done.stderr)
    assert error["error"] == "invalid_config" and error["key"] == "http.allow_unauthenticated"


@pytest.mark.parametrize("told", ["--no-auth", "COMPACTOR_HTTP_ALLOW_UNAUTHENTICATED"])
def test_serve_without_authentication_says_so_and_serves_everyone_as_one_tenant(
    tmp_path: Path, protected: str, told: str
) -> None:
    flag = [told] if told.startswith("--") else []
    env = {"COMPACTOR_REDIS_URL": protected}
    if not flag:
        env[told] = "true"
    with running(tmp_path, "serve", "--port", "0", *flag, **env) as proc:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        assert line, (tmp_path / "err").read_text()[-3000:]
        base = json.loads(line)["http"]
        start = start_line(tmp_path, "serve")
        assert start["auth"] == "OFF", start
        assert start["warning"].startswith("AUTHENTICATION IS OFF (" + told + ")"), start
        assert "'anonymous'" in start["warning"]
        port = protected.rsplit(":", 1)[1]
        assert (
            start["redis"] == f"redis://:***@127.0.0.1:{port}" and start["broker"] == start["redis"]
        )
        assert start["redis_from"] == "COMPACTOR_REDIS_URL", start

        snapshot = conversation("c-open", 1, window=100_000)
        with httpx.Client(base_url=base, timeout=30) as http:
            posted = http.post("/v1/conversations/c-open/snapshots", json=snapshot)
            assert posted.status_code == 202, posted.text  # no Authorization at all
            other = {"Authorization": "Bearer any-key-whatsoever-0123"}
            seen = http.get("/v1/conversations/c-open/events", headers=other)
            assert seen.status_code == 200, seen.text  # the same tenant, whatever the key
        with contextlib.closing(redis.Redis.from_url(protected)) as client:
            written = [k.decode() for k in client.scan_iter("*c-open*")]
        assert written and all("anonymous:c-open" in k for k in written), written
    logged = (tmp_path / "err").read_text()
    assert PASSWORD not in logged
    lines = json_lines(logged)  # stderr is JSON lines, uvicorn's own records too
    assert any(d.get("logger") == "uvicorn.error" for d in lines), lines
    with contextlib.closing(redis.Redis.from_url(protected)) as client:
        client.flushdb()


# --- which Redis: the long-running commands always say, the one-shot ones when asked ---------


@pytest.mark.parametrize("command", ["worker", "beat"])
def test_worker_and_beat_say_their_redis_and_where_it_came_from(
    tmp_path: Path, command: str, subprocesses: None
) -> None:
    closed = free_port()  # nothing listens: they only need to start
    config = tmp_path / "compactor.toml"
    config.write_text(f'[redis]\nurl = "redis://:{PASSWORD}@127.0.0.1:{closed}/3"\n')
    broker = f"amqp://guest:{PASSWORD}@127.0.0.1:{free_port()}//"
    with running(tmp_path, command, "--config", str(config), COMPACTOR_BROKER_URL=broker):
        start = start_line(tmp_path, command)
    assert start == {
        "command": command,
        "redis": f"redis://:***@127.0.0.1:{closed}/3",
        "redis_from": str(config),
        "broker": broker.replace(f":{PASSWORD}@", ":***@"),
        "broker_from": "COMPACTOR_BROKER_URL",
    }


def test_one_shot_commands_say_their_redis_only_when_asked(tmp_path: Path, protected: str) -> None:
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(conversation("c-said", 1)))
    quiet = compactor(tmp_path, "submit", str(snapshot), COMPACTOR_REDIS_URL=protected)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""  # piped: the output scripts read is unchanged
    said = compactor(tmp_path, "submit", "-v", str(snapshot), COMPACTOR_REDIS_URL=protected)
    assert said.returncode == 0, said.stderr
    (quietly,), (loudly,) = json_lines(quiet.stdout), json_lines(said.stdout)
    assert loudly.keys() == quietly.keys() and loudly["snapshot"] == str(snapshot)
    (start,) = json_lines(said.stderr)
    assert start["command"] == "submit" and start["redis_from"] == "COMPACTOR_REDIS_URL"
    assert PASSWORD not in said.stderr
    with contextlib.closing(redis.Redis.from_url(protected)) as client:
        client.flushdb()


def test_the_built_in_default_is_named_as_such() -> None:
    """Nothing configured: the commands would use a Redis on 127.0.0.1:6379 and say that it is
    the built-in default (in process: no command may touch the machine's Redis here)."""
    from worker.cli.common import redis_in_use
    from worker.config import load_settings

    assert redis_in_use(load_settings(None, environ={})) == {
        "redis": "redis://127.0.0.1:6379/0",
        "redis_from": "built-in default",
        "broker": "redis://127.0.0.1:6379/0",
        "broker_from": "redis (no [broker] url)",
    }
