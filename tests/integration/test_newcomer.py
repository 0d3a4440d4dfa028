"""What a new user does first, as the README says it, from where a new user stands: the
service started with a config file whose ``transcript_dir`` is relative, and the README's
client block run from another directory, pointed at that file by ``COMPACTOR_CONFIG``. The
transcript the workers wrote is the one the client finds: both read the path relative to the
file, not to their own working directories."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.docs_runner import REPO_ROOT, blocks

pytestmark = pytest.mark.slow

README = REPO_ROOT / "README.md"
CLIENT_BLOCK_MARK = 'client.restore("demo-coding-1", revision=20)'


def readme_client_block() -> str:
    """The README's block that submits, waits for and restores through ``Client()``."""
    found = [b.text for b in blocks(README) if b.lang == "python" and CLIENT_BLOCK_MARK in b.text]
    assert len(found) == 1, f"the README has {len(found)} client blocks restoring by revision"
    return found[0]


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env | {"PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp_path / "tmp")}


def started_up(config: Path, cwd: Path, env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    with out.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "worker", "up", "--config", str(config)],
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def ready_url(proc: subprocess.Popen[bytes], out: Path, timeout_s: float = 180) -> str:
    """The Redis URL ``up`` announced, once it said its workers are ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        docs = [
            json.loads(line)
            for line in out.read_text().splitlines()
            if line.startswith("{") and line.endswith("}")
        ]
        if any(d.get("status") == "workers ready" for d in docs):
            return str(next(d["redis"] for d in docs if "redis" in d and "logs" in d))
        assert proc.poll() is None, out.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError("`compactor up` not ready:\n" + out.read_text()[-3000:])


def test_the_readme_client_block_finds_the_transcript_from_another_directory(
    tmp_path: Path,
    subprocesses: None,
) -> None:
    site, service, agent = tmp_path / "site", tmp_path / "service", tmp_path / "agent"
    for directory in (site, service, agent / "examples"):
        directory.mkdir(parents=True)
    config = site / "compactor.toml"
    config.write_text('[compaction]\ntranscript_dir = "transcripts"\n')  # relative, as users write
    shutil.copy(REPO_ROOT / "examples" / "coding-session.json", agent / "examples")
    script = agent / "client_block.py"
    script.write_text(readme_client_block())

    env = clean_env(tmp_path)
    up = started_up(config, service, env, tmp_path / "up.out")
    try:
        url = ready_url(up, tmp_path / "up.out")
        ran = subprocess.run(
            [sys.executable, str(script)],
            cwd=agent,  # not the service's directory, nor the config file's
            env=env | {"COMPACTOR_CONFIG": str(config), "COMPACTOR_REDIS_URL": url},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=120)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]  # restored by revision
    kept = list((site / "transcripts" / "demo-coding-1").glob("*.json"))
    assert kept, "the workers write beside the config file"
    for cwd in (service, agent):
        assert not (cwd / "transcripts").exists(), f"nothing is written relative to {cwd}"
