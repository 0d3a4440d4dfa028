"""Exact token accounting for a text and its compressed form, without tokenizing both whole.

Codecs describe the original and the compressed text as lists of pieces whose concatenation is
the text (a line each, or a line split after its path prefix). Counting pieces separately is exact
where tiktoken's pre-tokenizer always splits between two pieces and tokenizes each side as it would
alone; :func:`is_split_point` recognises a conservative set of such junctions for the
``o200k_base`` and ``cl100k_base`` patterns, and pieces meeting anywhere else are joined into one
run first. Then:

    tokens(original) - tokens(compressed) = tokens(runs only the original has)
                                          - tokens(runs only the compressed text has)

so only the runs that differ are tokenized. Most of a compressed form is shared with its original
(a grep row is the original line minus its path, and its first word when that merges with the
path), which makes that a small fraction of the text.

The gate needs a decision, not the counts. The candidate's own runs are counted whole (they are
the smaller side); the original's own runs and the shared ones are counted a batch at a time
(:class:`Pending`), each batch narrowing their total to [counted, counted + UTF-8 bytes left],
since every token is at least one byte, and counting stops once that settles the gate (see
:meth:`TokenTally.passes`). A form that shares nothing (paths grouped by directory) thus counts
its original only until it has more than ``tokens(candidate) / (1 - min_saving)`` tokens: a large
run is cut into chunks at line breaks that are split points (:func:`chunks`), so the sum of the
chunks' counts is the run's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count, islice

import tiktoken

from worker.tokens import encoding_name_for_model, get_encoding
from worker.tokens.bounds import bounded_count

_BATCH_BYTES = 8 * 1024  # how much text to count before checking the bounds again


def is_split_point(left: str, right: str) -> bool:
    r"""True when counting ``left`` and ``right`` apart gives the count of ``left + right``.

    Why each rule holds: digits only ever form pre-tokens of their own; a letter or digit run ends
    at the first other character (bar "'" starting "'s"); a punctuation run ends at a space or tab
    (only newlines and "/" can follow it into its pre-token, by ``[\r\n/]*``); a newline pre-token
    only runs on into ``\r``, ``\n``, a blank line (``\s*[\r\n]+``) or, after punctuation, a
    ``/``. Whitespace before digits is excluded because ``\s+(?!\S)`` splits a run differently at
    the end of a text. Property tests check these rules against tiktoken itself.
    """
    before = left[-1]
    after = right[0]
    if before == "\n":
        if after == "/":
            return len(left) > 1 and left[-2].isascii() and left[-2].isalnum()
        if after in "\r\n":
            return False
        end = right.find("\n")
        return not (right if end < 0 else right[:end]).isspace()
    if not before.isascii():
        return False
    if after.isascii() and after.isdigit():
        return not before.isdigit() and not before.isspace()
    if before.isalnum():
        return after.isascii() and not after.isalnum() and after != "'"
    if after in " \t":
        return not before.isspace() and before.isprintable()
    return False


def utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class Pending:
    """The tokens of a bag of runs, counted a batch at a time and only when asked.

    Until everything is counted the total lies in ``[low, high]``: the tokens counted so far,
    plus at most one per UTF-8 byte not yet counted (a token is at least a byte).
    """

    __slots__ = ("_sources", "low", "rest")

    def __init__(self, sources: Iterable[Iterator[tuple[int, int]]] = (), rest: int = 0) -> None:
        self.low = 0
        self.rest = rest  # UTF-8 bytes not counted yet; 0 exactly when everything is counted
        self._sources = list(sources)

    @property
    def high(self) -> int:
        return self.low + self.rest

    def refine(self) -> None:
        """Count one more batch (only called while ``rest > 0``)."""
        while self._sources:
            batch = next(self._sources[0], None)
            if batch is not None:
                self.low += batch[0]
                self.rest -= batch[1]
                return
            self._sources.pop(0)
        raise AssertionError("a pending count ran out of runs before its bytes")

    def exact(self) -> int:
        while self.rest:
            self.refine()
        return self.low

    def __add__(self, other: Pending) -> Pending:
        """The sum, taking over both operands' uncounted batches (use only the sum afterwards)."""
        total = Pending([*self._sources, *other._sources], self.rest + other.rest)
        total.low = self.low + other.low
        return total


