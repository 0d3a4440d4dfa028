"""The state's Lua scripts against their Python side (worker.backend.scripts): each script names
its keys and arguments once, at its top, and reads them by name only; its builder lays out
KEYS and ARGV under the same names in the same order; and the scripts ship in the wheel.

What the scripts do is tested against a real Redis by the state's tests (test_redis_state.py,
test_idle_fairness.py, ...); here only the agreement between the two sides, with no Redis."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from worker.backend import scripts
from worker.config import RedisConfig

REPO = Path(__file__).resolve().parent.parent.parent
LUA = REPO / "worker" / "backend" / "lua"

# `local name = KEYS[3]`, `local name = tonumber(ARGV[7])`, a comment after it allowed.
DECLARED = re.compile(r"^local (\w+) = (?:tonumber\()?(KEYS|ARGV)\[(\d+)\]\)?\s*(?:--.*)?$")
# `local events_from = 14  -- ARGV[events_from] onwards: ...`: where a variable tail starts.
TAIL = re.compile(r"^local (\w+) = (\d+)\s*-- (KEYS|ARGV)\[(\w+)\] onwards\b")
NUMBERED = re.compile(r"\b(?:KEYS|ARGV)\[\d+\]")

CONFIG = RedisConfig()
C = "acme:c-42"

# One call of every builder, with values of the kinds the state passes.
CALLS = [
    scripts.submit(C, payload=b"zlib", revision=3, ttl_s=86_400, submission="9f2c4e"),
    scripts.unqueue(C, submission="9f2c4e"),
    scripts.publish(
        CONFIG,
        C,
        [("e-1", '{"a": 1}'), ("e-2", '{"b": 2}')],
        fencing_token="7",
        handled_revision=3,
        is_completed=True,
        last_count=8,
        memo=b"memo",
        memo_digest="d",
        composed="{}",
        dedup_ttl_s=600,
        proposal="",
    ),
    scripts.approve(
        CONFIG,
        C,
        proposal_id="p-1",
        base_id="",
        event_id="e-3",
        event="{}",
        composed="{}",
        last_count=8,
    ),
    scripts.decline(CONFIG, C, proposal_id="p-1", event_id="e-3", event="{}"),
    scripts.revert(
        CONFIG,
        C,
        reverted_id="e-1",
        composed_now=b"{}",
        composed_before="",
        event_id="e-4",
        event="{}",
    ),
    scripts.take(C, known_memo="d", idle=True),
    scripts.acquire(C, lease_ms=30_000, fence_ttl_s=604_800, unless_handled=None, claim="a" * 32),
    scripts.renew(C, token="7", lease_ms=30_000),
    scripts.release(C, token="7", taken_request="a" * 32, reply_ttl_ms=60_000),
    scripts.defer(C, ttl_s=86_400),
    scripts.request(C, request="{}", ttl_s=86_400),
    scripts.take_request(C),
    scripts.done_request(C, request_id="r-1"),
    scripts.take_idle(
        ["acme", "globex"],
        idle_since=1.5e9,
        expired_before=1.4e9,
        busy_since=1.49e9,
        per_tenant=100,
        now=1.6e9,
        busy_ttl_s=3_900,
        scan_left=2,
    ),
]


def declared(name: str) -> tuple[dict[str, list[str]], dict[str, int]]:
    """The names a script gives KEYS[1..] and ARGV[1..], in order, and where its tails start."""
    names: dict[str, list[str]] = {"KEYS": [], "ARGV": []}
    tails: dict[str, int] = {}
    for line in scripts.source(name).splitlines():
        if match := DECLARED.match(line):
            local, table, index = match.groups()
            assert int(index) == len(names[table]) + 1, f"{name}: {line!r} out of order"
            names[table].append(local)
        elif match := TAIL.match(line):
            local, start, table, named = match.groups()
            assert named == local, f"{name}: {line!r}"
            tails[table] = int(start)
    return names, tails


def test_every_script_has_a_file_and_every_file_a_script() -> None:
    assert sorted(p.stem for p in LUA.glob("*.lua")) == sorted(scripts.NAMES)
    assert sorted(call.script for call in CALLS) == sorted(scripts.NAMES)


@pytest.mark.parametrize("call", CALLS, ids=lambda call: call.script)
def test_the_builder_lays_out_what_the_script_names(call: scripts.Call) -> None:
    names, tails = declared(call.script)
    assert list(call.keys) == names["KEYS"]
    assert list(call.args) == names["ARGV"]
    # A tail read from a named position starts right after the named ones, and only a
    # script that reads one is given one.
    assert tails.get("KEYS") == (len(call.keys) + 1 if call.keys_tail else None)
    assert tails.get("ARGV") == (len(call.args) + 1 if call.args_tail else None)
    assert len(call.key_list()) == len(call.keys) + len(call.keys_tail)
    assert len(call.arg_list()) == len(call.args) + len(call.args_tail)


@pytest.mark.parametrize("name", scripts.NAMES)
def test_a_script_reads_its_keys_and_arguments_by_name_only(name: str) -> None:
    lines = scripts.source(name).splitlines()
    body = [line for line in lines if not DECLARED.match(line) and not line.startswith("--")]
    numbered = [line for line in body if NUMBERED.search(line.split("--")[0])]
    assert numbered == []
    # The names come first: nothing runs before the script has named what it reads.
    first_code = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    last_declared = max(
        i for i, line in enumerate(lines) if DECLARED.match(line) or TAIL.match(line)
    )
    assert all(
        DECLARED.match(line) or TAIL.match(line) for line in lines[first_code : last_declared + 1]
    )


def test_the_package_data_ships_every_script() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    patterns = package_data["worker.backend"]
    for path in LUA.glob("*.lua"):
        relative = path.relative_to(LUA.parent).as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative


@pytest.mark.slow
def test_the_built_wheel_holds_every_script(tmp_path: Path, subprocesses: None) -> None:
    """The wheel as pip builds it with pyproject's build backend (the dev extra installs it:
    no build isolation, nothing fetched), from a copy of the sources: what a non-editable
    install, the Docker image's included, gets."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    shutil.copytree(REPO / "worker", source / "worker", ignore=ignore)
    out = tmp_path / "wheel"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--no-index", "-q", "-w", str(out), str(source)),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {n for n in archive.namelist() if n.startswith("worker/backend/lua/")}
    assert shipped == {f"worker/backend/lua/{name}.lua" for name in scripts.NAMES}
