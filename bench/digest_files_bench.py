"""Precision and recall of the digest's "Files touched" on the shared corpus.

The reference is derived from each conversation's own tool calls and outputs, by code written
separately from ``worker.core.files`` (nothing here imports the digest's extraction):

* **existence evidence** (whole conversation): every path a tool output shows: lines that are
  one path (``ls``, ``find``, ``grep -l``), ``ls DIR`` entries joined to ``DIR``, ``ls -R`` headers
  and their entries, ``grep -n`` prefixes (``path:12:``), traceback ``File "path"`` lines,
  ``diff --git``/``---``/``+++`` headers, ``git status`` lines, pytest ``path::test`` lines; and
  the paths an output reports missing (``No such file or directory``, ``cannot access``, ...).
* **candidates** (the compacted range): each call's path arguments of file tools; for shell
  commands, the words of each simple command (here-document bodies, comment lines, quoted words
  with spaces and options removed; the pattern or script word of grep/sed/awk and everything of
  ``python -c``/``-m``, ``echo``, ``printf``, ``pip``, ``export``, ``cd`` left out).
* a candidate is **in the reference** when it is path-shaped and (a) some output shows it
  (suffix match, so ``/testbed/a/b.py`` shows ``a/b.py``), or (b) the command created it
  (redirect target, ``touch``/``mkdir``/``tee`` operand, last operand of ``cp``/``mv``), or (c) its
  command is a file command (cat, sed, grep, ls, rm, python, pytest, ...) whose call exited 0;
  and its own call's output does not report it missing.

The digest's files are the backticked paths of its "Files touched" section. Both sets are
compared per conversation after one normalization (no ``./``, no doubled or trailing ``/``).

    COMPACTOR_CORPUS_DIR=/work/shared/corpus .venv/bin/python bench/digest_files_bench.py [-v]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import conversations
from corpus_compact_bench import with_small_window

from worker.config import Settings
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent

PATHY = re.compile(r"^[\w@%+,.~/\-]+$")
EXT = re.compile(r"\.[A-Za-z][A-Za-z0-9_]{0,9}$")
RC = re.compile(r"<returncode>(-?\d+)</returncode>")
MISSING = [
    re.compile(r"([^\s:'\"]+): No such file or directory"),
    re.compile(r"cannot access '([^']+)'"),
    re.compile(r"can't open file '([^']+)'"),
    re.compile(r"can't read ([^\s:]+):"),
    re.compile(r"file or directory not found: (\S+)"),
]
GREP_LINE = re.compile(r"^([\w@%+,.~/\-]+\.[A-Za-z]\w*)[:-]\d+[:-]")
TRACEBACK = re.compile(r'File "([^"<>]+)", line \d+')
DIFF_HEAD = re.compile(r"^(?:diff --git a/(\S+) b/(\S+)|--- a/(\S+)|\+\+\+ b/(\S+))")
GIT_STATUS = re.compile(r"^\s*(?:modified|new file|deleted|renamed|both modified):\s+(\S+)")
PYTEST = re.compile(r"^([\w./\-]+\.py)(?:::\S+)?\s")
FILE_VERBS = {
    "cat",
    "head",
    "tail",
    "nl",
    "sed",
    "grep",
    "egrep",
    "awk",
    "wc",
    "ls",
    "rm",
    "python",
    "python3",
    "pytest",
    "diff",
    "git",
    "find",
    "cp",
    "mv",
    "chmod",
    "less",
    "touch",
    "mkdir",
    "tee",
    "rmdir",
}
NO_FILES = {"echo", "printf", "pip", "pip3", "export", "cd", "which", "conda", "apt-get"}
PATTERN_FIRST = {"grep", "egrep", "fgrep", "sed", "awk"}
VALUE_OPTIONS = {
    "head": ("-n", "-c"),
    "tail": ("-n", "-c"),
    "grep": ("-A", "-B", "-C", "-m", "-e", "-f"),
    "egrep": ("-A", "-B", "-C", "-m", "-e", "-f"),
    "sed": ("-e", "-f"),
    "awk": ("-F", "-v", "-f"),
    "pytest": ("-k", "-m", "-p", "-c", "-o", "-W", "-n"),
}
RUNNERS = {"python", "python3", "pytest"}
FILE_TOOL_KEYS = ("path", "file_path", "filepath", "filename", "file", "target_file")


def norm(path: str) -> str:
    p = re.sub(r"/+", "/", path.strip())
    while p.startswith("./"):
        p = p[2:]
    return p.rstrip("/") if len(p) > 1 else p


def path_shaped(word: str) -> bool:
    if not PATHY.match(word) or word.startswith("-") or not re.search(r"[A-Za-z]", word):
        return False
    return not (word in (".", "..", "/dev/null") or word.startswith("/dev/"))


# --- existence evidence from outputs ----------------------------------------------------------


def shown_paths(command: str, output: str) -> set[str]:
    shown: set[str] = set()
    body = output.split("<output>", 1)[-1] if "<output>" in output else output
    listed_dir = ""
    words = command.split()
    if words and words[0] == "ls":
        operands = [w for w in words[1:] if not w.startswith("-")]
        if len(operands) == 1 and "|" not in command and "&" not in command:
            listed_dir = operands[0]
    header = ""
    listing = bool(re.match(r"\s*(ls|find|git ls-files|tree)\b", command)) or " -l" in command
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            header = ""
            continue
        if listing and line.endswith(":") and PATHY.match(line[:-1]) and " " not in line:
            header = line[:-1]  # ls -R (or ls of several directories)
            shown.add(norm(header))
            continue
        for pattern in (GREP_LINE, TRACEBACK, GIT_STATUS, PYTEST):
            m = pattern.search(line)
            if m:
                shown.add(norm(m.group(1)))
        m = DIFF_HEAD.match(line)
        if m:
            shown.update(norm(g) for g in m.groups() if g)
        last = line.split()[-1]
        # one path a line, or an ls -l line, in the output of a listing command
        if listing and len(line.split()) in (1, 9) and path_shaped(last):
            if header:
                shown.add(norm(f"{header}/{last}"))
            elif listed_dir:
                shown.add(norm(f"{listed_dir}/{last}"))
            else:
                shown.add(norm(last))
    return shown


def missing_paths(output: str) -> set[str]:
    return {norm(m.group(1)) for p in MISSING for m in p.finditer(output)}


def is_shown(path: str, shown: set[str], suffixes: set[str]) -> bool:
    return path in shown or path in suffixes


def suffixes_of(shown: set[str]) -> set[str]:
    """Relative spellings of shown paths (``/testbed/a/b.py`` shows ``a/b.py``)."""
    out: set[str] = set()
    for p in shown:
        parts = p.split("/")
        for k in range(1, len(parts)):
            out.add("/".join(parts[k:]))
    return out


def with_parents(paths: set[str]) -> set[str]:
    """A path that exists shows that its directories exist."""
    out = set(paths)
    for p in paths:
        parts = p.split("/")
        for k in range(1, len(parts)):
            if parts[:k] != [""]:
                out.add("/".join(parts[:k]))
    return out


# --- candidates from calls --------------------------------------------------------------------


def without_heredocs(command: str) -> str:
    out, delimiter = [], None
    for line in command.split("\n"):
        if delimiter is not None:
            if line.strip() == delimiter:
                delimiter = None
            continue
        if not line.lstrip().startswith("#"):
            out.append(line)
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if m:
            delimiter = m.group(1)
    return "\n".join(out)


TOKEN = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"|&&|\|\||[;|&\n()]|[<>]+|[^\s;|&<>()'\"]+")


def segments(command: str) -> list[list[str]]:
    """Simple commands as lists of words (quoted words keep a marker when they hold a space)."""
    out: list[list[str]] = [[]]
    for tok in TOKEN.findall(without_heredocs(command).replace("\\\n", " ")):
        if tok in ("&&", "||", ";", "|", "&", "\n", "(", ")"):
            out.append([])
        elif tok[0] in "'\"":
            inner = tok[1:-1]
            out[-1].append(inner if not re.search(r"\s", inner) else "\x00")
        else:
            out[-1].append(tok)
    return [s for s in out if s]


def shell_candidates(command: str) -> list[tuple[str, str, bool]]:
    """(word, verb, created) for every path-shaped word in a file position."""
    found: list[tuple[str, str, bool]] = []
    for words in segments(command):
        rest: list[str] = []
        k = 0
        while k < len(words) and (re.match(r"^\w+=", words[k]) or words[k] in ("sudo", "env")):
            k += 1
        if k >= len(words):
            continue
        verb_path = words[k]
        verb = verb_path.rsplit("/", 1)[-1]
        args = words[k + 1 :]
        if "/" in verb_path and path_shaped(verb_path) and not verb_path.startswith("/usr/"):
            found.append((verb_path, verb, False))
        # redirections
        for i, w in enumerate(args):
            if w in (">", ">>") and i + 1 < len(args):
                found.append((args[i + 1], verb, True))
        args = [
            w
            for i, w in enumerate(args)
            if w not in (">", ">>", "<", "2>", ">&") and not (i and args[i - 1] in (">", ">>"))
        ]
        args = [w for w in args if not re.fullmatch(r"\d*>&?\d*", w)]
        if verb in NO_FILES:
            continue
        if verb.startswith("python"):
            if "-c" in args:
                continue
            if "-m" in args:
                at = args.index("-m")
                if at + 1 < len(args) and args[at + 1] == "pytest":
                    rest = args[at + 2 :]
                    verb = "pytest"
                else:
                    continue
            else:
                rest = args
        else:
            rest = args
        operands = []
        skip_next = False
        takes_value = VALUE_OPTIONS.get(verb, ())
        for w in rest:
            if skip_next:
                skip_next = False
                continue
            if w.startswith("-"):
                skip_next = w in takes_value or (len(w) > 2 and f"-{w[-1]}" in takes_value)
                if w in ("-e", "-f") and verb in PATTERN_FIRST:
                    verb = verb + "!"  # the script came with an option: every operand is a file
                continue
            operands.append(w)
        if verb in PATTERN_FIRST and operands:
            operands = operands[1:]
        verb = verb.rstrip("!")
        if verb.startswith("python") and operands:
            operands = operands[:1]  # the script; the rest are its own arguments
        if verb == "pytest":
            operands = [o.split("::", 1)[0] for o in operands]
        if verb == "find":
            operands = operands[:1]
        for i, w in enumerate(operands):
            created = verb in ("touch", "mkdir", "tee") or (
                verb in ("cp", "mv") and i == len(operands) - 1
            )
            found.append((w, verb, created))
    return [(w, v, c) for w, v, c in found if w != "\x00" and path_shaped(w)]


def reference(messages: list[dict[str, Any]], start: int, end: int) -> set[str]:
    outputs = {
        m.get("tool_call_id"): m.get("content") or "" for m in messages if m["role"] == "tool"
    }
    commands = {
        c["id"]: c["function"]
        for m in messages
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
    }
    shown: set[str] = set()
    for cid, fn in commands.items():
        try:
            command = json.loads(fn["arguments"]).get("command", "")
        except (ValueError, AttributeError):
            command = ""
        shown |= shown_paths(command if isinstance(command, str) else "", outputs.get(cid, ""))
    created_anywhere: set[str] = set()
    for fn in commands.values():
        try:
            command = json.loads(fn["arguments"]).get("command", "")
        except (ValueError, AttributeError):
            continue
        if isinstance(command, str):
            created_anywhere |= {norm(w) for w, _, c in shell_candidates(command) if c}
    shown = with_parents(shown | created_anywhere)
    suffixes = suffixes_of(shown)
    ref: set[str] = set()
    for m in messages[start:end]:
        for c in m.get("tool_calls") or []:
            output = outputs.get(c["id"], "")
            missing = missing_paths(output)
            rc_match = RC.search(output[:200])
            rc = int(rc_match.group(1)) if rc_match else 0
            if rc == 127 or "syntax error" in output[:300]:
                continue  # the shell ran nothing, or not this command
            try:
                args = json.loads(c["function"]["arguments"] or "{}")
            except ValueError:
                continue
            if not isinstance(args, dict):
                continue
            for key in FILE_TOOL_KEYS:
                value = args.get(key)
                if isinstance(value, str) and path_shaped(value) and norm(value) not in missing:
                    ref.add(norm(value))
            command = args.get("command")
            if not isinstance(command, str):
                continue
            for word, verb, created in shell_candidates(command):
                p = norm(word)
                if p in missing:
                    continue
                # grep exits 1 when nothing matched: it read the file all the same
                ok = rc == 0 or (rc == 1 and verb in ("grep", "egrep"))
                named = "/" in word and word.rstrip("/") in output  # the output names it
                # A script that ran shows it exists even when it failed (missing ones are out).
                ran = verb in RUNNERS or ("/" in word and verb == word.rsplit("/", 1)[-1])
                evidenced = (
                    (p in shown if "/" not in p else is_shown(p, shown, suffixes))
                    or created
                    or (ok and verb in FILE_VERBS)
                    or ran
                    or named
                )
                if evidenced and ("/" in word or EXT.search(p) or p in shown or created):
                    ref.add(p)
    return ref


FILE_LINE = re.compile(r"^- `([^`]+)`")


def digest_files(summary: str) -> set[str]:
    section = summary.split("## Files touched\n", 1)
    if len(section) < 2:
        return set()
    body = section[1].split("\n## ", 1)[0]
    return {norm(m.group(1)) for line in body.splitlines() if (m := FILE_LINE.match(line))}


def baseline_files(messages: list[dict[str, Any]], start: int, end: int) -> set[str]:
    """What the digest listed before issue 14: ``extract_paths`` over every argument string."""
    from worker.core.facts import argument_strings, extract_paths

    return {
        norm(p)
        for m in messages[start:end]
        for c in m.get("tool_calls") or []
        for text in argument_strings(c["function"]["arguments"])
        for p in extract_paths(text)
    }


def measure(*, baseline: bool = False, verbose: bool = False) -> dict[str, Any]:
    """Micro-averaged precision and recall over every conversation of the corpus."""
    tp = fp = fn = 0
    rows = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, snapshot in conversations():
            snap = with_small_window(snapshot)
            pipeline = Pipeline(Settings(), Adapters(store=FileStore(Path(tmp))), Reuse())
            event = pipeline.run(pipeline.parse(snap))[-1]
            if not isinstance(event, CompletedEvent):
                print(f"{name}: {event.type}")
                continue
            c = event.compaction
            ref = reference(snap["messages"], c.start, c.end)
            got = (
                baseline_files(snap["messages"], c.start, c.end)
                if baseline
                else digest_files(c.summary.text)
            )
            rows += 1
            tp += len(got & ref)
            fp += len(got - ref)
            fn += len(ref - got)
            if verbose and (got - ref or ref - got):
                extra, lost = sorted(got - ref), sorted(ref - got)
                print(f"{name}: not in reference {extra}; not in digest {lost}")
    return {
        "conversations": rows,
        "digest": tp + fp,
        "reference": tp + fn,
        "both": tp,
        "false_positives": fp,
        "missed": fn,
        "precision": tp / max(tp + fp, 1),
        "recall": tp / max(tp + fn, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-v", "--verbose", action="store_true", help="print every mismatch")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="score the earlier rule instead (every path-looking string in the call arguments)",
    )
    args = parser.parse_args()
    r = measure(baseline=args.baseline, verbose=args.verbose)
    print(f"conversations compacted: {r['conversations']}")
    print(f"digest files: {r['digest']}; reference files: {r['reference']}; in both: {r['both']}")
    print(
        f"precision {r['precision']:.1%} ({r['false_positives']} not in the reference); "
        f"recall {r['recall']:.1%} ({r['missed']} missed)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
