"""The suite's three tiers, derived from the fixtures each test uses, and the fast tier's guard.

A marker typed by hand drifts from what the test does; one derived from the fixtures cannot. At
collection every test gets exactly one of:

``system``
    its fixtures (directly or through other fixtures) include a *system* fixture: one defined in
    a system plugin (:data:`SYSTEM_PLUGINS`: the fault clusters), ``corpus_dir`` (the real
    conversations), or the declaring fixture ``system_scenario`` (long sessions, the browser, the
    real model, separate network hosts: scenarios of minutes that need more than the package).
``integration``
    else they include a *process* fixture: one defined in a process plugin
    (:data:`PROCESS_PLUGINS`: Redis, RabbitMQ, the S3 server, PostgreSQL, a running stack, ...)
    or the declaring fixtures ``subprocesses`` (the test starts a process itself: ``compactor``,
    node, a CLI helper) and ``sockets`` (it connects a socket, also on loopback, also to a
    server it runs in a thread such as :class:`worker.testing.standin_llm.StandinLLM`).
``fast``
    everything else: no process, no socket to anything, only the package in this interpreter.

A local fixture that starts a process or a server names the declaring fixture among its
parameters (``def llm(sockets: None) -> Iterator[StandinLLM]``), so every test using it follows.

The guard: in a run of exactly ``-m fast`` (``make test-fast``) a test that starts a process
(``subprocess``, ``os.fork``/``posix_spawn``/``system``, ``multiprocessing``) or connects a socket
fails, with a message naming the fixture to request; the attempt itself raises
:class:`FastTierViolation` (and the test fails even where the code under test swallows that).
Neither a run of exactly ``-m fast`` (``make test-fast``, over the whole of ``tests/``) nor a run
of ``tests/unit`` alone (the fast tier's folder) registers the process plugins, so the fast tier
does not even import their fixtures. A test that parametrizes one of their fixtures
(``indirect``) names it among its own parameters, so that its module still collects without
them (tests/integration/test_tiers.py checks both). Module imports at collection are not
guarded.
"""

from __future__ import annotations

import _posixsubprocess
import ast
import importlib.util
import os
import socket
import subprocess
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any

import pytest

#: Modules whose fixtures start processes or servers, in import order (each is registered,
#: so its asserts are rewritten, before another support module imports it).
PROCESS_PLUGINS = [
    "support.service_support",
    "support.cluster_support",
    "support.http_support",
    "support.store_support",
    "support.follower_support",
]
#: Modules whose fixtures build whole fault scenarios (a cluster of workers to break).
SYSTEM_PLUGINS = ["support.fault_support"]

#: Declaring fixtures: a test (or fixture) that starts processes or connects sockets itself.
SUBPROCESSES, SOCKETS = "subprocesses", "sockets"
#: Declaring fixture of the system kind, and the other system fixtures outside the plugins.
SYSTEM_SCENARIO = "system_scenario"
SYSTEM_FIXTURES = frozenset({SYSTEM_SCENARIO, "corpus_dir"})

FAST_ONLY = "fast"  # the -m expression that switches the guard on
UNIT_DIR = "unit"  # tests/unit: the fast tier's folder (once the tests are moved into tiers)


