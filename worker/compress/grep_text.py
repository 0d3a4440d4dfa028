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
from worker.compress.textform import Encoded, LineStart, TextForm, sample_chars, sample_lines

NAME = "grep-by-file"
HEADER = '[grep output, file prefix moved to "## FILE" headings]\n'
_HEADING = "## "
_CONTEXT_ROW = re.compile(r"[0-9]+-")
# A row that needs a closer look under "PATH:" (see _row): "N-...", "--", "## ..." or empty,
# found after its newline (a literal first character makes the search fast).
_UNPLAIN_ROW = re.compile(r"\n(?:[0-9]+-|--(?![^\n])|## |(?![^\n]))")
_MATCH_PATH = re.compile(r"(.+?):[0-9]+:")
_CONTEXT_PATH = re.compile(r"(.+?)-[0-9]+-")
_LOOKAHEAD_LINES = 64  # how far a context line looks for the match line that names its file
# Every path _Paths.starting finds is a prefix of its line that does not start with whitespace,
# holds no tab and one of "./\\", and is followed by ":" or "-" (see _plausible_path and _row).
# Two such lines in a row are what applies() needs, and most texts (code, logs) have none.
_PATH_LED = r"(?!\s)[^\t\n./\\]*+[./\\][^\t\n:-]*+[:-]"
_PATH_LED_LINE = re.compile(_PATH_LED)
_PATH_LED_PAIR = LineStart(rf"{_PATH_LED}[^\n]*+\n{_PATH_LED}")


def decode(payload: str, budget: ExpansionBudget | None = None) -> str:
    budget = budget or ExpansionBudget(NAME)
    # Lines starting with "## " are exactly where "\n## " occurs once a newline leads the text.
    preamble, *sections = ("\n" + payload).split("\n" + _HEADING)
    out: list[str] = []
    if preamble:  # verbatim lines before the first heading
        budget.spend(len(preamble))
        out.append(preamble[1:])
    for section in sections:
        path, newline, rows = section.partition("\n")
        if newline:  # else a heading with no line after it
            out.append(_expand_rows(path, rows, budget) if path else _verbatim(rows, budget))
    return "\n".join(out)


def _verbatim(rows: str, budget: ExpansionBudget) -> str:
    budget.spend(len(rows) + 1)
    return rows


def _expand_rows(path: str, rows: str, budget: ExpansionBudget) -> str:
    """The lines a file's rows stand for, in one replace unless some row needs a closer look."""
    if _UNPLAIN_ROW.search("\n" + rows) is None:  # every row stands for "PATH:row"
        budget.spend(len(rows) + 1 + (rows.count("\n") + 1) * (len(path) + 1))
        return path + ":" + rows.replace("\n", "\n" + path + ":")
    lines: list[str] = []
    for row in rows.split("\n"):
        lines.append(_expand_row(path, row))
        budget.spend(len(lines[-1]) + 1)
    return "\n".join(lines)


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
    if first.isdigit():
        # Reads back as "PATH-row" exactly when it starts like a context row "N-".
        return row if (_CONTEXT_ROW.match(row) is not None) == (line[size] == "-") else None
    if first in ("", "-", "#"):
        # Only rows starting like these can read back differently ("--", "## ").
        return None if row.startswith(_HEADING) or _expand_row(path, row) != line else row
    return row if line[size] == ":" else None  # "PATH-x" only stands for a context row "N-..."


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
    out = _Output()
    path: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
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
                    out.line(_HEADING + start)
        index += 1
        if row is not None and path is not None:  # (a row always has its file's path)
            out.row(line[: len(line) - len(row)], row)
            # The lines after it are usually rows of the same file, recognised in bulk.
            rows = _plain_rows(lines, index, path)
            out.plain_rows(path + ":", rows)
            index += len(rows)
            continue
        if path is not None and _expand_row(path, line) != line:
            out.line(_HEADING)  # close the group: this line is not one of its rows
            path = None
        if line.startswith(_HEADING):
            return None  # no way to write a verbatim line that reads as a heading
        out.line(line, original=line)
    return out.encoded() if out.rows >= 2 else None


