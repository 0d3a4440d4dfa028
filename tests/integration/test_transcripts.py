"""Transcripts (DESIGN.md §1 step 4, §5): atomic, create-only, private writes; retention by
count, age and total size; prunes that race each other or a writer never remove a kept file.

The tests taking ``store`` run once per store kind (support/store_support.py: files and S3 on a
real server); those taking ``file_store`` are about the file store's own ways (modes, paths,
temporary files, file ages)."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from worker.errors import InvalidSnapshot, StorageError, TranscriptConflict
from worker.transcripts import TranscriptKey, TranscriptStore, key_of_uri, transcript_name
from worker.transcripts.filesystem import FileStore


def eid(n: int) -> str:
    """A valid event id (hex), distinct per ``n``."""
    return hashlib.sha256(str(n).encode()).hexdigest()[:32]


def all_entries(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*"))


def temp_files(root: Path) -> list[Path]:
    return [p for p in all_entries(root) if p.is_file() and p.name.startswith(".")]


@pytest.fixture
def file_store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "transcripts")


def fill(store: FileStore, cid: str, revisions: range, size: int = 10) -> dict[int, Path]:
    return {r: Path(store.write(cid, r, eid(r), f"{r:0{size}d}".encode()).uri) for r in revisions}


def fill_any(store: TranscriptStore, cid: str, revisions: range, size: int = 10) -> dict[int, str]:
    """Like :func:`fill`, in any store: revision -> uri."""
    return {r: store.write(cid, r, eid(r), f"{r:0{size}d}".encode()).uri for r in revisions}


def kept(store: TranscriptStore) -> set[tuple[str, int]]:
    return {(t.conversation_id, t.revision) for t in store.stored()}


# --- writing (every store) ----------------------------------------------------------------------


def test_write_returns_a_matching_reference(store: TranscriptStore) -> None:
    payload = b'{"messages": ["\xc3\xa9"]}'
    ref = store.write("c-1", 7, eid(1), payload)
    assert ref.sha256 == hashlib.sha256(payload).hexdigest()
    assert ref.bytes == len(payload)
    assert key_of_uri(ref.uri) == TranscriptKey("c-1", transcript_name(7, eid(1)))
    assert store.read(ref.uri) == payload
    assert store.read_revision("c-1", 7) == payload
    assert store.read_revision("c-1", 8) is None
    [listed] = store.stored()
    assert (listed.uri, listed.bytes, listed.revision) == (ref.uri, len(payload), 7)
    assert abs(listed.created - time.time()) < 3600  # the store's clock, roughly ours


def test_same_bytes_twice_is_one_transcript(store: TranscriptStore) -> None:
    first = store.write("c-1", 3, eid(3), b"same")
    second = store.write("c-1", 3, eid(3), b"same")
    assert first == second
    assert [t.uri for t in store.stored()] == [first.uri]


def test_same_name_different_bytes_is_refused(store: TranscriptStore) -> None:
    ref = store.write("c-1", 3, eid(3), b"original")
    with pytest.raises(TranscriptConflict):
        store.write("c-1", 3, eid(3), b"tampered")
    assert store.read(ref.uri) == b"original"
    assert len(store.stored()) == 1


def test_concurrent_identical_writes_all_succeed(store: TranscriptStore) -> None:
    refs, errors = run_threads(8, lambda i: store.write("c-1", 9, eid(9), b"payload" * 1000))
    assert errors == []
    assert len(set(refs)) == 1
    assert len(store.stored("c-1")) == 1


def test_concurrent_conflicting_writes_one_wins(store: TranscriptStore) -> None:
    refs, errors = run_threads(8, lambda i: store.write("c-1", 9, eid(9), f"writer {i}".encode()))
    assert len(refs) >= 1
    assert all(isinstance(e, TranscriptConflict) for e in errors), errors
    assert len(refs) + len(errors) == 8
    stored = store.read(refs[0].uri)
    assert all(hashlib.sha256(stored).hexdigest() == r.sha256 for r in refs)
    assert len(store.stored("c-1")) == 1


@pytest.mark.parametrize("cid", ["../../etc", ".hidden", "a/b", "", "abc\n", "x" * 129])
def test_invalid_conversation_id_is_refused(store: TranscriptStore, cid: str) -> None:
    with pytest.raises(InvalidSnapshot):
        store.write(cid, 1, eid(1), b"x")
    assert store.stored() == []


@pytest.mark.parametrize("event_id", ["../x", "ABCDEF0123456789", "0123", "g" * 32, ""])
def test_invalid_event_id_refused(store: TranscriptStore, event_id: str) -> None:
    with pytest.raises(InvalidSnapshot):
        store.write("c-1", 1, event_id, b"x")


def test_huge_revisions_are_listed_and_retained(store: TranscriptStore) -> None:
    """Revisions may be large (e.g. millisecond timestamps): retention must still see them."""
    revisions = [999_999_999_999, 1_700_000_000_000, 1_700_000_000_001]
    for r in revisions:
        store.write("c-1", r, eid(r), b"x")
    assert [t.revision for t in store.stored("c-1")] == revisions
    store.enforce_count("c-1", 1)
    assert kept(store) == {("c-1", revisions[-1])}


# --- the file store's own ways ------------------------------------------------------------------


def test_a_file_reference_is_its_path(file_store: FileStore) -> None:
    ref = file_store.write("c-1", 7, eid(1), b"{}")
    path = Path(ref.uri)
    assert path.read_bytes() == b"{}"
    assert path.stat().st_size == ref.bytes
    assert path.parent == file_store.root / "c-1"
    assert path.name == transcript_name(7, eid(1))


def test_file_and_directory_modes(file_store: FileStore) -> None:
    old = os.umask(0o022)
    try:
        path = Path(file_store.write("c-1", 1, eid(1), b"x").uri)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(file_store.root.stat().st_mode) == 0o700


def test_no_temp_files_left_behind(file_store: FileStore) -> None:
    fill(file_store, "c-1", range(5))
    file_store.write("c-1", 4, eid(4), b"0000000004")  # a redelivered write
    with pytest.raises(TranscriptConflict):
        file_store.write("c-1", 4, eid(4), b"other")
    run_threads(8, lambda i: file_store.write("c-1", 9, eid(9), f"writer {i}".encode()))
    assert temp_files(file_store.root) == []
    assert len(file_store.stored("c-1")) == 6
    names = sorted(p.name for p in all_entries(file_store.root) if p.is_file())
    assert names == sorted(transcript_name(r, eid(r)) for r in [0, 1, 2, 3, 4, 9])


def test_invalid_conversation_id_never_becomes_a_path(file_store: FileStore) -> None:
    with pytest.raises(InvalidSnapshot):
        file_store.write("../../etc", 1, eid(1), b"x")
    assert not file_store.root.exists()


def test_read_refuses_paths_outside_the_store(file_store: FileStore, tmp_path: Path) -> None:
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    with pytest.raises(InvalidSnapshot):
        file_store.read(str(outside))
    with pytest.raises(InvalidSnapshot):
        file_store.read(str(file_store.root / ".." / "secret.json"))


# --- write failures -----------------------------------------------------------------------------


def test_root_is_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / "transcripts"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError):
        FileStore(blocker).write("c-1", 1, eid(1), b"x")
    assert blocker.read_text() == "not a directory"


def test_unwritable_proc_path() -> None:
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    with pytest.raises(StorageError):
        FileStore(Path("/proc/compactor-test-transcripts")).write("c-1", 1, eid(1), b"x")


def test_read_only_directory(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions; the two tests above force the failure")
    root = tmp_path / "ro"
    root.mkdir(mode=0o500)
    try:
        with pytest.raises(StorageError):
            FileStore(root).write("c-1", 1, eid(1), b"x")
    finally:
        root.chmod(0o700)


# --- retention (every store) --------------------------------------------------------------------


def test_enforce_count_keeps_the_newest(store: TranscriptStore) -> None:
    uris = fill_any(store, "c-1", range(1, 8))
    fill_any(store, "c-2", range(1, 4))
    removed = store.enforce_count("c-1", 3)
    assert sorted(removed) == sorted(uris[r] for r in range(1, 5))
    assert [t.revision for t in store.stored("c-1")] == [5, 6, 7]
    assert [t.revision for t in store.stored("c-2")] == [1, 2, 3]  # other conversations untouched
    assert store.enforce_count("c-1", 3) == []  # idempotent


def test_enforce_count_never_removes_the_protected_transcript(store: TranscriptStore) -> None:
    uris = fill_any(store, "c-1", range(1, 6))
    store.enforce_count("c-1", 1, protect=uris[2])
    assert sorted(t.revision for t in store.stored("c-1")) == [2, 5]


def test_enforce_count_none_keeps_everything(store: TranscriptStore) -> None:
    fill_any(store, "c-1", range(5))
    assert store.enforce_count("c-1", None) == []
    assert len(store.stored("c-1")) == 5


def test_prune_by_count_per_conversation(store: TranscriptStore) -> None:
    fill_any(store, "a", range(6))
    fill_any(store, "b", range(2))
    removed = store.prune(keep_per_conversation=3, max_age_s=None, max_total_bytes=None)
    assert len(removed) == 3
    assert kept(store) == {("a", 3), ("a", 4), ("a", 5), ("b", 0), ("b", 1)}


def test_prune_by_age_and_size_by_the_stores_clock(store: TranscriptStore) -> None:
    """Ages are the store's own (a file's mtime, an object's LastModified, to the second):
    an older batch, then a newer one at least a second later by that clock."""
    fill_any(store, "a", range(3), size=100)
    older = max(t.created for t in store.stored())
    while time.time() < older + 1.05:  # S3 keeps whole seconds: the next batch is newer
        time.sleep(0.05)
    fill_any(store, "b", range(3), size=100)
    newer = min(t.created for t in store.stored("b"))
    assert newer > older
    by_age = store.prune(
        keep_per_conversation=None,
        max_age_s=(newer - older) / 2,
        max_total_bytes=None,
        now=newer,
        dry_run=True,
    )
    assert {key_of_uri(u).conversation_id for u in by_age} == {"a"} and len(by_age) == 3
    by_size = store.prune(keep_per_conversation=None, max_age_s=None, max_total_bytes=300)
    assert sorted(by_size) == sorted(by_age)  # the oldest go first
    assert kept(store) == {("b", 0), ("b", 1), ("b", 2)}


def test_prune_of_an_empty_store_is_empty(store: TranscriptStore) -> None:
    assert store.prune(keep_per_conversation=1, max_age_s=1.0, max_total_bytes=0) == []


def test_list_ignores_foreign_and_temporary_files(file_store: FileStore) -> None:
    fill(file_store, "c-1", range(2))
    (file_store.root / "c-1" / ".tmp-000000000009-abc-1-ff.json").write_bytes(b"partial")
    (file_store.root / "c-1" / "notes.txt").write_bytes(b"x")
    (file_store.root / "stray.json").write_bytes(b"x")
    assert [t.revision for t in file_store.stored()] == [0, 1]
    file_store.prune(keep_per_conversation=1, max_age_s=None, max_total_bytes=None)
    assert (file_store.root / "c-1" / "notes.txt").exists()


def set_age(paths: list[Path], mtime: float) -> None:
    for p in paths:
        os.utime(p, (mtime, mtime))


NOW = 1_800_000_000.0
DAY = 86_400.0


def test_prune_by_age(file_store: FileStore) -> None:
    paths = fill(file_store, "a", range(4))
    set_age([paths[0], paths[1]], NOW - 10 * DAY)
    set_age([paths[2], paths[3]], NOW - 1 * DAY)
    removed = file_store.prune(
        keep_per_conversation=None, max_age_s=7 * DAY, max_total_bytes=None, now=NOW
    )
    assert sorted(map(Path, removed)) == [paths[0], paths[1]]
    assert [t.revision for t in file_store.stored()] == [2, 3]


def test_prune_by_total_size_removes_oldest_first(file_store: FileStore) -> None:
    a = fill(file_store, "a", range(3), size=100)
    b = fill(file_store, "b", range(3), size=100)
    for i, p in enumerate([a[0], b[0], a[1], b[1], a[2], b[2]]):
        set_age([p], NOW - 100 + i)
    removed = file_store.prune(
        keep_per_conversation=None, max_age_s=None, max_total_bytes=250, now=NOW
    )
    assert sorted(map(Path, removed)) == sorted([a[0], b[0], a[1], b[1]])
    assert sum(t.bytes for t in file_store.stored()) <= 250


def test_prune_all_limits_together_and_dry_run(file_store: FileStore) -> None:
    a = fill(file_store, "a", range(5), size=100)
    b = fill(file_store, "b", range(2), size=100)
    set_age([*a.values(), *b.values()], NOW - DAY)
    set_age([a[0]], NOW - 30 * DAY)
    before = all_entries(file_store.root)

    def prune(dry_run: bool) -> list[str]:
        return file_store.prune(
            keep_per_conversation=4,
            max_age_s=7 * DAY,
            max_total_bytes=100_000,
            now=NOW,
            dry_run=dry_run,
        )

    would = prune(dry_run=True)
    assert list(map(Path, would)) == [a[0]]
    assert all_entries(file_store.root) == before  # a dry run removes nothing
    assert prune(dry_run=False) == would
    assert not a[0].exists()


def test_prune_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "never-created")
    assert store.prune(keep_per_conversation=1, max_age_s=1.0, max_total_bytes=0) == []


# --- races (every store) ------------------------------------------------------------------------
def run_threads(n: int, work: Callable[[int], object]) -> tuple[list, list[BaseException]]:
    results: list = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        barrier.wait()
        try:
            out = work(i)
        except BaseException as exc:  # collected and asserted on by the caller
            with lock:
                errors.append(exc)
        else:
            with lock:
                results.append(out)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results, errors


def test_racing_prunes_remove_each_once_and_keep_the_rest(store: TranscriptStore) -> None:
    for cid in ("a", "b", "c"):
        fill_any(store, cid, range(30))
    removed_lists, errors = run_threads(
        8, lambda i: store.prune(keep_per_conversation=5, max_age_s=None, max_total_bytes=None)
    )
    assert errors == []
    removed = [p for lst in removed_lists for p in lst]
    assert len(removed) == len(set(removed)) == 3 * 25  # each reported removed once
    assert kept(store) == {(cid, r) for cid in ("a", "b", "c") for r in range(25, 30)}


def test_prune_racing_writes_never_removes_a_kept_one(store: TranscriptStore) -> None:
    keep = 3
    stop = threading.Event()
    written: list[TranscriptKey] = []
    prune_errors: list[BaseException] = []

    def writer() -> None:
        for r in range(60):
            uri = store.write("live", r, eid(r), f"revision {r}".encode()).uri
            written.append(key_of_uri(uri))
            store.enforce_count("live", keep, protect=uri)
            # The newest `keep` written so far are what retention keeps: they must all exist.
            present = {t.key for t in store.stored("live")}
            for key in written[-keep:]:
                assert key in present, f"{key} was removed while retention keeps it"
        stop.set()

    def pruner() -> None:
        try:
            while not stop.is_set():
                store.prune(keep_per_conversation=keep, max_age_s=None, max_total_bytes=None)
        except BaseException as exc:  # surfaced below
            prune_errors.append(exc)
            stop.set()

    pruners = [threading.Thread(target=pruner) for _ in range(4)]
    for t in pruners:
        t.start()
    try:
        writer()
    finally:
        stop.set()
        for t in pruners:
            t.join(timeout=60)
    assert prune_errors == []
    assert [t.revision for t in store.stored("live")] == [57, 58, 59]
