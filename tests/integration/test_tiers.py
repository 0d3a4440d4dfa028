"""The tiers derived from fixtures, and the fast tier's guard (tests/support/tiers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import tiers

TESTS = Path(__file__).resolve().parent.parent

# A suite of its own, run with the tier plugin: what each test does, and whether ``-m fast``
# must let it pass. Each would pass without the guard (the socket has a listener).
GUARDED = """
import multiprocessing
import os
import socket
import subprocess


def test_pure():
    assert sum(range(4)) == 6


def test_runs_a_process():
    subprocess.run([os.sys.executable, "-c", "pass"], check=True)


def test_swallows_the_refusal():
    try:
        subprocess.run([os.sys.executable, "-c", "pass"], check=True)
    except Exception:
        pass


def test_connects_on_loopback():
    with socket.create_server(("127.0.0.1", 0)) as server:
        socket.create_connection(server.getsockname(), timeout=5).close()


def test_forks():
    process = multiprocessing.get_context("fork").Process(target=int)
    process.start()
    process.join()


def test_spawns():
    process = multiprocessing.get_context("spawn").Process(target=int)
    process.start()
    process.join()


def test_os_system():
    assert os.system("true") == 0


def test_declares_it(subprocesses):
    subprocess.run([os.sys.executable, "-c", "pass"], check=True)
"""
REFUSED = {
    "test_runs_a_process": "`subprocesses`",
    "test_swallows_the_refusal": "`subprocesses`",
    "test_connects_on_loopback": "`sockets`",
    "test_forks": "`subprocesses`",
    "test_spawns": "`subprocesses`",
    "test_os_system": "`subprocesses`",
}


def run_suite(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COMPACTOR_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def guarded_suite(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    fast: f\n    integration: i\n    system: s\n"
    )
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["support.tiers"]\n')
    (tmp_path / "test_guarded.py").write_text(textwrap.dedent(GUARDED))
    return tmp_path


def test_the_fast_tier_fails_a_test_that_starts_a_process_or_connects_a_socket(
    guarded_suite: Path, subprocesses: None
) -> None:
    fast = run_suite(guarded_suite, "-m", "fast")
    lines = fast.stdout.splitlines()
    for name, fixture in REFUSED.items():
        assert any(line.startswith("FAILED") and f"::{name}" in line for line in lines), (
            name,
            fast.stdout[-4000:],
        )
        assert f"request the {fixture} fixture" in fast.stdout
    assert any(line.startswith("PASSED") and "::test_pure" in line for line in lines)
    assert "1 deselected" in fast.stdout  # test_declares_it: the integration tier
    # Without the guard every one of them passes: the refusals are the guard's alone.
    unguarded = run_suite(guarded_suite, "-m", "fast or integration")
    assert unguarded.returncode == 0, unguarded.stdout[-4000:]
    assert f"{len(REFUSED) + 2} passed" in unguarded.stdout


def test_a_tier_follows_from_the_fixtures_through_any_depth() -> None:
    assert tiers.tier_of(["tmp_path", "monkeypatch"]) == "fast"
    assert tiers.tier_of(["tmp_path", "redis_url", "redis_server", "redis_process"]) == (
        "integration"
    )
    assert tiers.tier_of(["stack", "redis_server"]) == "integration"
    assert tiers.tier_of(["sockets"]) == tiers.tier_of(["subprocesses"]) == "integration"
    assert tiers.tier_of(["make_cluster", "redis_server"]) == "system"
    assert tiers.tier_of(["corpus_dir"]) == tiers.tier_of(["system_scenario"]) == "system"


def test_every_fixture_of_a_process_plugin_is_a_process_fixture() -> None:
    service = tiers.fixtures_defined_in("support.service_support")
    assert {"redis_process", "redis_server", "redis_url", "broker"} <= service
    assert service <= tiers.PROCESS_FIXTURES
    assert "make_cluster" in tiers.fixtures_defined_in("support.fault_support")  # named by name=


def test_each_test_carries_exactly_one_tier(request: pytest.FixtureRequest) -> None:
    marks = {mark.name for mark in request.node.iter_markers()}
    assert marks & {"fast", "integration", "system"} == {"fast"}


# Loaded into a collection of the real suite: which of the process and system plugins it holds.
PROBE = """
def pytest_collection_finish(session):
    from support.tiers import PROCESS_PLUGINS, SYSTEM_PLUGINS
    manager = session.config.pluginmanager
    held = sorted(m for m in PROCESS_PLUGINS + SYSTEM_PLUGINS if manager.has_plugin(m))
    print("PLUGINS", " ".join(held) or "none")
"""


@pytest.mark.parametrize(
    ("marks", "registered"), [("fast", False), ("integration", True), ("", True)]
)
def test_only_the_tiers_that_start_processes_register_the_process_plugins(
    tmp_path: Path, subprocesses: None, marks: str, registered: bool
) -> None:
    """The whole suite collected as ``make test-fast`` does (``-m fast`` over all of tests/):
    none of the plugins that start processes is even imported; any other run has them all."""
    (tmp_path / "tier_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COMPACTOR_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(TESTS), str(TESTS.parent)])
    selection = ["-m", marks] if marks else []
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist"),
            *("-p", "tier_probe", "--collect-only", "-q", *selection, str(TESTS)),
        ],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("PLUGINS ")]
    held = line.split()[1:]
    if registered:
        assert held == sorted(tiers.PROCESS_PLUGINS + tiers.SYSTEM_PLUGINS), line
    else:
        assert held == ["none"], line
