"""What every plain-text form has in common: a one-line header, a payload, and how to count them.

A compressed text is ``header + payload``. The header is a fixed line per form that names the form
and states its expansion rule, so the model reading it knows how to expand it and the decoder
recognises it by an exact prefix match. A raw text that happens to start with one of these headers
is escaped with :data:`VERBATIM_HEADER`, so decompression never misreads raw output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from worker.compress.limits import ExpansionBudget

VERBATIM_HEADER = "[verbatim output follows]\n"
_SAMPLE_LINE_CHARS = 200  # a sample of N lines is taken from the first N * this characters


@dataclass(frozen=True, slots=True)
class Encoded:
    """A payload, plus both texts as pieces for :class:`~worker.compress.tally.TokenTally`.

    ``original_pieces`` join to the original text and ``payload_pieces`` to ``payload``; a codec
    splits them so that the pieces the two have in common are the same strings.
    """

    payload: str
    payload_pieces: Sequence[str]
    original_pieces: Sequence[str]


@dataclass(frozen=True, slots=True)
class TextForm:
    """A plain-text codec. ``applies`` is a cheap look at the text; ``encode`` may still decline."""

    name: str
    header: str
    applies: Callable[[str], bool]
    encode: Callable[[str], Encoded | None]
    decode: Callable[[str, ExpansionBudget | None], str]


def line_pieces(lines: Sequence[str]) -> list[str]:
    """``"\\n".join(lines)`` as pieces, one per line, each but the last with its newline."""
    pieces = [line + "\n" for line in lines]
    if pieces:
        pieces[-1] = lines[-1]
    return pieces


def sample_lines(text: str, *, limit: int = 64) -> list[str]:
    """The first ``limit`` lines, without splitting the whole text (detection must stay cheap)."""
    return text[: sample_chars(limit)].split("\n", limit)[:limit]


def sample_chars(limit: int = 64) -> int:
    """How far into a text :func:`sample_lines` looks: its lines are all lines of that prefix
    (the last one cut there), so what no line of the prefix has, no sampled line has either."""
    return limit * _SAMPLE_LINE_CHARS


class LineStart:
    """A pattern looked for at the start of every line of a text, in one C search.

    Detection uses it to rule a form out before any per-line Python work. A search for a newline
    followed by the pattern lets the engine skip ahead to each newline, where ``(?m)^`` would try
    every position (about five times slower); the first line is matched on its own.
    """

    __slots__ = ("_first", "_later")

    def __init__(self, pattern: str) -> None:
        self._first = re.compile(pattern)
        self._later = re.compile(f"\n(?:{pattern})")

    def found_in(self, text: str, end: int | None = None) -> bool:
        """Whether some line of ``text[:end]`` starts with a match (the last line cut at end)."""
        end = len(text) if end is None else end
        return (
            self._first.match(text, 0, end) is not None
            or self._later.search(text, 0, end) is not None
        )
