"""``compactor up --http-port``: ``compactor serve`` runs as a supervised child of ``up``,
logging JSON lines to ``http.log`` like the workers; without API keys ``up`` refuses to start
it (and anything else) unless told to run without authentication."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.fault_support import wait_until
from support.service_support import conversation
from test_up import UP, alive, descendants, json_lines, temporary_dirs, up_env

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
KEY = "key-for-the-up-test-0123"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_up_serves_http_and_restarts_it(tmp_path: Path, subprocesses: None) -> None:
    config = tmp_path / "compactor.toml"
    config.write_text(f'[compaction]\ntranscript_dir = "{tmp_path / "transcripts"}"\n')
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env |= {"PYTHONPATH": str(REPO_ROOT), "COMPACTOR_API_KEYS": json.dumps({KEY: "t1"})}
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    cmd = [sys.executable, "-m", "worker", "up", "--config", str(config)]
    cmd += ["--workdir", str(tmp_path / "work"), "--http-port", str(port)]
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=o, stderr=e)
    http = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {KEY}"}
    )

    def started() -> list[int]:
        docs = json_lines(err)
        return [
            int(d["pid"]) for d in docs if d.get("supervisor") == "started" and d["role"] == "http"
        ]

    def ready() -> bool:
        assert proc.poll() is None, err.read_text()[-3000:]
        with contextlib.suppress(httpx.HTTPError):
            return http.get("/readyz").status_code == 200
        return False

    try:
        wait_until(ready, timeout_s=90, what="/readyz from the serve child of up", every_s=0.3)
        snap = conversation("c-up", 1, window=100_000)
        r = http.post("/v1/conversations/c-up/snapshots", json=snap)
        assert r.status_code == 202, r.text

        def skipped() -> bool:
            r = http.get("/v1/conversations/c-up/events")
            return r.status_code == 200 and any(e["type"] == "compaction.skipped" for e in r.json())

        wait_until(skipped, timeout_s=60, what="the snapshot's outcome over HTTP")
        (first,) = started()
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: len(started()) == 2, timeout_s=30, what="serve to be restarted")
        wait_until(ready, timeout_s=60, what="the restarted serve to answer", every_s=0.3)
        everything = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, err.read_text()[-3000:]
        wait_until(
            lambda: not [p for p in everything if alive(p)],
            timeout_s=30,
            what="every process up started (serve too) to be gone",
        )
        (start,) = [d for d in json_lines(err) if d.get("command") == "up"]
        assert start["auth"] == "api_keys" and start["api_keys"] == 1, start
        http_log = (tmp_path / "work" / "logs" / "http.log").read_text().splitlines()
        logged = [json.loads(line) for line in http_log]  # every line is JSON
        assert [d["auth"] for d in logged if d.get("command") == "serve"] == ["api_keys"] * 2
        assert {"ts", "level", "logger", "message"} <= logged[-1].keys(), logged[-1]
        assert any(d.get("logger", "").startswith("uvicorn") for d in logged), logged
    finally:
        http.close()
        if proc.poll() is None:
            for pid in descendants(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()


def test_up_with_http_and_no_api_keys_refuses_before_starting_anything(
    tmp_path: Path, subprocesses: None
) -> None:
    port = free_port()
    done = subprocess.run(
        [*UP, "--http-port", str(port)],
        cwd=tmp_path,
        env=up_env(tmp_path),  # no COMPACTOR_API_KEYS
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (error,) = [json.loads(line) for line in done.stderr.splitlines()]  # nothing was started
    assert error["error"] == "invalid_config" and error["key"] == "http.api_keys", error
    assert "COMPACTOR_API_KEYS" in error["message"] and "--no-auth" in error["message"]
    assert temporary_dirs(tmp_path) == []
