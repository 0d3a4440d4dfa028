"""Several hosts sharing only the broker, Redis and the object store.

Two network namespaces ("hosts" a and b) on a private bridge; Redis (broker and state) and an
S3-compatible server listen on the bridge only, so a host reaches nothing of this machine's
loopback and no disk of the other host (each runs in its own working directory, with its own
``transcript_dir`` that must stay empty). Host a runs the compaction workers; host b runs the
agent and the scheduler:

- an agent on b gets its conversation compacted on a, then recalls a replaced message, undoes
  the compaction and restores the transcript, all from the object store;
- the scheduled prune, run by beat and a maintenance worker on b, enforces retention on the
  transcripts a wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.hosts_support import Network, network
from support.service_support import REPO_ROOT, conversation, wait_for_outcome

from worker.backend.embedded import EmbeddedRedis, free_port
from worker.client import Client
from worker.config import load_settings
from worker.runtime.supervisor import celery_command

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

BUCKET = "cw-hosts"
PREFIX = "transcripts"
TESTS = Path(__file__).resolve().parent.parent


@dataclass
class Site:
    net: Network
    redis_url: str
    s3_endpoint: str
    root: Path

    def host_dir(self, host: str) -> Path:
        return self.root / f"host-{host}"

    def env(self, host: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPACTOR_", "AWS_"))}
        env.update(
            COMPACTOR_CONFIG=str(self.host_dir(host) / "compactor.toml"),
            COMPACTOR_REDIS_URL=self.redis_url,
            AWS_ENDPOINT_URL=self.s3_endpoint,
            AWS_ACCESS_KEY_ID="test-key",
            AWS_SECRET_ACCESS_KEY="test-secret",
            AWS_REGION="us-east-1",
            PYTHONPATH=str(REPO_ROOT),
        )
        return env

    def run(
        self, host: str, argv: list[str], *, extra_env: dict[str, str] | None = None, **popen: Any
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.net.run_prefix(host) + argv,
            cwd=self.host_dir(host),
            env={**self.env(host), **(extra_env or {})},
            start_new_session=True,
            **popen,
        )

    def s3(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            aws_access_key_id="test-key",
            aws_secret_access_key="test-secret",
            region_name="us-east-1",
        )

    def objects(self) -> list[str]:
        pages = self.s3().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _write_config(directory: Path, extra: str) -> None:
    directory.mkdir(parents=True)
    (directory / "compactor.toml").write_text(f"""
[compaction]
transcript_dir = "{directory / "local-transcripts"}"
summary_max_output_tokens = 300
max_persisted_transcripts = 10

[transcripts]
url = "s3://{BUCKET}/{PREFIX}"
{extra}

[worker]
log_format = "text"
""")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, system_scenario: None) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("hosts")
    with network(["a", "b"]) as net:
        s3 = moto_server.ThreadedMotoServer(ip_address=net.gateway, port=free_port())
        s3.start()
        try:
            with EmbeddedRedis(host=net.gateway, password="hosts-test-pw") as redis_url:
                here = Site(net, redis_url, f"http://{net.gateway}:{s3._port}", root)
                here.s3().create_bucket(Bucket=BUCKET)
                _write_config(here.host_dir("a"), "")
                # The scheduler's host carries the size limit: retention is the prune's, not
                # the writer's.
                _write_config(here.host_dir("b"), "max_total_bytes = 1\n")
                yield here
        finally:
            s3.stop()


@pytest.fixture(scope="module")
def workers_on_a(site: Site) -> Iterator[subprocess.Popen[bytes]]:
    log = (site.host_dir("a") / "worker.log").open("ab")
    proc = site.run(
        "a",
        celery_command(
            "worker",
            None,
            queues="compactor.evaluate,compactor.summarize",
            pool="threads",
            concurrency=4,
            name="host-a@%h",
            loglevel="INFO",
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_worker(site, "host-a", proc)
        yield proc
    finally:
        _stop(proc)
        log.close()


def _wait_for_worker(site: Site, name: str, proc: subprocess.Popen[bytes]) -> None:
    from worker.runtime.celery_app import make_app

    settings = load_settings(site.host_dir("a") / "compactor.toml", environ=site.env("a"))
    app = make_app(settings)
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"worker {name} exited"
            replies = app.control.ping(timeout=0.5) or []
            if any(n.startswith(f"{name}@") for r in replies for n in r):
                return
        raise AssertionError(f"worker {name} did not answer within 90 s")
    finally:
        app.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def _client(site: Site, host: str) -> Client:
    env = site.env(host)
    return Client(load_settings(Path(env["COMPACTOR_CONFIG"]), environ=env))


def test_the_hosts_share_no_loopback(site: Site) -> None:
    """The premise: host b cannot reach this machine's Redis on loopback, only the bridge."""
    connect = "import socket; socket.create_connection(('127.0.0.1', 6379), 3)"
    probe = [sys.executable, "-c", connect]
    assert site.run("b", probe, stderr=subprocess.DEVNULL).wait(timeout=30) != 0


