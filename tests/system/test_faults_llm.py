"""LLM provider faults through real worker processes: 429 with Retry-After, 5xx bursts, hangs,
malformed bodies, overlong answers and a dead endpoint.

What must hold: retries are bounded (counted at the stand-in), the summary deadline is kept
(measured from submission to the outcome event), ``prefer_remote`` falls back to the digest and
says why in ``summary.fallback_reason``, ``remote_only`` publishes ``compaction.failed`` with the
provider error's code, and evaluation of other conversations never waits behind the provider.

Most tests share one cluster (Redis, an evaluate worker, a summarize worker, the stand-in) and
set the stand-in's faults per test; the worker runs ``prefer_remote`` and a snapshot asks for
``remote_only`` through its own ``config``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fault_support import (
    EVALUATE_QUEUES,
    SUMMARIZE_QUEUE,
    Cluster,
    MakeCluster,
    check_consistency,
    llm_section,
    requests_for,
    small,
    tagged,
    wait_until,
)

from worker.summarize.prompt import CUT_NOTE
from worker.testing.standin_llm import Fault, StandinLLM
from worker.wire.events import CompactionEvent, CompletedEvent, FailedEvent

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0  # per attempt
DEADLINE_S = 8.0  # per summary: long beside an evaluation, even on a loaded machine
MAX_RETRIES = 4
# A hung summary makes at most this many attempts before its deadline, fewer than the
# 1 + MAX_RETRIES it would make if only the retries bounded it: counted, not timed.
HUNG_ATTEMPTS = math.ceil(DEADLINE_S / TIMEOUT_S)
SLACK_S = 4.0  # queueing, evaluation and scheduling noise on a loaded machine
MAX_OUTPUT_TOKENS = 300
SUMMARIZE_CONCURRENCY = 4


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, system_scenario: None
) -> Iterator[tuple[Cluster, StandinLLM]]:
    with StandinLLM(latency_s=0.02) as llm:
        cluster = Cluster(
            tmp_path_factory.mktemp("llm-faults"),
            {
                "compaction": {
                    "mode": "prefer_remote",
                    "summary_max_output_tokens": MAX_OUTPUT_TOKENS,
                },
                "llm": llm_section(
                    llm.openai_base_url,
                    timeout_s=TIMEOUT_S,
                    deadline_s=DEADLINE_S,
                    max_retries=MAX_RETRIES,
                ),
                # A summary may last the whole deadline: the time limit, the visibility timeout
                # and the lease (renewed) leave it room on a loaded machine.
                "redis": {"visibility_timeout_s": 60, "lock_lease_s": 6.0},
                "worker": {"summarize_time_limit_s": 40.0},
            },
        )
        try:
            cluster.workers.start("eval", queues=EVALUATE_QUEUES, concurrency=2)
            cluster.workers.start("sum", queues=SUMMARIZE_QUEUE, concurrency=SUMMARIZE_CONCURRENCY)
            yield cluster, llm
        finally:
            cluster.close()


@pytest.fixture
def env(shared: tuple[Cluster, StandinLLM]) -> tuple[Cluster, StandinLLM]:
    cluster, llm = shared
    llm.reset()
    return cluster, llm


def submit_and_wait(
    cluster: Cluster,
    snap: dict[str, Any],
    *,
    timeout_s: float = 15.0,
) -> tuple[CompactionEvent, float]:
    """The outcome event and the seconds from submission to its appearance."""
    started = time.monotonic()
    cluster.client.submit(snap)
    event = cluster.wait_outcome(snap["conversation_id"], snap["revision"], timeout_s=timeout_s)
    return event, time.monotonic() - started


def assert_fell_back(event: CompactionEvent, code: str) -> None:
    assert isinstance(event, CompletedEvent), event
    summary = event.compaction.summary
    assert summary.source == "digest"
    assert summary.fallback_reason is not None and summary.fallback_reason.startswith(code), (
        summary.fallback_reason
    )


def assert_failed(event: CompactionEvent, code: str) -> None:
    assert isinstance(event, FailedEvent), event
    assert event.error.code == code, event.error
    assert "compaction" not in json.loads(event.to_json())


def test_429_with_retry_after_is_waited_for(env: tuple[Cluster, StandinLLM]) -> None:
    cluster, llm = env
    llm.enqueue(Fault(status=429, retry_after="1"))
    event, _ = submit_and_wait(cluster, tagged("c-429", 1, mode="remote_only"))
    assert event.type == "compaction.completed"
    assert event.compaction is not None and event.compaction.summary.source == "llm"
    assert event.compaction.summary.fallback_reason is None
    calls = requests_for(llm.requests, "c-429")
    assert len(calls) == 2
    gap = calls[1].received_at - calls[0].received_at
    assert 0.95 <= gap < DEADLINE_S, f"Retry-After: 1 not honoured (retried after {gap:.2f}s)"


def test_retry_after_past_the_deadline_is_not_waited_for(env: tuple[Cluster, StandinLLM]) -> None:
    cluster, llm = env
    llm.enqueue(Fault(status=429, retry_after="30"))
    event, elapsed = submit_and_wait(cluster, tagged("c-429-long", 1))
    assert_fell_back(event, "llm_rate_limited")
    assert len(requests_for(llm.requests, "c-429-long")) == 1
    assert elapsed < DEADLINE_S + SLACK_S, f"waited {elapsed:.2f}s for a hopeless retry"


def test_5xx_burst_within_the_retries_succeeds(env: tuple[Cluster, StandinLLM]) -> None:
    cluster, llm = env
    llm.enqueue(Fault(status=503), Fault(status=502))
    event, _ = submit_and_wait(cluster, tagged("c-5xx-burst", 1, mode="remote_only"))
    assert event.type == "compaction.completed"
    assert event.compaction is not None and event.compaction.summary.source == "llm"
    assert len(requests_for(llm.requests, "c-5xx-burst")) == 3


def test_5xx_beyond_the_retries_falls_back_or_fails_per_mode(
    env: tuple[Cluster, StandinLLM],
) -> None:
    cluster, llm = env
    llm.default_fault = Fault(status=500)
    prefer = tagged("c-5xx-prefer", 1)
    remote = tagged("c-5xx-remote", 1, mode="remote_only")
    started = time.monotonic()
    cluster.client.submit(prefer)
    cluster.client.submit(remote)
    assert_fell_back(cluster.wait_outcome("c-5xx-prefer", 1), "llm_server_error")
    assert_failed(cluster.wait_outcome("c-5xx-remote", 1), "llm_server_error")
    assert time.monotonic() - started < DEADLINE_S + SLACK_S
    for conv in ("c-5xx-prefer", "c-5xx-remote"):
        assert len(requests_for(llm.requests, conv)) == 1 + MAX_RETRIES, "retries not bounded"
    assert not (cluster.transcripts / "c-5xx-remote").exists(), "nothing written for a failure"
    check_consistency(cluster, {"c-5xx-prefer": {1: prefer}})


def test_a_hanging_provider_is_abandoned_at_the_deadline(env: tuple[Cluster, StandinLLM]) -> None:
    cluster, llm = env
    llm.default_fault = Fault(hang=True)
    started = time.monotonic()
    cluster.client.submit(tagged("c-hang-prefer", 1))
    cluster.client.submit(tagged("c-hang-remote", 1, mode="remote_only"))
    prefer = cluster.wait_outcome("c-hang-prefer", 1, timeout_s=DEADLINE_S + 10)
    remote = cluster.wait_outcome("c-hang-remote", 1, timeout_s=DEADLINE_S + 10)
    elapsed = time.monotonic() - started
    assert_fell_back(prefer, "llm_timeout")
    assert_failed(remote, "llm_timeout")
    assert TIMEOUT_S <= elapsed < DEADLINE_S + SLACK_S, f"deadline not kept: {elapsed:.2f}s"
    for conv in ("c-hang-prefer", "c-hang-remote"):
        # the deadline, not the retries, ended it (HUNG_ATTEMPTS < 1 + MAX_RETRIES)
        assert 1 <= len(requests_for(llm.requests, conv)) <= HUNG_ATTEMPTS < 1 + MAX_RETRIES


@pytest.mark.parametrize(
    ("fault", "name"),
    [
        (Fault(body=b"<html><body>502 Bad Gateway</body></html>"), "html"),
        (Fault(body=b'{"choices": []}'), "no-choices"),
        (Fault(body=b'{"choices": [{"message": {"content": 7}}]}'), "wrong-type"),
        (Fault(empty=True), "empty"),
    ],
)
def test_a_malformed_answer_falls_back_or_fails_per_mode(
    env: tuple[Cluster, StandinLLM], fault: Fault, name: str
) -> None:
    cluster, llm = env
    llm.default_fault = fault
    prefer, remote = f"c-bad-{name}-p", f"c-bad-{name}-r"
    cluster.client.submit(tagged(prefer, 1))
    cluster.client.submit(tagged(remote, 1, mode="remote_only"))
    assert_fell_back(cluster.wait_outcome(prefer, 1), "llm_malformed")
    assert_failed(cluster.wait_outcome(remote, 1), "llm_malformed")
    for conv in (prefer, remote):
        assert 1 <= len(requests_for(llm.requests, conv)) <= 1 + MAX_RETRIES


def test_an_overlong_answer_is_cut_to_the_bound(env: tuple[Cluster, StandinLLM]) -> None:
    cluster, llm = env
    llm.default_fault = Fault(overlong=True)
    snap = tagged("c-overlong", 1, mode="remote_only")
    event, _ = submit_and_wait(cluster, snap)
    assert event.type == "compaction.completed"
    assert event.compaction is not None and event.trigger is not None
    summary = event.compaction.summary
    assert summary.source == "llm" and summary.truncated
    assert CUT_NOTE in summary.text and "filler" not in summary.text  # the fragment is gone
    assert summary.tokens <= MAX_OUTPUT_TOKENS
    assert event.compaction.tokens_after < event.trigger.threshold_tokens  # type: ignore[operator]
    assert len(requests_for(llm.requests, "c-overlong")) == 1
    check_consistency(cluster, {"c-overlong": {1: snap}})


def test_a_hanging_provider_never_backs_up_evaluation(env: tuple[Cluster, StandinLLM]) -> None:
    """More hung summaries than the summarize worker has slots: the summarize queue waits, but
    every conversation under the threshold is still evaluated and skipped at once, and the hung
    ones all end (fallback) within two deadlines, the queue draining at the deadline's pace."""
    cluster, llm = env
    llm.default_fault = Fault(hang=True)
    hung = [f"c-jam{i}" for i in range(SUMMARIZE_CONCURRENCY + 2)]
    started = time.monotonic()
    for conv in hung:
        cluster.client.submit(tagged(conv, 1))
    wait_until(
        lambda: llm.stats()["in_flight"] >= SUMMARIZE_CONCURRENCY,
        timeout_s=30,
        what="every summarize slot to hang",
    )
    for i in range(6):
        conv = f"c-quick{i}"
        event, elapsed = submit_and_wait(cluster, small(conv), timeout_s=30)
        assert event.type == "compaction.skipped"
        # the proof is the order below; this only catches waiting out a whole deadline
        assert elapsed < DEADLINE_S, f"{conv} waited {elapsed:.2f}s behind the hung provider"
    for conv in hung:
        assert_fell_back(cluster.wait_outcome(conv, 1, timeout_s=3 * DEADLINE_S + 5), "llm_timeout")
        assert 1 <= len(requests_for(llm.requests, conv)) <= HUNG_ATTEMPTS, "deadline not kept"
    first_hung_done = min(e.created_at for c in hung for e in cluster.events(c))
    quick_created = max(e.created_at for i in range(6) for e in cluster.events(f"c-quick{i}"))
    assert quick_created < first_hung_done, "an evaluation waited for a hung summary to end"
    # two rounds of deadlines (6 hung, 4 slots); each summary's deadline is counted above
    assert time.monotonic() - started < 2 * DEADLINE_S + 2 * SLACK_S


