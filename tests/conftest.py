"""Shared fixtures: the real-conversation corpus (skipped where absent) and a CLI runner.

Tiers (support/tiers.py, README "Tests"): each test is marked ``fast``, ``integration`` or
``system`` from the fixtures it uses, never by hand. ``system``: a fault cluster
(fault_support), ``corpus_dir``, or the declaring ``system_scenario`` (long sessions, browser,
real model, separate hosts). ``integration``: any fixture of a process plugin (Redis, RabbitMQ,
S3, PostgreSQL, a stack, ...) or the declaring ``subprocesses``/``sockets``. ``fast``: the rest,
and ``-m fast`` fails a test that starts a process or connects a socket.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parent.parent

# The tiers (fast, integration, system) are derived from each test's fixtures, and the support
# modules whose fixtures start processes are registered only for the tiers that run them: see
# support/tiers.py. A test module imports only plain helpers from a support module, never a
# fixture (``from service_support import redis_server`` would give it its own copy, so a
# "session" Redis would start once per importing module in each xdist process).
pytest_plugins = ["support.tiers"]
CORPUS_ENV = "COMPACTOR_CORPUS_DIR"


# Shared, noisy machines: no property test fails because one example ran past Hypothesis's
# 200 ms deadline or its data was slow to generate. What the properties check is the same.
settings.register_profile(
    "shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("shared-machine")


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The real conversations: ``$COMPACTOR_CORPUS_DIR``, else ``../shared/corpus/swe-trajectories``
    beside the repository root. Skips (with the places looked at) when neither exists."""
    candidates = []
    if os.environ.get(CORPUS_ENV):
        candidates.append(Path(os.environ[CORPUS_ENV]))
    candidates.append(REPO_ROOT.parent / "shared" / "corpus" / "swe-trajectories")
    for path in candidates:
        if path.is_dir() and any(path.glob("*.json.gz")):
            return path
    pytest.skip(
        f"corpus not found (set ${CORPUS_ENV}, or put it at {candidates[-1]}); "
        "looked at: " + ", ".join(map(str, candidates))
    )


class CliResult(NamedTuple):
    code: int
    stdout: str
    stderr: str


class CliRunner:
    """Runs ``python -m worker ARGS`` in ``cwd`` with a clean ``COMPACTOR_*`` environment."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def __call__(
        self,
        *args: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        timeout_s: float = 120,
    ) -> CliResult:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), environ.get("PYTHONPATH", "")) if p
        )
        environ.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-m", "worker", *map(str, args)],
            cwd=self.cwd,
            env=environ,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)


class InProcessCliRunner(CliRunner):
    """Runs ``worker.cli.main(ARGS)`` (what ``python -m worker ARGS`` runs) in this process, as
    the process would: in ``cwd``, with a clean ``COMPACTOR_*`` environment plus ``env``, stdout
    and stderr captured (neither a terminal), the exit code from its return or ``SystemExit``.
    Everything it changed (directory, environment, the root logger it configures) is put back.
    For tests of what a command does, not of the interpreter's start (``timeout_s`` is not
    enforced: nothing here may hang)."""

    def __call__(
        self,
        *args: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        timeout_s: float = 120,
    ) -> CliResult:
        from worker.cli import main

        del timeout_s
        saved_environ, saved_cwd = dict(os.environ), os.getcwd()
        root = logging.getLogger()
        saved_logging = (root.handlers[:], root.level)
        out, err = io.StringIO(), io.StringIO()
        try:
            for key in [k for k in os.environ if k.startswith("COMPACTOR_")]:
                del os.environ[key]
            os.environ.update(env or {})
            os.chdir(self.cwd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main([str(a) for a in args])
                except SystemExit as exc:  # argparse's usage errors
                    code = exc.code if isinstance(exc.code, int) else 1
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_environ)
            root.handlers[:] = saved_logging[0]
            root.setLevel(saved_logging[1])
        return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def run_cli_in_process(tmp_path: Path) -> CliRunner:
    """:func:`run_cli`, each command run in this process (:class:`InProcessCliRunner`)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return InProcessCliRunner(cwd)


@pytest.fixture
def run_cli(tmp_path: Path, subprocesses: None) -> CliRunner:
    """``run_cli("compact", file) -> (code, stdout, stderr)``; ``run_cli.cwd`` is a fresh temp
    directory (so ``transcripts/`` and ``config/compactor.toml`` resolve inside it). Each command
    is a process: the integration tier."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return CliRunner(cwd)