def test_an_agent_on_b_recalls_and_undoes_what_a_compacted(
    site: Site, workers_on_a: subprocess.Popen[bytes]
) -> None:
    agent = site.run(
        "b",
        [sys.executable, str(TESTS / "hosts" / "agent_on_host.py"), str(TESTS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    job = {"conversation_id": "c-hosts-agent", "turns": 14}
    out, err = agent.communicate(json.dumps(job).encode(), timeout=180)
    assert agent.returncode == 0, err.decode()[-3000:]
    result = json.loads(out)
    assert "error" not in result, result
    assert result["transcript_uri"].startswith(f"s3://{BUCKET}/{PREFIX}/c-hosts-agent/")
    assert result["recalled"]["id"] == "r0"
    assert result["restored_ids"] == result["history_ids"]
    assert result["undone_ids"] == result["history_ids"]
    # Written on a, into the object store only: neither host's own disk holds a transcript.
    for host in ("a", "b"):
        assert not (site.host_dir(host) / "local-transcripts").exists()
    assert any("/c-hosts-agent/" in key for key in site.objects())


def test_the_prune_on_b_enforces_retention_for_what_a_wrote(
    site: Site, workers_on_a: subprocess.Popen[bytes]
) -> None:
    client = _client(site, "a")
    try:
        for cid in ("c-hosts-p1", "c-hosts-p2"):
            client.submit(conversation(cid, 14, window=6000))
            events = wait_for_outcome(client, cid, timeout_s=120)
            assert events[-1].type == "compaction.completed", events[-1]
    finally:
        client.close()
    written = [k for k in site.objects() if "/c-hosts-p" in k]
    assert len(written) == 2
    logs = site.host_dir("b") / "scheduler.log"
    with logs.open("ab") as log:
        # beat and a maintenance-only worker on b, pruning every second; a conversation's newest
        # transcript is kept while its compaction can still be undone (stream_ttl_s, here the
        # least, a minute): then it goes too
        every_second = {
            "COMPACTOR_WORKER_PRUNE_INTERVAL_S": "1",
            "COMPACTOR_REDIS_STREAM_TTL_S": "60",
        }
        commands = [
            celery_command("beat", None, workdir=site.host_dir("b")),
            celery_command(
                "worker", None, queues="compactor.maintenance", pool="threads", name="host-b@%h"
            ),
        ]
        procs = [
            site.run("b", argv, extra_env=every_second, stdout=log, stderr=subprocess.STDOUT)
            for argv in commands
        ]
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and site.objects():
                time.sleep(0.5)
        finally:
            for proc in procs:
                _stop(proc)
    # max_total_bytes = 1 on b: every transcript, all of them written on a, is pruned.
    assert site.objects() == [], logs.read_text(errors="replace")[-3000:]
