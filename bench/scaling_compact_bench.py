"""What ``compactor compact`` costs as a conversation grows: CPU and wall seconds of the real CLI.

    .venv/bin/python bench/scaling_compact_bench.py [--before DIR] [--sizes 1000,10000,50000]
        [--corpus N] [--repeat K] [--save DIR]

Each run is a fresh ``python -m worker compact SNAPSHOT`` process, reaped with ``wait4`` for its
own CPU seconds (user + system: what the work costs whatever else the machine runs; wall time
is printed beside it). The snapshots are generated conversations of short messages, as an agent
writes them (:func:`short_messages`: user turns, some repeated, assistant replies, tool calls of
a coding agent and their results), of each size in ``--sizes``, and the first ``--corpus``
conversations of the shared corpus (bench/corpus.py), each given a window small enough to
trigger (as bench/corpus_compact_bench.py does), summed in one row.

``--save DIR`` only writes the generated snapshots there (``scaling-N.json``), to profile one
(``python -m cProfile -m worker compact DIR/scaling-50000.json``).

With ``--before DIR`` (an older tree, e.g. ``git archive REV | tar -x -C DIR``) every snapshot is
also compacted by that code (``PYTHONPATH=DIR``) with the same interpreter and packages, side by
side, and the two runs' events are compared (all but ``created_at``): a row says ``same`` when
every event is identical. ``--repeat K`` keeps the smallest CPU time of K runs of each.
Printed: a Markdown table, the 50k/10k ratio of CPU seconds, then the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import ROOT, conversations, corpus_dir

TIMEOUT_S = 1800.0
# The generated conversations' model window: a threshold of 12,000 tokens, which every size
# here exceeds (1,000 short messages are about 30,000 tokens).
CONTEXT_WINDOW = 16_000
REPEATED_USER_TURNS = ("continue", "Please go on.", "Run the tests again.", "ok")


def _tool_step(rnd: random.Random, step: int, files: int) -> tuple[str, str]:
    """A bash command of a coding agent and its (short) output, mini-swe-agent style."""
    f = rnd.randrange(files)
    kind = rnd.randrange(7)
    ok = "<returncode>0</returncode>\n<output>\n"
    if kind == 0:
        return f"cat src/pkg/mod_{f}.py", f"{ok}def f_{f}(x):\n    return x + {f}\n</output>"
    if kind == 1:
        return f"grep -rn 'f_{f}' src/", f"{ok}src/pkg/mod_{f}.py:1:def f_{f}(x):\n</output>"
    if kind == 2:
        command = f"python -m pytest tests/test_mod_{f}.py -q"
        if rnd.random() < 0.5:
            return command, f"{ok}1 passed in 0.01s\n</output>"
        failure = f"FAILED tests/test_mod_{f}.py::test_case_{step} - AssertionError: {step}"
        return command, f"<returncode>1</returncode>\n<output>\n{failure}\n1 failed\n</output>"
    if kind == 3:
        return f"sed -i 's/x + {f}/x - {f}/' src/pkg/mod_{f}.py", f"{ok}</output>"
    if kind == 4:
        command = f"git commit -qam 'fix mod_{f}' && git log -1 --format=%h"
        return command, f"{ok}{rnd.getrandbits(28):07x}a\n</output>"
    if kind == 5:
        return f"ls src/pkg/sub_{f % 50}/", f"{ok}__init__.py\nmod_{f}.py\n</output>"
    return f"curl -s https://api.example.com/v1/items/{step}", f'{ok}{{"id": {step}}}\n</output>'


def short_messages(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` short messages (OpenAI wire format) of a coding agent's session: a system prompt and
    a task, then user turns (about one message in twelve; two thirds of them the same few words
    again), assistant replies, and bash calls with their results. The files worked on grow with
    the conversation (one per eight messages), so its must-keep facts do too."""
    rnd = random.Random(seed)
    files = max(n // 8, 50)
    messages: list[dict[str, Any]] = [
        {"id": "m0", "role": "system", "content": "You are a coding agent with a bash tool."},
        {"id": "m1", "role": "user", "content": "Fix the failing tests; keep the public API."},
    ]
    step = 0
    while len(messages) < n:
        i = len(messages)
        r = rnd.random()
        if r < 0.10:
            text = rnd.choice(REPEATED_USER_TURNS)
            messages.append({"id": f"m{i}", "role": "user", "content": text})
        elif r < 0.15:
            f = rnd.randrange(files)
            text = f"Also make src/pkg/mod_{f}.py handle empty input (request {i})."
            messages.append({"id": f"m{i}", "role": "user", "content": text})
        elif r < 0.21:
            f = rnd.randrange(files)
            text = f"The change to mod_{f} works; the next failure is in the parser ({i})."
            messages.append({"id": f"m{i}", "role": "assistant", "content": text})
        else:
            step += 1
            command, output = _tool_step(rnd, i, files)
            call = {"name": "bash", "arguments": json.dumps({"command": command})}
            messages.append(
                {
                    "id": f"m{i}",
                    "role": "assistant",
                    "content": f"THOUGHT: step {step}, next command.",
                    "tool_calls": [{"id": f"call_{i}", "type": "function", "function": call}],
                }
            )
            messages.append(
                {"id": f"m{i + 1}", "role": "tool", "tool_call_id": f"call_{i}", "content": output}
            )
    del messages[n:]
    if messages[-1].get("tool_calls"):  # cut after a call: end on a reply instead
        messages[-1] = {"id": messages[-1]["id"], "role": "assistant", "content": "Done for now."}
    return messages


def scaling_snapshot(n: int, seed: int = 0) -> dict[str, Any]:
    return {
        "conversation_id": f"scaling-{n}",
        "revision": 1,
        "model": {"name": "gpt-4.1", "context_window": CONTEXT_WINDOW},
        "format": "openai",
        "messages": short_messages(n, seed),
    }


@dataclass
class Run:
    cpu: float  # the process's user + system seconds
    wall: float
    code: int
    events: list[dict[str, Any]]


def compact(code_root: Path, snapshot_path: Path, work: Path) -> Run:
    """A fresh ``python -m worker compact`` of ``snapshot_path`` with the code at ``code_root``,
    its transcripts in an emptied ``work/transcripts`` (the same place for every tree: the
    events name it)."""
    shutil.rmtree(work / "transcripts", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    config = work / "compactor.toml"
    config.write_text(f'[compaction]\ntranscript_dir = "{work / "transcripts"}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env["PYTHONPATH"] = str(code_root)
    out = work / "stdout"
    with out.open("wb") as stdout:
        command = ["-m", "worker", "compact", str(snapshot_path), "--config", str(config)]
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, *command], cwd=work, env=env, stdout=stdout, stderr=subprocess.DEVNULL
        )
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            raise
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    events = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    return Run(usage.ru_utime + usage.ru_stime, wall, proc.returncode, events)


def comparable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "created_at"} for e in events]


