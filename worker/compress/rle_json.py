"""A string's repeated consecutive lines as ``[line, count]`` pairs (``rle-lines``).

Measured against the text form (``line [xN]``), this costs more tokens on most outputs, so it is
only chosen where the token count says it is cheaper; it exists because structured consumers
use it.
"""

from __future__ import annotations

from worker.compress.limits import ExpansionBudget
from worker.compress.node import FMT, Json, check_keys, field
from worker.errors import CompressionError

NAME = "rle-lines"


def encode(text: str) -> dict[str, Json] | None:
    runs: list[list[Json]] = []
    for line in text.split("\n"):
        if runs and runs[-1][0] == line:
            runs[-1][1] += 1
        else:
            runs.append([line, 1])
    if all(count == 1 for _, count in runs):
        return None
    return {FMT: NAME, "lines": runs}


def decode(node: dict[str, Json], budget: ExpansionBudget) -> str:
    check_keys(node, {"lines"})
    lines: list[str] = []
    for pair in field(node, "lines", list):
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], int)
            or isinstance(pair[1], bool)
            or pair[1] < 1
        ):
            raise CompressionError("rle-lines entries must be [line, count] with 1 <= count")
        budget.spend((len(pair[0]) + 1) * pair[1])
        lines.extend([pair[0]] * pair[1])
    return "\n".join(lines)
