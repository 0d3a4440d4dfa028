"""The file store (``file:///path``, the default): one directory per conversation.

A transcript is written to a temporary file created exclusively (mode 0600), fsynced, then
hard-linked into place, which is create-only (a second writer of the same name finds it there
and, when the bytes are the same, treats the write as done), then the directory is fsynced. A
reader therefore sees a transcript whole or not at all. Paths are built only from validated
conversation ids and names. A writer killed mid-write leaves a ``.tmp-`` file, which the
scheduled prune sweeps after an hour.

Several hosts can share this store only through a POSIX shared volume; the object and
PostgreSQL stores need none.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from worker.errors import ConfigError, StorageError, TranscriptConflict
from worker.transcripts import (
    NAME_PATTERN,
    StoredTranscript,
    TranscriptKey,
    TranscriptStore,
    is_conversation_id,
    valid_conversation_id,
)

__all__ = ["FileStore"]

DIR_MODE = 0o700
FILE_MODE = 0o600
STALE_TEMPORARY_S = 3600  # a writer killed mid-write leaves its temporary file behind


class FileStore(TranscriptStore):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.display = self.root.absolute().as_uri()

    @classmethod
    def from_url(cls, url: str) -> FileStore:
        if "://" not in url:
            return cls(Path(url))
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ConfigError("transcripts.url", "a file:// URL names a local path (file:///path)")
        return cls(Path(unquote(parts.path)))

    def path_of(self, key: TranscriptKey) -> Path:
        return self.root / key.conversation_id / key.name

    # --- primitives --------------------------------------------------------------------------

    def create(self, key: TranscriptKey, payload: bytes, digest: str) -> str:
        path = self.path_of(key)
        try:
            _make_dirs(path.parent, self.root)
            _create_durably(path, payload, digest)
        except OSError as exc:
            raise StorageError(
                f"cannot write transcript under {self.root}: {_reason(exc)}"
            ) from None
        return str(path)

    def get(self, key: TranscriptKey) -> bytes:
        path = self.path_of(key)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise StorageError(f"cannot read transcript {path}: {_reason(exc)}") from None

    def stored(self, conversation_id: str | None = None) -> list[StoredTranscript]:
        if conversation_id is not None:
            dirs = [self.root / valid_conversation_id(conversation_id)]
        else:
            dirs = [d for d in _subdirs(self.root) if is_conversation_id(d.name)]
        found = []
        for directory in dirs:
            for entry in _entries(directory):
                if NAME_PATTERN.fullmatch(entry.name) is None:
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # removed meanwhile by another prune
                key = TranscriptKey(directory.name, entry.name)
                found.append(StoredTranscript(key, entry.path, st.st_size, st.st_mtime))
        return sorted(found, key=lambda t: t.key)

    def delete(self, items: Iterable[StoredTranscript]) -> list[StoredTranscript]:
        removed = [t for t in items if _remove(self.path_of(t.key))]
        _fsync_dirs({self.path_of(t.key).parent for t in removed})
        return removed

    def sweep(self, now: float) -> list[str]:
        stale = []
        for directory in _subdirs(self.root):
            for entry in _entries(directory):
                if entry.name.startswith(".tmp-"):
                    with contextlib.suppress(FileNotFoundError):
                        if now - entry.stat().st_mtime > STALE_TEMPORARY_S:
                            stale.append(Path(entry.path))
        removed = [p for p in stale if _remove(p)]
        _fsync_dirs({p.parent for p in removed})
        return [str(p) for p in removed]


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
                raise TranscriptConflict.of(path.name) from None
    finally:
        _remove(tmp)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dirs(directories: set[Path]) -> None:
    for directory in directories:
        with contextlib.suppress(OSError):
            _fsync_dir(directory)


def _remove(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


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
