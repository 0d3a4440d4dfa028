"""What one process keeps so that evaluating a grown conversation costs only its new messages.

One :class:`Reuse` per process (a worker, the CLI, an agent's projections), created by its owner
and passed down; nothing here is a module global. It holds:

- a tokenizer per encoding, each with its cache of exact counts per text;
- the cache of compressed tool-result bodies;
- the recorder that notes which of those entries an evaluation used, so that they can travel
  to another process in the conversation's memo (:mod:`worker.reuse.memo`);
- the last parse and counted projection of recent conversations, and what this process knows
  of each one's memo (:class:`worker.reuse.recent.RecentConversations`).

None of it can change a result: every entry is keyed by content, and its value is a
deterministic function of that key.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from worker.cache import ContentCache, Recorder, Recording
from worker.core.projection import COMPRESSED_CACHE, CompressionCache, new_compression_cache
from worker.reuse.recent import RecentConversations
from worker.tokens import (
    CalibratedEstimateTokenizer,
    CharEstimateTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    encoding_name_for_model,
    has_known_tokenizer,
)

__all__ = ["Reuse"]

DEFAULT_CONVERSATION_CACHE_BYTES = 32 * 2**20


class Reuse:
    def __init__(
        self,
        *,
        conversation_cache_bytes: int = DEFAULT_CONVERSATION_CACHE_BYTES,
        token_cache_entries: int = 200_000,
        compressed_entries: int = 50_000,
    ) -> None:
        self.recorder = Recorder()
        self.compressed: CompressionCache = new_compression_cache(
            recorder=self.recorder, max_entries=compressed_entries
        )
        self.recent = RecentConversations(conversation_cache_bytes)
        self._token_cache_entries = token_cache_entries
        self._tokenizers: dict[str, TiktokenTokenizer] = {}
        self._calibrated = CalibratedEstimateTokenizer()
        self._lock = threading.Lock()

    def tokenizer(self, model: str | None, *, estimate: bool = False) -> Tokenizer:
        """This process's tokenizer for ``model``'s encoding (its cache serves every
        conversation), the character estimate (``estimate``), or for a model whose tokenizer
        is unknown the calibrated estimate."""
        if estimate:
            return CharEstimateTokenizer()
        if not has_known_tokenizer(model):
            return self._calibrated
        name = encoding_name_for_model(model)
        tok = self._tokenizers.get(name)
        if tok is None:
            with self._lock:
                tok = self._tokenizers.get(name)
                if tok is None:
                    tok = self._tokenizers[name] = TiktokenTokenizer(
                        model, cache_size=self._token_cache_entries, recorder=self.recorder
                    )
        return tok

    def memo_caches(self, tokenizer: Tokenizer) -> dict[str, ContentCache[Any]]:
        """The caches an evaluation with ``tokenizer`` reads, by name: what a memo carries."""
        caches: dict[str, ContentCache[Any]] = {COMPRESSED_CACHE: self.compressed.back}
        cache = getattr(tokenizer, "cache", None)
        if isinstance(cache, ContentCache):
            caches[cache.name] = cache
        return caches

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recording]:
        """Note every cache entry used inside the block (this thread or task only)."""
        with self.recorder.recording() as recorded:
            yield recorded
