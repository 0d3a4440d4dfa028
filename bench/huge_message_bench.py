"""What compacting one huge message costs: wall time and peak RSS of ``compactor compact``.

    .venv/bin/python bench/huge_message_bench.py [--before /tmp/huge-before] [--sizes 1,8,24]
        [--roles user,tool] [--kinds text,line,nows]

Each run is a fresh ``python -m worker compact SNAPSHOT`` process (reaped with ``wait4`` for its
own peak RSS) on a snapshot of a short conversation with one huge message, as a user message or
as a bash tool result, of 1, 8 and 24 MB (``max_snapshot_bytes`` is 32 MB):

- ``text``: ordinary text with spaces and line breaks: the corpus's messages and tool outputs
  one after the other (repeated to size), or generated prose when the corpus is absent;
- ``line``: the same text as one long line (every line break made a space);
- ``nows``: no whitespace at all, ``abab…`` (the case of issue 11: one endless pre-token).

With ``--before DIR`` (a checkout of an older commit, e.g. ``git worktree add /tmp/huge-before
3ca55fd``) each snapshot is also compacted by that code (``PYTHONPATH=DIR``), side by side, with
the same interpreter and packages. Printed: a Markdown table, then the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import conversations, corpus_dir

ROOT = Path(__file__).resolve().parent.parent
MB = 2**20
TIMEOUT_S = 1800.0


def corpus_text(size: int) -> tuple[str, str]:
    """At least ``size`` characters of ordinary text, and where it came from."""
    parts: list[str] = []
    total = 0
    if corpus_dir() is not None:
        for _, conversation in conversations():
            for message in conversation.get("messages", []):
                content = message.get("content")
                if isinstance(content, str) and content.strip():
                    parts.append(content)
                    total += len(content) + 1
            if total >= 32 * MB:
                break
        source = f"corpus {corpus_dir()}"
    if not parts:
        words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"]
        parts = [" ".join(words[(i + k) % len(words)] for k in range(9)) for i in range(4096)]
        source = "generated prose"
    text = "\n".join(parts)
    while len(text) < size:
        text = f"{text}\n{text}"
    return text[:size], source


def body(kind: str, size: int, text: str) -> str:
    if kind == "text":
        return text[:size]
    if kind == "line":
        return text[:size].replace("\r", " ").replace("\n", " ")
    return ("ab" * (size // 2 + 1))[:size]


def snapshot(role: str, content: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"id": "s", "role": "system", "content": "You are a coding agent."},
        {"id": "u0", "role": "user", "content": "Please fix tests/test_core.py."},
    ]
    if role == "user":
        messages.append({"id": "u1", "role": "user", "content": content})
    else:
        call = {"name": "bash", "arguments": json.dumps({"command": "cat big.txt"})}
        messages.append(
            {
                "id": "a0",
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c0", "type": "function", "function": call}],
            }
        )
        messages.append({"id": "r0", "role": "tool", "tool_call_id": "c0", "content": content})
    messages += [
        {"id": "u2", "role": "user", "content": "again"},
        {"id": "a2", "role": "assistant", "content": "Done."},
    ]
    return {
        "conversation_id": f"bench-huge-{role}",
        "revision": 1,
        "model": {"name": "gpt-4.1", "context_window": 128_000},
        "format": "openai",
        "messages": messages,
    }


@dataclass
class Run:
    seconds: float
    peak_mib: float
    code: int
    outcome: str
    tokens: int | None


def compact(code_root: Path, snapshot_path: Path, work: Path) -> Run:
    """A fresh ``python -m worker compact`` of ``snapshot_path``, with the code at ``code_root``."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "compactor.toml"
    config.write_text(f'[compaction]\ntranscript_dir = "{work / "transcripts"}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env["PYTHONPATH"] = str(code_root)
    out = work / "stdout"
    with out.open("wb") as stdout:
        start = time.perf_counter()
        command = ["-m", "worker", "compact", str(snapshot_path), "--config", str(config)]
        proc = subprocess.Popen(
            [sys.executable, *command],
            cwd=work,
            env=env,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
        )
        timer = threading.Timer(TIMEOUT_S, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    events = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    outcome = next((e for e in events if e.get("type", "").startswith("compaction.")), {})
    kind = str(outcome.get("type", "none")).removeprefix("compaction.")
    if proc.returncode not in (0, 1):
        kind = f"exit {proc.returncode}" if proc.returncode > 0 else "killed"
    trigger = outcome.get("trigger") or {}
    tokens = trigger.get("projected_tokens")
    return Run(seconds, usage.ru_maxrss / 1024, proc.returncode, kind, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--sizes", default="1,8,24", help="message sizes in MB")
    parser.add_argument("--roles", default="user,tool")
    parser.add_argument("--kinds", default="text,line,nows")
    args = parser.parse_args()
    sizes = [int(float(s) * MB) for s in args.sizes.split(",")]
    text, source = corpus_text(max(sizes))
    print(f"ordinary text: {source}")
    versions = [("after", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    head = "| message | MB | role |"
    rule = "|---|---|---|"
    for name, _ in versions[::-1]:
        head += f" {name} s | {name} peak MiB | {name} outcome | {name} tokens |"
        rule += "---|---|---|---|"
    print(head)
    print(rule, flush=True)
    with tempfile.TemporaryDirectory(prefix="huge-bench-") as tmp:
        for kind in args.kinds.split(","):
            for size in sizes:
                for role in args.roles.split(","):
                    path = Path(tmp) / "snapshot.json"
                    path.write_text(json.dumps(snapshot(role, body(kind, size, text))))
                    row = f"| {kind} | {size // MB} | {role} |"
                    for name, code_root in versions[::-1]:
                        run = compact(code_root, path, Path(tmp) / f"{name}-{kind}-{size}-{role}")
                        tokens = "" if run.tokens is None else f"{run.tokens:,}"
                        row += f" {run.seconds:.1f} | {run.peak_mib:.0f} | {run.outcome} |"
                        row += f" {tokens} |"
                    print(row, flush=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    python = sys.version.split()[0]
    print(f"CPUs: {os.cpu_count()}; load average at the end {load}; Python {python}")


if __name__ == "__main__":
    main()
