"""Hostile input (issue 6): every case of :mod:`hostile_cases` through the CLI and the broker.

CLI: ``worker.cli.main(["compact", FILE])``, the code ``python -m worker compact`` runs, for
every case in a fresh directory, each in its own process forked from one driver that imported
the CLI once (a sample also runs as separate ``python -m worker`` processes and must answer the
same), all under ``RLIMIT_AS`` = 2 GiB and reaped with ``wait4`` for their peak memory. A
rejected case exits 2 with one JSON line on stderr naming the field and reason, a handled one
exits 0 with its outcome event; neither leaves a traceback, takes long, or writes anything but
``transcripts/``.

Broker: one Redis and one real worker (under ``RLIMIT_AS``) for the whole corpus; each case is
submitted as raw bytes with ``Client.submit``. The client refuses what it checks itself (the
document, the id, the revision, the size), naming the field; the worker answers the rest with
``compaction.rejected`` or a normal outcome, and is still up afterwards.

Each batch (the forked CLI runs, the fresh-process sample, the broker's) runs once per test
session, in whichever pytest-xdist process first needs it (:mod:`shared_work`); every process
checks the same recorded outcomes.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.hostile_cases import (
    COMPLETED,
    FORGED_TEXT,
    HUGE_BYTES,
    HostileCase,
    hostile_cases,
)
from support.service_support import REPO_ROOT, Workers, client_for
from support.shared_work import once_per_session

from worker.backend.embedded import EmbeddedRedis, free_port
from worker.client import Client
from worker.config import load_settings, with_redis_url
from worker.errors import InvalidSnapshot
from worker.runtime.celery_app import make_app
from worker.summarize import SUMMARY_MARKER
from worker.wire.events import EVENT_ADAPTER, CompactionEvent, parse_event

CASES = hostile_cases()
BY_NAME = {c.name: c for c in CASES}
IDS = [c.name for c in CASES]

MEMORY_LIMIT = 2 << 30  # RLIMIT_AS of every CLI run
PEAK_RSS_LIMIT = 1 << 30  # what a run may actually use, at most
# Per case, in CPU seconds (user + system, from wait4): what the run itself cost, whatever else
# the machine was doing. Wall time only bounds a hang (HANG_S), generously.
CASE_CPU_S = 60.0
HANG_S = 900.0
PARALLEL = 2  # two CPUs here; more only adds contention
API_KEY_ENV = "COMPACTOR_HOSTILE_TEST_KEY"  # never set: no run may reach a real provider


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _tree(root: Path, *, skip: tuple[Path, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (outside ``skip``) with its size and mtime."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip]
        for name in filenames:
            st = (here / name).lstat()
            out[str((here / name).relative_to(root))] = (st.st_size, st.st_mtime_ns)
        for name in dirnames:
            out[str((here / name).relative_to(root)) + "/"] = (0, 0)
    return out


def _forbidden(case: HostileCase, *, cwd: Path, transcripts: Path) -> list[Path]:
    return [
        Path(p.format(cwd=cwd, transcripts=transcripts)).resolve(strict=False)
        for p in case.forbidden
    ]


def _transcript_files(transcripts: Path) -> list[Path]:
    return sorted(p for p in transcripts.rglob("*") if p.is_file()) if transcripts.exists() else []


def _etc_names() -> set[str]:
    return set(os.listdir("/etc"))


def _probe_names(case: HostileCase) -> set[str]:
    return {Path(p).name for p in case.forbidden if p.startswith("/etc/")}


# --- CLI -----------------------------------------------------------------------------------------


@dataclass
class CliRun:
    case: HostileCase
    cwd: Path
    code: int | None = None
    stdout: str = ""
    stderr: str = ""
    cpu_s: float = 0.0
    peak_rss: int = 0  # bytes
    tree_before: dict[str, tuple[int, int]] = field(default_factory=dict)
    tree_after: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def transcripts(self) -> Path:
        return self.cwd / "transcripts"

    def last_stderr_json(self) -> dict[str, Any]:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert lines, f"no error line on stderr (exit {self.code})"
        value: dict[str, Any] = json.loads(lines[-1])
        return value

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


def _cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _cli_config(dead_port: int) -> str:
    """Pins the LLM (only a snapshot's ``mode`` override would use it) to a closed loopback
    port, so no case can reach a real provider."""
    return f"""[llm]
base_url = "http://127.0.0.1:{dead_port}/v1"
api_key_env = "{API_KEY_ENV}"
timeout_s = 2.0
connect_timeout_s = 1.0
deadline_s = 4.0
max_retries = 0
"""


def _prepare(case: HostileCase, root: Path, config: str) -> tuple[CliRun, Path]:
    base = root / case.name
    cwd = base / "cwd"
    (cwd / "config").mkdir(parents=True)
    (cwd / "config" / "compactor.toml").write_text(config)
    snapshot = base / "snapshot.json"  # outside cwd: the run must not need to write near it
    with snapshot.open("wb") as f:
        for chunk in case.chunks():
            f.write(chunk)
    if case.size is not None:
        assert snapshot.stat().st_size == case.size
    run = CliRun(case=case, cwd=cwd)
    run.tree_before = _tree(base, skip=(cwd / "transcripts",))
    return run, snapshot


# Runs ``worker.cli.main(["compact", FILE])`` for many cases from one interpreter that imported
# the CLI once: it forks a child per case (``PARALLEL`` at a time), which changes into the case's
# directory, points fds 1 and 2 at files and exits with main()'s code; the driver reaps it with
# wait4 for its peak RSS. The children inherit the driver's RLIMIT_AS. Exactly the code
# ``python -m worker`` runs, without paying an interpreter start and the imports 100 times.
_FORK_DRIVER = r"""
import json, os, sys, time, traceback
import worker.cli, worker.pipeline, worker.wire.snapshots, worker.summarize.factory
import worker.summarize.llm, worker.transcripts
from worker.tokens import tokenizer_for
tokenizer_for("gpt-4.1").count("warm")
jobs, parallel = json.load(open(sys.argv[1])), int(sys.argv[2])
results, active = {}, {}

def child(job):
    os.chdir(job["cwd"])
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    code = 70
    try:
        code = worker.cli.main(["compact", job["snapshot"]])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

while jobs or active:
    while jobs and len(active) < parallel:
        job = jobs.pop(0)
        pid = os.fork()
        if pid == 0:
            child(job)
        active[pid] = (job["name"], time.monotonic())
    pid, status, usage = os.wait4(-1, 0)
    name, started = active.pop(pid)
    results[name] = {"code": os.waitstatus_to_exitcode(status),
                     "cpu_s": usage.ru_utime + usage.ru_stime, "maxrss": usage.ru_maxrss * 1024}
json.dump(results, sys.stdout)
"""


def _run_all(runs: list[tuple[CliRun, Path]], root: Path) -> None:
    """Every case through ``worker.cli.main`` in forked children of one driver process."""
    jobs = [
        {
            "name": run.case.name,
            "cwd": str(run.cwd),
            "snapshot": str(snapshot),
            "stdout": str(run.cwd.parent / "stdout"),
            "stderr": str(run.cwd.parent / "stderr"),
        }
        for run, snapshot in runs
    ]
    (root / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_DRIVER, str(root / "jobs.json"), str(PARALLEL)],
        cwd=root,
        env=_cli_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        preexec_fn=_limit_memory,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    (root / "jobs.json").unlink()
    for run, _snapshot in runs:
        result = results[run.case.name]
        run.code, run.cpu_s, run.peak_rss = result["code"], result["cpu_s"], result["maxrss"]
        _collect_output(run)


def _collect_output(run: CliRun) -> None:
    for name in ("stdout", "stderr"):
        path = run.cwd.parent / name
        setattr(run, name, path.read_text(errors="replace"))
        path.unlink()
    run.tree_after = _tree(run.cwd.parent, skip=(run.transcripts,))


def _run_fresh(runs: list[tuple[CliRun, Path]]) -> None:
    """Cases as a user runs them: a new ``python -m worker compact`` process each, ``PARALLEL``
    at a time, started and reaped (wait4, for the peak RSS) from this thread."""
    pending = list(runs)
    active: dict[int, tuple[CliRun, subprocess.Popen[bytes], float]] = {}
    while pending or active:
        while pending and len(active) < PARALLEL:
            run, snapshot = pending.pop(0)
            with (
                (run.cwd.parent / "stdout").open("wb") as out,
                (run.cwd.parent / "stderr").open("wb") as err,
            ):
                proc = subprocess.Popen(
                    [sys.executable, "-m", "worker", "compact", str(snapshot)],
                    cwd=run.cwd,
                    env=_cli_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    preexec_fn=_limit_memory,
                )
            active[proc.pid] = (run, proc, time.monotonic())
        pid, status, usage = os.wait4(-1, 0)
        if pid not in active:
            continue
        run, proc, _started = active.pop(pid)
        proc.returncode = run.code = os.waitstatus_to_exitcode(status)
        run.cpu_s = usage.ru_utime + usage.ru_stime
        run.peak_rss = usage.ru_maxrss * 1024
        _collect_output(run)


@dataclass(frozen=True)
class CliBatch:
    """Cases run through the CLI once for the session (:func:`shared_work.once_per_session`)."""

    runs: dict[str, CliRun]
    etc_before: set[str]  # the names in /etc before the batch ran


def _cli_record(run: CliRun) -> dict[str, Any]:
    return {
        "name": run.case.name,
        "cwd": str(run.cwd),
        "code": run.code,
        "stdout": run.stdout,
        "stderr": run.stderr,
        "cpu_s": run.cpu_s,
        "peak_rss": run.peak_rss,
        "tree_before": run.tree_before,
        "tree_after": run.tree_after,
    }


def _tree_of(record: dict[str, list[int]]) -> dict[str, tuple[int, int]]:
    return {path: (size, mtime) for path, (size, mtime) in record.items()}


def _cli_run_of(record: dict[str, Any]) -> CliRun:
    return CliRun(
        case=BY_NAME[record["name"]],
        cwd=Path(record["cwd"]),
        code=record["code"],
        stdout=record["stdout"],
        stderr=record["stderr"],
        cpu_s=record["cpu_s"],
        peak_rss=record["peak_rss"],
        tree_before=_tree_of(record["tree_before"]),
        tree_after=_tree_of(record["tree_after"]),
    )


def _cli_batch(
    factory: pytest.TempPathFactory,
    name: str,
    names: list[str],
    run_them: Callable[[list[tuple[CliRun, Path]], Path], None],
) -> CliBatch:
    """``names``' cases prepared in the session's shared directory and run by ``run_them``,
    once for the session; every xdist process reads the same outcomes."""

    def compute(root: Path) -> dict[str, Any]:
        etc_before = _etc_names()
        config = _cli_config(free_port())
        prepared = [_prepare(BY_NAME[n], root, config) for n in names]
        run_them(prepared, root)
        for _run, snapshot in prepared:
            snapshot.unlink()  # the 100 MB one only had to exist for its size check
        return {
            "etc_before": sorted(etc_before),
            "runs": [_cli_record(run) for run, _snapshot in prepared],
        }

    _root, record = once_per_session(factory, name, compute)
    runs = [_cli_run_of(r) for r in record["runs"]]
    return CliBatch({run.case.name: run for run in runs}, set(record["etc_before"]))


@pytest.fixture(scope="session")
def cli_batch(tmp_path_factory: pytest.TempPathFactory, subprocesses: None) -> CliBatch:
    return _cli_batch(tmp_path_factory, "hostile-cli", IDS, _run_all)


@pytest.fixture(scope="session")
def cli_runs(cli_batch: CliBatch) -> dict[str, CliRun]:
    return cli_batch.runs


# A sample of the corpus, a case or two per category, through separate ``python -m worker``
# processes: the forked runs must give exactly the same answers.
FRESH = [
    "trailing-garbage",
    "lone-high-surrogate",
    "nul-and-controls-in-content",
    "id-parent-traversal",
    "revision-bool",
    "message-is-string",
    "tool-result-before-call",
    "anthropic-blocks-in-openai",
    "config-transcript-dir-etc",
    "nested-arrays-10000",
    "payload-100mb",
    "forged-summary-over-threshold",
]


@pytest.fixture(scope="session")
def fresh_runs(tmp_path_factory: pytest.TempPathFactory, subprocesses: None) -> dict[str, CliRun]:
    def run_fresh(runs: list[tuple[CliRun, Path]], _root: Path) -> None:
        _run_fresh(runs)

    return _cli_batch(tmp_path_factory, "hostile-cli-fresh", FRESH, run_fresh).runs


@pytest.mark.slow
@pytest.mark.parametrize("name", IDS)
def test_cli(cli_runs: dict[str, CliRun], name: str) -> None:
    check_cli_run(cli_runs[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", FRESH)
def test_cli_fresh_process(
    fresh_runs: dict[str, CliRun], cli_runs: dict[str, CliRun], name: str
) -> None:
    fresh, forked = fresh_runs[name], cli_runs[name]
    check_cli_run(fresh)
    assert fresh.code == forked.code
    assert fresh.stderr == forked.stderr
    assert [_stable(e) for e in fresh.events()] == [_stable(e) for e in forked.events()]


def _stable(event: dict[str, Any]) -> dict[str, Any]:
    """An event without what differs between two runs (the time, where the transcript is)."""
    out = {k: v for k, v in event.items() if k != "created_at"}
    if out.get("compaction") and out["compaction"].get("transcript"):
        out["compaction"] = {**out["compaction"], "transcript": None}
    return out


def check_cli_run(run: CliRun) -> None:
    case = run.case
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.cpu_s < CASE_CPU_S, f"took {run.cpu_s:.1f} CPU seconds"
    assert 0 < run.peak_rss < PEAK_RSS_LIMIT, f"peak RSS {run.peak_rss >> 20} MiB"
    if case.expect == "rejected":
        assert run.code == 2, (run.code, run.stderr[-2000:])
        error = run.last_stderr_json()
        assert error.get("error") == "invalid_snapshot", error
        assert error.get("field") == case.field, error
        assert error.get("reason"), error
        assert case.reason.lower() in str(error["reason"]).lower(), error
        assert run.stdout == "", "a rejected snapshot publishes nothing"
        assert _transcript_files(run.transcripts) == [], "nothing is written for a rejection"
    else:
        assert run.code == 0, (run.code, run.stderr[-2000:])
        events = run.events()
        assert events, "a handled snapshot prints its outcome"
        for event in events:
            parse_event(event)
        assert events[-1]["type"] in case.outcomes, events[-1]
        assert events[-1]["conversation_id"] == case.conversation_id
        written = _transcript_files(run.transcripts)
        if case.outcomes == COMPLETED:
            uri = Path(events[-1]["compaction"]["transcript"]["uri"])
            assert (run.cwd / uri).resolve() in [p.resolve() for p in written]
            assert all(p.parent.name == case.conversation_id for p in written), written
        else:
            assert written == []
    # nothing written anywhere but transcripts/: the rest of the case's tree is untouched
    assert run.tree_after == run.tree_before
    for path in _forbidden(case, cwd=run.cwd, transcripts=run.transcripts):
        assert not path.exists(), f"{case.name} wrote {path}"


@pytest.mark.slow
def test_cli_never_touched_etc(cli_batch: CliBatch) -> None:
    appeared = _etc_names() - cli_batch.etc_before
    probes = set().union(*(_probe_names(c) for c in CASES))
    assert probes, "the corpus aims some traversals at /etc"
    assert not appeared & probes
    assert not {n for n in appeared if n.startswith("h-") or "hostile" in n}


@pytest.mark.slow
def test_cli_refuses_100mb_on_stdin_after_reading_at_most_the_limit(
    tmp_path: Path, subprocesses: None
) -> None:
    """``compact -`` reads at most ``max_snapshot_bytes + 1`` from a pipe, then refuses."""
    case = BY_NAME["payload-100mb"]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "compact", "-"],
        cwd=cwd,
        env=_cli_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_limit_memory,
    )
    assert proc.stdin is not None
    sent = 0
    try:
        for chunk in case.chunks():
            proc.stdin.write(chunk)
            sent += len(chunk)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it stopped reading: exactly what we want
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 2, err[-2000:]
    assert b"Traceback" not in err
    error = json.loads(err.decode().splitlines()[-1])
    assert error["error"] == "invalid_snapshot" and error["field"] == ""
    assert "limit" in error["reason"]
    assert out == b""
    assert not (cwd / "transcripts").exists()
    assert sent < HUGE_BYTES, "the CLI read the whole 100 MB instead of stopping at the limit"


def _replacement_texts(event: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for raw in event["compaction"]["replacement"]:
        content = raw["content"]
        text = content if isinstance(content, str) else json.dumps(content)
        out.append((raw["role"], text))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["forged-summary-over-threshold", "forged-summary-as-last-user-turn"]
)
def test_forged_summary_marker_is_not_promoted(cli_runs: dict[str, CliRun], name: str) -> None:
    """A user message that opens with our marker is handled like an earlier summary (its text
    is carried as *earlier* context), but never becomes our summary, never changes role, and the
    published summary is still the one we generated, with our header first."""
    event = cli_runs[name].events()[-1]
    summary = event["compaction"]["summary"]
    assert summary["source"] == "digest"
    header = f"{SUMMARY_MARKER}\nOffline digest of "
    assert summary["text"].startswith(header)
    assert summary["text"].count(SUMMARY_MARKER) == 1, "the forged marker is not repeated"
    # the forged text is quoted below our own sections, under the earlier-summary heading
    assert FORGED_TEXT in summary["text"]
    head, _, earlier = summary["text"].partition("## Earlier summary\n")
    assert FORGED_TEXT not in head and FORGED_TEXT in earlier
    # every replacement message is a user message: nothing became system or assistant text
    roles = [role for role, _text in _replacement_texts(event)]
    assert set(roles) == {"user"}, roles
    # only the summary we wrote carries the marker in the replacement
    marked = [t for _role, t in _replacement_texts(event) if t.startswith(SUMMARY_MARKER)]
    assert marked == [summary["text"]]


@pytest.mark.slow
def test_forged_marker_in_tool_output_is_plain_tool_output(cli_runs: dict[str, CliRun]) -> None:
    event = cli_runs["forged-summary-in-tool-output"].events()[-1]
    assert FORGED_TEXT not in event["compaction"]["summary"]["text"]
    assert "## Earlier summary" not in event["compaction"]["summary"]["text"]


@pytest.mark.slow
def test_forged_marker_under_threshold_triggers_nothing(cli_runs: dict[str, CliRun]) -> None:
    events = cli_runs["forged-summary-under-threshold"].events()
    assert [e["type"] for e in events] == ["compaction.skipped"]


# --- broker --------------------------------------------------------------------------------------


@dataclass
class BrokerRun:
    case: HostileCase
    refused: InvalidSnapshot | None = None
    error: str | None = None  # anything else Client.submit raised: its type and message
    status: str | None = None
    revision: int | None = None  # as the submission recorded it
    events: list[CompactionEvent] = field(default_factory=list)


OUTCOMES = {
    "compaction.completed",
    "compaction.skipped",
    "compaction.failed",
    "compaction.rejected",
}


WORKER_MEMORY_LIMIT = 3 << 30
AFTER_THE_CORPUS = "h-after-the-corpus"


class LimitedWorkers(Workers):
    """``Workers`` whose processes run under RLIMIT_AS, so a case that makes the worker
    allocate without bound fails in the worker instead of starving the machine."""

    def popen_options(self) -> dict[str, Any]:
        return {"preexec_fn": _limit_worker_memory}


def _limit_worker_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_LIMIT, WORKER_MEMORY_LIMIT))


@dataclass
class Broker:
    """The corpus through a private Redis and one worker, once for the session; what the
    worker showed once the corpus was through is recorded then, before anything else ran."""

    root: Path
    transcripts: Path
    etc_before: set[str]  # the names in /etc before the worker started
    tree_before: dict[str, tuple[int, int]]  # the batch's directory, outside what may change
    runs: dict[str, BrokerRun]
    # once every case had its outcome:
    running: bool  # the worker process had not exited
    log: str  # the worker's log
    me: str  # the worker's name
    ping_replies: list[dict[str, Any]]
    transcript_files: list[Path]
    tree_after: dict[str, tuple[int, int]]
    # then one more snapshot, submitted after the corpus:
    after_corpus_types: list[str]
    after_corpus_written: bool


def _not_watched(root: Path) -> tuple[Path, ...]:
    return (root / "transcripts", root / "logs", root / "redis-data")


def _submit(client: Client, run: BrokerRun) -> None:
    payload = run.case.build()
    try:
        result = client.submit(payload)
        run.status, run.revision = result.status, result.revision
    except InvalidSnapshot as exc:
        run.refused = exc
    except Exception as exc:  # recorded; the case's own test reports it
        run.error = f"{type(exc).__name__}: {exc}"


def _worker_busy(client: Client, app: Any, name: str) -> bool:
    """Task messages still queued in Redis, or running, reserved or scheduled in the worker.
    (Messages left unacknowledged by a crashed task do not count: nothing works on them.)"""
    r = client.state.client
    if any(int(r.llen(k)) for k in r.scan_iter(match="compactor.*", _type="list")):
        return True
    inspect = app.control.inspect(destination=[name], timeout=2.0)
    for ask in (inspect.active, inspect.reserved, inspect.scheduled):
        replies = ask() or {}
        if name not in replies or replies[name]:
            return True
    return False


def _await_outcomes(
    client: Client, app: Any, runs: list[BrokerRun], *, timeout_s: float = HANG_S
) -> None:
    """Poll until every run has an outcome, or the worker has had nothing to do for 5 s (a
    case that never gets an outcome then fails its own test instead of stalling the module).
    While the worker is busy, waiting goes on: on a loaded machine the CPU-heavy cases take
    minutes of wall time; ``timeout_s`` only bounds a hang."""
    waiting = [r for r in runs if r.status is not None]
    deadline = time.monotonic() + timeout_s
    idle_since: float | None = None
    name = f"hostile@{socket.gethostname()}"
    while waiting and time.monotonic() < deadline:
        for run in waiting:
            run.events = [e for _, e in client.events(run.case.conversation_id or "")]
        waiting = [r for r in waiting if not any(e.type in OUTCOMES for e in r.events)]
        if not waiting:
            break
        if _worker_busy(client, app, name):
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > 5.0:
            for run in waiting:  # one last look
                run.events = [e for _, e in client.events(run.case.conversation_id or "")]
            break
        time.sleep(0.1)


def _run_corpus(workers: Workers) -> dict[str, BrokerRun]:
    client = client_for(workers)
    app = make_app(client.settings)
    runs: dict[str, BrokerRun] = {}
    try:
        for case in CASES:
            runs[case.name] = BrokerRun(case)
            if not case.isolated:
                _submit(client, runs[case.name])
        _await_outcomes(client, app, list(runs.values()))
        for case in CASES:  # one at a time, once the rest is done
            if case.isolated:
                _submit(client, runs[case.name])
                _await_outcomes(client, app, [runs[case.name]])
        return runs
    finally:
        client.close()
        app.close()


def _ping(workers: Workers, me: str) -> list[dict[str, Any]]:
    app = make_app(with_redis_url(load_settings(workers.config, environ={}), workers.url))
    try:
        replies: list[dict[str, Any]] = app.control.ping(destination=[me], timeout=30.0) or []
        return replies
    finally:
        app.close()


def _submit_after_the_corpus(workers: Workers) -> list[str]:
    """One more compaction once the corpus is through: the event types it got."""
    client = client_for(workers)
    try:
        case = BY_NAME["forged-summary-message-id"]
        doc = json.loads(case.build())
        doc["conversation_id"] = AFTER_THE_CORPUS
        client.submit(doc)
        deadline = time.monotonic() + 60
        events: list[CompactionEvent] = []
        while time.monotonic() < deadline and not any(e.type in OUTCOMES for e in events):
            time.sleep(0.05)
            events = [e for _, e in client.events(AFTER_THE_CORPUS)]
        return [e.type for e in events]
    finally:
        client.close()


def _broker_run_record(run: BrokerRun) -> dict[str, Any]:
    return {
        "name": run.case.name,
        "refused": None if run.refused is None else [run.refused.field, run.refused.reason],
        "error": run.error,
        "status": run.status,
        "revision": run.revision,
        "events": [EVENT_ADAPTER.dump_python(e, mode="json") for e in run.events],
    }


def _broker_run_of(record: dict[str, Any]) -> BrokerRun:
    refused = record["refused"]
    return BrokerRun(
        case=BY_NAME[record["name"]],
        refused=None if refused is None else InvalidSnapshot(*refused),
        error=record["error"],
        status=record["status"],
        revision=record["revision"],
        events=[parse_event(e) for e in record["events"]],
    )


def _broker_batch(root: Path) -> dict[str, Any]:
    """Every case through a private Redis and one worker, then what the worker shows."""
    etc_before = _etc_names()
    transcripts = root / "transcripts"
    logs = root / "logs"
    logs.mkdir()
    config = root / "compactor.toml"
    config.write_text(f"""[compaction]
transcript_dir = "{transcripts}"
[llm]
base_url = "http://127.0.0.1:{free_port()}/v1"
api_key_env = "{API_KEY_ENV}"
max_retries = 0
[worker]
log_format = "text"
""")
    (root / "redis-data").mkdir()
    me = f"hostile@{socket.gethostname()}"
    with EmbeddedRedis(directory=root / "redis-data") as url:
        workers = LimitedWorkers(url, config, logs)
        try:
            workers.start("hostile", concurrency=4)
            tree_before = _tree(root, skip=_not_watched(root))
            runs = _run_corpus(workers)
            seen = {
                "running": workers.procs["hostile"].poll() is None,
                "log": workers.log("hostile"),
                "ping_replies": _ping(workers, me),
                "transcript_files": [str(p) for p in _transcript_files(transcripts)],
                "tree_after": _tree(root, skip=_not_watched(root)),
            }
            after_corpus_types = _submit_after_the_corpus(workers)
        finally:
            workers.stop_all()
    return {
        "etc_before": sorted(etc_before),
        "tree_before": tree_before,
        "runs": [_broker_run_record(run) for run in runs.values()],
        "me": me,
        **seen,
        "after_corpus_types": after_corpus_types,
        "after_corpus_written": (transcripts / AFTER_THE_CORPUS).is_dir(),
    }


@pytest.fixture(scope="session")
def broker_batch(tmp_path_factory: pytest.TempPathFactory, subprocesses: None) -> Broker:
    root, record = once_per_session(tmp_path_factory, "hostile-broker", _broker_batch)
    runs = [_broker_run_of(r) for r in record["runs"]]
    return Broker(
        root=root,
        transcripts=root / "transcripts",
        etc_before=set(record["etc_before"]),
        tree_before=_tree_of(record["tree_before"]),
        runs={run.case.name: run for run in runs},
        running=record["running"],
        log=record["log"],
        me=record["me"],
        ping_replies=record["ping_replies"],
        transcript_files=[Path(p) for p in record["transcript_files"]],
        tree_after=_tree_of(record["tree_after"]),
        after_corpus_types=record["after_corpus_types"],
        after_corpus_written=record["after_corpus_written"],
    )


@pytest.fixture(scope="session")
def broker_runs(broker_batch: Broker) -> dict[str, BrokerRun]:
    return broker_batch.runs


@pytest.mark.slow
@pytest.mark.parametrize("name", IDS)
def test_broker(broker_runs: dict[str, BrokerRun], broker_batch: Broker, name: str) -> None:
    case = BY_NAME[name]
    run = broker_runs[name]
    transcripts = broker_batch.transcripts
    assert run.error is None, f"Client.submit raised {run.error}"
    if case.client_refuses:
        assert run.refused is not None, f"the client sent it ({run.status})"
        assert run.refused.field == case.refused_field, run.refused.to_dict()
        assert run.refused.reason
        return
    assert run.refused is None, run.refused.to_dict()
    assert run.status == "queued", run.status
    assert run.revision == case.revision, "the submission recorded another revision"
    outcomes = [e for e in run.events if e.type in OUTCOMES]
    assert outcomes, f"no outcome for {case.conversation_id}: {[e.type for e in run.events]}"
    assert len(outcomes) == 1, [e.type for e in outcomes]
    event = outcomes[0]
    assert event.conversation_id == case.conversation_id
    assert event.revision == case.revision
    conv_dir = transcripts / (case.conversation_id or "")
    if case.expect == "rejected":
        assert event.type == "compaction.rejected", event
        assert event.error is not None and event.error.code == "invalid_snapshot"
        assert (event.error.field or "") == case.field, event.error
        assert event.error.message and event.reason
        assert case.reason.lower() in event.error.message.lower(), event.error
        assert not conv_dir.exists(), "nothing is written for a rejection"
    else:
        assert event.type in case.outcomes, (event.type, event.reason, event.error)
        if event.type == "compaction.completed":
            assert event.compaction is not None and event.compaction.transcript is not None
            uri = Path(event.compaction.transcript.uri).resolve()
            assert uri.parent == conv_dir.resolve() and uri.is_file()
    for path in _forbidden(case, cwd=transcripts.parent, transcripts=transcripts):
        assert not path.exists(), f"{case.name} wrote {path}"


@pytest.mark.slow
def test_broker_worker_still_answers(broker_batch: Broker) -> None:
    broker = broker_batch
    assert broker.running, broker.log[-3000:]
    me, replies = broker.me, broker.ping_replies
    assert any(me in reply for reply in replies), replies
    # every transcript lies under transcript_dir, in a directory of a handled case
    handled = {c.conversation_id for c in CASES if c.expect == "handled"}
    for path in broker.transcript_files:
        assert path.parent.parent == broker.transcripts and path.parent.name in handled, path
    appeared = _etc_names() - broker.etc_before
    assert not {n for n in appeared if n.startswith("h-") or "hostile" in n}
    # nothing was written in the batch's directory outside transcripts/ (and logs, Redis data)
    assert broker.tree_after == broker.tree_before


@pytest.mark.slow
def test_broker_worker_logged_no_traceback(broker_batch: Broker) -> None:
    """Every case ends in an event, not in a crashed task."""
    log = broker_batch.log
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:3000]


@pytest.mark.slow
def test_broker_still_compacts_after_the_corpus(broker_batch: Broker) -> None:
    assert broker_batch.after_corpus_types == ["compaction.completed"]
    assert broker_batch.after_corpus_written
