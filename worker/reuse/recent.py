"""What a worker process keeps of the conversations it evaluated last, so that a grown
conversation's next snapshot costs only its new messages here: the last parse (its equal
messages are reused), the counted projection (their token counts) and what this process knows
of the conversation's memo in Redis. Bounded by the summed size of the snapshots' payloads,
least recently used first out. Thread-safe."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from worker.core.projection import CountedProjection
from worker.reuse.memo import StoredMemo
from worker.wire.snapshots import ParsedSnapshot


@dataclass
class _Recent:
    parsed: ParsedSnapshot
    size_bytes: int
    counted: CountedProjection | None = None
    memo: StoredMemo | None = None


class RecentConversations:
    def __init__(self, max_bytes: int) -> None:
        self._entries: OrderedDict[str, _Recent] = OrderedDict()
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, conversation_id: str) -> ParsedSnapshot | None:
        """The conversation's last parsed snapshot here (it becomes the most recent)."""
        with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is None:
                return None
            self._entries.move_to_end(conversation_id)
            return entry.parsed

    def put(self, parsed: ParsedSnapshot, size_bytes: int) -> None:
        """Keep ``parsed`` as the conversation's last parse. The counted projection and memo
        kept for the earlier one stay until replaced: the evaluation of this parse reuses
        them."""
        with self._lock:
            old = self._entries.pop(parsed.conversation_id, None)
            if old is not None:
                self._bytes -= old.size_bytes
            if size_bytes > self._max_bytes:
                return
            entry = _Recent(parsed, size_bytes)
            if old is not None:
                entry.counted, entry.memo = old.counted, old.memo
            self._entries[parsed.conversation_id] = entry
            self._bytes += size_bytes
            while self._bytes > self._max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.size_bytes

    def counted(self, conversation_id: str) -> CountedProjection | None:
        """The conversation's last counted projection here."""
        entry = self._entries.get(conversation_id)
        return entry.counted if entry is not None else None

    def remember_counted(self, conversation_id: str, counted: CountedProjection | None) -> None:
        with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is not None:
                entry.counted = counted

    def stored_memo(self, conversation_id: str) -> StoredMemo | None:
        """What this process knows of the conversation's memo in Redis."""
        entry = self._entries.get(conversation_id)
        return entry.memo if entry is not None else None

    def remember_memo(self, conversation_id: str, stored: StoredMemo | None) -> None:
        with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is not None:
                entry.memo = stored
