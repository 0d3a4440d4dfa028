"""Token counts of huge texts in bounded time and memory, exact wherever that is affordable.

tiktoken splits a text into pre-tokens (words, numbers, runs of punctuation or whitespace) and
byte-pair merges each one. The merge is far worse than linear in the length of a pre-token and
allocates tens of bytes per byte of it, and ``encode`` returns one Python int per token. One
24 MB pre-token (``abab…`` with no whitespace) thus cost about 20 s and 1.3 GB, an ordinary
24 MB text a list of millions of ints, and a run of a million spaces makes tiktoken's o200k
pre-tokenizer give up altogether (``ValueError``: backtracking limit; ``encode_ordinary`` even
panics). Here a long text is counted a segment at a time instead:

- Segments are cut only at *split points*, junctions where tiktoken's pre-tokenizer always
  splits and tokenizes each side as it would alone (the rules of
  :func:`worker.compress.tally.is_split_point`; :data:`_CUT` finds them), so the sum of the
  segments' counts is tiktoken's count of the text: exact.
- A stretch of more than :data:`RUN_LIMIT` characters with no split point in it (in practice one
  enormous pre-token: letters with no space, or a run of spaces, newlines or punctuation; also a
  very long digit string or a line of non-ASCII text with no ASCII space, punctuation or line
  break) is not merged at all: it counts as its UTF-8 length in bytes. Every token is at least
  one byte, so that is never less than tiktoken's count (an over-count: compaction fires no later
  than the exact count would make it), and it is the only inexact case.

So ``bounded_count(text)`` equals tiktoken's count for every text without such a stretch and is
an upper bound otherwise. A stretch is judged by its own length, not by where the text around
it starts, so the count is also additive at split points. Time is linear in the text (each
tiktoken call gets at most ``SEGMENT_CHARS + RUN_LIMIT`` characters, well under the million at
which its pre-tokenizer fails) and memory is a segment's worth.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import tiktoken

Encode = Callable[[str], Sequence[int]]  # e.g. tiktoken.Encoding.encode_ordinary

# Texts up to this size are counted by one tiktoken call, as before.
SEGMENT_CHARS = 64 * 1024
# A stretch without a split point longer than this is bounded by its UTF-8 bytes, not merged.
RUN_LIMIT = 256 * 1024
# How far from a junction :func:`joined_count` looks for split points (a few words or a line).
JOIN_WINDOW = 256

# Split points, as the end of a match (the character before it, then a lookahead at the one
# after), one alternative per rule of tally.is_split_point:
# - a line break before a line that has a visible character and starts with neither "\r" nor
#   "/" (before "/" only after an ASCII letter or digit);
# - an ASCII character that is neither a digit nor whitespace, before an ASCII digit;
# - an ASCII letter or digit before ASCII that is not a letter, digit or "'";
# - visible ASCII punctuation before a space or tab.
_CUT = re.compile(
    r"\n(?=[^\r\n/])(?=[^\n]*?\S)"
    r"|(?<=[A-Za-z0-9])\n(?=/)"
    r"|[\x00-\x08\x0e-\x1b\x7f!-/:-~](?=[0-9])"
    r"|[A-Za-z0-9](?=[\x00-\x26\x28-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f])"
    r"|[!-/:-@\[-`{-~](?=[ \t])"
)
_LOOKAHEAD = 4096
# Runs of one kind of character that have no split point inside (letters and non-ASCII,
# whitespace other than line breaks, line breaks, digits, punctuation): skipped in one step
# before searching, which finds the end of one enormous pre-token about 30 times faster than
# searching it for split points.
_RUN = re.compile(r"[A-Za-z\x80-\U0010FFFF]+|[^\S\n]+|\n+|[0-9]+|[!-/:-@\[-`{-~]+")


def split_points(text: str, start: int = 0, end: int | None = None) -> list[int]:
    """The split points :func:`bounded_count` may cut at, strictly inside ``text[start:end]``."""
    stop = len(text) if end is None else end
    # The lookaheads may see this far past ``end`` (a line break before an indented line).
    window = min(stop + _LOOKAHEAD, len(text))
    return [found.end() for found in _CUT.finditer(text, start, window) if found.end() < stop]


def utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def segments(text: str) -> list[tuple[int, int, bool]]:
    """``(start, end, exact)`` spans covering ``text`` in order, each cut at a split point;
    ``exact`` is False for a stretch of more than :data:`RUN_LIMIT` characters without one."""
    out: list[tuple[int, int, bool]] = []
    pos, size = 0, len(text)
    while size - pos > SEGMENT_CHARS:
        target = pos + SEGMENT_CHARS
        run = _RUN.match(text, target - 1)
        found = _CUT.search(text, target - 1 if run is None else run.end() - 1)
        end = found.end() if found is not None and found.end() < size else size
        if end - target <= RUN_LIMIT - SEGMENT_CHARS:
            out.append((pos, end, True))  # no stretch here can be longer than RUN_LIMIT
            pos = end
            continue
        # The stretch from the last split point before ``target`` to ``end`` has none inside.
        before = split_points(text, pos, target + 1)
        start = before[-1] if before else pos
        if end - start <= RUN_LIMIT:
            out.append((pos, end, True))
        else:
            if start > pos:
                out.append((pos, start, True))
            out.append((start, end, False))
        pos = end
    if pos < size:
        out.append((pos, size, True))
    return out


def bounded_count(encode: Encode, text: str) -> int:
    """tiktoken's count of ``text`` (special tokens counted as text), except that a stretch of
    more than :data:`RUN_LIMIT` characters with no split point counts as its UTF-8 bytes: an
    upper bound. ``encode``: the encoding's ``encode_ordinary``. Linear time, memory of one
    segment."""
    if len(text) <= SEGMENT_CHARS:
        return len(encode(text))
    total = 0
    for start, end, exact in segments(text):
        piece = text[start:end]
        total += len(encode(piece)) if exact else utf8_bytes(piece)
    return total


def junction_tokens(encode: Encode, left: str, right: str) -> int | None:
    """What joining adds to the counts of both sides: ``bounded_count(left + right)`` minus
    ``bounded_count(left) + bounded_count(right)``, from the text around the junction alone;
    None when there is no split point near it (an enormous pre-token there).

    Nothing when the junction is a split point. Otherwise the text from the last split point of
    ``left`` to the first one of ``right`` (or a whole side, when short) is counted together and
    apart: a split point of either side alone is one of the joined text too (its rules look at
    most to the end of its line, and the side already has a visible character there), so the
    counts add up everywhere else.
    """
    if not left or not right:
        return 0
    end_of_left = left[-2:]  # as far back as the rules look
    if _CUT.match(end_of_left + right[:JOIN_WINDOW], len(end_of_left) - 1):
        return 0
    start, end = _last_split(left), _first_split(right)
    if start is None or end is None:
        return None
    tail, head = left[start:], right[:end]
    together = bounded_count(encode, tail + head)
    return together - bounded_count(encode, tail) - bounded_count(encode, head)


def _last_split(text: str) -> int | None:
    """The last split point of ``text`` within :data:`JOIN_WINDOW` characters of its end (looked
    for in a short end first: one is usually a word away), or its start when it is that short."""
    size = min(16, JOIN_WINDOW)
    while True:
        start = max(len(text) - size, 0)
        points = split_points(text, start)
        if points:
            return points[-1]
        if start == 0:
            return 0
        if size >= JOIN_WINDOW:
            return None
        size *= 4


def _first_split(text: str) -> int | None:
    """The first split point of ``text`` within :data:`JOIN_WINDOW` characters of its start, or its
    end when it is that short."""
    found = _CUT.search(text, 0, min(len(text), JOIN_WINDOW))
    if found is not None and found.end() < len(text):
        return found.end()
    return len(text) if len(text) <= JOIN_WINDOW else None


def joined_count(encode: Encode, left: str, left_tokens: int, right: str, right_tokens: int) -> int:
    """``bounded_count(encode, left + right)`` from the counts of both sides, tokenizing only the
    text around where they meet (:func:`junction_tokens`), or the whole when that cannot."""
    extra = junction_tokens(encode, left, right)
    if extra is None:
        return bounded_count(encode, left + right)
    return left_tokens + right_tokens + extra


def is_exact(text: str) -> bool:
    """Whether :func:`bounded_count` of ``text`` is tiktoken's own count."""
    return len(text) <= RUN_LIMIT or all(exact for _, _, exact in segments(text))


