"""Transcript storage faults through real worker processes, and concurrent pruning.

A compaction whose transcript cannot be written is not published (the agent keeps its whole
history); a ``compaction.failed`` event with ``error.code == "storage_unavailable"`` says why,
and the next snapshot succeeds once storage is back. The tests run as root, so ``chmod`` cannot
make a directory read-only: the faults are a read-only tmpfs, a 64 KiB tmpfs (full), a directory
replaced by a regular file, and a directory removed (recreated when it can be; a failure when
its parent is gone and replaced by a file). The tmpfs cases skip where mounting is not allowed.

Pruning: two or more ``compactor prune`` processes at once, and prunes (the scheduled task on
two workers, plus a tight loop in this process) racing a stream of transcript writes, never
remove a transcript that retention keeps; the race runs once per store kind
(tests/support/store_support.py), the other store kinds' faults are in test_faults_stores.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fault_support import (
    ALL_QUEUES,
    Cluster,
    MakeCluster,
    check_consistency,
    mount_tmpfs,
    tagged,
    unmount,
    wait_until,
    write_config,
)
from support.service_support import REPO_ROOT

from worker.config import Settings
from worker.errors import StorageError, TranscriptConflict
from worker.transcripts import filesystem, key_of_uri, open_store
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompactionEvent

pytestmark = pytest.mark.slow

STORAGE_ERROR = "storage_unavailable"
REVISIONS = 6  # per conversation in the prune race


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, system_scenario: None) -> Iterator[Cluster]:
    cluster = Cluster(
        tmp_path_factory.mktemp("storage-faults"), {"compaction": {"mode": "local_only"}}
    )
    try:
        cluster.transcripts.mkdir(mode=0o700)
        cluster.workers.start("w", queues=ALL_QUEUES, concurrency=2)
        yield cluster
    finally:
        cluster.close()


def run(cluster: Cluster, snap: dict[str, Any]) -> CompactionEvent:
    cluster.client.submit(snap)
    return cluster.wait_outcome(snap["conversation_id"], snap["revision"], timeout_s=60)


def assert_storage_failure(cluster: Cluster, event: CompactionEvent, why: str) -> None:
    """Failed, for the stated reason, and nothing published or left behind for it."""
    assert event.type == "compaction.failed", event
    assert event.error is not None and event.error.code == STORAGE_ERROR, event.error
    assert "cannot write transcript" in event.error.message and why in event.error.message, (
        event.error.message
    )
    events = cluster.events(event.conversation_id)
    assert not [
        e for e in events if e.type == "compaction.completed" and e.revision == event.revision
    ], "published without its transcript"
    assert not [p for p in cluster.transcripts.rglob(".tmp-*")], "temporary file left behind"


def test_a_conversation_directory_replaced_by_a_file(shared: Cluster) -> None:
    conv = "c-notdir"
    snaps = {rev: tagged(conv, rev) for rev in (1, 2, 3)}
    assert run(shared, snaps[1]).type == "compaction.completed"
    directory = shared.transcripts / conv
    aside = directory.with_name(conv + ".aside")
    directory.rename(aside)
    directory.write_text("not a directory")
    try:
        assert_storage_failure(shared, run(shared, snaps[2]), "Not a directory")
    finally:
        directory.unlink()
        aside.rename(directory)
    assert run(shared, snaps[3]).type == "compaction.completed"
    check_consistency(shared, {conv: snaps})


def test_a_read_only_transcript_directory(shared: Cluster) -> None:
    conv = "c-readonly"
    target = shared.transcripts / conv
    snaps = {rev: tagged(conv, rev) for rev in (1, 2)}
    mount_tmpfs(target, size="1m", read_only=True)
    try:
        assert_storage_failure(shared, run(shared, snaps[1]), "Read-only file system")
    finally:
        unmount(target)
    assert run(shared, snaps[2]).type == "compaction.completed"
    check_consistency(shared, {conv: {2: snaps[2]}})


def test_a_full_transcript_directory(shared: Cluster) -> None:
    conv = "c-full"
    target = shared.transcripts / conv
    fits = tagged(conv, 1, turns=10, body=150)
    too_big = tagged(conv, 2, turns=10, body=800)
    after = tagged(conv, 3, turns=10, body=800)
    mount_tmpfs(target, size="64k")
    try:
        first = run(shared, fits)
        assert first.type == "compaction.completed"
        assert len(json.dumps(too_big)) > 64 * 1024
        assert_storage_failure(shared, run(shared, too_big), "No space left on device")
        assert [p.name for p in target.iterdir()] == [Path(first.compaction.transcript.uri).name]  # type: ignore[union-attr]
        subprocess.run(["mount", "-o", "remount,size=1m", str(target)], check=True)
        assert run(shared, after).type == "compaction.completed"
        check_consistency(shared, {conv: {1: fits, 3: after}})
    finally:
        unmount(target)


def test_a_removed_transcript_directory(make_cluster: MakeCluster, tmp_path: Path) -> None:
    """Removed: recreated (0700) and the compaction completes. Removed with its parent replaced
    by a file (it cannot be created): failed, then fine again once the path is restored."""
    root = tmp_path / "volume" / "transcripts"  # one level deeper, so its parent can go too
    cluster = make_cluster({"compaction": {"mode": "local_only", "transcript_dir": root}})
    cluster.workers.start("w", queues=ALL_QUEUES, concurrency=2)
    conv = "c-removed"
    snaps = {rev: tagged(conv, rev) for rev in (1, 2, 3, 4)}
    assert run(cluster, snaps[1]).type == "compaction.completed"

    subprocess.run(["rm", "-rf", str(root)], check=True)
    assert run(cluster, snaps[2]).type == "compaction.completed"
    assert (root.stat().st_mode & 0o777) == 0o700

    subprocess.run(["rm", "-rf", str(root.parent)], check=True)
    root.parent.write_text("the volume is gone")
    try:
        assert_storage_failure(cluster, run(cluster, snaps[3]), "Not a directory")
    finally:
        root.parent.unlink()
    assert run(cluster, snaps[4]).type == "compaction.completed"
    check_consistency(cluster, {conv: {4: snaps[4]}})


# --- interrupted writes ---------------------------------------------------------------------

BIG = 8 << 20  # a transcript whose write takes a while: room to be interrupted in


class Interrupted(Exception):
    """Raised from a signal handler mid-write, as Celery's soft time limit raises its own."""


