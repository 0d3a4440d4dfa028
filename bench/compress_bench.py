"""Lossless tool-output compression over the real corpus, plus JSON forms and 1 MB timings.

    .venv/bin/python bench/compress_bench.py [--corpus DIR] [--runs N]

Prints Markdown tables (paste them into BENCHMARKS.md):

1. every tool result of ``../shared/corpus`` (or ``$COMPACTOR_CORPUS_DIR``), by category of the
   command that produced it: how many were compressed, tokens saved against the raw output
   (o200k_base, summed) over all outputs and over the compressed ones, round-trip success, and
   the worst case (largest growth);
2. the same results as the seed's JSON shapes (match objects, path lists, ``ls -l`` rows as
   arrays of objects), built here from the corpus text: each JSON form against compact JSON, and
   the JSON vs plain-text forms against the raw text;
3. compressing 1 MB outputs of several shapes (built from this interpreter's site-packages, so
   every line is distinct): p50 and max of several runs, without and with exact stats.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import random
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from worker.compress import (  # noqa: E402
    compress_tool_result,
    compress_with_stats,
    decompress_tool_result,
    envelope,
    structured,
)
from worker.compress.node import same_json  # noqa: E402
from worker.compress.tally import TokenTally  # noqa: E402
from worker.compress.text import best_form  # noqa: E402
from worker.tokens import count_tokens  # noqa: E402

CATEGORIES = ("grep", "listings", "file views", "test runs", "other")
MEGABYTE = 1_000_000

# --- the corpus ---


@dataclass(frozen=True)
class ToolResult:
    command: str
    output: str


def corpus_dir(explicit: str | None) -> Path:
    for place in (
        explicit,
        os.environ.get("COMPACTOR_CORPUS_DIR"),
        REPO_ROOT.parent / "shared" / "corpus",
    ):
        if place and (any(Path(place).glob("*.json.gz")) or any(Path(place).glob("*/*.json.gz"))):
            return Path(place)
    sys.exit("corpus not found: pass --corpus DIR or set $COMPACTOR_CORPUS_DIR")


def tool_results(directory: Path) -> list[ToolResult]:
    results = []
    files = sorted(directory.glob("*.json.gz")) or sorted(directory.glob("*/*.json.gz"))
    for path in files:
        messages = json.loads(gzip.decompress(path.read_bytes()))["messages"]
        commands = {
            call["id"]: json.loads(call["function"]["arguments"]).get("command", "")
            for message in messages
            for call in message.get("tool_calls") or []
        }
        results += [
            ToolResult(commands.get(m.get("tool_call_id"), ""), m["content"])
            for m in messages
            if m.get("role") == "tool"
        ]
    return results


_TEST_RUNNERS = re.compile(r"\b(pytest|tox|runtests\.py|bin/test)\b")
_SKIPPED = {"cd", "export", "source", "set", "true", "timeout"}


def category(command: str) -> str:
    """By the command that produced the output: the first real command of the line."""
    if _TEST_RUNNERS.search(command):
        return "test runs"
    for segment in re.split(r"&&|\|\||;|\|", command):
        words = segment.split()
        while words and "=" in words[0] and not words[0].startswith("="):
            words = words[1:]  # VAR=value prefixes
        if not words or words[0] in _SKIPPED:
            continue
        head = words[0].rsplit("/", 1)[-1]
        if head in ("grep", "egrep", "fgrep", "rg"):
            return "grep"
        if head in ("find", "ls", "tree") or words[:2] == ["git", "ls-files"]:
            return "listings"
        writes = "<<" in segment or ">" in segment  # cat <<EOF > file writes, shows nothing
        if (
            head in ("cat", "nl", "head", "tail") or (head == "sed" and "-n" in words)
        ) and not writes:
            return "file views"
        return "other"
    return "other"


def body_lines(output: str) -> list[str]:
    parts = envelope.split(output) or ["", output, ""]
    return [line for body in parts[1::2] for line in body.split("\n") if line]


def is_repetitive(output: str) -> bool:
    """At least a tenth of the lines (and five) repeat the line before them."""
    lines = output.split("\n")
    repeats = sum(a == b and a.strip() != "" for a, b in itertools.pairwise(lines))
    return repeats >= 5 and repeats * 10 >= len(lines)


def is_path_list(output: str) -> bool:
    """Nearly every line is a path with a directory (find, git ls-files), not ls columns."""
    lines = body_lines(output)
    paths = sum(" " not in line and "/" in line for line in lines)
    return len(lines) >= 3 and paths * 10 >= len(lines) * 9


_PATH_PREFIX = re.compile(r"[^\s:]+[/.][^\s:]*:")


def has_path_prefixes(output: str) -> bool:
    """Most lines start with ``path:``, the output of grep over several files."""
    lines = body_lines(output)
    return len(lines) >= 2 and sum(bool(_PATH_PREFIX.match(line)) for line in lines) * 2 >= len(
        lines
    )


@dataclass
class Row:
    outputs: int = 0
    compressed: int = 0
    tokens_raw: int = 0
    tokens_after: int = 0
    raw_of_compressed: int = 0
    after_of_compressed: int = 0
    round_trips: int = 0
    codecs: dict[str, int] = field(default_factory=dict)

    def add(self, before: int, after: int, codec: str | None, round_trip: bool) -> None:
        self.outputs += 1
        self.tokens_raw += before
        self.tokens_after += after
        self.round_trips += round_trip
        if codec is not None:
            self.compressed += 1
            self.raw_of_compressed += before
            self.after_of_compressed += after
            self.codecs[codec] = self.codecs.get(codec, 0) + 1

    def cells(self, name: str) -> list[str]:
        return [
            name,
            str(self.outputs),
            f"{self.compressed} ({percent(self.compressed, self.outputs)})",
            str(self.tokens_raw),
            str(self.tokens_after),
            percent(self.tokens_raw - self.tokens_after, self.tokens_raw),
            percent(self.raw_of_compressed - self.after_of_compressed, self.raw_of_compressed),
            percent(self.round_trips, self.outputs),
        ]


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def corpus_section(results: list[ToolResult]) -> None:
    rows = {name: Row() for name in CATEGORIES}
    extra = {
        "grep over several files": Row(),
        "path lists (find, git ls-files)": Row(),
        "repeated-line outputs (any command)": Row(),
    }
    total = Row()
    worst: tuple[int, float, str] = (-(10**9), 0.0, "")
    started = time.perf_counter()
    for result in results:
        outcome = compress_with_stats("bash", result.output)
        round_trip = decompress_tool_result("bash", outcome.output) == result.output
        args = (outcome.tokens_before, outcome.tokens_after, outcome.codec, round_trip)
        kind = category(result.command)
        rows[kind].add(*args)
        total.add(*args)
        if kind == "grep" and has_path_prefixes(result.output):
            extra["grep over several files"].add(*args)
        if kind == "listings" and is_path_list(result.output):
            extra["path lists (find, git ls-files)"].add(*args)
        if is_repetitive(result.output):
            extra["repeated-line outputs (any command)"].add(*args)
        growth = outcome.tokens_after - outcome.tokens_before
        if growth > worst[0]:
            worst = (growth, outcome.tokens_after / max(outcome.tokens_before, 1), result.command)
    elapsed = time.perf_counter() - started
    header = [
        "category",
        "outputs",
        "compressed",
        "tokens raw",
        "tokens after",
        "saved (all)",
        "saved (compressed)",
        "round trip",
    ]
    body = [rows[name].cells(name) for name in CATEGORIES] + [total.cells("**all**")]
    body += [row.cells(f"_{name}_") for name, row in extra.items()]
    print(f"**Corpus: {total.outputs} tool results (o200k_base tokens, gate 200 tokens / 15%)**\n")
    print(table(header, body))
    print(f"\nForms used: {', '.join(f'{k} {v}' for k, v in sorted(total.codecs.items()))}")
    if worst[0] > 0:
        command = worst[2].split("\n")[0][:80]
        print(f"Worst case: an output grew by {worst[0]} tokens (x{worst[1]:.3f}): {command!r}")
    else:
        print(f"Worst case: no output grew (largest change {worst[0]} tokens)")
    print(f"Round trip: {total.round_trips}/{total.outputs}; all results in {elapsed:.2f} s\n")


# --- the seed's JSON shapes, built from the corpus text ---

_LS_LONG = re.compile(
    r"([-dlcbps][-rwxsStT]{9})\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\w{3}\s+\d+\s+[\d:]+)\s+(.+)"
)


def ls_rows(output: str) -> list[dict[str, Any]]:
    rows = []
    for line in body_lines(output):
        match = _LS_LONG.fullmatch(line)
        if match is not None:
            mode, links, owner, group, size, modified, name = match.groups()
            rows.append(
                {
                    "mode": mode,
                    "links": int(links),
                    "owner": owner,
                    "group": group,
                    "size": int(size),
                    "modified": " ".join(modified.split()),
                    "name": name,
                }
            )
    return rows


_NUMBERED = re.compile(r"(\d+):(.*)")
_FILE_ARGUMENT = re.compile(r"[\w./-]+\.\w+")


def grep_matches(result: ToolResult) -> list[dict[str, Any]]:
    """``grep -n PATTERN FILE`` output as the seed's match objects (the corpus has no ``-rn``)."""
    try:
        words = shlex.split(result.command.split("|")[0].split("&&")[-1])
    except ValueError:  # a quote closed after the pipe: not a simple grep
        return []
    files = [w for w in words[1:] if _FILE_ARGUMENT.fullmatch(w) and not w.startswith("-")]
    if not words or words[0] != "grep" or "-n" not in " ".join(words) or len(files) != 1:
        return []
    matches = []
    for line in body_lines(result.output):
        match = _NUMBERED.fullmatch(line)
        if match is not None:
            path = "/testbed/" + files[0].removeprefix("./")
            number, line_text = int(match.group(1)), match.group(2)
            matches.append({"file": path, "line_number": number, "line": line_text})
    return matches