DEAD_DEADLINE_S = 60.0  # a summary that waited for its deadline would take a minute


@pytest.fixture
def dead_llm(system_scenario: None) -> Iterator[StandinLLM]:
    """A dead provider behind a live port: every connection is closed unanswered (an
    ``llm_connection_error``), and each attempt is counted."""
    with StandinLLM() as llm:
        llm.default_fault = Fault(drop=True)
        yield llm


def test_a_dead_endpoint_trips_the_breaker_and_nothing_waits(
    make_cluster: MakeCluster, dead_llm: StandinLLM
) -> None:
    """A dead provider (every connection closed unanswered, so the stand-in counts each
    attempt): ``prefer_remote`` falls back, ``remote_only`` fails with the error code; after
    ``circuit_failure_threshold`` failures the breaker answers at once (``circuit_open``)
    without opening a connection; other conversations are evaluated meanwhile; nothing is left
    queued. Proved by counting attempts, not by timing them."""
    threshold, llm = 2, dead_llm
    cluster = make_cluster(
        {
            "compaction": {"mode": "prefer_remote"},
            "llm": llm_section(
                llm.openai_base_url,
                max_retries=MAX_RETRIES,
                timeout_s=DEAD_DEADLINE_S / 2,
                deadline_s=DEAD_DEADLINE_S,
                circuit_failure_threshold=threshold,
                circuit_reset_s=3600.0,  # no probe during the test
            ),
            "redis": {"visibility_timeout_s": 300},
            "worker": {"summarize_time_limit_s": 2 * DEAD_DEADLINE_S},
        }
    )
    cluster.workers.start("eval", queues=EVALUATE_QUEUES, concurrency=2)
    cluster.workers.start("sum", queues=SUMMARIZE_QUEUE, concurrency=SUMMARIZE_CONCURRENCY)
    prefer = [f"c-dead-p{i}" for i in range(6)]
    remote = [f"c-dead-r{i}" for i in range(2)]
    started = time.monotonic()
    for conv in prefer:
        cluster.client.submit(tagged(conv, 1))
    for conv in remote:
        cluster.client.submit(tagged(conv, 1, mode="remote_only"))
    for i in range(4):
        event, elapsed = submit_and_wait(cluster, small(f"c-dead-quick{i}"), timeout_s=30)
        assert event.type == "compaction.skipped" and elapsed < DEAD_DEADLINE_S / 2
    reasons = []
    for conv in prefer:
        event = cluster.wait_outcome(conv, 1, timeout_s=30)
        assert event.type == "compaction.completed" and event.compaction is not None
        reasons.append(event.compaction.summary.fallback_reason or "")
        assert reasons[-1].split(":")[0] in ("llm_connection_error", "circuit_open"), reasons
    for conv in remote:
        event = cluster.wait_outcome(conv, 1, timeout_s=30)
        assert event.type == "compaction.failed" and event.error is not None
        assert event.error.code in ("llm_connection_error", "circuit_open"), event.error
    assert any(r.startswith("circuit_open") for r in reasons), reasons
    # The breaker opened at the threshold: besides the failures that opened it, only the
    # attempts already in flight then (one per other summarize slot) reached the provider,
    # where the retries alone would have allowed 1 + MAX_RETRIES for each summary.
    attempts = len(llm.requests)
    assert threshold <= attempts <= threshold + SUMMARIZE_CONCURRENCY - 1, attempts
    assert attempts < len(prefer + remote) * (1 + MAX_RETRIES)
    assert all(r.fault.drop for r in llm.requests)
    connections = llm.stats()["connections_accepted"]

    # Once open, a summary makes no attempt at all: it fails at once with circuit_open.
    later = ["c-dead-later-p0", "c-dead-later-p1"]
    for conv in later:
        cluster.client.submit(tagged(conv, 1))
    cluster.client.submit(tagged("c-dead-later-r0", 1, mode="remote_only"))
    for conv in later:
        event = cluster.wait_outcome(conv, 1, timeout_s=30)
        assert event.type == "compaction.completed" and event.compaction is not None
        assert (event.compaction.summary.fallback_reason or "").startswith("circuit_open")
    event = cluster.wait_outcome("c-dead-later-r0", 1, timeout_s=30)
    assert event.type == "compaction.failed" and event.error is not None
    assert event.error.code == "circuit_open", event.error
    assert len(llm.requests) == attempts, "a summary reached the provider past the breaker"
    assert llm.stats()["connections_accepted"] == connections, "a connection past the breaker"
    # nothing waited for a deadline (a minute each): a wide sanity margin, not the proof
    assert time.monotonic() - started < DEAD_DEADLINE_S / 2, "summaries waited"
    queues = [
        k for k in cluster.raw.scan_iter(match="compactor.*") if cluster.raw.type(k) == b"list"
    ]
    assert all(cluster.raw.llen(k) == 0 for k in queues), "work left queued"
    check_consistency(cluster, {conv: {1: tagged(conv, 1)} for conv in prefer + later})
    assert not Path(cluster.transcripts, remote[0]).exists()