@pytest.fixture(params=["unnamed", "named"])
def temporary_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the file store writes: a file without a name (O_TMPFILE, the default on
    Linux) and, where the file system has none, a named ``.tmp-`` file."""
    if request.param == "unnamed" and not filesystem.UNNAMED_FILES:
        pytest.skip("no O_TMPFILE or /proc here: the store writes named temporary files")
    monkeypatch.setattr(filesystem, "UNNAMED_FILES", request.param == "unnamed")
    return str(request.param)


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(f"{filesystem.TEMPORARY_PREFIX}*"))


def numbered(i: int, size: int = BIG) -> bytes:
    return (b"%08d" % i) * (size // 8)


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path, temporary_kind: str) -> None:
    """A write refused midway (the file grows past what the process may write: EFBIG, as a
    full disk fails it) and a write that conflicts leave no temporary file, and the
    transcript already there untouched."""
    store = FileStore(tmp_path / "transcripts")
    ref = store.write("c-1", 1, "ab" * 8, numbered(1, 4096))
    with pytest.raises(TranscriptConflict):
        store.write("c-1", 1, "ab" * 8, numbered(2, 4096))
    assert leftovers(store.root) == []
    assert Path(ref.uri).read_bytes() == numbered(1, 4096)

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
    try:
        with pytest.raises(StorageError, match="File too large"):
            store.write("c-1", 2, "cd" * 8, numbered(3, 1 << 20))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert leftovers(store.root) == []
    assert [t.revision for t in store.stored("c-1")] == [1]


def test_a_write_interrupted_anywhere_is_whole_or_absent_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """An exception raised from a signal handler at points spread over the whole write (as
    Celery's soft time limit, or Ctrl-C, raise one): each transcript is whole or absent, and
    no temporary file survives. Only with files without a name: a named temporary file can
    outlive an exception raised inside the very cleanup that removes it (the prune sweeps it:
    test_prune_sweeps_temporary_files_left_by_killed_writers)."""
    if not filesystem.UNNAMED_FILES:
        pytest.skip("no O_TMPFILE or /proc here: the store writes named temporary files")
    store = FileStore(tmp_path / "transcripts")
    started = time.monotonic()
    store.write("c-1", 0, "00" * 8, numbered(0))
    one_write_s = time.monotonic() - started
    previous = signal.signal(signal.SIGALRM, _interrupt)
    interrupted = 0
    try:
        for i in range(1, 41):
            delay = one_write_s * i / 30  # from the start to past the end of a write
            try:
                signal.setitimer(signal.ITIMER_REAL, delay)
                try:
                    store.write("c-1", i, f"{i:016x}", numbered(i))
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except Interrupted:
                interrupted += 1
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert interrupted > 0, "no write was interrupted: the test proved nothing"
    assert leftovers(store.root) == []
    for t in store.stored("c-1"):
        assert Path(t.uri).read_bytes() == numbered(t.revision), f"{t.uri} is not whole"


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted


WRITER = """
import sys
from worker.transcripts.filesystem import FileStore
import worker.transcripts.filesystem as filesystem
filesystem.UNNAMED_FILES = sys.argv[2] == "unnamed"
store = FileStore(sys.argv[1])
for i in range(10_000):
    payload = (b"%08d" % i) * (int(sys.argv[3]) // 8)
    print("writing", i, flush=True)
    store.write("c-1", i, f"{i:016x}", payload)
"""


def test_a_killed_writer_leaves_only_whole_transcripts(
    tmp_path: Path, temporary_kind: str, system_scenario: None
) -> None:
    """A process writing transcripts in a loop, SIGKILLed mid-write (while it holds the new
    file open): every transcript there is whole; without a name nothing else is left, a named
    temporary file is, and the prune sweeps it once it is an hour old."""
    root = tmp_path / "transcripts"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), temporary_kind, str(BIG)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        for i in range(4):  # three writes done (the ones checked below), the fourth begun
            assert writer.stdout.readline() == f"writing {i}\n", "the writer ended early"
        wait_until(
            lambda: has_file_open_in(writer.pid, root / "c-1"),
            timeout_s=60,
            every_s=0.0005,
            what="the writer to hold a transcript file open (mid-write)",
        )
        writer.kill()
    finally:
        writer.kill()
        writer.communicate(timeout=60)
    store = FileStore(root)
    written = store.stored("c-1")
    assert len(written) >= 3
    for t in written:
        assert Path(t.uri).read_bytes() == numbered(t.revision), f"{t.uri} is not whole"
    left = leftovers(root)
    assert len(left) == (0 if temporary_kind == "unnamed" else 1), left
    for name in left:  # an hour later
        os.utime(root / "c-1" / name, (time.time() - 7200, time.time() - 7200))
    removed = store.prune(keep_per_conversation=None, max_age_s=None, max_total_bytes=None)
    assert [Path(p).name for p in removed] == left
    assert leftovers(root) == []


def has_file_open_in(pid: int, directory: Path) -> bool:
    """Whether the process has a file in ``directory`` open (a file without a name shows as
    ``directory/#inode (deleted)``)."""
    inside = f"{directory}/"
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                return True
    return False


def test_prune_sweeps_temporary_files_left_by_killed_writers(tmp_path: Path) -> None:
    """A ``.tmp-`` file over an hour old is a killed writer's: the prune removes it (and says
    so); a younger one may be a write in flight and stays, as does every other file."""
    store = FileStore(tmp_path / "transcripts")
    ref = store.write("c-1", 1, "ab" * 8, b"{}")
    directory = Path(ref.uri).parent
    now = time.time()
    stale = directory / ".tmp-000000000000000002-cdcdcdcdcdcdcdcd.json-4242-0badf00d"
    fresh = directory / ".tmp-000000000000000003-efefefefefefefef.json-4243-feedface"
    other = directory / ".notes"
    for path in (stale, fresh, other):
        path.write_bytes(b"partial")
        os.utime(path, (now - 7200, now - 7200))
    os.utime(fresh, (now - 60, now - 60))
    removed = store.prune(keep_per_conversation=None, max_age_s=None, max_total_bytes=None)
    assert removed == [str(stale)]
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [fresh.name, other.name, Path(ref.uri).name]
    )


# --- pruning --------------------------------------------------------------------------------


def _filled_store(root: Path, *, conversations: int, revisions: int) -> FileStore:
    store = FileStore(root)
    base = time.time() - 3600
    n = 0
    for c in range(conversations):
        for rev in range(revisions):
            payload = json.dumps(
                {"c": c, "rev": rev, "pad": "x" * (500 + 97 * ((c * 7 + rev) % 11))}
            )
            ref = store.write(f"c-prune{c}", rev, f"{c:08x}{rev:08x}", payload.encode())
            n += 1
            os.utime(ref.uri, (base + n, base + n))  # distinct ages: one right answer
    return store


def test_concurrent_prunes_remove_exactly_what_retention_removes(
    tmp_path: Path, system_scenario: None
) -> None:
    """Four ``compactor prune`` processes at once (count and total-size limits) end with exactly
    the transcripts one prune would keep; none fails; together they removed the rest once."""
    root = tmp_path / "transcripts"
    store = _filled_store(root, conversations=30, revisions=6)
    keep = 3
    after_count = store.prune(
        keep_per_conversation=keep, max_age_s=None, max_total_bytes=None, dry_run=True
    )
    total = sum(t.bytes for t in store.stored() if t.uri not in set(after_count))
    limit = int(total * 0.7)
    # What undoing each conversation's newest compaction needs stays (as the prune keeps it)
    undo = Settings().redis.stream_ttl_s
    doomed = set(
        store.prune(
            keep_per_conversation=keep,
            max_age_s=None,
            max_total_bytes=limit,
            dry_run=True,
            undo_window_s=undo,
        )
    )
    everything = {t.uri for t in store.stored()}
    assert after_count and len(doomed) > len(after_count)  # both limits bite
    config = write_config(
        tmp_path / "prune.toml",
        {
            "compaction": {"transcript_dir": root, "max_persisted_transcripts": keep},
            "transcripts": {"max_total_bytes": limit},
        },
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "worker", "prune", "--config", str(config)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outputs]
    removed = [x for out, _ in outputs for x in json.loads(out)["removed"]]
    assert {t.uri for t in store.stored()} == everything - doomed, "over- or under-pruned"
    assert set(removed) == doomed and len(removed) == len(doomed), "a file removed twice"


def test_prunes_racing_writes_never_remove_a_kept_transcript(
    make_cluster: MakeCluster, store_url: str
) -> None:
    """Workers write a stream of transcripts (retention: the newest 3 per conversation) while
    the scheduled prune runs on two workers and this process prunes in a tight loop: at the end
    each conversation has exactly its newest 3 compactions' transcripts, whole. Once per store
    kind (tests/support/store_support.py)."""
    keep = 3
    cluster = make_cluster(
        {
            "compaction": {"mode": "local_only", "max_persisted_transcripts": keep},
            "transcripts": {"url": store_url},
        }
    )
    cluster.workers.start("w1", queues=ALL_QUEUES, concurrency=2)
    cluster.workers.start("w2", queues=ALL_QUEUES, concurrency=2)
    store = open_store(store_url)
    stop = threading.Event()
    prunes = [0]
    failures: list[BaseException] = []

    def prune_loop() -> None:
        while not stop.is_set():
            try:
                store.prune(keep_per_conversation=keep, max_age_s=None, max_total_bytes=None)
                prunes[0] += 1
            except BaseException as exc:  # reported below
                failures.append(exc)
                return

    pruner = threading.Thread(target=prune_loop)
    pruner.start()
    convs = [f"c-race{i}" for i in range(4)]
    submitted: dict[str, dict[int, dict[str, Any]]] = {c: {} for c in convs}
    try:
        for rev in range(REVISIONS):
            pruned = prunes[0]
            for conv in convs:
                submitted[conv][rev] = snap = tagged(conv, rev, turns=10, body=150)
                cluster.client.submit(snap)
                cluster.send_task("compactor.prune")
            for conv in convs:  # every revision compacts, so every one writes a transcript
                cluster.wait_outcome(conv, rev, timeout_s=60)
            # this process pruned again since the revision was submitted (counted, not timed)
            wait_until(
                lambda pruned=pruned: prunes[0] > pruned or failures,
                timeout_s=60,
                what=f"a prune in this process during revision {rev}",
            )
    finally:
        stop.set()
        pruner.join(timeout=60)
        store.close()
    assert not failures, failures
    assert prunes[0] >= REVISIONS
    completed = {
        c: [e for e in cluster.events(c) if e.type == "compaction.completed"] for c in convs
    }
    for conv in convs:
        assert [e.revision for e in completed[conv]] == list(range(REVISIONS))
        kept = completed[conv][-keep:]
        with contextlib.closing(open_store(store_url)) as check:
            present = [t.key for t in check.stored(conv)]
            assert present == sorted(key_of_uri(e.compaction.transcript.uri) for e in kept), conv  # type: ignore[union-attr]
            for event in kept:
                ref = event.compaction.transcript  # type: ignore[union-attr]
                assert hashlib.sha256(check.read(ref.uri)).hexdigest() == ref.sha256
    check_consistency(
        cluster,
        {c: {e.revision: submitted[c][e.revision] for e in completed[c][-keep:]} for c in convs},
    )