def prefixed_matches(output: str) -> list[dict[str, Any]]:
    """``grep -r`` output (``path:text``) as match objects."""
    matches = []
    for line in body_lines(output):
        prefix = _PATH_PREFIX.match(line)
        if prefix is not None:
            matches.append({"file": prefix.group(0)[:-1], "line": line[prefix.end() :]})
    return matches


def ls_table(result: ToolResult) -> Any:
    rows = ls_rows(result.output)
    return rows if len(rows) >= 2 else None


def grep_objects(result: ToolResult) -> Any:
    matches = grep_matches(result)
    return {"matches": matches} if len(matches) >= 2 else None


def path_list(result: ToolResult) -> Any:
    if not is_path_list(result.output):
        return None
    return {"files": ["/testbed/" + path.removeprefix("./") for path in body_lines(result.output)]}


def json_section(results: list[ToolResult]) -> None:
    shapes: list[tuple[str, str, Callable[[ToolResult], Any]]] = [
        ("arrays of objects (`ls -l` rows) -> csv", "listings", ls_table),
        ("grep -n match objects -> grep-v1", "grep", grep_objects),
        ("absolute path lists -> glob-v1", "listings", path_list),
    ]
    rows = []
    for name, kind, build in shapes:
        values = [v for r in results if category(r.command) == kind and (v := build(r)) is not None]
        before = after = compressed = 0
        for value in values:
            outcome = compress_with_stats("bash", value, min_tokens=0, min_saving=0.0)
            assert same_json(decompress_tool_result("bash", outcome.output), value)
            before += outcome.tokens_before
            after += outcome.tokens_after
            compressed += outcome.compressed
        rows.append(
            [
                name,
                str(len(values)),
                str(compressed),
                str(before),
                str(after),
                percent(before - after, before),
            ]
        )
    print("**The seed's JSON forms against compact JSON (inputs built from corpus outputs)**\n")
    print(table(["shape", "inputs", "compressed", "compact JSON", "after", "saved"], rows))
    print()
    forms_vs_text(results)


