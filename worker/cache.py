"""A small thread-safe LRU keyed by content hash: what makes re-evaluating a grown conversation
cost only its new messages (token counts, compressed tool results)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


def content_key(*parts: str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()


class ContentCache(Generic[V]):
    def __init__(self, max_entries: int) -> None:
        self._data: OrderedDict[str | bytes, V] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()
        self.misses = 0

    def get_or_compute(self, key: str | bytes, compute: Callable[[], V]) -> V:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = compute()  # outside the lock: computing may be slow, and is deterministic
        with self._lock:
            self.misses += 1
            self._data[key] = value
            if len(self._data) > self._max:
                self._data.popitem(last=False)
        return value