def cut_prefix(encoding: tiktoken.Encoding, text: str, max_tokens: int) -> tuple[str, bool]:
    """``text`` cut to a prefix of at most ``max_tokens`` tokens; (prefix, was_cut).

    A segment at a time (:func:`segments`): the text's tokens are its segments' tokens one after
    the other, so the cut is the one the whole text's tokens give, when no stretch before it is
    bounded. Inside a bounded stretch (one enormous pre-token) the cut is at a token boundary of
    at most :data:`RUN_LIMIT` characters of it. Either way the prefix never has more than
    ``max_tokens`` tokens.
    """
    if len(text) <= SEGMENT_CHARS:
        return _cut(encoding, text, max_tokens)
    used = 0
    for start, end, exact in segments(text):
        piece = text[start:end]
        tokens = len(encoding.encode_ordinary(piece)) if exact else utf8_bytes(piece)
        if used + tokens > max_tokens:
            head = piece if exact else piece[:RUN_LIMIT]
            cut, _ = _cut(encoding, head, max_tokens - used)
            return text[:start] + cut, True
        used += tokens
    return text, False


def _cut(encoding: tiktoken.Encoding, text: str, limit: int) -> tuple[str, bool]:
    ids = encoding.encode_ordinary(text)
    if len(ids) <= limit:
        return text, False
    cut = encoding.decode(ids[: max(limit, 0)])
    # A token can end inside a multi-byte character; drop the replacement char it decodes to.
    cut = cut.rstrip("\ufffd")
    while cut and len(encoding.encode_ordinary(cut)) > limit:
        cut = cut[:-1]
    return cut, True
