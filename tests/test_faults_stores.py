"""Transcript store faults through real worker processes, for every store kind
(tests/store_support.py): a worker SIGKILLed mid-summary loses nothing and leaves no partial
transcript; an S3 store that goes away gives ``compaction.failed`` (``storage_unavailable``)
with nothing published, and the next snapshot compacts once it is back; an S3 store that
refuses the credentials is a storage failure naming the bucket, never the secret.

The file store's own faults (read-only, full, a directory removed or replaced) are in
tests/test_faults_storage.py.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from fault_support import (  # noqa: F401 - fixtures
    ALL_QUEUES,
    EVALUATE_QUEUES,
    SUMMARIZE_QUEUE,
    Cluster,
    check_consistency,
    llm_section,
    make_cluster_fixture,
    reconcile_until,
    tagged,
    wait_until,
)
from store_support import (  # noqa: F401 - fixtures
    S3_ENVIRONMENT,
    S3Server,
    postgres_database,
    s3_environment,
    s3_server,
    store_url,
)

from worker.errors import StorageError
from worker.events import CompactionEvent
from worker.testing.standin_llm import StandinLLM
from worker.transcripts import open_store

pytestmark = pytest.mark.slow

STORAGE_ERROR = "storage_unavailable"


def run(cluster: Cluster, snap: dict) -> CompactionEvent:  # type: ignore[type-arg]
    cluster.client.submit(snap)
    return cluster.wait_outcome(snap["conversation_id"], snap["revision"], timeout_s=60)


def test_sigkill_mid_summary_loses_nothing(make_cluster, store_url: str) -> None:  # type: ignore[no-untyped-def]
    """The summarizing worker is killed while its LLM calls are in flight: after the
    reconciler re-queues the work, every conversation has exactly one compaction per revision,
    each transcript whole in the store, and no failure."""
    with StandinLLM(latency_s=0.3) as llm:
        cluster = make_cluster(
            {
                "compaction": {"mode": "remote_only"},
                "llm": llm_section(llm.openai_base_url, timeout_s=3.0, deadline_s=3.5),
                "redis": {"visibility_timeout_s": 5, "lock_lease_s": 1.5},
                "worker": {"summarize_time_limit_s": 4.0, "reconcile_after_s": 2.0},
                "transcripts": {"url": store_url},
            }
        )
        workers = cluster.workers
        workers.start("eval", queues=EVALUATE_QUEUES, concurrency=2)
        workers.start("sum", queues=SUMMARIZE_QUEUE, concurrency=2)
        convs = ["c-kill0", "c-kill1"]
        submitted = {c: {0: tagged(c, 0)} for c in convs}
        llm.hold()  # calls wait for their answer: the kill lands mid-summary
        for conv in convs:
            cluster.client.submit(submitted[conv][0])
        wait_until(lambda: llm.stats()["in_flight"] > 0, timeout_s=60, what="a summary in flight")
        workers.stop("sum", sig=signal.SIGKILL)
        llm.release()
        workers.start("sum", queues=SUMMARIZE_QUEUE, concurrency=2)
        reconcile_until(
            cluster,
            lambda: all(cluster.outcome(c, 0) for c in convs),
            timeout_s=90,
            what="every conversation's outcome after the kill",
        )
        for conv in convs:
            submitted[conv][1] = snap = tagged(conv, 1)
            assert run(cluster, snap).type == "compaction.completed"
        completed = check_consistency(cluster, submitted)
        assert all([e.revision for e in done] == [0, 1] for done in completed.values())
        failed = [e for c in convs for e in cluster.events(c) if e.type == "compaction.failed"]
        assert not failed, failed


def test_an_s3_store_that_goes_away_and_comes_back(
    make_cluster,
    tmp_path: Path,
    s3_environment: None,  # type: ignore[no-untyped-def]
) -> None:
    """Its own S3 server, stopped (connections refused) and started again (empty: moto keeps
    objects in memory, so the bucket is created again, as an operator restoring it would)."""
    server = S3Server(tmp_path)
    server.start()
    try:
        bucket = server.new_bucket("compactor-faults")
        cluster = make_cluster(
            {"compaction": {"mode": "local_only"}, "transcripts": {"url": server.url(bucket)}}
        )
        cluster.workers.start("w", queues=ALL_QUEUES, concurrency=2)
        conv = "c-s3-away"
        snaps = {rev: tagged(conv, rev) for rev in (1, 2, 3)}
        assert run(cluster, snaps[1]).type == "compaction.completed"
        server.stop()
        failed = run(cluster, snaps[2])
        assert failed.type == "compaction.failed", failed
        assert failed.error is not None and failed.error.code == STORAGE_ERROR, failed.error
        assert "s3://compactor-faults" in failed.error.message, failed.error.message
        assert not [
            e for e in cluster.events(conv) if e.type == "compaction.completed" and e.revision == 2
        ], "published without its transcript"
        server.start()
        server.new_bucket(bucket)
        assert run(cluster, snaps[3]).type == "compaction.completed"
        check_consistency(cluster, {conv: {3: snaps[3]}})
    finally:
        server.stop()


def test_an_s3_store_that_refuses_the_credentials(tmp_path: Path, s3_environment: None) -> None:
    """Every request refused (403): a StorageError that names the bucket and the reason, and
    never the secret key."""
    server = S3Server(tmp_path, authenticate=True)
    server.start()
    try:
        store = open_store(server.url("compactor-denied"))
        try:
            for attempt in (
                lambda: store.write("c-1", 1, "ab" * 16, b"{}"),
                lambda: store.stored(),
                lambda: store.prune(keep_per_conversation=1, max_age_s=None, max_total_bytes=None),
            ):
                with pytest.raises(StorageError) as failure:
                    attempt()
                message = str(failure.value)
                assert "s3://compactor-denied" in message and "InvalidAccessKeyId" in message
                assert S3_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"] not in message
        finally:
            store.close()
    finally:
        server.stop()