DEGENERATE = "I'll be happy to help you with that! " * 4  # short: room left for any appendix


def test_a_degenerate_answer_is_gated_on_the_models_own_text(
    env: tuple[Cluster, StandinLLM],
) -> None:
    """A model that answers only pleasantries keeps none of the range's facts: under
    ``prefer_remote`` the gate, scoring the model's own text before any repair of ours, replaces
    it with the digest and says why; ``remote_only`` (no gate) publishes it repaired, with the
    score of the model's own text."""
    cluster, llm = env
    llm.default_fault = Fault(text=DEGENERATE)
    prefer, remote = "c-degenerate-p", "c-degenerate-r"
    cluster.client.submit(tagged(prefer, 1))
    cluster.client.submit(tagged(remote, 1, mode="remote_only"))
    assert_fell_back(cluster.wait_outcome(prefer, 1), "summary_fidelity")
    event = cluster.wait_outcome(prefer, 1)
    assert event.compaction is not None
    assert "happy to help" not in event.compaction.summary.text
    assert len(requests_for(llm.requests, prefer)) == 1  # answered, then refused by the gate
    published = cluster.wait_outcome(remote, 1)
    assert isinstance(published, CompletedEvent) and published.compaction is not None
    summary = published.compaction.summary
    assert summary.source == "llm" and summary.fidelity is not None
    assert summary.fidelity.score < 0.5 and summary.fidelity.repaired > 0