@dataclass(frozen=True, slots=True)
class Delta:
    """How two texts' token counts differ, known exactly without counting what they share.

    ``added``: exact tokens of the runs only the candidate has. ``removed``: the runs only the
    original has, and ``shared``: the runs both have, each counted only as far as a decision
    needs (see :class:`Pending`).
    """

    removed: Pending
    added: int
    shared: Pending

    def __add__(self, other: Delta) -> Delta:
        return Delta(
            self.removed + other.removed, self.added + other.added, self.shared + other.shared
        )


class TokenTally:
    """Exact token counts through one encoding, caching each distinct text it counts."""

    def __init__(self, model: str | None = None) -> None:
        encoding: tiktoken.Encoding = get_encoding(encoding_name_for_model(model))
        self._encode = encoding.encode_ordinary
        self._cache: dict[str, int] = {}
        self._newline_tokens = self._len("\n")

    def _len(self, text: str) -> int:
        """tiktoken's count, bounded for an enormous pre-token (:mod:`worker.tokens.bounds`)."""
        return bounded_count(self._encode, text)

    def count_text(self, text: str) -> int:
        """Tokens of one text, through the cache."""
        cached = self._cache.get(text)
        if cached is None:
            cached = self._len(text)
            self._cache[text] = cached
        return cached

    def count(self, pieces: Iterable[str]) -> int:
        """Exact tokens of ``"".join(pieces)``."""
        return self.pending(Counter(runs(pieces))).exact()

    def pending(self, bag: Counter[str]) -> Pending:
        """The tokens of ``copies`` of each run in ``bag``, to be counted when asked."""
        size = sum(copies * utf8_size(run) for run, copies in bag.items())
        return Pending([self._batches(bag)], size)

    def delta(self, original: Sequence[str], candidate: Sequence[str]) -> Delta:
        """The exact difference between two piece lists' counts, counting only the candidate's
        own runs now: the original's own and the shared ones wait until a decision needs them."""
        original_runs = Counter(runs(original))
        candidate_runs = Counter(runs(candidate))
        removed: Counter[str] = Counter()
        shared: Counter[str] = Counter()
        for run, copies in original_runs.items():
            kept = min(copies, candidate_runs.get(run, 0))
            if kept:
                shared[run] = kept
            if copies > kept:
                removed[run] = copies - kept
        added = Counter(
            {run: copies - original_runs.get(run, 0) for run, copies in candidate_runs.items()}
        )
        added = +added  # keep positive counts only
        return Delta(self.pending(removed), self.pending(added).exact(), self.pending(shared))

    def counts(self, delta: Delta) -> tuple[int, int]:
        """Exact (before, after) token counts of the two texts ``delta`` compares."""
        shared = delta.shared.exact()
        return delta.removed.exact() + shared, delta.added + shared

    def saves(self, delta: Delta) -> bool:
        """Exactly whether the candidate has fewer tokens than the original, i.e. removed > added;
        the original's own runs are counted only until that is settled."""
        removed = delta.removed
        while removed.low <= delta.added < removed.high:
            removed.refine()
        return removed.low > delta.added

    def passes(self, delta: Delta, *, min_tokens: int, min_saving: float) -> bool:
        """Exactly whether before > min_tokens and before - after > min_saving * before.

        With ``r`` the removed and ``s`` the shared tokens, before = r + s and after = added + s.
        Both are narrowed a batch at a time, and counting stops as soon as each condition has
        the same answer for every (r, s) still possible: the size test is monotone in r + s, the
        saving test in r and in s, so its extreme corners decide it. For a clearly good or
        clearly bad candidate that is usually early.
        """
        removed, shared = delta.removed, delta.shared
        while True:
            least, most = removed.low + shared.low, removed.high + shared.high
            savings = {
                r - delta.added > min_saving * (r + s)
                for r in (removed.low, removed.high)
                for s in (shared.low, shared.high)
            }
            if most <= min_tokens or savings == {False}:
                return False
            if least > min_tokens and savings == {True}:
                return True
            # The original's own runs first: they are what a candidate removes, often few and
            # repeated (cached), and when the candidate shares nothing they are all there is.
            (removed if removed.rest else shared).refine()

    def _batches(self, bag: Counter[str]) -> Iterator[tuple[int, int]]:
        """``(tokens, UTF-8 bytes)`` of the bag's runs, a batch at a time.

        Each encode call costs about a microsecond before any work, so runs seen once are counted
        in batches, concatenated directly (a split point between them) or around a newline that
        is a split point on both sides, whose tokens are then taken off again. A run larger than
        a batch is counted in chunks cut at split points (:func:`chunks`), so that a decision
        can stop partway through it.
        """
        batch: list[str] = []
        batch_bytes = separators = 0
        for run, copies in bag.items():
            size = utf8_size(run)
            if size > _BATCH_BYTES:
                for chunk in chunks(run, _BATCH_BYTES):
                    yield copies * self._len(chunk), copies * utf8_size(chunk)
                continue
            if copies > 1:
                yield copies * self.count_text(run), copies * size
                continue
            if batch and not is_split_point(batch[-1], run):
                if is_split_point(batch[-1], "\n") and is_split_point("\n", run):
                    batch.append("\n")
                    separators += 1
                else:
                    yield self._count_batch(batch, separators), batch_bytes
                    batch, batch_bytes, separators = [], 0, 0
            batch.append(run)
            batch_bytes += size
            if batch_bytes >= _BATCH_BYTES:
                yield self._count_batch(batch, separators), batch_bytes
                batch, batch_bytes, separators = [], 0, 0
        if batch:
            yield self._count_batch(batch, separators), batch_bytes

    def _count_batch(self, batch: list[str], separators: int) -> int:
        if len(batch) == 1:
            return self.count_text(batch[0])
        return self._len("".join(batch)) - separators * self._newline_tokens


