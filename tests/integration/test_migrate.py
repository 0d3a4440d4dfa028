"""``compactor transcripts migrate FROM TO`` and ``transcripts list`` as processes, between the
file store and S3 (moto's server on loopback): every kept transcript copied and verified, a
re-run skips what is there, a conflict is counted and never overwritten, a migration killed
mid-way and run again ends complete, and events published before it restore from the new
store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import REPO_ROOT
from support.store_support import S3Server
from test_cli import fixture, save, stdout_events

from worker.client import Client
from worker.config import load_settings
from worker.transcripts import TranscriptStore, open_store
from worker.wire.events import parse_event

if TYPE_CHECKING:
    from conftest import CliRunner

pytestmark = pytest.mark.slow


def eid(n: int) -> str:
    return f"{n:032x}"


def filled(url: str, conversations: int, revisions: int, size: int = 200) -> dict[str, bytes]:
    """Write transcripts into the store ``url`` names; return str(key) -> bytes."""
    store = open_store(url)
    written = {}
    try:
        for c in range(conversations):
            for r in range(revisions):
                payload = json.dumps({"c": c, "r": r, "pad": "x" * (size + c + r)}).encode()
                ref = store.write(f"c-{c}", r, eid(c * 1000 + r), payload)
                written[ref.uri.rsplit("/", 2)[-2] + "/" + ref.uri.rsplit("/", 1)[-1]] = payload
    finally:
        store.close()
    return written


def contents(url: str) -> dict[str, bytes]:
    store = open_store(url)
    try:
        return {str(t.key): store.get(t.key) for t in store.stored()}
    finally:
        store.close()


def summary(stdout: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return value


@pytest.fixture
def s3_url(s3_server: S3Server) -> str:
    return s3_server.url(s3_server.new_bucket())


@pytest.mark.parametrize("direction", ["file-to-s3", "s3-to-file"])
def test_migrate_copies_everything_verified_and_a_rerun_skips(
    run_cli: CliRunner, tmp_path: Path, s3_url: str, direction: str
) -> None:
    file_url = (tmp_path / "files").as_uri()
    source, target = (file_url, s3_url) if direction == "file-to-s3" else (s3_url, file_url)
    written = filled(source, conversations=3, revisions=4)
    first = run_cli("transcripts", "migrate", source, target)
    assert first.code == 0, first.stderr
    result = summary(first.stdout)
    assert (result["total"], result["copied"], result["skipped"], result["conflicts"]) == (
        12,
        12,
        0,
        0,
    )
    assert result["bytes"] == sum(map(len, written.values()))
    assert contents(target) == written
    progress = [json.loads(line) for line in first.stderr.splitlines()]
    assert progress[-1]["done"] == 12  # no terminal: JSON progress lines, the last at the end
    again = run_cli("transcripts", "migrate", source, target)
    assert again.code == 0, again.stderr
    assert summary(again.stdout) | {"conflicting": []} == result | {
        "copied": 0,
        "skipped": 12,
        "bytes": 0,
    }
    listed = run_cli("transcripts", "list", "--url", target, "--conversation", "c-1")
    assert listed.code == 0, listed.stderr
    assert [json.loads(line)["revision"] for line in listed.stdout.splitlines()] == [0, 1, 2, 3]


def test_a_conflict_in_the_target_is_counted_and_never_overwritten(
    run_cli: CliRunner, tmp_path: Path, s3_url: str
) -> None:
    source = (tmp_path / "files").as_uri()
    written = filled(source, conversations=1, revisions=3)
    target: TranscriptStore = open_store(s3_url)
    try:
        target.write("c-0", 1, eid(1), b"another history")
    finally:
        target.close()
    result = run_cli("transcripts", "migrate", source, s3_url)
    assert result.code == 1, result.stderr  # the work is not complete
    out = summary(result.stdout)
    assert (out["copied"], out["skipped"], out["conflicts"]) == (2, 0, 1)
    conflicting = out["conflicting"]
    assert len(conflicting) == 1 and conflicting[0].startswith("c-0/000000000000000001-")
    kept = contents(s3_url)
    assert kept[conflicting[0]] == b"another history"
    assert {k: v for k, v in kept.items() if k != conflicting[0]} == {
        k: v for k, v in written.items() if k != conflicting[0]
    }


def test_a_killed_migration_run_again_is_complete(tmp_path: Path, s3_url: str) -> None:
    """SIGKILL once a progress line says some were copied; the next run copies the rest and
    skips (after comparing) at least what the killed one had reported."""
    source = (tmp_path / "files").as_uri()
    written = filled(source, conversations=12, revisions=10, size=1000)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    cmd = [sys.executable, "-m", "worker", "transcripts", "migrate", source, s3_url]
    proc = subprocess.Popen(
        [*cmd, "--progress-every", "5"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        reported = json.loads(proc.stderr.readline())
        assert reported["copied"] >= 5
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    partial = contents(s3_url)
    assert len(partial) >= reported["copied"]
    assert all(written[k] == v for k, v in partial.items())  # whole or absent, never partial
    rerun = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    out = summary(rerun.stdout)
    assert out["skipped"] == len(partial) >= reported["copied"]
    assert out["copied"] + out["skipped"] == len(written) and out["conflicts"] == 0
    assert contents(s3_url) == written


@pytest.mark.parametrize("direction", ["file-to-s3", "s3-to-file"])
def test_events_published_before_a_migration_restore_from_the_new_store(
    run_cli: CliRunner, tmp_path: Path, s3_url: str, direction: str
) -> None:
    file_url = (tmp_path / "files").as_uri()
    old, new = (file_url, s3_url) if direction == "file-to-s3" else (s3_url, file_url)
    snapshot = fixture("openai")
    compacted = run_cli("compact", save(run_cli, snapshot), env={"COMPACTOR_TRANSCRIPTS_URL": old})
    assert compacted.code == 0, compacted.stderr
    [event] = [
        parse_event(e) for e in stdout_events(compacted) if e["type"] == "compaction.completed"
    ]
    uri = event.compaction.transcript.uri  # type: ignore[union-attr]
    assert uri.startswith("s3://") == old.startswith("s3://")  # written to the old store
    moved = run_cli("transcripts", "migrate", old, new)
    assert moved.code == 0, moved.stderr
    assert summary(moved.stdout)["copied"] == 1
    # A client configured with the new store (Redis is never contacted for a restore).
    environ = {"COMPACTOR_TRANSCRIPTS_URL": new, "COMPACTOR_REDIS_URL": "redis://127.0.0.1:1/0"}
    client = Client(load_settings(None, environ=environ))
    try:
        assert client.restore(event) == snapshot["messages"]  # type: ignore[arg-type]
        assert client.restore(snapshot["conversation_id"]) == snapshot["messages"]
    finally:
        client.close()