def forms_vs_text(results: list[ToolResult]) -> None:
    """Why text stays text: the same grep matches as JSON forms and as text forms."""
    tally = TokenTally()
    sums = {
        "raw text": 0,
        "match objects (compact JSON)": 0,
        "seed JSON form": 0,
        "grep-by-file text": 0,
    }
    for result in results:
        if category(result.command) != "grep" or not has_path_prefixes(result.output):
            continue
        text = (envelope.split(result.output) or ["", result.output, ""])[1]
        matches = prefixed_matches(result.output)
        if len(matches) != len([line for line in text.split("\n") if line]):
            continue  # only outputs that are nothing but path:text matches
        encoded = compress_tool_result("grep", {"matches": matches}, min_tokens=0, min_saving=-1)
        choice = best_form(text, tally)
        sums["raw text"] += count_tokens(text)
        sums["match objects (compact JSON)"] += count_tokens(structured.dumps({"matches": matches}))
        sums["seed JSON form"] += count_tokens(structured.dumps(encoded))
        sums["grep-by-file text"] += count_tokens(choice.text if choice else text)
    raw = sums["raw text"]
    rows = [[name, str(value), percent(value - raw, raw)] for name, value in sums.items()]
    print("**`grep -r` output over several files (corpus): JSON and text forms vs raw text**\n")
    print(table(["form", "tokens", "change vs raw text"], rows))
    print()


