"""Listings (``ls``, ``ls -R``, ``ls -F``) packed onto one line per block, as text.

One entry per line costs a newline token per entry, while a space merges into the next name's
first token. So every line break inside a block of non-empty lines becomes a space, and blank
lines (between ``ls -R`` directories) stay, so blocks stay visible. Expanding turns each space
back into a line break, which is exact as long as no entry holds a space.

Two forms, told apart by their header: the plain one for listings without a single space, and
one where an entry holding a space (or starting with a tab) gets a line of its own, led by a tab
that marks it verbatim; a whole ``ls -R`` of a real tree usually has a few such names.
"""

from __future__ import annotations

from worker.compress.limits import ExpansionBudget
from worker.compress.textform import Encoded, TextForm, sample_lines

NAME = "listing-packed"
HEADER = "[listing, spaces stand for line breaks]\n"
HEADER_WITH_VERBATIM = "[listing, spaces stand for line breaks except on tab-led lines]\n"
_VERBATIM = "\t"
_MIN_LINES = 4


def decode(payload: str, budget: ExpansionBudget | None = None) -> str:
    del budget  # expanding keeps the size
    return payload.replace(" ", "\n")


def decode_with_verbatim(payload: str, budget: ExpansionBudget | None = None) -> str:
    del budget  # expanding only shrinks
    out: list[str] = []
    for line in payload.split("\n"):
        if line.startswith(_VERBATIM):
            out.append(line[len(_VERBATIM) :])
        else:
            out.extend(line.split(" "))
    return "\n".join(out)


def encode(text: str) -> Encoded | None:
    return None if " " in text else _pack(text, verbatim=False)


def encode_with_verbatim(text: str) -> Encoded | None:
    return _pack(text, verbatim=True) if " " in text else None


def _pack(text: str, *, verbatim: bool) -> Encoded | None:
    lines = text.split("\n")
    blocks: list[list[str]] = []
    previous = ""  # the last line packed into a block, "" after a blank or verbatim line
    for line in lines:
        if verbatim and (" " in line or line.startswith(_VERBATIM)):
            blocks.append([_VERBATIM + line])
            previous = ""
        elif line and previous:
            blocks[-1].append(line)
            previous = line
        else:
            blocks.append([line])  # a block's first line, or a blank line kept as it is
            previous = line
    payload_lines = [" ".join(block) for block in blocks]
    if len(payload_lines) * 2 > len(lines):
        return None  # blocks of one or two lines: nothing worth packing
    return Encoded("\n".join(payload_lines), _pieces(payload_lines), [text])


def _pieces(payload_lines: list[str]) -> list[str]:
    # One piece per name, so that names repeated across directories are tokenized once.
    pieces: list[str] = []
    for line in payload_lines:
        names = line.split(" ")
        pieces.append(names[0])
        pieces.extend(" " + name for name in names[1:])
        pieces.append("\n")
    pieces.pop()
    return pieces


def applies(text: str) -> bool:
    return " " not in text and text.count("\n", 0, 4096) >= _MIN_LINES


def applies_with_verbatim(text: str) -> bool:
    """Mostly entries without spaces: a listing with a few odd names, not prose or ``ls -l``."""
    lines = sample_lines(text)
    spaced = sum(" " in line for line in lines)
    return len(lines) >= _MIN_LINES and spaced * 8 <= len(lines) and " " in text


FORM = TextForm(NAME, HEADER, applies, encode, decode)
FORM_WITH_VERBATIM = TextForm(
    NAME, HEADER_WITH_VERBATIM, applies_with_verbatim, encode_with_verbatim, decode_with_verbatim
)
