"""examples/*.py run offline as their docstrings say, and use only the public faces a user has
(no private helpers, no polling loops)."""

from __future__ import annotations

import ast
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*_example.py"))
#: What docs/ and README.md document for scripts and agents.
PUBLIC = re.compile(r"worker\.(client|session|local|integrations\.[a-z_]+)")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_imports_only_public_modules_and_never_polls(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("worker")
    ]
    imported += [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("worker")
    ]
    assert imported, path.name
    assert [m for m in imported if not PUBLIC.fullmatch(m)] == [], path.name
    calls = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert not calls & {"time.sleep", "asyncio.sleep", "time.monotonic"}, path.name


def run_example(name: str, cwd: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / name)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def given_and_held(lines: list[str], pattern: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (re.search(pattern, line).groups() for line in lines)]  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("openai_agents_example.py", r"model given +(\d+) items; SQLiteSession holds +(\d+)"),
        ("agent_framework_example.py", r"model sent +(\d+) messages; history holds +(\d+)"),
    ],
)
def test_a_framework_example_runs_offline_and_compacts(
    name: str, pattern: str, tmp_path: Path, subprocesses: None
) -> None:
    """Ten runs each: the framework's store keeps every item, and once a compaction landed
    the model is given fewer items than in the run before."""
    lines = run_example(name, tmp_path)
    runs = given_and_held([line for line in lines if line.startswith("run ")], pattern)
    assert len(runs) == 10
    held = [h for _, h in runs]
    assert held == sorted(held) and held[-1] > held[0]
    applied = int(lines[-1].removeprefix("compactions applied: "))
    assert applied >= 1
    given = [g for g, _ in runs]
    assert any(later < earlier for earlier, later in itertools.pairwise(given))
    assert not list(tmp_path.iterdir())  # nothing left behind in the working directory