# --- 1 MB outputs ---


def site_packages() -> Path:
    return next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())


def python_files() -> Iterator[tuple[str, list[str]]]:
    root = site_packages()
    for path in sorted(root.rglob("*.py")):
        try:
            yield str(path.relative_to(root)), path.read_text("utf-8").split("\n")
        except (UnicodeDecodeError, OSError):
            continue


def first_megabyte(lines: Iterator[str]) -> str:
    out: list[str] = []
    size = 0
    for line in lines:
        out.append(line + "\n")
        size += len(line) + 1
        if size >= MEGABYTE:
            break
    return "".join(out)


def megabyte_outputs() -> dict[str, str]:
    def grep(numbered: bool) -> Iterator[str]:
        for path, lines in python_files():
            for number, line in enumerate(lines, 1):
                if "def " in line or "import " in line:
                    yield f"{path}:{number}:{line}" if numbered else f"{path}:{line}"

    def find() -> Iterator[str]:
        for copy in range(10):  # the tree once is under 1 MB in a small venv
            for path in sorted(site_packages().rglob("*")):
                yield f"./copy{copy}/{path.relative_to(site_packages())}"

    def ls_recursive() -> Iterator[str]:
        for copy in range(10):
            for directory in sorted(p for p in site_packages().rglob("*") if p.is_dir()):
                names = sorted(child.name for child in directory.iterdir())
                yield f"./copy{copy}/{directory.relative_to(site_packages())}:"
                yield from names
                yield ""

    def numbered() -> Iterator[str]:
        count = 0
        for _, lines in python_files():
            for line in lines:
                count += 1
                yield f"{count:>6}\t{line}"

    def code() -> Iterator[str]:
        for _, lines in python_files():
            yield from lines

    def log() -> Iterator[str]:
        rng = random.Random(7)
        while True:
            yield from ["Cloning test database for alias 'default'..."] * rng.randint(1, 8)
            yield f"test_{rng.randrange(10**6)} (queries.tests.JoinReuseTest) ... ok"

    return {
        "grep -rn (path:N:text)": first_megabyte(grep(True)),
        "grep -r (path:text)": first_megabyte(grep(False)),
        "find (paths)": first_megabyte(find()),
        "ls -R": first_megabyte(ls_recursive()),
        "nl -ba view": first_megabyte(numbered()),
        "cat view (no form applies)": first_megabyte(code()),
        "log with repeated lines": first_megabyte(log()),
    }


def timing_section(runs: int) -> None:
    rows = []
    for name, text in megabyte_outputs().items():
        fast = timed(partial(compress_tool_result, "bash", text), runs)
        exact = timed(partial(compress_with_stats, "bash", text), runs)
        outcome = compress_with_stats("bash", text)
        assert decompress_tool_result("bash", outcome.output) == text
        saved = percent(outcome.tokens_before - outcome.tokens_after, outcome.tokens_before)
        rows.append(
            [
                name,
                f"{len(text) / MEGABYTE:.2f}",
                outcome.codec or "(unchanged)",
                saved,
                f"{statistics.median(fast):.0f} / {max(fast):.0f}",
                f"{statistics.median(exact):.0f} / {max(exact):.0f}",
            ]
        )
    print(f"**Compressing 1 MB outputs (ms, p50 / max of {runs} runs)**\n")
    header = ["output", "MB", "form", "saved", "compress_tool_result", "compress_with_stats"]
    print(table(header, rows))
    print()


def timed(call: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="directory of *.json.gz snapshots")
    parser.add_argument("--runs", type=int, default=7, help="timing runs per 1 MB output")
    args = parser.parse_args()
    results = tool_results(corpus_dir(args.corpus))
    corpus_section(results)
    json_section(results)
    timing_section(args.runs)


if __name__ == "__main__":
    main()