def _plain_rows(lines: list[str], start: int, path: str) -> list[str]:
    """The rows of the lines from ``start`` that are ``PATH:row`` and read back as such, up to
    the first line that is not: what :func:`_row` would say line by line, decided in bulk."""
    prefix = path + ":"
    end = start
    while end < len(lines) and lines[end].startswith(prefix):
        end += 1
    rows = [line[len(prefix) :] for line in lines[start:end]]
    joined = "\n" + "\n".join(rows)
    unplain = _UNPLAIN_ROW.search(joined)
    if unplain is not None:
        del rows[joined.count("\n", 0, unplain.start()) :]
    return rows


class _Output:
    """The payload as lines, and both texts as pieces for counting: each line with its newline
    (the last one's is taken off at the end), a row apart from its path prefix."""

    def __init__(self) -> None:
        self.payload: list[str] = []
        self.pieces: list[str] = []
        self.original: list[str] = []
        self.rows = 0

    def line(self, line: str, *, original: str | None = None) -> None:
        self.payload.append(line)
        self.pieces.append(line + "\n")
        if original is not None:
            self.original.append(original + "\n")

    def row(self, prefix: str, row: str) -> None:
        self.payload.append(row)
        self._pieces(prefix, row)
        self.rows += 1

    def plain_rows(self, prefix: str, rows: list[str]) -> None:
        """Like :meth:`row` for each of ``rows``, in list operations (empty heads included)."""
        self.payload += rows
        cuts = list(map(_word_end, rows))
        heads = [row[:cut] for row, cut in zip(rows, cuts, strict=True)]
        pieces = heads * 2  # heads and tails, interleaved
        pieces[0::2] = heads
        pieces[1::2] = [row[cut:] + "\n" for row, cut in zip(rows, cuts, strict=True)]
        self.pieces += pieces
        pieces[0::2] = map(prefix.__add__, heads)
        self.original += pieces
        self.rows += len(rows)

    def _pieces(self, prefix: str, row: str) -> None:
        cut = _word_end(row)
        if cut:
            self.pieces.append(row[:cut])
            prefix += row[:cut]
            row = row[cut:]
        self.pieces.append(row + "\n")
        self.original.append(prefix)
        self.original.append(row + "\n")

    def encoded(self) -> Encoded:
        self.pieces[-1] = self.pieces[-1][:-1]
        self.original[-1] = self.original[-1][:-1]
        return Encoded("\n".join(self.payload), self.pieces, self.original)


def _word_end(row: str) -> int:
    """Where a row's first word ends when that word would merge with the path prefix before it
    into one pre-token ("a.py:def" against "def"), or 0. Counted apart, the rest of the row is
    the same run in both texts, so it need not be tokenized to know the difference."""
    first = row[:1]
    if first.isdigit() or first.isspace():
        return 0  # ":" before a digit or a space is a split point already
    return max(row.find(" "), 0)


def applies(text: str) -> bool:
    """Two neighbouring lines in the first screenful share a path prefix."""
    return may_apply(text) and _shares_a_path(text)


def may_apply(text: str) -> bool:
    """False when no two neighbouring lines of the first screenful could start with paths, which
    rules the form out in one C search; applies() is never true where this is false."""
    return _PATH_LED_PAIR.found_in(text, sample_chars())


def _shares_a_path(text: str) -> bool:
    paths = _Paths(sample_lines(text))
    previous: str | None = None
    for index, line in enumerate(paths.lines):
        # A line that does not start like a path starts no group: skip the regexes of starting().
        path = paths.starting(index) if _PATH_LED_LINE.match(line) else None
        if path is not None and path == previous:
            return True
        previous = path
    return False


FORM = TextForm(NAME, HEADER, applies, encode, decode)
