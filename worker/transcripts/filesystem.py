"""The file store (``file:///path``, the default): one directory per conversation.

A transcript is written to a file that has no name yet (Linux's ``O_TMPFILE``, mode 0600),
fsynced, then hard-linked into place, which is create-only (a second writer of the same name
finds it there and, when the bytes are the same, treats the write as done), then the directory
is fsynced. A reader therefore sees a transcript whole or not at all, and a writer stopped at
any point (an exception, a kill) leaves nothing behind: the kernel frees a file without a name.
Where the file system has no ``O_TMPFILE`` (some network file systems), the file is a named
``.tmp-`` one instead, removed on every exception; only a writer killed mid-write leaves it,
and the scheduled prune sweeps those after an hour. Paths are built only from validated
conversation ids and names.

Several hosts can share this store only through a POSIX shared volume; the object and
PostgreSQL stores need none.
"""

from __future__ import annotations

import contextlib
import errno
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
STALE_TEMPORARY_S = 3600  # a writer killed mid-write leaves its named temporary file behind
TEMPORARY_PREFIX = ".tmp-"
# A file without a name is linked into place through /proc (linkat(2) of an fd needs a
# privilege otherwise); without either, named temporary files.
UNNAMED_FILES = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
# What open(O_TMPFILE) fails with where the file system (or kernel) does not have it.
_NO_TMPFILE = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL}


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
            _create_durably(path.parent, key.name, payload, digest)
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
                if entry.name.startswith(TEMPORARY_PREFIX):
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


def _create_durably(directory: Path, name: str, payload: bytes, digest: str) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            if not (UNNAMED_FILES and _link_unnamed(dir_fd, name, payload)):
                _link_named(dir_fd, name, payload)
        except FileExistsError:  # create-only: never replaces an existing transcript
            if hashlib.sha256((directory / name).read_bytes()).hexdigest() != digest:
                raise TranscriptConflict.of(name) from None
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _link_unnamed(dir_fd: int, name: str, payload: bytes) -> bool:
    """Write ``payload`` to a file without a name, then give it ``name`` (create-only);
    False, having done nothing, where the file system has no such files."""
    try:
        fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, FILE_MODE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NO_TMPFILE:
            return False
        raise
    try:
        _write_durably(fd, payload)
        # A directory fd makes CPython call linkat(2), which follows the /proc link to the
        # file (link(2) would try to link the symbolic link itself).
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
    finally:
        os.close(fd)
    return True


def _link_named(dir_fd: int, name: str, payload: bytes) -> None:
    """As :func:`_link_unnamed`, through a named temporary file, removed whatever happens."""
    tmp = f"{TEMPORARY_PREFIX}{name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE, dir_fd=dir_fd)
        try:
            _write_durably(fd, payload)
        finally:
            os.close(fd)
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)


def _write_durably(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


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