def fixtures_defined_in(module: str) -> set[str]:
    """The fixture names ``module`` defines, read from its source (the module is not imported:
    the fast tier classifies tests without loading what starts processes)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"tier plugin {module!r} not found on sys.path")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if ast.unparse(target) not in ("pytest.fixture", "fixture"):
                continue
            renamed = [k.value for k in call.keywords if k.arg == "name"] if call else []
            if renamed and isinstance(renamed[0], ast.Constant):
                names.add(str(renamed[0].value))
            else:
                names.add(node.name)
    return names


def _defined(modules: Iterable[str]) -> frozenset[str]:
    return frozenset(name for module in modules for name in fixtures_defined_in(module))


PROCESS_FIXTURES = _defined(PROCESS_PLUGINS) | {SUBPROCESSES, SOCKETS}
SYSTEM_FIXTURES = SYSTEM_FIXTURES | _defined(SYSTEM_PLUGINS)


def tier_of(fixturenames: Iterable[str]) -> str:
    """The tier of a test whose fixture closure is ``fixturenames``."""
    names = set(fixturenames)
    if names & SYSTEM_FIXTURES:
        return "system"
    if names & PROCESS_FIXTURES:
        return "integration"
    return "fast"


def fast_only(config: pytest.Config) -> bool:
    return str(config.getoption("markexpr", "") or "").strip() == FAST_ONLY


@pytest.fixture(scope="session")
def subprocesses() -> None:
    """Declares that the test (or the fixture naming this) starts processes: integration tier."""


@pytest.fixture(scope="session")
def sockets() -> None:
    """Declares that the test (or the fixture naming this) connects sockets, loopback included:
    integration tier."""


@pytest.fixture(scope="session")
def system_scenario() -> None:
    """Declares a system scenario (long session, browser, real model, separate hosts): system
    tier."""


def runs_only_unit_tests(config: pytest.Config) -> bool:
    """Whether every path of the run lies in ``tests/unit`` (the fast tier's folder)."""
    unit = Path(__file__).resolve().parent.parent / UNIT_DIR
    start = config.invocation_params.dir
    paths = [Path(start, arg.split("::")[0]).resolve() for arg in config.args]
    return bool(paths) and all(path.is_relative_to(unit) for path in paths)


def pytest_configure(config: pytest.Config) -> None:
    # The fast tier uses none of these: its folder's tests were put there because they use
    # none, and ``-m fast`` deselects every test that does (derived from the fixtures' names,
    # which needs no plugin registered).
    if runs_only_unit_tests(config) or fast_only(config):
        return
    for module in PROCESS_PLUGINS + SYSTEM_PLUGINS:
        config.pluginmanager.import_plugin(module)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(getattr(item, "fixturenames", ())))


class FastTierViolation(RuntimeError):
    """A test of the fast tier started a process or connected a socket."""


class Guard:
    """While installed, every process start and socket connection is refused and recorded."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def _refuse(self, what: str, fixture: str) -> FastTierViolation:
        message = (
            f"the fast tier neither starts processes nor connects sockets, and this test {what}: "
            f"request the `{fixture}` fixture (or the fixture that provides what it talks to, "
            "such as redis_server or stack) so that it runs in the integration tier "
            "(tests/support/tiers.py)"
        )
        self.violations.append(message)
        return FastTierViolation(message)

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        self._saved.append((owner, name, original))
        setattr(owner, name, make(original))

    def install(self) -> None:
        guard = self

        def process(what: str) -> Callable[[Any], Any]:
            def make(_original: Any) -> Any:
                def refused(*args: Any, **kwargs: Any) -> Any:
                    shown = args[1] if what == "subprocess" and len(args) > 1 else what
                    raise guard._refuse(f"started a process ({shown!r})", SUBPROCESSES)

                return refused

            return make

        def connect(_original: Any) -> Any:
            def refused(sock: socket.socket, address: Any, *args: Any) -> Any:
                raise guard._refuse(f"connected a socket to {address!r}", SOCKETS)

            return refused

        # Popen._execute_child(self, args, ...): every subprocess and asyncio subprocess.
        self._patch(subprocess.Popen, "_execute_child", process("subprocess"))
        # multiprocessing's spawn and forkserver start through fork_exec; fork through os.fork.
        self._patch(_posixsubprocess, "fork_exec", process("fork_exec"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            self._patch(os, name, process(f"os.{name}"))
        for name in ("connect", "connect_ex"):
            self._patch(socket.socket, name, connect)

    def uninstall(self) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)


_GUARD = pytest.StashKey[Guard]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    if not fast_only(item.config):
        return (yield)
    guard = item.stash[_GUARD] = Guard()
    guard.install()
    try:
        return (yield)
    finally:
        guard.uninstall()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    guard = item.stash.get(_GUARD, None)
    if guard is not None:
        if guard.violations and not report.failed:
            # The code under test caught the refusal (a retry loop, an ``except OSError``): the
            # test still fails, with what it tried.
            report.outcome = "failed"
            report.longrepr = "\n".join(dict.fromkeys(guard.violations))
        guard.violations.clear()
    return report