def chunks(text: str, size: int) -> Iterator[str]:
    """``text`` in consecutive chunks of at least ``size`` characters (the last may be shorter)
    whose token counts add up to its own: every cut is at a line break that is a split point."""
    start = 0
    while len(text) - start > size:
        cut = _split_line_break(text, start + size)
        if cut < 0:
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


def _split_line_break(text: str, position: int) -> int:
    """The first index at or after ``position`` that follows a newline, is inside ``text`` and
    is a split point, or -1."""
    cut = text.find("\n", position - 1) + 1
    while 0 < cut < len(text):
        end = text.find("\n", cut)
        line = text[cut:] if end < 0 else text[cut:end]
        # An empty line is a blank one: it would join the newline before it.
        if line and is_split_point(text[max(cut - 2, 0) : cut], line):
            return cut
        cut = end + 1
    return -1


def runs(pieces: Iterable[str]) -> list[str]:
    """``pieces`` joined wherever they do not meet at a split point; empty pieces dropped."""
    pieces = [piece for piece in pieces if piece]
    # The indexes of the pieces that join the one before them. The common junctions are decided
    # inline (this runs once or twice per line of a megabyte): a line break before a line that
    # starts with a visible character other than "/", a letter or digit before a tab or space.
    joins = [
        index
        for index, left, right in zip(count(1), pieces, islice(pieces, 1, None))
        if not (
            (left[-1] == "\n" and right[0] != "/" and not right[0].isspace())
            or (right[0] in " \t" and left[-1].isascii() and left[-1].isalnum())
            or is_split_point(left, right)
        )
    ]
    if not joins:
        return pieces
    out: list[str] = []
    start = 0
    for first, last in _spans(joins):
        out += pieces[start : first - 1]
        out.append("".join(pieces[first - 1 : last + 1]))
        start = last + 1
    out += pieces[start:]
    return out


def _spans(indexes: list[int]) -> Iterator[tuple[int, int]]:
    """``(first, last)`` of each run of consecutive numbers in the ascending ``indexes``."""
    first = last = indexes[0]
    for index in indexes[1:]:
        if index != last + 1:
            yield first, last
            first = index
        last = index
    yield first, last