@dataclass
class Row:
    name: str
    messages: int
    runs: dict[str, list[Run]]  # tree -> one run per snapshot of the row

    def cpu(self, tree: str) -> float:
        return sum(r.cpu for r in self.runs[tree])

    def wall(self, tree: str) -> float:
        return sum(r.wall for r in self.runs[tree])

    def outcome(self, tree: str) -> str:
        kinds = sorted({e["type"].removeprefix("compaction.") for r in self.runs[tree] for e in
                        r.events if e["type"].startswith("compaction.")})  # fmt: skip
        codes = sorted({r.code for r in self.runs[tree]})
        return "/".join(kinds) + ("" if codes == [0] else f" (exit {codes})")


def measure(
    trees: dict[str, Path], snapshots: list[dict[str, Any]], work: Path, repeat: int
) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {name: [] for name in trees}
    for k, snapshot in enumerate(snapshots):
        path = work / f"snapshot-{k}.json"
        path.write_text(json.dumps(snapshot))
        for name, root in trees.items():
            runs = [compact(root, path, work) for _ in range(repeat)]
            out[name].append(min(runs, key=lambda r: r.cpu))
        path.unlink()
    return out


def corpus_snapshots(limit: int) -> list[dict[str, Any]]:
    from corpus_compact_bench import with_small_window

    snaps = []
    for _, snapshot in conversations():
        if len(snaps) >= limit:
            break
        snaps.append(with_small_window(snapshot))
    return snaps


def table(rows: list[Row], trees: list[str]) -> list[str]:
    head = "| snapshot | messages |"
    rule = "|---|---|"
    for name in trees:
        head += f" {name} CPU s | {name} wall s | {name} CPU ms/message |"
        rule += "---|---|---|"
    head += " outcome |" + (" events |" if len(trees) > 1 else "")
    rule += "---|" + ("---|" if len(trees) > 1 else "")
    lines = [head, rule]
    for row in rows:
        line = f"| {row.name} | {row.messages:,} |"
        for name in trees:
            per = row.cpu(name) * 1000 / row.messages
            line += f" {row.cpu(name):.2f} | {row.wall(name):.2f} | {per:.3f} |"
        line += f" {row.outcome(trees[-1])} |"
        if len(trees) > 1:
            pairs = zip(row.runs[trees[0]], row.runs[trees[-1]], strict=True)
            same = all(comparable(a.events) == comparable(b.events) for a, b in pairs)
            line += " same |" if same else " DIFFERENT |"
        lines.append(line)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="an older tree to compare with")
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--corpus", type=int, default=100, help="corpus conversations (0: none)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, the least CPU kept")
    parser.add_argument("--save", type=Path, help="only write the generated snapshots here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            (args.save / f"scaling-{n}.json").write_text(json.dumps(scaling_snapshot(n)))
        return 0
    trees = {"before": args.before.resolve()} if args.before else {}
    trees["after"] = ROOT
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="scaling-bench-") as tmp:
        work = Path(tmp)
        for n in sizes:
            runs = measure(trees, [scaling_snapshot(n)], work, args.repeat)
            rows.append(Row(f"{n:,} short messages", n, runs))
            print(f"measured {n} short messages", file=sys.stderr, flush=True)
        if args.corpus and corpus_dir() is not None:
            snaps = corpus_snapshots(args.corpus)
            messages = sum(len(s["messages"]) for s in snaps)
            runs = measure(trees, snaps, work, args.repeat)
            rows.append(Row(f"corpus, {len(snaps)} conversations", messages, runs))
    for line in table(rows, list(trees)):
        print(line)
    by_size = {row.messages: row for row in rows if row.name.endswith("short messages")}
    if 10_000 in by_size and 50_000 in by_size:
        ratios = [
            f"{name} {by_size[50_000].cpu(name) / by_size[10_000].cpu(name):.2f}" for name in trees
        ]
        print(f"CPU seconds, 50,000 / 10,000 short messages: {'; '.join(ratios)} (must be <= 5)")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    python = sys.version.split()[0]
    print(f"CPUs: {os.cpu_count()}; load average at the end {load}; Python {python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
