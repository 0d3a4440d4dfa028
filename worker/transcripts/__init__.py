"""Durable pre-compaction transcripts: what every store promises, retention, and the choice of
store by URL (``[transcripts] url``).

A transcript is named by its conversation and ``{revision:018d}-{event_id[:16]}.json``. Every
store keeps these promises (docs/transcripts.md):

- a transcript is whole or absent, and durable before :meth:`TranscriptStore.write` returns
  (so before its event is published);
- writes are create-only: a second write of the same name with the same bytes is a no-op (a
  redelivered task), with other bytes a :class:`~worker.errors.TranscriptConflict`;
- retention is computed here, once, from a listing (:func:`doomed_by_retention`), and a store
  removes only what that listing held: a transcript written after the listing is never removed
  by it, and removing what is already gone is fine, so prunes racing each other or a write
  never remove what retention keeps;
- any failure of the backend (unreachable, denied, full) is a :class:`~worker.errors.StorageError`
  (``storage_unavailable``: retried, nothing published).

A reference's ``uri`` names the store it was written to, but readers find a transcript by the
conversation and name at its end, so events published before a ``compactor transcripts migrate``
still restore from the new store.
"""

from __future__ import annotations

import abc
import hashlib
import importlib
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from worker.errors import ConfigError, InvalidSnapshot
from worker.wire.events import TranscriptRef
from worker.wire.models import CONVERSATION_ID_PATTERN, MAX_REVISION

if TYPE_CHECKING:
    from worker.config import Settings

__all__ = [
    "StoredTranscript",
    "TranscriptKey",
    "TranscriptStore",
    "doomed_by_retention",
    "is_conversation_id",
    "key_of_uri",
    "open_store",
    "prune_by_settings",
    "store_url",
    "transcript_name",
    "valid_conversation_id",
]

NAME_PATTERN = re.compile(r"(\d{18})-([0-9a-f]{16})\.json")
_CONVERSATION_ID = re.compile(CONVERSATION_ID_PATTERN)
_EVENT_ID = re.compile(r"[0-9a-f]{16,64}")


@dataclass(frozen=True, order=True)
class TranscriptKey:
    """Where a transcript lives in any store: its conversation and its file name."""

    conversation_id: str
    name: str

    def __post_init__(self) -> None:
        valid_conversation_id(self.conversation_id)
        if not NAME_PATTERN.fullmatch(self.name):
            raise InvalidSnapshot("uri", f"not a transcript name: {self.name!r}")

    @property
    def revision(self) -> int:
        return int(self.name[:18])

    def __str__(self) -> str:
        return f"{self.conversation_id}/{self.name}"


@dataclass(frozen=True)
class StoredTranscript:
    """One kept transcript, as a store lists it (``created``: seconds since the epoch)."""

    key: TranscriptKey
    uri: str
    bytes: int
    created: float

    @property
    def conversation_id(self) -> str:
        return self.key.conversation_id

    @property
    def revision(self) -> int:
        return self.key.revision


def is_conversation_id(name: str) -> bool:
    return _CONVERSATION_ID.fullmatch(name) is not None


def valid_conversation_id(conversation_id: str) -> str:
    if not is_conversation_id(conversation_id):
        raise InvalidSnapshot("conversation_id", "not a valid conversation id")
    return conversation_id


def transcript_name(revision: int, event_id: str) -> str:
    if not _EVENT_ID.fullmatch(event_id) or not 0 <= revision <= MAX_REVISION:
        raise InvalidSnapshot("event_id", "not a valid event id or revision")
    return f"{revision:018d}-{event_id[:16]}.json"


def key_of_uri(uri: str) -> TranscriptKey:
    """The key at the end of any store's reference (``.../{conversation}/{name}``)."""
    parts = uri.replace("\\", "/").rstrip("/").rsplit("/", 2)
    if len(parts) < 2:
        raise InvalidSnapshot("uri", "not a transcript reference")
    return TranscriptKey(parts[-2], parts[-1])


