"""Path listings (``find``, ``git ls-files``, ``rg --files``) grouped by directory, as text.

A run of consecutive paths in one directory becomes one line ``DIR/ name1 name2 ...``: the
directory once, then the names separated by single spaces. Every other line is kept verbatim.
Paths containing whitespace are never grouped, so splitting a group line on spaces is exact; a
verbatim line that would parse as a group line makes the codec decline.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import groupby, pairwise, repeat

from worker.compress.limits import ExpansionBudget
from worker.compress.textform import Encoded, LineStart, TextForm, sample_chars, sample_lines

NAME = "paths-by-dir"
HEADER = '[paths grouped by directory: "DIR/ a b" = DIR/a, DIR/b]\n'
_GROUP_LINE = re.compile(r"(\S*[/\\]) (\S+(?: \S+)*)")
_INLINE_WHITESPACE = re.compile(r"[^\S\n]")
_ASCII_WHITESPACE = " \t\r\x0b\x0c\x1c\x1d\x1e\x1f"  # what it matches in ASCII text
# A line with a directory key holds a separator and no whitespace (see _directory_keys), and
# applies() needs two in a row: most texts (code, logs, prose) have no such pair.
_KEYED = r"(?=[^\s/\\]*+[/\\])\S++"
_KEYED_PAIR = LineStart(rf"{_KEYED}\n{_KEYED}(?![^\n])")


def decode(payload: str, budget: ExpansionBudget | None = None) -> str:
    budget = budget or ExpansionBudget(NAME)
    out: list[str] = []
    for line in payload.split("\n"):
        group = _group(line)
        if group is None:
            budget.spend(len(line) + 1)
            out.append(line)
            continue
        directory, names = group
        budget.spend(len(directory) * (names.count(" ") + 1) + len(line))
        out.append(directory + names.replace(" ", "\n" + directory))  # a name holds no space
    return "\n".join(out)


def _group(line: str) -> tuple[str, str] | None:
    """``(DIR/, "a b ...")`` if ``line`` is a group line, else None."""
    if " " not in line:
        return None
    if not line.isprintable():  # other whitespace than spaces (or control characters)
        match = _GROUP_LINE.fullmatch(line)
        return None if match is None else (match.group(1), match.group(2))
    # Printable, so spaces are its only whitespace: the pattern comes down to these checks.
    directory, _, names = line.partition(" ")
    if directory[-1:] not in ("/", "\\") or not names or "  " in names:
        return None
    if names[0] == " " or names[-1] == " ":
        return None
    return directory, names


def _directory_keys(text: str, lines: list[str]) -> list[str | None]:
    """Per line, what tells its directory apart (equal for lines in one directory), or None if
    it is not a path worth grouping: no separator, nothing after it, or whitespace in it."""
    if "\\" in text:
        keys = list(map(_directory_of, lines))
    else:  # the common case, in one pass of C calls: the text before the last "/"
        splits = map(str.rpartition, lines, repeat("/"))
        keys = [head if slash and name else None for head, slash, name in splits]
    for index in _lines_with_whitespace(text):
        keys[index] = None
    return keys


def _directory_of(line: str) -> str | None:
    """``line`` up to and including its last separator, if it has a name after it."""
    cut = max(line.rfind("/"), line.rfind("\\"))
    return line[: cut + 1] if 0 <= cut < len(line) - 1 else None


def _lines_with_whitespace(text: str) -> set[int]:
    """Indexes of the lines holding whitespace (bar the line breaks)."""
    if text.isascii():  # one fast search per character instead of a regular expression
        found = (at for char in _ASCII_WHITESPACE for at in _first_on_each_line(text, char))
    else:
        found = (match.start() for match in _INLINE_WHITESPACE.finditer(text))
    indexes: set[int] = set()
    line = position = 0
    for at in sorted(found):
        line += text.count("\n", position, at)
        position = at
        indexes.add(line)
    return indexes


def _first_on_each_line(text: str, char: str) -> Iterator[int]:
    at = text.find(char)
    while at >= 0:
        yield at
        end = text.find("\n", at)
        at = text.find(char, end) if end >= 0 else -1


def encode(text: str) -> Encoded | None:
    lines = text.split("\n")
    payload: list[str] = []
    start = grouped = 0
    for key, run in groupby(_directory_keys(text, lines)):
        end = start + len(list(run))
        directory = _directory_of(lines[start]) if key is not None else None
        if directory is not None and end - start >= 2:
            # Names hold no whitespace, so " DIR/" occurs only where one path meets the next.
            joined = " ".join(lines[start:end])
            payload.append(directory + " " + joined[len(directory) :].replace(" " + directory, " "))
            grouped += end - start
        else:
            for line in lines[start:end]:
                if _group(line) is not None:
                    return None  # a verbatim line that would read back as a group
                payload.append(line)
        start = end
    if grouped < 2:
        return None
    joined = "\n".join(payload)
    # Grouped lines share no text with their originals, and per-line pieces cost more Python
    # time than they could save in tokenizing: two whole pieces count fastest.
    return Encoded(joined, [joined], [text])


def applies(text: str) -> bool:
    """Two neighbouring lines in the first screenful are paths in the same directory."""
    return may_apply(text) and _shares_a_directory(text)


def may_apply(text: str) -> bool:
    """False when no two neighbouring lines of the first screenful could be paths, which rules
    the form out in one C search; applies() is never true where this is false."""
    return _KEYED_PAIR.found_in(text, sample_chars())


def _shares_a_directory(text: str) -> bool:
    sample = sample_lines(text)
    keys = _directory_keys("\n".join(sample), sample)
    return any(a is not None and a == b for a, b in pairwise(keys))


FORM = TextForm(NAME, HEADER, applies, encode, decode)