def test_a_fallback_model_answers_when_the_first_fails(make_cluster: MakeCluster) -> None:
    """``[llm] fallback_models`` through a real worker: the first model is not served (404),
    the fallback model writes the summary, and the event says which and why."""
    with StandinLLM() as llm:
        cluster = make_cluster(
            {
                "compaction": {"mode": "prefer_remote"},
                # Deadlines far beyond any load and no retry: a first call slow enough to
                # time out would be retried on the same model after consuming the 404, which
                # is a test of speed, not of the fallback.
                "llm": llm_section(
                    llm.openai_base_url,
                    fallback_models=["small-b"],
                    timeout_s=60.0,
                    connect_timeout_s=10.0,
                    deadline_s=120.0,
                    max_retries=0,
                ),
            }
        )
        cluster.workers.start("eval", queues=EVALUATE_QUEUES, concurrency=1)
        cluster.workers.start("sum", queues=SUMMARIZE_QUEUE, concurrency=1)
        llm.enqueue(Fault(status=404))
        event, _ = submit_and_wait(cluster, tagged("c-fallback", 1, mode="remote_only"))
        assert isinstance(event, CompletedEvent) and event.compaction is not None
        summary = event.compaction.summary
        assert summary.source == "llm" and summary.model == "small-b"
        assert (summary.fallback_reason or "").startswith(
            "llm_rejected: model stand-in failed: llm_rejected"
        )
        assert [r.body["model"] for r in requests_for(llm.requests, "c-fallback")] == [
            "stand-in",
            "small-b",
        ]
