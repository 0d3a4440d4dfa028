"""``compactor up`` as a process: it supervises its children (a worker that dies is started
again, and answers again), and SIGTERM stops everything it started (workers, their pool
processes, the scheduler and the embedded Redis). It refuses a port something else listens on
before starting anything, removes its temporary directory however it ends, and prints what
``make demo`` shows: each compaction's replacement in full and a line per conversation."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support.fault_support import wait_until

from worker.config import load_settings, with_redis_url
from worker.runtime.celery_app import make_app

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
UP = [sys.executable, "-m", "worker", "up"]
EXAMPLES = REPO_ROOT / "examples"


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


def up_env(tmp_path: Path) -> dict[str, str]:
    """A clean environment whose temporary directories are made under ``tmp_path/tmp``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env | {"PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp_path / "tmp")}


def temporary_dirs(tmp_path: Path) -> list[Path]:
    """The ``compactor-up-*`` directories in the environment's temporary directory."""
    return sorted((tmp_path / "tmp").glob("compactor-up-*"))


class Up:
    """A running ``python -m worker up`` with its stdout and stderr in files; ``--workdir``
    unless ``workdir`` is False (then in a temporary directory under ``tmp_path/tmp``)."""

    def __init__(self, tmp_path: Path, *, workdir: bool = True) -> None:
        self.config = tmp_path / "compactor.toml"
        self.config.write_text(
            f'[compaction]\ntranscript_dir = "{tmp_path / "transcripts"}"\n\n'
            '[worker]\nlog_format = "text"\n'
        )
        self.stdout, self.stderr = tmp_path / "up.out", tmp_path / "up.err"
        cmd = [*UP, "--config", str(self.config)]
        if workdir:
            cmd += ["--workdir", str(tmp_path / "work")]
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                cmd,
                cwd=tmp_path,
                env=up_env(tmp_path),
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
def up(tmp_path: Path, subprocesses: None) -> Iterator[Up]:
    running = Up(tmp_path, workdir=False)
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


def test_up_restarts_a_killed_worker_and_sigterm_stops_everything(up: Up, tmp_path: Path) -> None:
    url = up.wait_ready()
    (workdir,) = temporary_dirs(tmp_path)
    assert json_lines(up.stdout)[0]["logs"] == str(workdir / "logs")
    assert json_lines(up.stdout)[0]["removed_at_exit"] is True
    (start,) = [d for d in json_lines(up.stderr) if d.get("command") == "up"]
    assert start["redis"] == url and start["redis_from"] == "embedded", start
    assert start["broker"] == url and start["broker_from"] == "redis (no [broker] url)", start
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
    assert temporary_dirs(tmp_path) == [], "the temporary directory is removed on SIGTERM"
    said = stop_line(up.stderr)  # the last line, once everything it started is gone
    assert said["reason"] == "signal" and said["exit_code"] == 0, said
    assert said["message"].startswith("SIGTERM: stopped the evaluate and summarize workers")
    assert "the embedded Redis" in said["message"] and "temporary directory" in said["message"]


def stop_line(stderr: Path) -> dict[str, Any]:
    """``up``'s last stderr line: what stopped and why."""
    *_, last = json_lines(stderr)
    assert last.get("stopped") == "compactor up", last
    return last


def test_up_stops_and_says_so_when_its_embedded_redis_exits(up: Up, tmp_path: Path) -> None:
    """The one child ``up`` cannot restart: without its Redis nothing works, so it stops the
    rest and says why, instead of restarting workers that cannot connect."""
    url = up.wait_ready()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    everything = descendants(up.proc.pid)
    servers = [pid for pid in everything if f":{port}" in cmdline(pid) and "redis" in cmdline(pid)]
    assert len(servers) == 1, [cmdline(pid) for pid in everything]
    os.kill(servers[0], signal.SIGKILL)
    assert up.proc.wait(timeout=120) == 1, up.output()
    said = stop_line(up.stderr)
    assert said["reason"] == "redis_exited" and said["exit_code"] == 1, said
    assert "embedded Redis exited" in said["message"]
    wait_until(
        lambda: not [pid for pid in everything if alive(pid)],
        timeout_s=30,
        what="every process `up` started to be gone",
    )
    assert temporary_dirs(tmp_path) == []


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def test_supervisor_backs_off_a_child_that_keeps_exiting_and_stop_ends_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], subprocesses: None
) -> None:
    from worker.runtime.supervisor import Supervisor

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


