"""grep output (``path:N:text``, ``path-N-text``, ``path:text``) regrouped by file, as text.

Each run of consecutive lines from one file gets a ``## PATH`` heading and loses its path prefix,
like ripgrep's ``--heading`` view. A line under a heading stands for ``PATH:line``, or for
``PATH-line`` when it starts like a context line (``N-``); blank lines and ``--`` separators stay
as they are. A bare ``## `` line closes the current file, after which lines are verbatim until the
next heading (``grep: ...`` messages, lines from files that match only once in a row).
Non-contiguous matches of one file simply get a second heading, so the line order never changes.
"""

from __future__ import annotations

import re
from functools import lru_cache

from worker.compress.limits import ExpansionBudget
from worker.compress.textform import Encoded, TextForm, line_pieces, sample_lines

NAME = "grep-by-file"
HEADER = '[grep output, file prefix moved to "## FILE" headings]\n'
_HEADING = "## "
_CONTEXT_ROW = re.compile(r"[0-9]+-")
_MATCH_PATH = re.compile(r"(.+?):[0-9]+:")
_CONTEXT_PATH = re.compile(r"(.+?)-[0-9]+-")
_LOOKAHEAD_LINES = 64  # how far a context line looks for the match line that names its file


def decode(payload: str, budget: ExpansionBudget | None = None) -> str:
    budget = budget or ExpansionBudget(NAME)
    out: list[str] = []
    path: str | None = None
    for line in payload.split("\n"):
        if line.startswith(_HEADING):
            path = line[len(_HEADING) :] or None
            continue
        expanded = line if path is None else _expand_row(path, line)
        budget.spend(len(expanded) + 1)
        out.append(expanded)
    return "\n".join(out)


def _expand_row(path: str, row: str) -> str:
    if row in ("", "--"):
        return row
    separator = "-" if _CONTEXT_ROW.match(row) else ":"
    return path + separator + row


def _row(path: str, line: str) -> str | None:
    """How ``line`` is written under ``path``'s heading, or None if it is not one of its lines."""
    size = len(path)
    if len(line) <= size or line[size] not in ":-" or not line.startswith(path):
        return None
    row = line[size + 1 :]
    first = row[:1]
    if first.isdigit() or first in ("", "-", "#"):
        # Only rows starting like these can read back differently ("N-", "--", "## ").
        if row.startswith(_HEADING) or _expand_row(path, row) != line:
            return None
    elif line[size] != ":":
        return None  # "PATH-x" only reads back as itself when x is a context row "N-..."
    return row


@lru_cache(maxsize=4096)
def _plausible_path(path: str, *, numbered: bool) -> bool:
    if not path or path[0].isspace() or path[-1].isspace() or "\t" in path:
        return False
    if path.startswith(_HEADING) or not any(c in path for c in "./\\"):
        return False
    # Spaces are fine in a real path ("My Documents/x.py:3:"), but a timestamp or a log prefix
    # ("2024-01-01 12:30:45") must not pass for one; a bare "x:" prefix must be a plain path.
    if " " in path:
        return numbered and ("/" in path or "\\" in path)
    return True


def _unnumbered_path(line: str) -> str | None:
    colon = line.find(":")
    if colon == 1 and line[0].isalpha() and line[2:3] in ("\\", "/"):
        colon = line.find(":", 2)  # a Windows drive letter is part of the path
    if colon <= 0:
        return None
    path = line[:colon]
    return path if _plausible_path(path, numbered=False) else None


class _Paths:
    """The path each line names, worked out only for the lines that start a group."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self._matched: dict[int, str | None] = {}

    def matched(self, index: int) -> str | None:
        """The path of a match line, ``PATH:N:...``."""
        if index not in self._matched:
            match = _MATCH_PATH.match(self.lines[index])
            plausible = match is not None and _plausible_path(match.group(1), numbered=True)
            self._matched[index] = match.group(1) if match is not None and plausible else None
        return self._matched[index]

    def starting(self, index: int) -> str | None:
        """The file a line belongs to when it starts a new group."""
        matched = self.matched(index)
        if matched is not None:
            return matched
        line = self.lines[index]
        context = _CONTEXT_PATH.match(line)
        if context is not None:
            # grep -B/-C: the path is the one the next match line names, which may hold "-N-".
            for ahead in range(index + 1, min(index + 1 + _LOOKAHEAD_LINES, len(self.lines))):
                path = self.matched(ahead)
                if path is not None and _row(path, line) is not None:
                    return path
            if _plausible_path(context.group(1), numbered=True):
                return context.group(1)
        return _unnumbered_path(line)


def encode(text: str) -> Encoded | None:
    lines = text.split("\n")
    paths = _Paths(lines)
    payload: list[str] = []
    original: list[str] = []
    path: str | None = None
    grouped = 0
    for index, line in enumerate(lines):
        newline = "\n" if index + 1 < len(lines) else ""
        row = _row(path, line) if path is not None else None
        if row is None and (line or path is None):
            start = paths.starting(index)
            following = lines[index + 1] if index + 1 < len(lines) else ""
            # Open a group for a run of two or more lines, or for one line when the alternative
            # is closing the current group: both cost a heading line.
            if start is not None and (path is not None or _row(start, following) is not None):
                row = _row(start, line)
                if row is not None:
                    path = start
                    payload.append(_HEADING + start)
        if row is not None:
            payload.append(row)
            original += [line[: len(line) - len(row)], row + newline]
            grouped += 1
            continue
        if path is not None and _expand_row(path, line) != line:
            payload.append(_HEADING)  # close the group: this line is not one of its rows
            path = None
        if line.startswith(_HEADING):
            return None  # no way to write a verbatim line that reads as a heading
        payload.append(line)
        original.append(line + newline)
    if grouped < 2:
        return None
    return Encoded("\n".join(payload), line_pieces(payload), original)


def applies(text: str) -> bool:
    """Two neighbouring lines in the first screenful share a path prefix."""
    paths = _Paths(sample_lines(text))
    previous: str | None = None
    for index in range(len(paths.lines)):
        path = paths.starting(index)
        if path is not None and path == previous:
            return True
        previous = path
    return False


FORM = TextForm(NAME, HEADER, applies, encode, decode)
