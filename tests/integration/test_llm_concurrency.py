"""Many summaries at once from one process: one shared client, bounded connections, keep-alive,
fork safety and a clean shutdown."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from worker.config import LLMConfig
from worker.errors import LLMTransientError
from worker.summarize import SummaryRequest
from worker.summarize.llm import LLMSummarizer
from worker.testing.standin_llm import StandinLLM
from worker.wire.events import Summary
from worker.wire.models import Message

LOOP_THREAD = "llm-summarizer-loop"


@pytest.fixture
def llm(sockets: None) -> Iterator[StandinLLM]:
    with StandinLLM() as server:
        yield server


def make(llm: StandinLLM, **overrides: object) -> LLMSummarizer:
    fields: dict[str, object] = {"base_url": llm.openai_base_url, "deadline_s": 10.0}
    fields.update(overrides)
    return LLMSummarizer(LLMConfig.model_validate(fields), environ={})


def request(i: int) -> SummaryRequest:
    text = f"step {i}: edit src/pkg/file_{i}.py"
    return SummaryRequest(
        conversation_id=f"c-{i}",
        revision=1,
        messages=[Message(id="u", role="user", content=text, source_index=0)],
        max_input_chars=4000,
        max_output_tokens=200,
        source_tokens=100_000,
    )


def run_all(summarizer: LLMSummarizer, count: int, threads: int) -> list[Summary]:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(summarizer.summarize, map(request, range(count))))


def wait_in_flight(llm: StandinLLM, count: int, *, timeout_s: float = 60.0) -> None:
    """Until ``count`` requests are in flight at the stand-in (held, or slow)."""
    deadline = time.monotonic() + timeout_s
    while llm.stats()["in_flight"] < count:
        assert time.monotonic() < deadline, f"fewer than {count} calls reached the provider"
        time.sleep(0.01)


@pytest.mark.slow
def test_two_hundred_threads_keep_two_hundred_calls_in_flight(llm: StandinLLM) -> None:
    # A wide connect timeout: on a starved machine (parallel test processes) the client's loop
    # may see 200 connects complete seconds late, and five "timeouts" would open the breaker.
    with make(llm, timeout_s=150.0, deadline_s=180.0, connect_timeout_s=60.0) as summarizer:
        llm.hold()  # every request waits at the provider until all 200 have arrived
        with ThreadPoolExecutor(max_workers=200) as pool:
            futures = [pool.submit(summarizer.summarize, request(i)) for i in range(200)]
            deadline = time.monotonic() + 120
            while llm.stats()["in_flight"] < 200 and time.monotonic() < deadline:
                time.sleep(0.01)
            in_flight = llm.stats()["in_flight"]
            llm.release()
            summaries = [f.result() for f in futures]
    assert in_flight == 200
    assert [f"file_{i}.py" in s.text for i, s in enumerate(summaries)] == [True] * 200
    assert llm.stats()["connections_accepted"] == 200  # one pool, one connection per call


def test_max_concurrency_bounds_connections_and_calls(llm: StandinLLM) -> None:
    llm.latency_s = 0.05
    with make(llm, max_concurrency=4) as summarizer, ThreadPoolExecutor(max_workers=1) as runner:
        llm.hold()  # the first calls wait at the provider: the bound is reached before any ends
        try:
            done = runner.submit(run_all, summarizer, 16, 16)
            wait_in_flight(llm, 4)
        finally:
            llm.release()
        assert len(done.result(timeout=60)) == 16
    stats = llm.stats()
    assert stats["in_flight_peak"] == 4
    assert stats["connections_peak"] <= 4


def test_sequential_summaries_reuse_one_keep_alive_connection(llm: StandinLLM) -> None:
    with make(llm) as summarizer:
        for i in range(5):
            summarizer.summarize(request(i))
    assert llm.stats()["connections_accepted"] == 1


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # 3.12+ warns on fork in threads
def test_a_forked_child_builds_its_own_loop_and_client(llm: StandinLLM) -> None:
    with make(llm) as summarizer:
        parent = summarizer.summarize(request(1))
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave without running any test teardown
            code = 0
            try:
                text = summarizer.summarize(request(2)).text
                os.write(write_end, json.dumps({"ok": "file_2.py" in text}).encode())
            except BaseException as exc:
                os.write(write_end, json.dumps({"error": repr(exc)}).encode())
                code = 1
            finally:
                os._exit(code)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            child = json.loads(pipe.read() or "{}")
        _, status = os.waitpid(pid, 0)
        assert child == {"ok": True} and os.waitstatus_to_exitcode(status) == 0
        assert summarizer.summarize(request(3)).text != parent.text  # the parent still works
    assert llm.stats()["connections_accepted"] == 2  # the child did not reuse our socket


def test_close_stops_the_loop_thread_and_refuses_new_work(llm: StandinLLM) -> None:
    # Other tests of this process may leave summarizers open: only this one's thread counts.
    others = set(_loop_threads())
    summarizer = make(llm)
    assert set(_loop_threads()) == others  # nothing starts before the first call
    summarizer.summarize(request(1))
    assert len(set(_loop_threads()) - others) == 1
    summarizer.close()
    summarizer.close()  # idempotent
    assert not set(_loop_threads()) - others
    with pytest.raises(LLMTransientError) as caught:
        summarizer.summarize(request(2))
    assert caught.value.code == "llm_closed"


def _loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == LOOP_THREAD and t.is_alive()]


def test_closing_while_calls_are_in_flight_fails_them_cleanly(llm: StandinLLM) -> None:
    llm.hold()  # the call stays in flight until the summarizer is closed under it
    summarizer = make(llm)
    outcomes: list[BaseException] = []

    def call() -> None:
        try:
            summarizer.summarize(request(1))
        except BaseException as exc:
            outcomes.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_in_flight(llm, 1)
    summarizer.close()
    caller.join(30)
    assert [getattr(e, "code", repr(e)) for e in outcomes] == ["llm_closed"]
