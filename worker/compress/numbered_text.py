"""``nl -ba`` / ``cat -n`` views with the line-number padding removed, as text.

Both tools print each number right-aligned in six columns and a tab. The padding costs about a
token per line and tells the model nothing, so ``"   123\\tx"`` is written ``"123\\tx"``; the number
itself stays, because the model uses it to address edits. Lines that are not numbered this way
stay verbatim; a verbatim line that would read as a numbered one makes the codec decline.
"""

from __future__ import annotations

import re

from worker.compress.limits import ExpansionBudget
from worker.compress.textform import Encoded, LineStart, TextForm, sample_lines

NAME = "numbered-lines"
HEADER = "[nl -ba, number padding removed]\n"
_WIDTH = 6
_PADDED = re.compile(r"( *)([0-9]+)\t")
_UNPADDED = re.compile(r"[0-9]+\t")
# The lines encode() takes padding off: one to five spaces, then a number, six columns in all.
# A text numbered otherwise (say "%4d\t") often passes applies(); this rules it out in C.
_SIX_COLUMNS_PADDED = LineStart(r"(?: {5}[0-9]| {4}[0-9]{2}| {3}[0-9]{3}| {2}[0-9]{4}| [0-9]{5})\t")


def decode(payload: str, budget: ExpansionBudget | None = None) -> str:
    del budget  # at most five padding characters per line of at least two
    out: list[str] = []
    for line in payload.split("\n"):
        number = _UNPADDED.match(line)
        if number is None:
            out.append(line)
        else:
            digits = number.end() - 1
            out.append(line[:digits].rjust(_WIDTH) + line[digits:])
    return "\n".join(out)


def encode(text: str) -> Encoded | None:
    if not _SIX_COLUMNS_PADDED.found_in(text):
        return None  # no line would lose padding (the loop below would say so line by line)
    lines = text.split("\n")
    payload: list[str] = []
    unpadded = 0
    for line in lines:
        number = _PADDED.match(line)
        if number is not None and number.group(2).rjust(_WIDTH) == line[: number.end(2)]:
            payload.append(line[number.end(1) :])
            unpadded += number.end(1) > 0
        elif _UNPADDED.match(line) is not None:
            return None  # a verbatim line that would read back as a numbered one
        else:
            payload.append(line)
    if unpadded == 0:
        return None
    joined = "\n".join(payload)
    # Every line changes, so there is nothing to share: two whole pieces count fastest.
    return Encoded(joined, [joined], [text])


def applies(text: str) -> bool:
    lines = sample_lines(text, limit=16)
    return sum(_PADDED.match(line) is not None for line in lines) * 2 >= len(lines)


FORM = TextForm(NAME, HEADER, applies, encode, decode)
