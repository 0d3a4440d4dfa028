"""Blocking reads wait as long as they were told: idle followers (``Client.events``,
``Client.aevents``, an SSE stream of ``compactor serve``) and the webhook delivery loop stay
quiet with Redis healthy, on a standalone Redis, a Redis Cluster and behind Sentinel, with the
newest redis-py our range allows (the suite's) and the lowest (installed apart, run in a
subprocess).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from support.blocking_support import check_blocking_reads, client_of, published
from support.cluster_support import SentinelServers
from support.follower_support import (
    AsyncFollower,
    Receiver,
    SseFollower,
    SyncFollower,
    wait_until,
    warnings_in,
)
from support.http_support import Stack
from support.service_support import REPO_ROOT

pytestmark = pytest.mark.slow

IDLE_S = 60.0  # how long the followers stay idle, with the default settings


def test_idle_followers_get_keep_alives_and_nothing_else(
    serve: Stack, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync, an async and an SSE follower and the webhook delivery loop, idle for a minute
    with the default settings (``block_ms`` 5 s, ``sse_keepalive_s`` 15 s, blocking reads of
    5 s in the webhook loop): the SSE stream carries keep-alive comments and nothing else, no
    log (the server's or this process') has a line in that time, and the event published
    afterwards reaches every follower and the webhook."""
    caplog.set_level(logging.INFO)
    client = client_of(serve.redis_url)
    conversation = "acme:idle-1"  # the tenant's conversation idle-1
    followers: list[Any] = []
    try:
        with serve.http() as http:
            hook = http.post(
                "/v1/webhooks", json={"url": receiver.url, "conversation_id": "idle-1"}
            )
            assert hook.status_code == 201, hook.text
        first = published(client, conversation, 1)  # the SSE route needs a known conversation
        wait_until(lambda: len(receiver.bodies) == 1, "the first webhook delivery")
        sync, asynchronous = SyncFollower(client, conversation), AsyncFollower(client, conversation)
        sse = SseFollower(serve, "idle-1")
        followers = [sync, asynchronous, sse]
        wait_until(lambda: all(len(f.events) == 1 for f in followers), "the followers' first event")
        server_log = serve.root / "logs" / "serve.log"
        logged_before, comments_before = server_log.stat().st_size, len(sse.comments)
        caplog.clear()

        idle_from = time.monotonic()
        wait_until(
            lambda: (
                time.monotonic() - idle_from >= IDLE_S
                or any(f.error is not None for f in followers)
            ),
            "the idle minute",
        )

        assert [f.error for f in followers] == [None, None, None]
        keep_alives = sse.comments[comments_before:]
        assert len(keep_alives) >= 2 and set(keep_alives) == {": keep-alive"}, keep_alives
        assert server_log.read_bytes()[logged_before:].decode() == ""
        assert warnings_in(caplog) == [] and [r.getMessage() for r in caplog.records] == []
        assert [len(f.events) for f in followers] == [1, 1, 1]

        second = published(client, conversation, 2)
        wait_until(
            lambda: all(len(f.events) == 2 for f in followers) and len(receiver.bodies) == 2,
            "the event published after the idle minute",
        )
        assert [e.event_id for e in sync.events] == [first.event_id, second.event_id]
        assert [e.event_id for e in asynchronous.events] == [first.event_id, second.event_id]
        assert [e["event_id"] for e in sse.events] == [first.event_id, second.event_id]
        assert [b["event_id"] for b in receiver.bodies] == [first.event_id, second.event_id]
        assert receiver.bodies[1]["conversation_id"] == "idle-1"
    finally:
        for follower in followers:
            follower.stop()
        client.close()


@pytest.mark.parametrize("topology", ["standalone", "cluster", "sentinel"])
def test_blocking_reads_wait_as_long_as_they_were_told(
    topology: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    subprocesses: None,
) -> None:
    """A read of 12 s (longer than any socket timeout in play) on each URL form, sync and
    async, waits all of it without an error or a warning, then delivers."""
    caplog.set_level(logging.WARNING)
    sentinel = None
    if topology == "standalone":
        url = request.getfixturevalue("redis_url")
    elif topology == "cluster":
        url = request.getfixturevalue("cluster_url")
    else:
        sentinel = SentinelServers(tmp_path)
        url = sentinel.start()
    try:
        check_blocking_reads(url)
    finally:
        if sentinel is not None:
            sentinel.stop()
    assert warnings_in(caplog) == []


# --- the lowest redis-py the range allows ---------------------------------------------------


def lowest_allowed_redis_py() -> str:
    """The lower bound of ``redis`` in pyproject.toml's dependencies."""
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    (spec,) = [r for r in map(Requirement, dependencies) if r.name == "redis"]
    (lowest,) = [s.version for s in spec.specifier if s.operator == ">="]
    return lowest


def installed_apart(version: str) -> Path:
    """``redis==version`` installed (with pip, once) in a directory of its own under
    ``.pytest_cache``; skips, with pip's reason, where it cannot be downloaded."""
    target = REPO_ROOT / ".pytest_cache" / f"redis-py-{version}"
    if (target / "redis").is_dir():
        return target
    partial = target.with_name(f"{target.name}.{os.getpid()}")  # pytest-xdist: one per process
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
            *("--timeout", "30", "--retries", "2", "--target", str(partial)),
            f"redis=={version}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"could not install redis=={version}: {proc.stderr.strip()[-500:]}")
    try:
        partial.rename(target)
    except OSError:  # another process got there first
        shutil.rmtree(partial, ignore_errors=True)
    return target


def test_blocking_reads_on_the_lowest_redis_py_allowed(
    redis_url: str, cluster_url: str, tmp_path: Path
) -> None:
    """The same check, in a process that imports the lowest redis-py the range allows (whose
    clients have no socket timeout by default, where the newest have 5 s), on the three URL
    forms at once."""
    version = lowest_allowed_redis_py()
    target = installed_apart(version)
    sentinel = SentinelServers(tmp_path)
    sentinel_url = sentinel.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
        env["PYTHONPATH"] = os.pathsep.join([str(target), str(REPO_ROOT)])
        urls = [redis_url, cluster_url, sentinel_url]
        proc = subprocess.run(
            [sys.executable, str(REPO_ROOT / "tests" / "support" / "blocking_support.py"), *urls],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
    finally:
        sentinel.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, *checked = proc.stdout.splitlines()
    ran = re.fullmatch(r"redis-py (\S+) from (.+)", first)
    assert ran is not None, first
    assert Version(ran[1]) == Version(version) and Path(ran[2]) == target / "redis" / "__init__.py"
    assert sorted(checked) == sorted(f"ok {u}" for u in urls)
    assert "WARNING" not in proc.stderr, proc.stderr
