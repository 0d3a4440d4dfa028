"""The TypeScript client (clients/typescript), tested by Node's own test runner against a real
``compactor serve``, Redis and Celery workers started here (the stack of ``http_support``):

- the package's dev dependencies (``typescript``, ``@types/node`` and the Vercel AI SDK ``ai``)
  installed by ``npm ci`` from its committed package-lock.json into clients/typescript/node_modules
  (gitignored; done again only when the lock file changes), under a lock so that pytest-xdist
  processes never install at once;
- ``tsc --noEmit`` strict over the sources and the tests (and the build configuration);
- the shared conformance fixtures (tests/fixtures/conformance, which test_conformance.py runs
  against the Python package) run by the TypeScript suite;
- the client suite against the real serve: every route, SSE following resumed with
  ``Last-Event-ID`` through a cut connection, sessions, webhooks, review;
- a 40-turn agent loop of the AI SDK's ``generateText`` with a stand-in model, kept bounded by
  the service and never blocked, not even while ``compactor serve`` is stopped (SIGSTOP): its
  prompts are counted here with the worker's own tokenizer.

Node.js or npm being absent skips this module with the reason; anything else that fails (an
``npm ci`` that cannot reach the registry included) fails it, since CI has both."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.http_support import KEY_A, KEY_B, Stack

from worker.tokens import count_tokens

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent.parent
PACKAGE = REPO / "clients" / "typescript"
CONFORMANCE = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"
THRESHOLD = 2000  # the workers' auto_compact_threshold_tokens (test/support.ts reads it)
NPM_TIMEOUT_S = 300
# The stack's configuration: a fixed threshold (no share of a window), keep-alives every second
# (a follower notices a cut connection fast), webhooks to the test's receiver on loopback.
CONFIG = f"""auto_compact_threshold_tokens = {THRESHOLD}
auto_compact_threshold_percent = "none"
[http]
sse_keepalive_s = 1.0
[webhooks]
allow_private = true
backoff_s = 0.2
"""


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not found on PATH: the TypeScript client's tests need Node.js and npm")
    return found


@pytest.fixture(scope="module")
def package() -> Path:
    """clients/typescript with its dev dependencies installed as package-lock.json pins them."""
    tool("node")
    npm = tool("npm")
    lock = PACKAGE / "package-lock.json"
    digest = hashlib.sha256(lock.read_bytes() + (PACKAGE / "package.json").read_bytes()).hexdigest()
    stamp = PACKAGE / "node_modules" / ".compactor-installed"
    # One lock per checkout and machine: xdist processes (and concurrent runs) install in turn.
    key = hashlib.sha256(str(PACKAGE).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"compactor-ts-{key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text() == digest):
            try:
                done = subprocess.run(
                    [npm, "ci", "--no-audit", "--no-fund", "--no-progress"],
                    cwd=PACKAGE,
                    capture_output=True,
                    text=True,
                    timeout=NPM_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired as exc:
                raise AssertionError(f"npm ci took over {NPM_TIMEOUT_S} s") from exc
            assert done.returncode == 0, f"npm ci failed: {(done.stdout + done.stderr)[-3000:]}"
            stamp.write_text(digest)
    return PACKAGE


def tsc(package: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["node", str(package / "node_modules" / "typescript" / "bin" / "tsc"), *args],
        cwd=package,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def compiled(package: Path, subprocesses: None) -> Iterator[Path]:
    """The sources and tests compiled to JavaScript, in a directory of this process's own under
    the package (so that Node finds its node_modules), removed afterwards."""
    out = package / "build" / f"pytest-{os.getpid()}"
    done = tsc(package, "-p", "tsconfig.json", "--outDir", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    yield out
    shutil.rmtree(out, ignore_errors=True)


def stack_config() -> str:
    return CONFIG


class Run:
    """What ``node --test`` reported (TAP): the names of the tests that passed, failed and were
    skipped, and its output for the assertion messages."""

    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self.returncode = done.returncode
        self.output = done.stdout + done.stderr
        lines = done.stdout.splitlines()
        results = [
            re.match(r"\s*(not ok|ok) \d+ - (.*?)(?: # (SKIP|TODO).*)?$", line) for line in lines
        ]
        self.passed = [m[2] for m in results if m and m[1] == "ok" and not m[3]]
        self.skipped = [m[2] for m in results if m and m[3]]
        self.failed = [m[2] for m in results if m and m[1] == "not ok"]

    def summary(self) -> str:
        return (
            f"exit {self.returncode}; failed: {self.failed}; skipped: {self.skipped}\n"
            + (self.output[-6000:])
        )


def node_test(compiled: Path, files: list[str], env: dict[str, str], timeout_s: float) -> Run:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    environ |= {"COMPACTOR_TEST_CONFORMANCE_DIR": str(CONFORMANCE)} | env
    done = subprocess.run(
        [
            "node",
            "--test",
            "--test-concurrency=1",  # one serve between the files: the loop stops it for a while
            "--test-reporter=tap",
            *(str(compiled / "test" / f"{name}.test.js") for name in files),
        ],
        cwd=compiled.parent.parent,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return Run(done)


def service_env(stack: Stack) -> dict[str, str]:
    assert stack.server is not None
    return {
        "COMPACTOR_BASE": stack.base,
        "COMPACTOR_KEY": KEY_A,
        "COMPACTOR_TEST_OTHER_KEY": KEY_B,
        "COMPACTOR_TEST_SERVE_PID": str(stack.server.pid),
        "COMPACTOR_TEST_THRESHOLD": str(THRESHOLD),
    }


def test_types_check_strict(package: Path, subprocesses: None) -> None:
    config = json.loads((package / "tsconfig.json").read_text())["compilerOptions"]
    assert config["strict"] is True and config["noUncheckedIndexedAccess"] is True
    for project in ("tsconfig.json", "tsconfig.build.json"):  # the tests too, and what ships
        done = tsc(package, "-p", project, "--noEmit")
        assert done.returncode == 0, done.stdout + done.stderr


def test_shared_conformance_fixtures_pass_in_typescript(compiled: Path) -> None:
    run = node_test(compiled, ["conformance"], {}, timeout_s=120)
    assert run.returncode == 0 and not run.failed and not run.skipped, run.summary()
    # every case of the fixtures ran by its name (test_conformance.py runs the same ones)
    apply_cases = json.loads((CONFORMANCE / "apply.json").read_text())
    verifications = json.loads((CONFORMANCE / "webhooks.json").read_text())["verifications"]
    names = [c["name"] for c in apply_cases] + [f"verify: {c['name']}" for c in verifications]
    missing = [name for name in names if name not in run.passed]
    assert not missing, run.summary()


def test_client_suite_against_a_real_serve(compiled: Path, stack: Stack) -> None:
    files = ["client", "session", "webhooks"]
    run = node_test(compiled, files, service_env(stack), timeout_s=900)
    assert run.returncode == 0 and not run.failed and not run.skipped, run.summary()
    assert len(run.passed) >= 20, run.summary()


def test_a_40_turn_ai_sdk_agent_loop_stays_bounded_and_is_never_blocked(
    compiled: Path, stack: Stack, tmp_path: Path
) -> None:
    report = tmp_path / "loop.json"
    env = service_env(stack) | {"COMPACTOR_TEST_AGENT_LOOP_REPORT": str(report)}
    run = node_test(compiled, ["ai-sdk"], env, timeout_s=900)
    assert run.returncode == 0 and not run.failed and not run.skipped, run.summary()
    loop: dict[str, Any] = json.loads(report.read_text())
    prompts = loop["prompts"]
    assert {p["turn"] for p in prompts} == set(range(40)) and len(prompts) == 80  # 2 steps a turn
    # Never blocked: every step's call to the adapter returned at once, the serve stopped or not.
    assert max(p["ms"] for p in prompts) < 250, [p["ms"] for p in prompts]
    assert sum(p["frozen"] for p in prompts) == 10
    # Bounded, in the worker's own tokens: once the first compaction arrived, no prompt of a
    # turn with the service up is over the threshold by more than the turns it has not yet
    # compacted (a turn is about 500 tokens), though the agent's own history grew far past it.
    tokens = [count_tokens(json.dumps(p["messages"]), "gpt-4.1") for p in prompts]
    first = next(i for i, p in enumerate(prompts) if summarized(p["messages"]))
    settled = [t for t, p in zip(tokens, prompts, strict=True) if p["frozen"] is False]
    after = [t for t, p in zip(tokens[first:], prompts[first:], strict=True) if not p["frozen"]]
    assert max(after) < 2 * THRESHOLD, tokens
    assert max(settled) < 2 * THRESHOLD, tokens
    history = count_tokens(json.dumps(loop["history"]), "gpt-4.1")
    assert history > 8 * THRESHOLD, history
    assert loop["status"]["eventsApplied"] >= 5 and loop["status"]["compactionsSkipped"] == 0


def summarized(messages: list[dict[str, Any]]) -> bool:
    return any(str(m.get("content")).startswith("[compaction-worker summary]") for m in messages)


# --- docs/typescript.md -------------------------------------------------------------------------

DOCS_PAGE = REPO / "docs" / "typescript.md"
TARBALL = "compaction-worker-client-0.1.0.tgz"  # what the page tells a reader to install


@pytest.fixture(scope="module")
def consumer(package: Path) -> Iterator[Path]:
    """A project of a reader's, as docs/typescript.md says to make one: the package built and
    packed by ``npm pack`` and its tarball installed by ``npm install`` (no registry needed: the
    package has no dependencies). It sits under the package so that the AI SDK example finds
    ``ai`` in the package's node_modules, as it would in the reader's own."""
    project = package / "build" / f"pytest-{os.getpid()}-consumer"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    key = hashlib.sha256(str(PACKAGE).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"compactor-ts-{key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # npm pack writes dist/: one process at a time
        npm(package, "pack", "--pack-destination", str(project))
    assert (project / TARBALL).exists(), sorted(p.name for p in project.iterdir())
    (project / "package.json").write_text(
        json.dumps({"name": "docs-examples", "private": True, "type": "module"})
    )
    npm(project, "install", "--no-audit", "--no-fund", "--no-progress", f"./{TARBALL}")
    installed = project / "node_modules" / "@compaction-worker" / "client"
    assert (installed / "dist" / "index.d.ts").exists()
    assert not (installed / "src").exists()  # only what the package's "files" names
    (project / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "target": "es2022",
                    "module": "nodenext",
                    "moduleResolution": "nodenext",
                    "strict": True,
                    "noUncheckedIndexedAccess": True,
                    "types": ["node"],
                    "typeRoots": [str(package / "node_modules" / "@types")],
                    "skipLibCheck": True,
                    "rootDir": ".",
                    "outDir": "out",
                },
                "include": ["*.ts"],
            }
        )
    )
    yield project
    shutil.rmtree(project, ignore_errors=True)


def npm(cwd: Path, *args: str) -> None:
    done = subprocess.run(
        [tool("npm"), *args], cwd=cwd, capture_output=True, text=True, timeout=NPM_TIMEOUT_S
    )
    assert done.returncode == 0, f"npm {' '.join(args)}: {(done.stdout + done.stderr)[-3000:]}"


def typescript_blocks() -> list[str]:
    return re.findall(r"^```typescript\n(.*?)^```$", DOCS_PAGE.read_text(), re.M | re.S)


def test_the_docs_examples_run_as_written(package: Path, consumer: Path, stack: Stack) -> None:
    """Each typescript block of docs/typescript.md, in a reader's project with the package
    installed from its tarball: type-checked strictly, then run against the real serve."""
    examples = typescript_blocks()
    assert len(examples) == 4
    for index, text in enumerate(examples):
        (consumer / f"example{index}.ts").write_text(text)
    done = tsc(package, "-p", str(consumer / "tsconfig.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env |= {"COMPACTOR_BASE": stack.base, "COMPACTOR_KEY": KEY_A}
    outputs = []
    for index in range(len(examples)):
        run = subprocess.run(
            ["node", f"out/example{index}.js"],
            cwd=consumer,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, f"example {index}: {run.stdout}{run.stderr}"
        outputs.append(run.stdout)
    # what the comments on the page say each prints
    client, follow, hook, agent = outputs
    assert re.search(r"^12 messages -> [0-9]+$", client, re.M), client
    assert client.splitlines()[-2:] == ["true", "compaction.reverted"], client
    assert re.search(r"^[0-9]+-[0-9]+ compaction\.\w+ 1$", follow, re.M), follow
    assert "not_found 404" in follow, follow
    assert "verified: compaction.skipped" in hook, hook
    sizes = re.search(
        r"^([0-9]+) messages kept by the agent; ([0-9]+) sent to the model$", agent, re.M
    )
    assert sizes and int(sizes[2]) < int(sizes[1]), agent
