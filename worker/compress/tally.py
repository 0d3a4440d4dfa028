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
(a grep row is the original line minus its path), which makes that a small fraction of the text.
The shared runs' tokens are bounded by their UTF-8 size (every token is at least one byte), which
often settles the gate after counting a fraction of them (see :meth:`TokenTally.passes`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import tiktoken

from worker.tokens import encoding_name_for_model, get_encoding

_BATCH_BYTES = 32 * 1024  # how much unchanged text to count before checking the bound again


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


@dataclass(frozen=True, slots=True)
class Delta:
    """How two texts' token counts differ, known exactly without counting what they share.

    ``removed``/``added``: exact tokens of the runs only the original/only the candidate has.
    ``shared_bytes``: UTF-8 size of the runs both have, an upper bound of their tokens.
    ``shared``: those runs, with how often each occurs, to count them when a bound is not enough.
    """

    removed: int
    added: int
    shared_bytes: int
    shared: Counter[str] = field(default_factory=Counter, compare=False, repr=False)

    def __add__(self, other: Delta) -> Delta:
        return Delta(
            self.removed + other.removed,
            self.added + other.added,
            self.shared_bytes + other.shared_bytes,
            self.shared + other.shared,
        )


class TokenTally:
    """Exact token counts through one encoding, caching each distinct text it counts."""

    def __init__(self, model: str | None = None) -> None:
        encoding: tiktoken.Encoding = get_encoding(encoding_name_for_model(model))
        self._encode = encoding.encode_ordinary
        self._cache: dict[str, int] = {}
        self._newline_tokens = len(self._encode("\n"))

    def count_text(self, text: str) -> int:
        """Tokens of one text, through the cache."""
        cached = self._cache.get(text)
        if cached is None:
            cached = len(self._encode(text))
            self._cache[text] = cached
        return cached

    def count(self, pieces: Iterable[str]) -> int:
        """Exact tokens of ``"".join(pieces)``."""
        return self._sum(Counter(runs(pieces)))

    def delta(self, original: Sequence[str], candidate: Sequence[str]) -> Delta:
        """The exact difference between two piece lists' counts, and a bound on the rest."""
        original_runs = Counter(runs(original))
        candidate_runs = Counter(runs(candidate))
        removed: Counter[str] = Counter()
        shared: Counter[str] = Counter()
        shared_bytes = 0
        for run, copies in original_runs.items():
            kept = min(copies, candidate_runs.get(run, 0))
            if kept:
                shared[run] = kept
                shared_bytes += kept * utf8_size(run)
            if copies > kept:
                removed[run] = copies - kept
        added = Counter(
            {run: copies - original_runs.get(run, 0) for run, copies in candidate_runs.items()}
        )
        added = +added  # keep positive counts only
        return Delta(self._sum(removed), self._sum(added), shared_bytes, shared)

    def counts(self, delta: Delta) -> tuple[int, int]:
        """Exact (before, after) token counts of the two texts ``delta`` compares."""
        shared = self._sum(delta.shared)
        return delta.removed + shared, delta.added + shared

    def passes(self, delta: Delta, *, min_tokens: int, min_saving: float) -> bool:
        """Exactly whether before > min_tokens and before - after > min_saving * before.

        With ``s`` the shared tokens, before = removed + s and after = added + s. The shared runs
        are counted a batch at a time, and every batch narrows ``s`` to [counted, counted + the
        UTF-8 size of the rest] (a token is at least a byte); counting stops as soon as that
        range settles the answer, which for a good candidate is usually early.
        """
        saved = delta.removed - delta.added
        counted, rest_bytes = 0, delta.shared_bytes
        batches = self._batches(delta.shared)
        while True:
            least, most = delta.removed + counted, delta.removed + counted + rest_bytes
            if saved <= min_saving * (least if min_saving >= 0 else most):
                return False  # fails even for the most favourable shared count
            if least > min_tokens and saved > min_saving * (most if min_saving >= 0 else least):
                return True
            batch = next(batches, None)
            if batch is None:
                return False  # everything counted: least == most, and the gate did not pass
            counted += batch[0]
            rest_bytes -= batch[1]

    def _sum(self, bag: Counter[str]) -> int:
        """Sum of ``copies * tokens(run)``."""
        return sum(tokens for tokens, _ in self._batches(bag))

    def _batches(self, bag: Counter[str]) -> Iterator[tuple[int, int]]:
        """``(tokens, UTF-8 bytes)`` of the bag's runs, a batch at a time.

        Each encode call costs about a microsecond before any work, so runs seen once are counted
        in batches, concatenated directly (a split point between them) or around a newline that
        is a split point on both sides, whose tokens are then taken off again.
        """
        batch: list[str] = []
        batch_bytes = separators = 0
        for run, copies in bag.items():
            size = utf8_size(run)
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
        return len(self._encode("".join(batch))) - separators * self._newline_tokens


def runs(pieces: Iterable[str]) -> list[str]:
    """``pieces`` joined wherever they do not meet at a split point; empty pieces dropped."""
    out: list[str] = []
    pending: list[str] = []
    for piece in pieces:
        if not piece:
            continue
        if not pending:
            pending = [piece]
            continue
        last = pending[-1][-1]
        first = piece[0]
        # The common junctions are decided inline (this loop runs once or twice per line of a
        # megabyte): a line break before a line starting with a visible character, and a letter
        # or digit before a tab or space.
        split = (
            (last == "\n" and first != "/" and not first.isspace())
            or (first in " \t" and last.isascii() and last.isalnum())
            or is_split_point(pending[-1], piece)
        )
        if split:
            out.append(pending[0] if len(pending) == 1 else "".join(pending))
            pending = [piece]
        else:
            pending.append(piece)
    if pending:
        out.append(pending[0] if len(pending) == 1 else "".join(pending))
    return out
