"""Runs of identical consecutive lines written once with a `` [xN]`` suffix, as text.

``line [x3]`` stands for three copies of ``line``. A line that already ends like a suffix gets
`` [x1]`` appended, so it reads back as itself. For CRLF lines the suffix goes before the ``\\r``
so the line still ends the way it did.
"""

from __future__ import annotations

import re
from itertools import islice
from operator import eq

from worker.compress.limits import ExpansionBudget
from worker.compress.textform import Encoded, TextForm, line_pieces

NAME = "repeated-lines"
HEADER = '["line [xN]" = line repeated N times]\n'
_SUFFIX = re.compile(r" \[x([1-9][0-9]{0,8})\](\r?)\Z")  # counts below a billion
_MIN_SAVED_CHARS = 12  # a suffix costs about four tokens; collapse only runs worth more


def decode(payload: str, budget: ExpansionBudget | None = None) -> str:
    budget = budget or ExpansionBudget(NAME)
    out: list[str] = []
    for line in payload.split("\n"):
        suffix = _SUFFIX.search(line) if line.endswith(("]", "]\r")) else None
        if suffix is None:
            budget.spend(len(line) + 1)
            out.append(line)
            continue
        copies = int(suffix.group(1))
        base = line[: suffix.start()] + suffix.group(2)
        budget.spend((len(base) + 1) * copies)
        out.extend([base] * copies)
    return "\n".join(out)


def _with_count(line: str, copies: int) -> str:
    if line.endswith("\r"):
        return f"{line[:-1]} [x{copies}]\r"
    return f"{line} [x{copies}]"


def _runs(lines: list[str]) -> list[tuple[str, int]]:
    runs: list[tuple[str, int]] = []
    start = 0
    for index in range(1, len(lines) + 1):
        if index == len(lines) or lines[index] != lines[start]:
            runs.append((lines[start], index - start))
            start = index
    return runs


def encode(text: str) -> Encoded | None:
    lines = text.split("\n")
    payload: list[str] = []
    collapsed = 0
    for line, copies in _runs(lines):
        if copies > 1 and (copies - 1) * (len(line) + 1) >= _MIN_SAVED_CHARS:
            payload.append(_with_count(line, copies))
            collapsed += copies - 1
        elif line.endswith(("]", "]\r")) and _SUFFIX.search(line) is not None:
            payload.extend([_with_count(line, 1)] * copies)
        else:
            payload.extend([line] * copies)
    if collapsed == 0:
        return None
    return Encoded("\n".join(payload), line_pieces(payload), line_pieces(lines))


def applies(text: str) -> bool:
    """At least one line in fifty repeats the line before it (comparing neighbours is cheap
    next to tokenizing, so this looks at the whole text)."""
    lines = text.split("\n")
    repeats: int = sum(map(eq, lines, islice(lines, 1, None)))
    return repeats >= 2 and repeats * 50 >= len(lines)


FORM = TextForm(NAME, HEADER, applies, encode, decode)
