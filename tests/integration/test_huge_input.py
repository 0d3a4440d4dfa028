"""One huge message inside the snapshot limit (issue 11): compacting it through the real CLI
finishes with a bounded peak memory, and the facts taken from it stay linear.

Each compaction runs ``python -m worker compact`` in its own process, reaped with ``wait4`` for
that process's own peak RSS by a small launcher (:data:`LAUNCHER`); the bounds are wide (1 GiB;
120 s as a timeout, not a measurement), so a busy machine cannot make them flake. Before the
bounded counts, the 24 MB ``abab…`` message took 1.5-1.7 GB, the arguments case ran for over ten
minutes, and 20 MB of spaces failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.config import Settings
from worker.core import facts, files

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
# Forks and reaps the compaction, and writes its peak RSS (KiB) to argv[1]. Not measured from
# the test's own process: Popen starts a child by vfork, and Linux counts the memory the parent
# (an xdist worker, after other tests) ever held into the peak of what it execs; a small
# launcher's fork starts the compaction from a few MiB instead.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as peak:
    peak.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""
PEAK_RSS_LIMIT = 1 << 30
TIMEOUT_S = 120.0
MB = 2**20
BIG = 24 * MB  # inside max_snapshot_bytes (32 MB) with room for the rest of the snapshot


def _snapshot(where: str, body: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"id": "s", "role": "system", "content": "You are a coding agent."},
        {"id": "u0", "role": "user", "content": "Please fix tests/test_core.py."},
    ]
    call = {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": ""}}
    if where == "user":
        messages.append({"id": "u1", "role": "user", "content": body})
    elif where == "tool":
        call["function"]["arguments"] = json.dumps({"command": "cat big.txt"})
        messages.append({"id": "a0", "role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"id": "r0", "role": "tool", "tool_call_id": "c0", "content": body})
    else:  # the arguments of a tool call
        call["function"]["arguments"] = json.dumps({"command": body})
        messages.append({"id": "a0", "role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"id": "r0", "role": "tool", "tool_call_id": "c0", "content": "ok"})
    messages += [
        {"id": "u2", "role": "user", "content": "again"},
        {"id": "a2", "role": "assistant", "content": "Done."},
    ]
    return {
        "conversation_id": f"huge-{where}",
        "revision": 1,
        "model": {"name": "gpt-4.1", "context_window": 128_000},
        "format": "openai",
        "messages": messages,
    }


def _compact(tmp_path: Path, snapshot: dict[str, Any]) -> tuple[int, str, int]:
    """(exit code, stdout, peak RSS in bytes) of ``python -m worker compact`` on ``snapshot``."""
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(snapshot), encoding="utf-8")
    assert path.stat().st_size <= Settings().compaction.max_snapshot_bytes
    config = tmp_path / "compactor.toml"
    config.write_text(f'[compaction]\ntranscript_dir = "{tmp_path / "transcripts"}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    out, peak = tmp_path / "stdout", tmp_path / "peak"
    compact = ["-m", "worker", "compact", str(path), "--config", str(config)]
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(peak), *compact],
            cwd=tmp_path,
            env=env,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the timeout kills the launcher and the compaction
        )
        timer = threading.Timer(TIMEOUT_S, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        try:
            code = proc.wait()
        finally:
            timer.cancel()
    return code, out.read_text(), int(peak.read_text()) * 1024


CASES = {
    "user-no-whitespace": ("user", "ab" * (BIG // 2)),
    "tool-no-whitespace": ("tool", "ab" * (BIG // 2)),
    "arguments-no-whitespace": ("arguments", "ab" * (BIG // 2)),
    "user-spaces": ("user", "x" + " " * (20 * MB) + "x"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_huge_message_compacts_within_bounds(
    tmp_path: Path, case: str, subprocesses: None
) -> None:
    where, body = CASES[case]
    code, stdout, peak = _compact(tmp_path, _snapshot(where, body))
    assert code == 0, (code, stdout[-2000:])
    events = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    done = [e for e in events if e["type"] == "compaction.completed"]
    assert len(done) == 1, [e["type"] for e in events]
    compaction = done[0]["compaction"]
    # The count may be the documented upper bound (the body's bytes), never below tiktoken's.
    assert done[0]["trigger"]["projected_tokens"] >= len(body) // 8
    assert compaction["tokens_after"] < 2_000  # the huge message went into the summary
    assert compaction["summary"]["tokens"] <= Settings().compaction.summary_max_output_tokens
    assert peak < PEAK_RSS_LIMIT, f"peak RSS {peak / MB:.0f} MiB"
    assert len(list((tmp_path / "transcripts").rglob("*.json"))) == 1


# --- facts ---------------------------------------------------------------------------------

LINE_PARTS = [
    "Error", "Exception", "error:", "E", " ", "  ", "\t", "FAIL", "FAIL:", "FAILED", "FAILEDx",
    "fatal:", "Traceback (most recent call last)", "No such file or directory", "x", "_", ":",
    "command not found", "Permission denied", "ValueError", "é", "1", "\x1f", "\u3000",
    "cannot open", "not found", "does not exist",
]  # fmt: skip
NAME_PARTS = ["a", "B", "1", ".", "-", "@", "+", "_", "é", "py", ".py", ".tar", "xxxxxxxxx"]


@settings(deadline=None, max_examples=500)
@given(
    parts=st.lists(st.sampled_from(LINE_PARTS), max_size=8),
    padding=st.sampled_from(["", "x" * 2000, " " * 2000]),
    at=st.integers(0, 8),
)
def test_every_error_line_holds_a_hint(parts: list[str], padding: str, at: int) -> None:
    """error_lines looks only at the lines with an _ERROR_HINT match: none may be missed."""
    line = "".join([*parts[:at], padding, *parts[at:]])
    if facts._ERROR_LINE.search(line):
        assert facts._ERROR_HINT.search(line)


def _old_error_lines(output: str, limit: int = 3) -> list[str]:
    """facts.error_lines as it was: the pattern searched in every line."""
    lines: list[str] = []
    for line in output.splitlines():
        if facts._ERROR_LINE.search(line):
            text = line.strip()
            if len(text) > facts.MAX_ERROR_LINE_CHARS:
                text = text[: facts.MAX_ERROR_LINE_CHARS - 1] + "…"
            if text and text not in lines:
                lines.append(text)
            if len(lines) >= limit:
                break
    return lines


# Every line break of str.splitlines(), with "\r\n" and a blank line; "\x1f" is a space, not one.
BREAKS = ["\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
OUTPUTS = st.lists(
    st.sampled_from([*LINE_PARTS, *BREAKS, "\n\n", "\r\r\n", "y" * 300]), max_size=30
).map("".join)


@settings(deadline=None, max_examples=1000)
@given(output=OUTPUTS, limit=st.sampled_from([1, 3, 10]))
def test_error_lines_are_the_lines_the_pattern_finds(output: str, limit: int) -> None:
    assert facts.error_lines(output, limit=limit) == _old_error_lines(output, limit)


@settings(deadline=None, max_examples=500)
@given(OUTPUTS)
def test_lines_holding_a_match_are_the_lines_split(output: str) -> None:
    lines = [line for line in output.splitlines() if files._MISSING.search(line)]
    assert list(files.lines_holding(output, files._MISSING)) == lines
    assert files._missing_lines(output) == lines[: files.MAX_MISSING_LINES]


@settings(deadline=None, max_examples=500)
@given(name=st.lists(st.sampled_from(NAME_PARTS), min_size=1, max_size=10).map("".join))
def test_an_extension_is_found_at_the_end_alone(name: str) -> None:
    tail = facts._EXTENSION.search(name[-11:]) is not None
    assert tail is (facts._EXTENSION.search(name) is not None)


class _Spy:
    """A compiled pattern that notes the length of every text it is asked to search."""

    def __init__(self, pattern: Any) -> None:
        self.pattern, self.sizes = pattern, []

    def search(self, text: str, *args: Any) -> Any:
        self.sizes.append(len(text))
        return self.pattern.search(text, *args)


def test_facts_of_a_huge_line_are_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    errors = _Spy(facts._ERROR_LINE)
    extension = _Spy(facts._EXTENSION)
    monkeypatch.setattr(facts, "_ERROR_LINE", errors)
    monkeypatch.setattr(facts, "_EXTENSION", extension)
    huge = "ab" * (4 * MB)
    assert facts.error_lines(f"{huge}\nValueError: boom\n") == ["ValueError: boom"]
    assert errors.sizes == [len("ValueError: boom")]  # the huge line was never searched
    many = "x\n" * MB  # a million short lines are not looked at one by one
    assert facts.error_lines(f"{many}{huge}\nE   assert 1\n{many}") == ["E   assert 1"]
    assert errors.sizes[1:] == [len("E   assert 1")]
    assert facts.extract_paths(f"see {huge}.py and src/{huge}") == [f"{huge}.py", f"src/{huge}"]
    assert max(extension.sizes) <= 11