class TranscriptStore(abc.ABC):
    """A place transcripts are kept. Subclasses implement the five primitives at the bottom;
    everything else (names, digests, retention) is shared."""

    #: How the store is shown (no credentials): in logs, ``config show`` and migrate's output.
    display: str = ""

    def write(
        self, conversation_id: str, revision: int, event_id: str, payload: bytes
    ) -> TranscriptRef:
        """Write ``payload`` durably and create-only; return its reference for the event."""
        key = TranscriptKey(conversation_id, transcript_name(revision, event_id))
        digest = hashlib.sha256(payload).hexdigest()
        uri = self.create(key, payload, digest)
        return TranscriptRef(uri=uri, sha256=digest, bytes=len(payload))

    def read(self, uri: str) -> bytes:
        """The bytes of the transcript a reference names (from this store)."""
        return self.get(key_of_uri(uri))

    def read_revision(self, conversation_id: str, revision: int) -> bytes | None:
        """The newest kept transcript of ``conversation_id`` at ``revision``, or None."""
        kept = [t for t in self.stored(conversation_id) if t.revision == revision]
        return self.get(kept[-1].key) if kept else None

    def enforce_count(
        self, conversation_id: str, keep: int | None, *, protect: str | None = None
    ) -> list[str]:
        """Remove all but the newest ``keep`` transcripts of one conversation; never
        ``protect`` (the uri just written)."""
        if keep is None:
            return []
        items = self.stored(conversation_id)
        doomed = [t for t in items[: max(len(items) - keep, 0)] if t.uri != protect]
        return [t.uri for t in self.delete(doomed)]

    def prune(
        self,
        *,
        keep_per_conversation: int | None,
        max_age_s: float | None,
        max_total_bytes: int | None,
        now: float | None = None,
        dry_run: bool = False,
        undo_window_s: float | None = None,
    ) -> list[str]:
        """Apply every retention limit; return what was (or, dry run, would be) removed.
        ``undo_window_s``: see :func:`doomed_by_retention`."""
        current = time.time() if now is None else now
        doomed = doomed_by_retention(
            self.stored(),
            keep_per_conversation=keep_per_conversation,
            max_age_s=max_age_s,
            max_total_bytes=max_total_bytes,
            now=current,
            undo_window_s=undo_window_s,
        )
        if dry_run:
            return [t.uri for t in doomed]
        removed = [t.uri for t in self.delete(doomed)]
        return removed + self.sweep(current)

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str) -> TranscriptStore:
        """The store a URL of its scheme names (credentials from the URL or the environment)."""

    def close(self) -> None:  # noqa: B027 -- optional: stores without connections keep it
        """Release connections (a no-op for stores that hold none)."""

    # --- the primitives a store implements ---------------------------------------------------

    @abc.abstractmethod
    def create(self, key: TranscriptKey, payload: bytes, digest: str) -> str:
        """Store ``payload`` under ``key`` durably, only if absent; return its uri. Same bytes
        already there: done. Other bytes: :class:`~worker.errors.TranscriptConflict`."""

    @abc.abstractmethod
    def get(self, key: TranscriptKey) -> bytes:
        """The stored bytes (:class:`~worker.errors.StorageError` when absent or unreadable)."""

    @abc.abstractmethod
    def stored(self, conversation_id: str | None = None) -> list[StoredTranscript]:
        """Every kept transcript (of one conversation), by conversation then oldest first."""

    @abc.abstractmethod
    def delete(self, items: Iterable[StoredTranscript]) -> list[StoredTranscript]:
        """Remove these (idempotent); return the ones this call removed."""

    def sweep(self, now: float) -> list[str]:
        """Remove what interrupted writes left behind (stores without such leftovers: none)."""
        return []


def doomed_by_retention(
    items: list[StoredTranscript],
    *,
    keep_per_conversation: int | None,
    max_age_s: float | None,
    max_total_bytes: int | None,
    now: float,
    undo_window_s: float | None = None,
) -> list[StoredTranscript]:
    """What the retention limits remove from a listing (``items`` as ``stored()`` orders
    them): all but the newest ``keep_per_conversation`` of each conversation, everything older
    than ``max_age_s``, then the oldest survivors until the rest fit ``max_total_bytes``.

    ``undo_window_s``: each conversation's newest transcript younger than this is never removed
    by age or size. It is what undoing the conversation's newest compaction needs, for as long
    as the conversation's composed record (which lives that long after its newest compaction)
    can still apply that compaction to a full history."""
    doomed: dict[str, StoredTranscript] = {}
    by_conversation: dict[str, list[StoredTranscript]] = {}
    for t in items:
        by_conversation.setdefault(t.conversation_id, []).append(t)
    if keep_per_conversation is not None:
        for group in by_conversation.values():
            doomed.update((t.uri, t) for t in group[: max(len(group) - keep_per_conversation, 0)])
    needed = set()
    if undo_window_s is not None:
        needed = {
            group[-1].uri
            for group in by_conversation.values()
            if now - group[-1].created <= undo_window_s
        }
    if max_age_s is not None:
        doomed.update(
            (t.uri, t) for t in items if now - t.created > max_age_s and t.uri not in needed
        )
    if max_total_bytes is not None:
        total = sum(t.bytes for t in items if t.uri not in doomed)
        removable = sorted(
            (t for t in items if t.uri not in doomed and t.uri not in needed),
            key=lambda t: t.created,
        )
        for t in removable:
            if total <= max_total_bytes:
                break
            doomed[t.uri] = t
            total -= t.bytes
    return list(doomed.values())


def prune_by_settings(
    store: TranscriptStore, settings: Settings, *, dry_run: bool = False
) -> list[str]:
    """The scheduled prune: every retention limit the settings give."""
    retention = settings.transcripts
    return store.prune(
        keep_per_conversation=settings.compaction.max_persisted_transcripts,
        max_age_s=retention.max_age_days * 86400 if retention.max_age_days else None,
        max_total_bytes=retention.max_total_bytes,
        dry_run=dry_run,
        undo_window_s=settings.redis.stream_ttl_s,
    )


def store_url(settings: Settings) -> str:
    """The configured store's URL: ``[transcripts] url``, else ``compaction.transcript_dir``."""
    url = settings.transcripts.url
    if url is not None:
        return url.get_secret_value()
    return Path(settings.compaction.transcript_dir).absolute().as_uri()


#: The store of each URL scheme, imported when first used (each may need an optional extra).
_STORES = {
    "": ("worker.transcripts.filesystem", "FileStore"),
    "file": ("worker.transcripts.filesystem", "FileStore"),
    "s3": ("worker.transcripts.s3", "S3Store"),
    "postgresql": ("worker.transcripts.postgres", "PostgresStore"),
    "postgres": ("worker.transcripts.postgres", "PostgresStore"),
}


def open_store(settings_or_url: Settings | str) -> TranscriptStore:
    """The store a URL names: ``file:///path`` (or a bare path), ``s3://bucket/prefix`` or
    ``postgresql://...``."""
    url = settings_or_url if isinstance(settings_or_url, str) else store_url(settings_or_url)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in _STORES:
        raise ConfigError(
            "transcripts.url", f"unsupported scheme {scheme!r} (file://, s3:// or postgresql://)"
        )
    module_name, class_name = _STORES[scheme]
    store_class: type[TranscriptStore] = getattr(importlib.import_module(module_name), class_name)
    return store_class.from_url(url)
