"""Path listings (``find``, ``git ls-files``, ``rg --files``) grouped by directory, as text.

A run of consecutive paths in one directory becomes one line ``DIR/ name1 name2 ...``: the
directory once, then the names separated by single spaces. Every other line is kept verbatim.
Paths containing whitespace are never grouped, so splitting a group line on spaces is exact; a
verbatim line that would parse as a group line makes the codec decline.
"""

from __future__ import annotations

import re

from worker.compress.limits import ExpansionBudget
from worker.compress.textform import Encoded, TextForm, sample_lines

NAME = "paths-by-dir"
HEADER = '[paths grouped by directory: "DIR/ a b" = DIR/a, DIR/b]\n'
_GROUP_LINE = re.compile(r"(\S*[/\\]) (\S+(?: \S+)*)")
_WHITESPACE = re.compile(r"\s")


def decode(payload: str, budget: ExpansionBudget | None = None) -> str:
    budget = budget or ExpansionBudget(NAME)
    out: list[str] = []
    for line in payload.split("\n"):
        group = _GROUP_LINE.fullmatch(line)
        if group is None:
            budget.spend(len(line) + 1)
            out.append(line)
            continue
        directory, names = group.group(1), group.group(2).split(" ")
        budget.spend(len(directory) * len(names) + len(line))
        out.extend(directory + name for name in names)
    return "\n".join(out)


def _directory_of(line: str) -> str | None:
    """``line`` up to and including its last separator, if it is a path worth grouping."""
    cut = max(line.rfind("/"), line.rfind("\\"))
    if cut < 0 or cut == len(line) - 1 or _WHITESPACE.search(line) is not None:
        return None
    return line[: cut + 1]


def _run_end(lines: list[str], start: int, directory: str) -> int:
    end = start + 1
    while end < len(lines) and _directory_of(lines[end]) == directory:
        end += 1
    return end


def encode(text: str) -> Encoded | None:
    lines = text.split("\n")
    payload: list[str] = []
    index = 0
    grouped = 0
    while index < len(lines):
        directory = _directory_of(lines[index])
        end = _run_end(lines, index, directory) if directory is not None else index + 1
        if directory is not None and end - index >= 2:
            names = [line[len(directory) :] for line in lines[index:end]]
            payload.append(directory + " " + " ".join(names))
            grouped += end - index
        elif _GROUP_LINE.fullmatch(lines[index]) is not None:
            return None  # a verbatim line that would read back as a group
        else:
            payload.append(lines[index])
        index = end
    if grouped < 2:
        return None
    joined = "\n".join(payload)
    # Grouped lines share no text with their originals, and per-line pieces cost more Python
    # time than they could save in tokenizing: two whole pieces count fastest.
    return Encoded(joined, [joined], [text])


def applies(text: str) -> bool:
    """Two neighbouring lines in the first screenful are paths in the same directory."""
    previous: str | None = None
    for line in sample_lines(text):
        directory = _directory_of(line)
        if directory is not None and directory == previous:
            return True
        previous = directory
    return False


FORM = TextForm(NAME, HEADER, applies, encode, decode)
