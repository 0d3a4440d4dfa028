"""The retry schedule: ``Backoff`` on its own (pure), and the sessions' four loops (the thread
and asyncio senders and followers) waiting by that one schedule against a Redis that refuses."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from worker.client import Client
from worker.config import Settings, with_redis_url
from worker.session import AsyncCompactingSession, CompactingSession
from worker.session._threads import RETRY, Backoff

SEND = "cannot submit %s revision %d (%s); keeping the newest snapshot (%d turns pending), "
READ = "cannot read events of %s (%s); retrying in %.1fs"


# --- Backoff on its own ---------------------------------------------------------------------


def test_delays_start_at_the_base_double_and_stop_at_the_cap() -> None:
    backoff = Backoff(0.2, 5.0)
    assert [backoff.delay(n) for n in range(1, 8)] == pytest.approx(
        [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    )
    assert backoff.delay(10_000) == 5.0  # no overflow however long the outage


def test_the_sessions_schedule_is_the_documented_one() -> None:
    """docs/session.md: 0.2 s, doubling, at most 5 s."""
    assert [RETRY.delay(n) for n in (1, 2, 3)] == pytest.approx([0.2, 0.4, 0.8])
    assert RETRY.delay(100) == RETRY.cap_s == 5.0


def test_jitter_takes_a_share_off_by_the_source_given() -> None:
    draws = iter([0.0, 0.5, 0.999])
    backoff = Backoff(1.0, 8.0, jitter=0.5, random=lambda: next(draws))
    assert [backoff.delay(n) for n in (1, 2, 3)] == pytest.approx([1.0, 1.5, 4.0 * 0.5005])


def test_full_jitter_stays_between_zero_and_the_delay() -> None:
    backoff = Backoff(1.0, 4.0, jitter=1.0, random=lambda: 0.999999)
    assert 0.0 < backoff.delay(3) < 0.001


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"base_s": 0.0, "cap_s": 1.0}, "0 < base_s <= cap_s"),
        ({"base_s": 2.0, "cap_s": 1.0}, "0 < base_s <= cap_s"),
        ({"base_s": 1.0, "cap_s": 2.0, "jitter": 1.5}, "jitter"),
        ({"base_s": 1.0, "cap_s": 2.0, "jitter": -0.1}, "jitter"),
    ],
)
def test_a_backoff_that_cannot_work_is_refused(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("<", ".")):
        Backoff(**arguments)


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1, not 0"):
        Backoff(1.0, 2.0).delay(0)


# --- the sessions' loops --------------------------------------------------------------------


@pytest.fixture
def refusing_client(sockets: None) -> Iterator[Client]:
    """A client whose Redis refuses every connection (a loopback port nothing listens on)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = Client(with_redis_url(Settings(), f"redis://127.0.0.1:{port}/0"))
    yield client
    client.close()


def delays(caplog: pytest.LogCaptureFixture, message: str, conversation_id: str) -> list[float]:
    """The waits the loop logged, in order, for ``message`` about the conversation."""
    found: list[float] = []
    for record in caplog.records:
        args = record.args
        if not (isinstance(args, tuple) and record.msg.startswith(message[:24])):
            continue
        if args[0] == conversation_id and isinstance(args[-1], float):
            found.append(args[-1])
    return found


def enough(caplog: pytest.LogCaptureFixture, conversation_id: str) -> Callable[[], bool]:
    def check() -> bool:
        return all(len(delays(caplog, m, conversation_id)) >= 3 for m in (SEND, READ))

    return check


EXPECTED = [RETRY.delay(1), RETRY.delay(2), RETRY.delay(3)]


@pytest.mark.slow
def test_the_thread_loops_wait_by_the_shared_schedule(
    refusing_client: Client, caplog: pytest.LogCaptureFixture, sockets: None
) -> None:
    caplog.set_level(logging.WARNING, logger="worker.session")
    session = CompactingSession("c-backoff-threads", client=refusing_client)
    try:
        session.extend([{"role": "user", "content": "hello"}])
        deadline = time.monotonic() + 60
        while not enough(caplog, "c-backoff-threads")() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        session.close(timeout_s=0)
    assert delays(caplog, SEND, "c-backoff-threads")[:3] == EXPECTED
    assert delays(caplog, READ, "c-backoff-threads")[:3] == EXPECTED
    status = session.status
    assert status.retrying and status.submit_failures >= 3 and status.follower_error


@pytest.mark.slow
def test_the_asyncio_loops_wait_by_the_same_schedule(
    refusing_client: Client, caplog: pytest.LogCaptureFixture, sockets: None
) -> None:
    caplog.set_level(logging.WARNING, logger="worker.session")

    async def run() -> AsyncCompactingSession:
        session = AsyncCompactingSession("c-backoff-tasks", client=refusing_client)
        try:
            await session.extend([{"role": "user", "content": "hello"}])
            deadline = time.monotonic() + 60
            while not enough(caplog, "c-backoff-tasks")() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await session.close(timeout_s=0)
        return session

    session = asyncio.run(run())
    assert delays(caplog, SEND, "c-backoff-tasks")[:3] == EXPECTED
    assert delays(caplog, READ, "c-backoff-tasks")[:3] == EXPECTED
    status = session.status
    assert status.retrying and status.submit_failures >= 3 and status.follower_error
