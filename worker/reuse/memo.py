"""A conversation's evaluation memo: the exact token counts and compression outcomes its last
evaluation used, kept in Redis beside the conversation.

Evaluating a grown conversation then computes only what its new messages add, on whichever
worker process takes it: every process preloads the memo into its own caches before evaluating.
Without it, a conversation's next snapshot lands on a process that has never seen it about
(n-1)/n of the time with n processes, and is counted and compressed in full again.

Entries are keyed by content hash (or, for short texts, the text itself), and each value is a
deterministic function of its key, so a memo can only save work, never change a result. A memo
that is missing, from another version, or malformed is ignored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from worker.cache import ContentCache, Key, Recorded

MEMO_VERSION = 3
# A memo is worth storing only while it is small beside the snapshot it speeds up; beyond this,
# compressed bodies are left out (they are recomputed) and then the memo as a whole.
MAX_MEMO_BYTES = 4 << 20


# A process rewrites a conversation's memo once the conversation has this share more messages
# than when it was written: a memo a few messages behind costs the next process only those few
# messages, and rewriting it after every turn costs every evaluation.
REWRITE_GROWTH = 0.1


@dataclass(frozen=True)
class Memo:
    entries: Recorded
    messages: int  # wire messages of the snapshot whose evaluation wrote it


@dataclass(frozen=True)
class StoredMemo:
    """What this process knows of the memo stored for a conversation: its digest, the messages
    of the snapshot that wrote it, and the caches' eviction count when this process last had
    all its entries."""

    digest: str
    messages: int
    evictions: int


def memo_digest(blob: bytes) -> str:
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def worth_rewriting(messages: int, stored: StoredMemo | None) -> bool:
    """Once the conversation has grown by REWRITE_GROWTH since the memo was written, or has
    shrunk (compacted, or its history rewritten: the memo's entries are mostly of messages gone)."""
    return (
        stored is None
        or messages > stored.messages * (1 + REWRITE_GROWTH)
        or messages < stored.messages
    )


def encode_memo(recorded: Recorded, *, messages: int) -> bytes | None:
    """The memo to store, or None when even its token counts alone are too big."""
    blob = _encode(recorded, messages)
    if len(blob) <= MAX_MEMO_BYTES:
        return blob
    counts_only = {
        name: {k: v for k, v in entries.items() if not isinstance(v, str)}
        for name, entries in recorded.items()
    }
    blob = _encode(counts_only, messages)
    return blob if len(blob) <= MAX_MEMO_BYTES else None


def decode_memo(blob: bytes | None) -> Memo:
    """A stored memo; empty when there is none or it cannot be trusted."""
    empty = Memo(entries={}, messages=0)
    if not blob or len(blob) > MAX_MEMO_BYTES:
        return empty
    try:
        doc = _loads(blob)
        if doc.get("v") != MEMO_VERSION or type(doc["messages"]) is not int:
            return empty
        entries = {
            name: {_key(k): _value(name, v) for k, v in pairs}
            for name, pairs in doc["caches"].items()
        }
        return Memo(entries=entries, messages=doc["messages"])
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return empty


def _loads(blob: bytes) -> Any:
    """orjson reads our own JSON (small integers, shallow) fastest; json reads what orjson
    refuses: texts holding a lone surrogate, which are written as escapes."""
    try:
        return orjson.loads(blob)
    except orjson.JSONDecodeError:
        return json.loads(blob)


def preload(recorded: Recorded, caches: Mapping[str, ContentCache[Any]]) -> int:
    """Put the memo's entries into the matching caches; returns how many were new."""
    return sum(
        cache.preload(recorded[name].items()) for name, cache in caches.items() if name in recorded
    )


def _encode(recorded: Recorded, messages: int) -> bytes:
    caches = {
        name: [[_key_text(k), v] for k, v in entries.items()]
        for name, entries in recorded.items()
        if entries
    }
    doc = {"v": MEMO_VERSION, "messages": messages, "caches": caches}
    # ASCII escapes keep any text (lone surrogates included) exact through JSON.
    return json.dumps(doc, separators=(",", ":")).encode()


def _key_text(key: Key) -> str:
    return "h" + key.hex() if isinstance(key, bytes) else "s" + key


def _key(text: Any) -> Key:
    if not isinstance(text, str) or text[:1] not in ("h", "s"):
        raise ValueError("memo key")
    return bytes.fromhex(text[1:]) if text[0] == "h" else text[1:]


def _value(cache_name: str, value: Any) -> int | str | None:
    """Token caches hold counts; the compression cache holds a body or None (unchanged)."""
    if cache_name.startswith("tokens:"):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    elif value is None or isinstance(value, str):
        return value
    raise ValueError("memo value")
