"""The memo step: an evaluation that first preloads what earlier evaluations of the conversation
computed (on any process), and says which memo to store after it (:mod:`worker.reuse.memo`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.cache import ContentCache
from worker.core.projection import COMPRESSED_CACHE, CountedProjection
from worker.pipeline.context import SnapshotContext
from worker.pipeline.evaluate import Evaluation, evaluate
from worker.reuse import Reuse
from worker.reuse.memo import (
    StoredMemo,
    decode_memo,
    encode_memo,
    memo_digest,
    preload,
    worth_rewriting,
)


@dataclass(frozen=True)
class StoredBlob:
    """A conversation's memo as the store returned it: its digest, and its bytes unless the
    reader said it knew that digest."""

    digest: str
    blob: bytes | None = None


@dataclass(frozen=True)
class MemoUpdate:
    """After an evaluation: the memo to store (None: keep the stored one), what this process
    then knows of the stored memo, and what the evaluation had to compute itself."""

    blob: bytes | None
    stored: StoredMemo | None
    texts_tokenized: int = 0
    results_compressed: int = 0

    @property
    def digest(self) -> str:
        """The digest to store beside ``blob`` ("" when there is none to store)."""
        return self.stored.digest if self.blob and self.stored else ""

    def counters(self) -> dict[str, float]:
        return {
            "texts_tokenized_total": float(self.texts_tokenized),
            "tool_results_compressed_total": float(self.results_compressed),
        }


def evaluate_with_memo(
    context: SnapshotContext,
    reuse: Reuse,
    memo: StoredBlob | None,
    known: StoredMemo | None = None,
    prior: CountedProjection | None = None,
) -> tuple[Evaluation, MemoUpdate]:
    """:func:`evaluate`, first preloading the conversation's stored ``memo`` (what earlier
    evaluations computed) into ``reuse``, the process whose caches ``context`` counts with,
    unless ``known`` says this process already has all of it (the store then need not send its
    bytes).

    When the stored memo has fallen behind, this evaluation writes a new one: it then evaluates
    every message (not reusing ``prior``), so that every entry used is noted."""
    caches = reuse.memo_caches(context.tokenizer)
    evictions = _evictions(caches)
    stored = _load_memo(memo, known, caches, evictions)
    size = len(context.snapshot.messages)
    rewrite = worth_rewriting(size, stored)
    with reuse.recording() as recorded:
        evaluation = evaluate(context, None if rewrite else prior)
    computed = {
        "texts_tokenized": sum(
            n for name, n in recorded.computed.items() if name != COMPRESSED_CACHE
        ),
        "results_compressed": recorded.computed[COMPRESSED_CACHE],
    }
    if not rewrite:
        return evaluation, MemoUpdate(blob=None, stored=stored, **computed)
    used = {name: recorded.used[name] for name in caches if name in recorded.used}
    blob = encode_memo(used, messages=size)
    # Too big to store: remembered as "none, on purpose" (digest ""), so that the evaluations
    # after this one do not each try again until the conversation has grown.
    digest = memo_digest(blob) if blob is not None else ""
    made = StoredMemo(digest=digest, messages=size, evictions=evictions)
    return evaluation, MemoUpdate(blob=blob, stored=made, **computed)


def _load_memo(
    memo: StoredBlob | None,
    known: StoredMemo | None,
    caches: dict[str, ContentCache[Any]],
    evictions: int,
) -> StoredMemo | None:
    if memo is None:
        # None stored: the conversation is new, its memo expired, or this process found it too
        # big to store and remembers that.
        return known if known is not None and not known.digest else None
    if known is not None and known.digest == memo.digest:
        if known.evictions != evictions:
            # Some of its entries may have left this process's caches since; those are
            # computed again, and the memo is taken as known from now on.
            return StoredMemo(digest=known.digest, messages=known.messages, evictions=evictions)
        return known  # made or loaded here, and nothing has been evicted since
    if memo.blob is None:
        return None  # the store held back bytes we do not have: evaluate without them
    loaded = decode_memo(memo.blob)
    preload(loaded.entries, caches)
    return StoredMemo(digest=memo.digest, messages=loaded.messages, evictions=_evictions(caches))


def _evictions(caches: dict[str, ContentCache[Any]]) -> int:
    """How many entries the caches have dropped so far: a change means some may be gone."""
    return sum(cache.evictions for cache in caches.values())
