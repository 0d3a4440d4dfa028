"""``ls -l`` listings with the column padding dropped and the common owner and date said once.

A row ``drwxr-xr-x  2 root root   4096 Oct 24  2024 docs`` costs a dozen tokens before its name,
and in a listing of a checked-out tree most rows share the owner, the group and the date. Here the
first payload line gives the most common ``OWNER GROUP MON DAY TIME``; each row is written with
single spaces, without owner and group when they are those, and without its date when it is that
one: ``drwxr-xr-x 2 4096 docs``. Expanding pads the columns again the way ``ls`` aligns them
(every run of consecutive rows is one listing: mode and names to the left, counts to the right),
and the encoder declines any text that does not expand back byte for byte.
"""

from __future__ import annotations

import re
from collections import Counter

from worker.compress.limits import ExpansionBudget
from worker.compress.textform import Encoded, LineStart, TextForm, sample_chars, sample_lines
from worker.errors import CompressionError

NAME = "long-listing"
HEADER = "[ls -l, single-spaced; a row without owner group or date has those of the first line]\n"
MAX_CHARS = 256 * 1024  # shares no text with its original: judging it means counting both
_MIN_ROWS = 4
_MODE = r"[-bcdlpsD][-rwxsStTl]{9}[.+]?"
_DATE = r"([A-Z][a-z]{2}) +([0-9]{1,2}) +([0-9]{1,2}:[0-9]{2}|[0-9]{4})"
_RAW_ROW = re.compile(rf"({_MODE}) +([0-9]+) (\S+) +(\S+) +([0-9]+) {_DATE} (.*)")
_ROW = re.compile(rf"({_MODE}) ([0-9]+) (.*)")
_ROW_DATE = re.compile(_DATE.replace(" +", " ") + " ")
# A raw row up to its name, looked for in C before any row is parsed.
_RAW_ROW_HEAD = LineStart(rf"{_MODE} +[0-9]+ \S+ +\S+ +[0-9]+ {_DATE} ")

# mode, links, owner, group, size, month, day, time (or year), name
_Row = tuple[str, str, str, str, str, str, str, str, str]


def decode(payload: str, budget: ExpansionBudget | None = None) -> str:
    budget = budget or ExpansionBudget(NAME)
    first, _, body = payload.partition("\n")
    defaults = first.split(" ")
    if len(defaults) != 5:
        raise CompressionError(f"{NAME}: the first line is not OWNER GROUP MON DAY TIME")
    out: list[str] = []
    listing: list[_Row] = []  # the rows of the run being read
    for line in body.split("\n"):
        row = _read_row(line, defaults)
        if row is not None:
            listing.append(row)
            continue
        out += _aligned(listing, budget)
        listing = []
        budget.spend(len(line) + 1)
        out.append(line)
    out += _aligned(listing, budget)
    return "\n".join(out)


def _read_row(line: str, defaults: list[str]) -> _Row | None:
    """The fields of a payload row, or None for a line to keep as it is."""
    match = _ROW.fullmatch(line)
    if match is None:
        return None
    mode, links, rest = match.groups()
    owner, group = defaults[:2]
    first, _, after = rest.partition(" ")
    if not _is_number(first):  # an owner and a group come first
        owner = first
        group, _, rest = after.partition(" ")
    size, _, rest = rest.partition(" ")
    if not _is_number(size):
        return None
    date = _ROW_DATE.match(rest)
    month, day, time = defaults[2:] if date is None else date.groups()
    name = rest if date is None else rest[date.end() :]
    return mode, links, owner, group, size, month, day, time, name


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _aligned(listing: list[_Row], budget: ExpansionBudget) -> list[str]:
    """The rows of one listing padded as ``ls -l`` pads them: each column to its widest."""
    if not listing:
        return []
    widths = [max(len(row[column]) for row in listing) for column in range(5)]
    budget.spend(len(listing) * (sum(widths) + 17) + sum(len(row[8]) for row in listing))
    return [
        f"{mode:<{widths[0]}} {links:>{widths[1]}} {owner:<{widths[2]}} {group:<{widths[3]}} "
        f"{size:>{widths[4]}} {month} {day:>2} {time:>5} {name}"
        for mode, links, owner, group, size, month, day, time, name in listing
    ]


def encode(text: str) -> Encoded | None:
    if len(text) > MAX_CHARS:
        return None
    lines = text.split("\n")
    rows = [_RAW_ROW.fullmatch(line) for line in lines]
    parsed = [row.groups() for row in rows if row is not None]
    if len(parsed) < _MIN_ROWS:
        return None
    owner = Counter(row[2:4] for row in parsed).most_common(1)[0][0]
    date = Counter(row[5:8] for row in parsed).most_common(1)[0][0]
    payload = [" ".join([*owner, *date])]
    for line, row in zip(lines, rows, strict=True):
        payload.append(line if row is None else _short_row(row.groups(), owner, date))
    joined = "\n".join(payload)
    try:
        if decode(joined) != text:
            return None  # padded otherwise than ls pads, or a line that reads as a row
    except CompressionError:
        return None
    # Every row changes, so nothing is the same run in both texts: two whole pieces.
    return Encoded(joined, [joined], [text])


def _short_row(row: tuple[str, ...], owner: tuple[str, ...], date: tuple[str, ...]) -> str:
    """A row single-spaced, without the owner, group and date the first line gives."""
    fields = list(row[:2])
    if row[2:4] != owner:  # (a numeric owner here reads as the size: decode() catches that)
        fields += row[2:4]
    fields.append(row[4])
    if row[5:8] != date:
        fields += row[5:8]
    fields.append(row[8])
    return " ".join(fields)


def applies(text: str) -> bool:
    """At least a few rows of ``ls -l`` in the first screenful (ruled out in one C search when
    no line there starts like one)."""
    return (
        _RAW_ROW_HEAD.found_in(text, sample_chars())
        and sum(_RAW_ROW.fullmatch(line) is not None for line in sample_lines(text)) >= _MIN_ROWS
    )


FORM = TextForm(NAME, HEADER, applies, encode, decode)
