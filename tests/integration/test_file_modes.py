"""Everything the service writes is private to its user: files 0600, directories 0700.

``compactor up --workdir D`` is run for real, as ``make demo`` runs it (embedded Redis with AOF,
two workers, the scheduler, a submitted conversation followed to its outcome), under the
common umask 022, and then every file and directory under D is checked: the AOF holds
snapshots and events, the logs hold conversation ids, the schedule is the scheduler's state.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from worker.backend.embedded import EmbeddedRedis

REPO = Path(__file__).resolve().parent.parent.parent


def group_or_other_access(root: Path) -> list[str]:
    """Every path under root (root included) with any permission bit for group or others."""
    offenders = []
    for path in [root, *sorted(root.rglob("*"))]:
        mode = path.lstat().st_mode
        if stat.S_IMODE(mode) & 0o077:
            offenders.append(f"{stat.filemode(mode)} {path.relative_to(root.parent)}")
    return offenders


@pytest.mark.slow
def test_compactor_up_writes_nothing_group_or_world_accessible(
    tmp_path: Path, subprocesses: None
) -> None:
    workdir = tmp_path / "D"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env["COMPACTOR_TRANSCRIPT_DIR"] = str(workdir / "transcripts")  # demo.toml's is relative
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker",
            "up",
            "--workdir",
            str(workdir),
            "--config",
            str(REPO / "examples" / "demo.toml"),
            "--submit",
            str(REPO / "examples" / "coding-session.json"),
            "--until-done",
        ],
        cwd=tmp_path,
        env=env,
        umask=0o022,  # the common default; the service must not rely on a stricter one
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "demo-coding-1 revision 20: compaction.completed" in done.stdout

    names = {path.name for path in workdir.rglob("*")}
    assert any(name.startswith("appendonly") for name in names), names  # Redis's AOF
    assert any(name.startswith("compactor-beat-schedule") for name in names), names
    assert {"evaluate.log", "summarize.log", "beat.log", "redis.log"} <= names
    assert list((workdir / "transcripts").rglob("*.json")), "the conversation was compacted"
    assert group_or_other_access(workdir) == []


def test_embedded_redis_keeps_its_data_private_whatever_the_umask(
    tmp_path: Path, subprocesses: None
) -> None:
    data = tmp_path / "redis"
    data.mkdir(mode=0o755)  # made by an earlier version, say
    data.chmod(0o755)
    before = os.umask(0o022)
    try:
        with EmbeddedRedis(directory=data, appendonly=True) as url:
            client = redis.Redis.from_url(url)
            client.set("cw:snap:c-1", b"a snapshot")
            client.close()
    finally:
        os.umask(before)
    assert any(path.name.startswith("appendonly") for path in data.rglob("*"))
    assert group_or_other_access(data) == []
