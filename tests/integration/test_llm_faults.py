"""Each provider fault ends in the right outcome, within the deadline, over real sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from worker.config import LLMConfig, Settings
from worker.errors import CompactorError, LLMPermanentError, LLMTransientError
from worker.summarize import SummaryRequest
from worker.summarize.factory import llm_summarizer
from worker.summarize.llm import LLMSummarizer
from worker.summarize.resilience import CircuitBreaker, retry_after_s
from worker.testing.standin_llm import Fault, StandinLLM
from worker.wire.models import Message

KEY_ENV = "TEST_LLM_KEY"
KEY = "sk-faults-test-key"
SLACK_S = 5.0  # scheduling noise allowed past a deadline, on a loaded machine
DEADLINE_S = 15.0  # the default: far beyond any healthy exchange with the stand-in
RESET_S = 2.0  # a breaker's pause: far beyond the checks made while it is open


@pytest.fixture(scope="module")
def server(sockets: None) -> Iterator[StandinLLM]:
    with StandinLLM(expected_key=KEY) as llm:
        yield llm


@pytest.fixture
def llm(server: StandinLLM) -> StandinLLM:
    server.reset()
    return server


def config(base_url: str, provider: str = "openai", **overrides: object) -> LLMConfig:
    fields: dict[str, object] = {
        "provider": provider,
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "timeout_s": 5.0,
        "connect_timeout_s": 2.0,
        "deadline_s": DEADLINE_S,
        "max_retries": 3,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
        "circuit_failure_threshold": 100,
    }
    fields.update(overrides)
    return LLMConfig.model_validate(fields)


def make(llm: StandinLLM, provider: str = "openai", **overrides: object) -> LLMSummarizer:
    base = llm.anthropic_base_url if provider == "anthropic" else llm.openai_base_url
    return LLMSummarizer(config(base, provider, **overrides), environ={KEY_ENV: KEY})


REQUEST = SummaryRequest(
    conversation_id="c-1",
    revision=1,
    messages=[Message(id="u", role="user", content="please fix src/app.py", source_index=0)],
    max_input_chars=2000,
    max_output_tokens=200,
    source_tokens=100_000,
)


def fails(summarizer: LLMSummarizer, kind: type[CompactorError], code: str) -> float:
    """Seconds until ``summarize`` raised ``kind`` with ``code``."""
    start = time.monotonic()
    with pytest.raises(kind) as caught:
        summarizer.summarize(REQUEST)
    assert caught.value.code == code, caught.value.message
    return time.monotonic() - start


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_429_with_retry_after_then_success(llm: StandinLLM, provider: str) -> None:
    llm.enqueue(Fault(status=429, retry_after="0"), Fault(status=429, retry_after="0"))
    with make(llm, provider) as summarizer:
        summary = summarizer.summarize(REQUEST)
    assert summary.source == "llm"
    assert [r.fault.status for r in llm.requests] == [429, 429, 200]


def test_retry_after_seconds_is_waited_for(llm: StandinLLM) -> None:
    llm.enqueue(Fault(status=429, retry_after="1"))
    with make(llm, deadline_s=10.0) as summarizer:
        summarizer.summarize(REQUEST)
    first, second = llm.requests
    assert second.received_at - first.received_at >= 0.95


def test_retry_after_beyond_the_deadline_fails_at_once(llm: StandinLLM) -> None:
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    llm.enqueue(Fault(status=429, retry_after="30"), Fault(status=429, retry_after=later))
    with make(llm) as summarizer:  # waiting, even only to the deadline, would take 15 s
        assert fails(summarizer, LLMTransientError, "llm_rate_limited") < DEADLINE_S / 3
        assert fails(summarizer, LLMTransientError, "llm_rate_limited") < DEADLINE_S / 3
    assert len(llm.requests) == 2


def test_retry_after_parses_seconds_and_http_dates() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    assert retry_after_s("7", now=now) == 7.0
    assert retry_after_s("Thu, 01 Jan 2026 00:00:30 GMT", now=now) == 30.0
    assert retry_after_s("Wed, 31 Dec 2025 00:00:00 GMT", now=now) == 0.0  # past: no wait
    assert retry_after_s("soon", now=now) is None
    assert retry_after_s(None) is None


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_5xx_burst_then_success(llm: StandinLLM, provider: str) -> None:
    llm.enqueue(Fault(status=503), Fault(status=500), Fault(status=529))
    with make(llm, provider) as summarizer:
        summarizer.summarize(REQUEST)
    assert [r.fault.status for r in llm.requests] == [503, 500, 529, 200]


def test_5xx_forever_exhausts_the_retries_within_the_deadline(llm: StandinLLM) -> None:
    llm.default_fault = Fault(status=502)
    with make(llm) as summarizer:
        elapsed = fails(summarizer, LLMTransientError, "llm_server_error")
    assert len(llm.requests) == 4  # max_retries + 1
    assert elapsed < DEADLINE_S


def test_a_hanging_provider_times_out_within_the_deadline(llm: StandinLLM) -> None:
    llm.default_fault = Fault(hang=True)
    with make(llm, timeout_s=1.0, deadline_s=2.5, max_retries=20) as summarizer:
        elapsed = fails(summarizer, LLMTransientError, "llm_timeout")
    assert 1.0 <= elapsed < 2.5 + SLACK_S  # the retries alone would allow 21 s
    # a timed-out attempt is retried, but none starts after the deadline: each lasts 1 s
    assert 2 <= len(llm.requests) <= 3


def test_the_deadline_bounds_the_whole_summary_not_just_one_attempt(llm: StandinLLM) -> None:
    llm.default_fault = Fault(status=500, latency_s=0.5)
    with make(llm, timeout_s=5.0, deadline_s=2.0, max_retries=40) as summarizer:
        start = time.monotonic()
        with pytest.raises(LLMTransientError):
            summarizer.summarize(REQUEST)
    assert time.monotonic() - start < 2.0 + SLACK_S  # the retries alone would allow 20 s
    assert 1 <= len(llm.requests) <= 4  # each answer takes 0.5 s: none starts past 2 s


@pytest.mark.parametrize(
    ("provider", "body"),
    [
        ("openai", b"<html>502 Bad Gateway</html>"),
        ("openai", b'{"choices": []}'),
        ("openai", b'{"choices": [{"message": {"role": "assistant", "content": null}}]}'),
        ("openai", b""),
        ("anthropic", b'{"type": "message", "content": [{"type": "tool_use"}]}'),
        ("anthropic", b'{"type": "error", "error": {"type": "api_error"}}'),
        ("anthropic", b"[1, 2"),
    ],
)
def test_a_malformed_body_is_a_failure_not_retried(
    llm: StandinLLM, provider: str, body: bytes
) -> None:
    llm.enqueue(Fault(body=body))
    with make(llm, provider) as summarizer:
        fails(summarizer, LLMTransientError, "llm_malformed")
    assert len(llm.requests) == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_empty_answer_is_a_failure(llm: StandinLLM, provider: str) -> None:
    llm.enqueue(Fault(empty=True))
    with make(llm, provider) as summarizer:
        fails(summarizer, LLMTransientError, "llm_malformed")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_wrong_key_is_permanent_and_not_retried(llm: StandinLLM, provider: str) -> None:
    base = llm.anthropic_base_url if provider == "anthropic" else llm.openai_base_url
    cfg = config(base, provider)
    with LLMSummarizer(cfg, environ={KEY_ENV: "sk-wrong-key-0000"}) as summarizer:
        fails(summarizer, LLMPermanentError, "llm_auth_failed")
    assert len(llm.requests) == 1
    assert llm.requests[0].auth_present and llm.requests[0].auth_valid is False


def test_other_4xx_are_permanent_and_not_retried(llm: StandinLLM) -> None:
    llm.enqueue(Fault(status=404), Fault(status=400))
    with make(llm) as summarizer:
        fails(summarizer, LLMPermanentError, "llm_rejected")
        fails(summarizer, LLMPermanentError, "llm_rejected")
    assert len(llm.requests) == 2


def test_a_dropped_connection_is_retried(llm: StandinLLM) -> None:
    llm.enqueue(Fault(drop=True))
    with make(llm) as summarizer:
        summarizer.summarize(REQUEST)
    assert [r.fault.drop for r in llm.requests] == [True, False]


def test_a_dead_endpoint_fails_within_the_deadline(sockets: None) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = config(f"http://127.0.0.1:{port}/v1", deadline_s=1.0)
    with LLMSummarizer(cfg, environ={KEY_ENV: KEY}) as summarizer:
        elapsed = fails(summarizer, LLMTransientError, "llm_connection_error")
    assert elapsed < 1.0 + SLACK_S


def test_an_unusable_base_url_is_a_configuration_error() -> None:
    cfg = config("ftp://127.0.0.1:1/v1")
    with LLMSummarizer(cfg, environ={}) as summarizer:
        fails(summarizer, LLMPermanentError, "llm_bad_config")


def test_the_circuit_opens_fails_fast_then_half_opens(llm: StandinLLM) -> None:
    llm.default_fault = Fault(status=500)
    with make(llm, circuit_failure_threshold=3, circuit_reset_s=RESET_S, max_retries=10) as s:
        # opened mid-retries: 3 attempts, not 11, and the error is the first real cause
        fails(s, LLMTransientError, "llm_server_error")
        assert len(llm.requests) == 3
        assert s.circuit_state == "open"
        assert fails(s, LLMTransientError, "circuit_open") < RESET_S / 2
        assert len(llm.requests) == 3  # no request at all
        time.sleep(RESET_S + 0.05)
        assert s.circuit_state == "half_open"
        llm.enqueue(Fault(status=500))  # the probe fails: open again after one request
        fails(s, LLMTransientError, "llm_server_error")
        assert len(llm.requests) == 4
        time.sleep(RESET_S + 0.05)
        llm.default_fault = Fault()
        s.summarize(REQUEST)  # the probe succeeds: closed
        assert s.circuit_state == "closed"
        s.summarize(REQUEST)
    assert len(llm.requests) == 6


def test_half_open_lets_exactly_one_probe_through(llm: StandinLLM) -> None:
    llm.default_fault = Fault(status=500)
    with make(llm, circuit_failure_threshold=1, circuit_reset_s=0.2, max_retries=0) as s:
        fails(s, LLMTransientError, "llm_server_error")
        time.sleep(0.25)
        llm.default_fault = Fault()  # a healthy probe, held at the provider until released
        outcomes: list[object] = []
        probe = threading.Thread(target=lambda: outcomes.append(s.summarize(REQUEST)))
        llm.hold()
        try:
            probe.start()
            deadline = time.monotonic() + 30
            while llm.stats()["in_flight"] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert llm.stats()["in_flight"] == 1, "the probe never reached the provider"
            assert fails(s, LLMTransientError, "circuit_open") < 1.0  # while the probe runs
            assert len(llm.requests) == 2  # the probe only
        finally:
            llm.release()
        probe.join(30)
        assert len(outcomes) == 1 and s.circuit_state == "closed"
    assert len(llm.requests) == 2


def test_the_breaker_counts_consecutive_failures_only() -> None:
    clock = [0.0]
    breaker = CircuitBreaker(2, 10.0, clock=lambda: clock[0])
    breaker.record(ok=False, probe=breaker.acquire())
    breaker.record(ok=True, probe=breaker.acquire())
    breaker.record(ok=False, probe=breaker.acquire())
    assert breaker.state == "closed"
    breaker.record(ok=False, probe=breaker.acquire())
    assert breaker.state == "open"
    clock[0] = 10.0
    assert breaker.acquire() is True  # the probe
    with pytest.raises(LLMTransientError):
        breaker.acquire()  # a second caller while the probe is out


def test_a_chunked_summary_lets_its_probe_finish_so_the_breaker_can_close(
    llm: StandinLLM,
) -> None:
    chunked = REQUEST.model_copy(
        update={
            "messages": [
                Message(id=f"u{i}", role="user", content=f"part {i} " + "x" * 900, source_index=i)
                for i in range(4)
            ],
            "max_input_chars": 1000,
        }
    )
    llm.default_fault = Fault(status=500)
    with make(llm, circuit_failure_threshold=1, circuit_reset_s=0.2, max_retries=0) as s:
        fails(s, LLMTransientError, "llm_server_error")
        time.sleep(0.25)
        llm.default_fault = Fault()
        with pytest.raises(LLMTransientError) as caught:
            s.summarize(chunked)
        assert caught.value.code == "circuit_open"  # its sibling chunks were refused...
        assert s.circuit_state == "closed"  # ...but its probe went through and closed it
        assert s.summarize(chunked).chunks >= 4


def test_an_attempt_cut_short_by_the_deadline_does_not_count_against_the_provider(
    llm: StandinLLM,
) -> None:
    llm.default_fault = Fault(hang=True)
    with make(llm, circuit_failure_threshold=1, timeout_s=5.0, deadline_s=0.3) as s:
        fails(s, LLMTransientError, "llm_timeout")
        assert s.circuit_state == "closed"


def test_time_queued_behind_our_own_concurrency_is_not_counted_against_the_deadline(
    llm: StandinLLM,
) -> None:
    """A one-slot client (as for a one-slot local server) and five summaries at once, each
    call taking a third of the deadline: the last waits four calls' time for the slot, past
    the deadline, yet every summary succeeds, one request at a time."""
    latency, deadline = 1.0, 3.0
    llm.default_fault = Fault(latency_s=latency)
    outcomes: list[object] = []
    with make(llm, max_concurrency=1, timeout_s=deadline, deadline_s=deadline) as s:

        def one() -> None:
            try:
                outcomes.append(s.summarize(REQUEST))
            except CompactorError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=one) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert s.circuit_state == "closed"
    assert [type(o).__name__ for o in outcomes] == ["Summary"] * 5, outcomes
    assert llm.stats()["in_flight_peak"] == 1  # they did queue, behind our own limit
    arrivals = sorted(r.received_at for r in llm.requests)
    assert arrivals[-1] - arrivals[0] >= 4 * latency > deadline  # the queue outlasted one deadline


def test_the_first_real_cause_is_reported_not_the_breaker_it_opened(llm: StandinLLM) -> None:
    """The call whose own timeout opened the breaker reports ``llm_timeout`` (its retry found
    the breaker open); a later call, refused without trying, says ``circuit_open`` and why."""
    llm.default_fault = Fault(hang=True)
    with make(
        llm, circuit_failure_threshold=1, circuit_reset_s=60.0, timeout_s=0.5, max_retries=3
    ) as s:
        fails(s, LLMTransientError, "llm_timeout")
        assert len(llm.requests) == 1 and s.circuit_state == "open"
        with pytest.raises(LLMTransientError) as caught:
            s.summarize(REQUEST)
        assert caught.value.code == "circuit_open"
        assert "after llm_timeout" in caught.value.message
    assert len(llm.requests) == 1


def chain(llm: StandinLLM, monkeypatch: pytest.MonkeyPatch, **overrides: object) -> Any:
    monkeypatch.setenv(KEY_ENV, KEY)
    cfg = config(llm.openai_base_url, fallback_models=["small-b", "small-c"], **overrides)
    summarizer = llm_summarizer(Settings(compaction={"mode": "prefer_remote"}, llm=cfg))
    assert summarizer is not None
    return summarizer


def test_fallback_models_are_tried_in_order_and_the_summary_names_its_model(
    llm: StandinLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first model is not served (404, permanent), the second times out at its own
    deadline, the third answers: the summary is the third's and says why the others failed."""
    llm.enqueue(Fault(status=404), Fault(hang=True))
    summarizer = chain(llm, monkeypatch, deadline_s=1.0, timeout_s=1.0, max_retries=0)
    try:
        summary = summarizer.summarize(REQUEST)
    finally:
        summarizer.close()
    assert [r.body["model"] for r in llm.requests] == ["gpt-4.1-mini", "small-b", "small-c"]
    assert summary.source == "llm" and summary.model == "small-c"
    reason = summary.fallback_reason or ""
    assert reason.startswith("llm_rejected: model gpt-4.1-mini failed: llm_rejected")
    assert "model small-b failed: llm_timeout" in reason


def test_when_every_model_fails_the_first_ones_error_is_raised(
    llm: StandinLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm.default_fault = Fault(status=500)
    summarizer = chain(llm, monkeypatch, max_retries=1)
    try:
        with pytest.raises(LLMTransientError) as caught:
            summarizer.summarize(REQUEST)
    finally:
        summarizer.close()
    assert caught.value.code == "llm_server_error"
    assert "model small-c failed: llm_server_error" in caught.value.message
    assert len(llm.requests) == 3 * 2  # each model with its own retries


def test_without_fallback_models_the_summary_names_the_model(llm: StandinLLM) -> None:
    with make(llm) as s:
        summary = s.summarize(REQUEST)
    assert summary.model == "gpt-4.1-mini" and summary.fallback_reason is None
