"""``compactor up`` as a process: it supervises its children (a worker that dies is started
again, and answers again), and SIGTERM stops everything it started (workers, their pool
processes, the scheduler and the embedded Redis)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fault_support import wait_until

from worker.celery_app import make_app
from worker.config import load_settings, with_redis_url

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
UP = [sys.executable, "-m", "worker", "up"]


def json_lines(path: Path) -> list[dict[str, Any]]:
    docs = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line being written, or indented output
    return docs


def proc_state(pid: int) -> str | None:
    """The process' state letter from /proc (``Z`` for a zombie), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z")


def descendants(pid: int) -> set[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class Up:
    """A running ``python -m worker up`` with its stdout and stderr in files."""

    def __init__(self, tmp_path: Path) -> None:
        self.config = tmp_path / "compactor.toml"
        self.config.write_text(
            f'[compaction]\ntranscript_dir = "{tmp_path / "transcripts"}"\n\n'
            '[worker]\nlog_format = "text"\n'
        )
        self.stdout, self.stderr = tmp_path / "up.out", tmp_path / "up.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
        env["PYTHONPATH"] = str(REPO_ROOT)
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [*UP, "--config", str(self.config), "--workdir", str(tmp_path / "work")],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    def output(self) -> str:
        return f"stdout:\n{self.stdout.read_text()}\nstderr:\n{self.stderr.read_text()[-3000:]}"

    def wait_ready(self, timeout_s: float = 120) -> str:
        def ready() -> str | None:
            assert self.proc.poll() is None, f"up exited early: {self.output()}"
            docs = json_lines(self.stdout)
            if any(d.get("status") == "workers ready" for d in docs):
                return str(docs[0]["redis"])
            return None

        return wait_until(
            ready, timeout_s=timeout_s, what="`compactor up` to be ready", every_s=0.2
        )

    def started(self, role: str) -> list[int]:
        """The pids ``up`` started for ``role``, in order (its stderr log)."""
        return [
            int(d["pid"])
            for d in json_lines(self.stderr)
            if d.get("supervisor") == "started" and d.get("role") == role
        ]

    def kill(self) -> None:
        if self.proc.poll() is None:
            for pid in descendants(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    running = Up(tmp_path)
    try:
        yield running
    finally:
        running.kill()


def worker_pids(app: Any) -> dict[str, int]:
    """``{kind: pid}`` of the workers answering (node ``kind@host``)."""
    try:
        stats = app.control.inspect(timeout=1.0).stats() or {}
    except Exception:  # a broker blip: nobody answered this time
        return {}
    return {node.split("@")[0]: int(info["pid"]) for node, info in stats.items()}


def test_up_restarts_a_killed_worker_and_sigterm_stops_everything(up: Up) -> None:
    url = up.wait_ready()
    app = make_app(with_redis_url(load_settings(up.config, environ={}), url))
    try:

        def both() -> dict[str, int] | None:
            pids = worker_pids(app)
            return pids if {"evaluate", "summarize"} <= set(pids) else None

        answering = wait_until(both, timeout_s=60, what="both workers to answer")
        killed = answering["summarize"]
        assert up.started("summarize") == [killed]
        tree = descendants(up.proc.pid)
        assert killed in tree and answering["evaluate"] in tree
        assert len(up.started("beat")) == 1 and alive(up.started("beat")[0])

        os.kill(killed, signal.SIGKILL)

        def replaced() -> dict[str, int] | None:
            pids = both()
            return pids if pids and pids["summarize"] != killed else None

        restarted = wait_until(
            replaced,
            timeout_s=90,
            what="the summarize worker to be restarted and answer again",
            every_s=0.2,
        )
        assert restarted["evaluate"] == answering["evaluate"], "only the dead one is restarted"
        assert up.started("summarize") == [killed, restarted["summarize"]]
        exits = [
            d
            for d in json_lines(up.stderr)
            if d.get("supervisor") == "exited" and d.get("role") == "summarize"
        ]
        assert len(exits) == 1, exits
        assert exits[0]["pid"] == killed and exits[0]["returncode"] == -signal.SIGKILL
        assert exits[0]["restart_in_s"] > 0
    finally:
        app.close()

    everything = descendants(up.proc.pid)  # workers, pool processes, beat, redis-server
    assert len(everything) >= 4, everything
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(timeout=90) == 0, up.output()
    wait_until(
        lambda: not [pid for pid in everything if alive(pid)],
        timeout_s=30,
        what="every process `up` started to be gone",
    )
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    assert not [d for d in json_lines(up.stderr) if "error" in d], up.output()


def test_supervisor_backs_off_a_child_that_keeps_exiting_and_stop_ends_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.cli_service import Supervisor

    crash = [sys.executable, "-c", "import sys; sys.exit(3)"]
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    supervisor = Supervisor(
        [("crashing", crash), ("steady", sleeper)],
        env=dict(os.environ),
        logs=tmp_path,
        backoff_s=0.05,
        max_backoff_s=0.2,
        poll_s=0.01,
    )
    supervisor.start()
    try:
        steady = supervisor.pids()["steady"]

        def exits() -> list[dict[str, Any]]:
            docs = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
            seen.extend(d for d in docs if d["supervisor"] == "exited")
            return seen

        seen: list[dict[str, Any]] = []
        wait_until(lambda: len(exits()) >= 5, timeout_s=60, what="five exits of the crashing one")
    finally:
        supervisor.stop(timeout_s=10)
    assert {d["role"] for d in seen} == {"crashing"}
    assert all(d["returncode"] == 3 for d in seen)
    assert [d["restart_in_s"] for d in seen[:5]] == [0.05, 0.1, 0.2, 0.2, 0.2]
    assert not alive(steady)
