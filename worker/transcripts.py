"""Durable pre-compaction transcripts, and their retention.

A transcript is written before its event is published: to a temporary file created exclusively
(mode 0600), fsynced, then hard-linked into place, which is create-only (a second writer of the
same name finds it there and, when the bytes are the same, treats the write as done), then the
directory is fsynced. A reader therefore sees a transcript whole or not at all. Paths are built
only from validated conversation ids, revisions and event ids.

Retention keeps the newest ``max_persisted_transcripts`` per conversation after every write,
and a scheduled prune applies age and total-size limits. Deleting is idempotent (a file already
gone is fine), so two prunes at once, or a prune racing a write, never remove a kept file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from worker.errors import InvalidSnapshot, StorageError, TranscriptConflict
from worker.events import TranscriptRef
from worker.models import CONVERSATION_ID_PATTERN, MAX_REVISION

_NAME = re.compile(r"(\d{18})-([0-9a-f]{16})\.json")
_CONVERSATION_ID = re.compile(CONVERSATION_ID_PATTERN)
_EVENT_ID = re.compile(r"[0-9a-f]{16,64}")
DIR_MODE = 0o700
FILE_MODE = 0o600


@dataclass(frozen=True)
class StoredTranscript:
    path: Path
    conversation_id: str
    revision: int
    bytes: int
    mtime: float


def transcript_name(revision: int, event_id: str) -> str:
    if not _EVENT_ID.fullmatch(event_id) or not 0 <= revision <= MAX_REVISION:
        raise InvalidSnapshot("event_id", "not a valid event id or revision")
    return f"{revision:018d}-{event_id[:16]}.json"


class TranscriptStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def conversation_dir(self, conversation_id: str) -> Path:
        if not _CONVERSATION_ID.fullmatch(conversation_id):
            raise InvalidSnapshot("conversation_id", "not a valid conversation id")
        return self.root / conversation_id

    def write(
        self, conversation_id: str, revision: int, event_id: str, payload: bytes
    ) -> TranscriptRef:
        """Write ``payload`` durably and create-only; return its reference for the event."""
        directory = self.conversation_dir(conversation_id)
        path = directory / transcript_name(revision, event_id)
        digest = hashlib.sha256(payload).hexdigest()
        try:
            _make_dirs(directory, self.root)
            _create_durably(path, payload, digest)
        except OSError as exc:
            raise StorageError(
                f"cannot write transcript under {self.root}: {_reason(exc)}"
            ) from None
        return TranscriptRef(uri=str(path), sha256=digest, bytes=len(payload))

    def read(self, uri: str) -> bytes:
        path = Path(uri)
        if self.root.resolve() not in path.resolve().parents:
            raise InvalidSnapshot("uri", "not a transcript of this store")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise StorageError(f"cannot read transcript {uri}: {_reason(exc)}") from None

    def stored(self, conversation_id: str | None = None) -> list[StoredTranscript]:
        """Transcripts oldest revision first (per conversation), skipping temporary files."""
        dirs = [self.conversation_dir(conversation_id)] if conversation_id else _subdirs(self.root)
        found = []
        for directory in dirs:
            for entry in _entries(directory):
                match = _NAME.fullmatch(entry.name)
                if match is None:
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # removed meanwhile by another prune
                found.append(
                    StoredTranscript(
                        path=Path(entry.path),
                        conversation_id=directory.name,
                        revision=int(match.group(1)),
                        bytes=st.st_size,
                        mtime=st.st_mtime,
                    )
                )
        return sorted(found, key=lambda t: (t.conversation_id, t.path.name))

    def _stale_temporaries(self, now: float) -> list[Path]:
        stale = []
        for directory in _subdirs(self.root):
            for entry in _entries(directory):
                if entry.name.startswith(".tmp-"):
                    with contextlib.suppress(FileNotFoundError):
                        if now - entry.stat().st_mtime > STALE_TEMPORARY_S:
                            stale.append(Path(entry.path))
        return stale

    def enforce_count(
        self, conversation_id: str, keep: int | None, *, protect: Path | None = None
    ) -> list[Path]:
        """Remove all but the newest ``keep`` transcripts of one conversation."""
        if keep is None:
            return []
        items = self.stored(conversation_id)
        doomed = [t.path for t in items[: max(len(items) - keep, 0)] if t.path != protect]
        return _remove_all(doomed)

    def prune(
        self,
        *,
        keep_per_conversation: int | None,
        max_age_s: float | None,
        max_total_bytes: int | None,
        now: float | None = None,
        dry_run: bool = False,
    ) -> list[Path]:
        """Apply every retention limit; return what was (or, dry run, would be) removed."""
        items = self.stored()
        doomed: dict[Path, None] = {}
        current = time.time() if now is None else now
        by_conversation: dict[str, list[StoredTranscript]] = {}
        for t in items:
            by_conversation.setdefault(t.conversation_id, []).append(t)
        for group in by_conversation.values():
            if keep_per_conversation is not None:
                doomed.update(
                    (t.path, None) for t in group[: max(len(group) - keep_per_conversation, 0)]
                )
        if max_age_s is not None:
            doomed.update((t.path, None) for t in items if current - t.mtime > max_age_s)
        doomed.update((p, None) for p in self._stale_temporaries(current))
        if max_total_bytes is not None:
            survivors = sorted((t for t in items if t.path not in doomed), key=lambda t: t.mtime)
            total = sum(t.bytes for t in survivors)
            for t in survivors:
                if total <= max_total_bytes:
                    break
                doomed[t.path] = None
                total -= t.bytes
        return list(doomed) if dry_run else _remove_all(list(doomed))


STALE_TEMPORARY_S = 3600  # a writer killed mid-write leaves its temporary file behind


def _make_dirs(directory: Path, root: Path) -> None:
    for d in (root, directory):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE, exist_ok=False, parents=d is root)


def _create_durably(path: Path, payload: bytes, digest: str) -> None:
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # create-only: never replaces an existing transcript
        except FileExistsError:
            if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                raise TranscriptConflict(
                    f"a different transcript already exists at {path.name}: this conversation "
                    "and revision were compacted before with other messages; the first stays "
                    "(transcripts are create-only); submit the edited history as a new revision"
                ) from None
    finally:
        _remove(tmp)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _remove_all(paths: list[Path]) -> list[Path]:
    removed = [p for p in paths if _remove(p)]
    for directory in {p.parent for p in removed}:
        with contextlib.suppress(OSError):
            _fsync_dir(directory)
    return removed


def _subdirs(root: Path) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(directory) if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