def listening_socket() -> socket.socket:
    """Something else listening on a loopback port (``getsockname()[1]``)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    return sock


@pytest.mark.parametrize("flag", ["--redis-port", "--http-port"])
def test_up_refuses_a_port_in_use_before_starting_anything(
    tmp_path: Path, flag: str, subprocesses: None
) -> None:
    taken = listening_socket()
    port = taken.getsockname()[1]
    env = up_env(tmp_path) | {"COMPACTOR_API_KEYS": json.dumps({"k" * 16: "t1"})}
    try:
        done = subprocess.run(
            [*UP, flag, str(port)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        with pytest.raises(BlockingIOError):
            taken.accept()  # nobody connected to it: it was not joined
    finally:
        taken.close()
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # no Redis to announce, no workers
    (error,) = [json.loads(line) for line in done.stderr.splitlines()]
    assert error["error"] == "port_in_use", error
    assert f"{flag} {port}" in error["message"] and f"127.0.0.1:{port}" in error["message"]
    assert temporary_dirs(tmp_path) == []


def test_embedded_redis_never_joins_a_server_already_on_its_port(
    tmp_path: Path, subprocesses: None
) -> None:
    """Even past the check (another server binding in between), ``EmbeddedRedis`` makes sure the
    Redis answering on its port is its own process, and stops its own."""
    from worker.backend.embedded import EmbeddedRedis
    from worker.errors import UsageError

    with EmbeddedRedis(directory=tmp_path / "first") as url:
        first = redis.Redis.from_url(url)
        first.set("mine", "1")
        port = first.connection_pool.connection_kwargs["port"]
        second = EmbeddedRedis(directory=tmp_path / "second", port=port)
        with pytest.raises(UsageError) as caught:
            second.start()
        assert caught.value.code == "port_in_use" and f":{port}" in caught.value.message
        assert second.process is None, "its own redis-server is stopped"
        assert first.get("mine") == b"1" and first.dbsize() == 1  # untouched
        first.close()


def test_ctrl_c_during_start_up_stops_what_started_and_removes_the_temporary_directory(
    tmp_path: Path,
    subprocesses: None,
) -> None:
    running = Up(tmp_path, workdir=False)
    try:
        started = wait_until(
            lambda: json_lines(running.stdout),
            timeout_s=120,
            what="`compactor up` to announce its Redis",
            every_s=0.05,
        )
        url = started[0]["redis"]
        assert temporary_dirs(tmp_path), "the temporary directory exists while it runs"
        everything = descendants(running.proc.pid)
        running.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        code = running.proc.wait(timeout=90)
        ready = any(d.get("status") == "workers ready" for d in json_lines(running.stdout))
        assert code == (0 if ready else 130), running.output()  # 130: interrupted
        said = stop_line(running.stderr)
        assert said["reason"] == "signal" and said["exit_code"] == code, said
        assert said["message"].startswith("Ctrl-C (SIGINT): stopped "), said
        wait_until(
            lambda: not [pid for pid in everything if alive(pid)],
            timeout_s=30,
            what="every process `up` started to be gone",
        )
        with pytest.raises(redis.exceptions.ConnectionError):
            redis.Redis.from_url(url, socket_connect_timeout=1).ping()
        assert temporary_dirs(tmp_path) == []
    finally:
        running.kill()


def test_the_demo_shows_each_replacement_whole_and_a_line_per_conversation(
    tmp_path: Path,
    subprocesses: None,
) -> None:
    """``make demo``'s command, for two of its conversations: what the next request holds
    instead of the compacted range (the messages carried and the summary, whole), the reason of
    a skip, then one line per conversation; its temporary directory is gone at the end."""
    coding = EXAMPLES / "coding-session.json"
    short = EXAMPLES / "short-session.json"
    # The demo's transcript_dir is relative to its file: a copy keeps them under tmp_path.
    (tmp_path / "examples").mkdir()
    demo = tmp_path / "examples" / "demo.toml"
    demo.write_text((EXAMPLES / "demo.toml").read_text())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cmd = [*UP, "--config", str(demo), "--until-done"]
    done = subprocess.run(
        [*cmd, "--submit", str(coding), str(short)],
        cwd=elsewhere,  # not the config's directory: nothing is written here
        env=up_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "<5 messages>" not in out and '…"' not in out
    by_id = {m["id"]: m for m in json.loads(coding.read_text())["messages"]}
    assert "demo-coding-1 revision 20: compaction.completed" in out
    head = re.search(r"  ([\d,]+) → ([\d,]+) tokens: messages m2 … m19 \(18\) are replaced", out)
    assert head is not None, out
    for carried in ("m2", "m19"):  # the user's words, carried verbatim, every line of them
        for line in by_id[carried]["content"].splitlines():
            assert f"  │ {line}\n" in out, (carried, line)
    assert "  ┌ user (the summary)\n  │ [compaction-worker summary]\n" in out
    assert "## Errors seen" in out and "## Actions" in out  # the summary is not cut short
    assert "demo-short-1 revision 2: compaction.skipped: 25 tokens <= threshold" in out
    closing = out.rstrip("\n").splitlines()[-2:]  # in the order their first events came
    assert sorted(closing) == [
        f"demo-coding-1: {head.group(1)} → {head.group(2)} tokens (1 compaction)",
        "demo-short-1: 25 → 25 tokens (0 compactions)",
    ], out[-2000:]
    transcripts = load_settings(demo, environ={}).compaction.transcript_dir
    assert transcripts.is_relative_to(tmp_path), transcripts
    assert list((transcripts / "demo-coding-1").glob("*.json"))
    assert list(elsewhere.iterdir()) == []
    assert temporary_dirs(tmp_path) == [], "removed on a normal exit too"
    last = json.loads(done.stderr.splitlines()[-1])
    assert last["stopped"] == "compactor up" and last["reason"] == "until_done", last
    assert last["message"].startswith("--until-done: every submitted snapshot has its outcome")


def test_an_embedded_redis_that_exits_says_why_from_its_log(
    tmp_path: Path, subprocesses: None
) -> None:
    """A Redis Cluster node whose bus port is taken exits at once: the error carries the log's
    reason, not only where the log is."""
    from worker.backend.embedded import EmbeddedRedis, restartable_port
    from worker.errors import CompactorError

    port = restartable_port(also_offset=10000)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port + 10000))
        holder.listen()
        node = EmbeddedRedis(
            directory=tmp_path / "node", port=port, extra_args=("--cluster-enabled", "yes")
        )
        with pytest.raises(CompactorError) as caught:
            node.start()
    assert caught.value.code == "redis_start_failed"
    assert "Failed listening on port" in caught.value.message, caught.value.message
    assert "redis.log" in caught.value.message and node.process is None
