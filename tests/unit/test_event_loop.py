"""The kombu event-loop workaround in :mod:`worker.runtime.celery_app` (``wake_when_ready``), on a
real kombu ``Hub`` in-process: a callback queued by the loop's own thread while the loop runs
its ready callbacks must not leave the next poll waiting for a timer.

No timing is asserted: each poll is inspected before it could sleep (what a zero-timeout poll
of the same poller returns at that moment), so the unfixed loop is caught without waiting out
its timeout."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kombu.asynchronous import Hub

from worker.runtime.celery_app import PromptEventLoop, make_app, wake_when_ready


@dataclass
class Poll:
    """One poll of the loop: the timeout it asked for, whether callbacks were ready then,
    and how many events the poller had at once (without waiting)."""

    timeout: float
    callbacks_ready: bool
    events_at_once: int


@dataclass
class Turns:
    hub: Hub
    polls: list[Poll] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)


@pytest.fixture
def turns() -> Iterator[Turns]:
    """A hub with one idle socket to watch (the loop polls only when it has some) and a timer
    a minute away (the poll's timeout is then the loop's longest), whose poller records each
    poll instead of sleeping in it."""
    hub = Hub()
    idle, peer = socket.socketpair()
    hub.add_reader(idle.fileno(), lambda: None)
    hub.call_later(60, lambda: None)
    state = Turns(hub)
    poll_now = hub.poller.poll

    def recording_poll(timeout: float) -> Any:
        events = poll_now(0)
        state.polls.append(Poll(timeout, bool(hub._ready), len(events or ())))
        return events

    hub.poller.poll = recording_poll
    try:
        yield state
    finally:
        hub.close()
        idle.close()
        peer.close()


def run_turns(state: Turns, count: int) -> None:
    """``count`` turns of the loop, after queueing a callback that queues another from the
    loop's thread (as py-amqp's reader does after reading a message, and a task run there does
    with its acknowledgement)."""
    hub = state.hub

    def second() -> None:
        state.ran.append("second")

    def first() -> None:
        state.ran.append("first")
        hub.call_soon(second)

    hub.call_soon(first)
    loop = hub.create_loop()
    for _ in range(count):
        next(loop)


def test_kombu_itself_polls_with_a_timeout_while_callbacks_are_ready(turns: Turns) -> None:
    """The bug the workaround is for. When this fails, kombu no longer sleeps with callbacks
    ready: remove ``wake_when_ready`` and ``PromptEventLoop`` from worker/runtime/celery_app.py."""
    run_turns(turns, 1)
    assert turns.ran == ["first"]
    first_poll = turns.polls[0]
    assert first_poll.callbacks_ready
    assert first_poll.timeout > 0
    assert first_poll.events_at_once == 0  # nothing would end it before the timer


def test_the_loop_does_not_sleep_while_callbacks_are_ready(turns: Turns) -> None:
    assert wake_when_ready(turns.hub)
    run_turns(turns, 2)
    assert turns.ran == ["first", "second"]
    assert turns.polls[0].callbacks_ready
    assert turns.polls[0].events_at_once >= 1  # the hub's wakeup: the poll returns at once
    # Nothing ready, nothing to wake for: an idle worker still sleeps in its poll.
    assert not turns.polls[1].callbacks_ready
    assert turns.polls[1].events_at_once == 0


def test_every_worker_of_the_app_gets_the_workaround() -> None:
    """Built as ``celery worker`` builds it (not started: nothing connects), on each broker."""
    for url in ("redis://127.0.0.1:1/0", "amqp://guest:guest@127.0.0.1:1//"):
        app = make_app()
        app.conf.broker_url = url
        assert PromptEventLoop in app.steps["worker"]
        worker = app.WorkController(
            pool_cls="solo", without_mingle=True, without_gossip=True, quiet=True
        )
        try:
            assert worker.hub is not None
            ticks = [getattr(t, "__qualname__", "") for t in worker.hub.on_tick]
            assert any(name.startswith("wake_when_ready.") for name in ticks)
        finally:
            worker.hub.close()
            app.close()
