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
(tests/store_support.py), the other store kinds' faults are in tests/test_faults_stores.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_support import (  # noqa: F401 - fixtures
    ALL_QUEUES,
    Cluster,
    check_consistency,
    make_cluster_fixture,
    mount_tmpfs,
    sha256_of,
    tagged,
    unmount,
    wait_until,
    write_config,
)
from service_support import REPO_ROOT
from store_support import (  # noqa: F401 - fixtures
    postgres_database,
    s3_environment,
    s3_server,
    store_url,
)

from worker.events import CompactionEvent
from worker.stores.filesystem import FileStore
from worker.transcripts import key_of_uri, open_store

pytestmark = pytest.mark.slow

STORAGE_ERROR = "storage_unavailable"
REVISIONS = 6  # per conversation in the prune race


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(
        tmp_path_factory.mktemp("storage-faults"), {"compaction": {"mode": "local_only"}}
    )
    try:
        cluster.transcripts.mkdir(mode=0o700)
        cluster.workers.start("w", queues=ALL_QUEUES, concurrency=2)
        yield cluster
    finally:
        cluster.close()


def run(cluster: Cluster, snap: dict) -> CompactionEvent:  # type: ignore[type-arg]
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


def test_a_removed_transcript_directory(make_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
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


def test_concurrent_prunes_remove_exactly_what_retention_removes(tmp_path: Path) -> None:
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
    doomed = set(
        store.prune(keep_per_conversation=keep, max_age_s=None, max_total_bytes=limit, dry_run=True)
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


def test_prunes_racing_writes_never_remove_a_kept_transcript(make_cluster, store_url: str) -> None:  # type: ignore[no-untyped-def]
    """Workers write a stream of transcripts (retention: the newest 3 per conversation) while
    the scheduled prune runs on two workers and this process prunes in a tight loop: at the end
    each conversation has exactly its newest 3 compactions' transcripts, whole. Once per store
    kind (tests/store_support.py)."""
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
    submitted: dict[str, dict[int, dict]] = {c: {} for c in convs}  # type: ignore[type-arg]
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
