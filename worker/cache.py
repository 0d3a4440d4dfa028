"""A small thread-safe LRU keyed by content hash: what makes re-evaluating a grown conversation
cost only its new messages (token counts, compressed tool results).

While a cache's :class:`Recorder` is recording (per thread or task: a context variable), every
entry an evaluation reads or computes is noted under the cache's name, so that the entries can
travel to another worker process with the conversation (:mod:`worker.reuse.memo`) and be
:meth:`preloaded <ContentCache.preload>` there. The caches and their recorder belong to one
:class:`worker.reuse.Reuse`, which a process owns and passes down.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

V = TypeVar("V")
Key = str | bytes
Recorded = dict[str, dict[Key, Any]]  # cache name -> the entries used


@dataclass
class Recording:
    """The entries an evaluation used, and how many of them it had to compute, by cache."""

    used: Recorded = field(default_factory=dict)
    computed: Counter[str] = field(default_factory=Counter)


_MISSING: Any = object()


def content_key(*parts: str) -> bytes:
    """A digest of the parts, each length-prefixed: no two different part lists share one (a
    separator byte would not do: a part may contain it)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


class Recorder:
    """Notes the cache entries used inside :meth:`recording` blocks, per thread or asyncio task
    (a context variable), for the caches built with it."""

    def __init__(self) -> None:
        self._current: ContextVar[Recording | None] = ContextVar("cache_recording", default=None)

    def current(self) -> Recording | None:
        return self._current.get()

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recording]:
        """Note every cache entry used inside the block (by cache name)."""
        recorded = Recording()
        token = self._current.set(recorded)
        try:
            yield recorded
        finally:
            self._current.reset(token)


_NOT_RECORDING = Recorder()  # for caches that nothing records


class ContentCache(Generic[V]):
    def __init__(
        self, max_entries: int, *, name: str = "", recorder: Recorder | None = None
    ) -> None:
        self._data: OrderedDict[Key, V] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()
        self.name = name
        self.recorder = recorder or _NOT_RECORDING
        self.misses = 0
        self.evictions = 0

    def get_or_compute(self, key: Key, compute: Callable[[], V]) -> V:
        # Reads take no lock: each OrderedDict call is atomic under the GIL, and a key evicted
        # between the two calls only costs its recency. Inserting and evicting take the lock.
        value: V = self._data.get(key, _MISSING)
        recorded = self.recorder.current()
        if value is _MISSING:
            value = compute()  # outside the lock: computing may be slow, and is deterministic
            with self._lock:
                self.misses += 1
                self._put(key, value)
            if recorded is not None:
                recorded.computed[self.name] += 1
        else:
            try:  # noqa: SIM105 (contextlib.suppress costs a context object on the hot path)
                self._data.move_to_end(key)
            except KeyError:
                pass
        if recorded is not None and self.name:
            recorded.used.setdefault(self.name, {})[key] = value
        return value

    def preload(self, entries: Iterable[tuple[Key, V]]) -> int:
        """Add entries computed elsewhere (values are deterministic in their keys); returns how
        many were new here."""
        added = 0
        with self._lock:
            for key, value in entries:
                if key not in self._data:
                    self._put(key, value)
                    added += 1
        return added

    def _put(self, key: Key, value: V) -> None:
        self._data[key] = value
        if len(self._data) > self._max:
            self._data.popitem(last=False)
            self.evictions += 1


H = TypeVar("H", bound=Hashable)
# What one front entry costs beyond its text (dict slot, tuple, digest), in the same unit as
# ``size_of`` (characters): an empty text is not free.
FRONT_ENTRY_OVERHEAD = 160


class FrontCache(Generic[H, V]):
    """A :class:`ContentCache` fronted by the texts themselves: Python computes a string's hash
    once per string object, so a message this process has parsed before (the parse reuses it)
    costs one dict lookup instead of a content digest. Bounded by the summed ``size_of`` of its
    keys (characters); the digest-keyed cache behind it is what memos fill and carry."""

    def __init__(
        self,
        back: ContentCache[V],
        *,
        max_size: int,
        max_entries: int,
        size_of: Callable[[H], int],
        key_of: Callable[[H], Key],
    ) -> None:
        self.back = back
        self._front: dict[H, tuple[V, Key]] = {}
        self._max_size = max_size
        self._max_entries = max_entries
        self._size = 0
        self._size_of = size_of
        self._key_of = key_of
        self._lock = threading.Lock()

    def get_or_compute(self, item: H, compute: Callable[[], V]) -> V:
        hit = self._front.get(item)
        if hit is not None:
            value, key = hit
            recorded = self.back.recorder.current()
            if recorded is not None and self.back.name:
                recorded.used.setdefault(self.back.name, {})[key] = value
            return value
        key = self._key_of(item)
        value = self.back.get_or_compute(key, compute)
        self._remember(item, value, key)
        return value

    def _remember(self, item: H, value: V, key: Key) -> None:
        size = self._entry_size(item)
        if size > self._max_size:
            return
        with self._lock:
            if item in self._front:
                return
            self._front[item] = (value, key)
            self._size += size
            # Oldest first: dicts keep insertion order.
            while self._size > self._max_size or len(self._front) > self._max_entries:
                oldest = next(iter(self._front))
                del self._front[oldest]
                self._size -= self._entry_size(oldest)

    def _entry_size(self, item: H) -> int:
        return self._size_of(item) + FRONT_ENTRY_OVERHEAD

    def __len__(self) -> int:
        return len(self._front)
