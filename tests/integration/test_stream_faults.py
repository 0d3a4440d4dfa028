"""Readers that survive what they find or what happens to Redis: an entry that is not a JSON
event in a conversation's stream (every reader skips it, with one warning) or in
``cw:recent`` (the webhook loop goes on); a Redis restart under ``compactor serve`` (the next
request is answered); an entry handed to the webhook consumer whose read never returned (it is
delivered all the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from support.blocking_support import client_of, published
from support.follower_support import AsyncFollower, Receiver, SseFollower, SyncFollower, wait_until
from support.http_support import Stack

from worker.api.webhooks import GROUP
from worker.backend import keys
from worker.backend.embedded import EmbeddedRedis
from worker.client import Client

pytestmark = pytest.mark.slow

NOT_JSON = b"\xff{not json"  # neither UTF-8 nor JSON


def warned_about(caplog: pytest.LogCaptureFixture, entry_id: str) -> int:
    return sum(
        1 for r in caplog.records if r.levelno == logging.WARNING and entry_id in r.getMessage()
    )


def add_unreadable(client: Client, stream: str) -> str:
    entry_id: bytes = client.state.client.xadd(stream, {"event": NOT_JSON})
    return entry_id.decode()


def test_an_entry_that_is_not_json_is_skipped_by_every_reader_with_one_warning(
    serve: Stack, run_cli: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``Client.events``, ``Client.aevents``, ``compactor events`` and the HTTP events route
    (JSON and SSE) return the valid events around it, each warning once about it."""
    caplog.set_level(logging.WARNING)
    client = client_of(serve.redis_url)
    conversation = "acme:bad-1"
    try:
        first = published(client, conversation, 1)
        bad = add_unreadable(client, keys.events(conversation))
        second = published(client, conversation, 2)
        valid = [first.event_id, second.event_id]

        assert [e.event_id for _, e in client.events(conversation)] == valid
        assert warned_about(caplog, bad) == 1
        caplog.clear()

        async def read_async() -> list[str]:
            return [e.event_id async for _, e in client.aevents(conversation)]

        assert asyncio.run(read_async()) == valid
        assert warned_about(caplog, bad) == 1

        cli = run_cli("events", conversation, env={"COMPACTOR_REDIS_URL": serve.redis_url})
        assert cli.code == 0, cli.stderr
        assert [json.loads(line)["event_id"] for line in cli.stdout.splitlines()] == valid
        assert cli.stderr.count(bad) == 1 and "warning" in cli.stderr.lower(), cli.stderr

        with serve.http() as http:
            listed = http.get("/v1/conversations/bad-1/events")
        assert listed.status_code == 200, listed.text
        assert [e["event_id"] for e in listed.json()] == valid
        sse = SseFollower(serve, "bad-1")
        try:
            wait_until(lambda: len(sse.events) == 2, "both valid events on the SSE stream")
            assert [e["event_id"] for e in sse.events] == valid
        finally:
            sse.stop()
        server_log = (serve.root / "logs" / "serve.log").read_text()
        assert server_log.count(bad) == 2, server_log  # the JSON page, the SSE stream
    finally:
        client.close()


def test_followers_move_past_an_unreadable_newest_entry(
    serve: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """When the entry is the newest, each follower reads it once and waits for the next
    event; it never reads the entry again (which would warn again, in a loop)."""
    caplog.set_level(logging.WARNING)
    client = client_of(serve.redis_url)
    conversation = "acme:bad-2"
    followers: list[Any] = []
    try:
        first = published(client, conversation, 1)
        bad = add_unreadable(client, keys.events(conversation))
        followers = [
            SyncFollower(client, conversation, block_ms=500),
            AsyncFollower(client, conversation, block_ms=500),
            SseFollower(serve, "bad-2"),
        ]
        wait_until(lambda: all(len(f.events) == 1 for f in followers), "the first event")
        wait_until(lambda: warned_about(caplog, bad) == 2, "both clients' warning")
        server_log = serve.root / "logs" / "serve.log"
        wait_until(lambda: bad in server_log.read_text(), "the SSE stream's warning")
        second = published(client, conversation, 2)
        wait_until(lambda: all(len(f.events) == 2 for f in followers), "the next event")
        assert [f.error for f in followers] == [None, None, None]
        assert [e.event_id for e in followers[0].events] == [first.event_id, second.event_id]
        assert [e.event_id for e in followers[1].events] == [first.event_id, second.event_id]
        assert [e["event_id"] for e in followers[2].events] == [first.event_id, second.event_id]
        assert warned_about(caplog, bad) == 2  # once per client follower
        assert server_log.read_text().count(bad) == 1
    finally:
        for follower in followers:
            follower.stop()
        client.close()


class SilentRelay:
    """A TCP relay on loopback in front of Redis that, like a NAT or a host between them, does
    not pass on to the client that Redis closed a connection: the client's socket stays open
    until its next write, which is answered with a reset. (Directly on loopback, the client
    sees the close at once and redis-py reconnects before using the connection.)"""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.resets = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            gone = threading.Event()  # Redis closed this connection
            threading.Thread(target=self._down, args=(upstream, client, gone), daemon=True).start()
            threading.Thread(target=self._up, args=(client, upstream, gone), daemon=True).start()

    def _down(self, upstream: socket.socket, client: socket.socket, gone: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)
        gone.set()  # and the client is not told
        upstream.close()

    def _up(self, client: socket.socket, upstream: socket.socket, gone: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if gone.is_set():
                    self.resets += 1
                    break
                upstream.sendall(data)
        # a reset (no FIN): what the client gets writing to a connection the far end forgot
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()


@pytest.mark.parametrize("connection", ["direct", "through a relay"])
def test_the_first_request_after_a_redis_restart_is_answered(
    connection: str, tmp_path: Path, subprocesses: None
) -> None:
    """``compactor serve``'s pooled connections all broke when Redis was killed; the first
    request after Redis is back (same port, its AOF reloaded) reconnects and is answered, also
    when the broken connections look open until used."""
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=True)
    url = server.start()
    admin = redis.Redis.from_url(url)
    admin.config_set("appendfsync", "always")  # the event survives the SIGKILL below
    relay = SilentRelay(server.port) if connection == "through a relay" else None
    (tmp_path / "serve").mkdir()
    stack = Stack(tmp_path / "serve", relay.url if relay else url)
    client = client_of(url)
    try:
        stack.start(workers=False)
        event = published(client, "acme:restart-1", 1)
        path = "/v1/conversations/restart-1/events"
        with stack.http() as http:
            assert http.get(path).status_code == 200  # the server's pool holds connections
            server.stop(kill=True)
            server.start()
            first = http.get(path)
            assert first.status_code == 200, first.text
            assert [e["event_id"] for e in first.json()] == [event.event_id]
            hooks = http.get("/v1/webhooks")
            assert hooks.status_code == 200, hooks.text
        if relay is not None:
            assert relay.resets >= 1  # a request did meet a connection Redis had closed
    finally:
        client.close()
        admin.close()
        stack.stop()
        if relay is not None:
            relay.close()
        server.stop()


def test_an_entry_handed_to_the_webhook_consumer_whose_read_never_returned_is_delivered(
    serve: Stack, receiver: Receiver
) -> None:
    """The entry is handed to ``serve``'s consumer (it is pending for it) by a read whose reply
    ``serve`` never saw, as when a read times out client-side just as Redis answers it: it is
    delivered all the same, then acknowledged."""
    admin = redis.Redis.from_url(serve.redis_url)
    client = client_of(serve.redis_url)
    try:
        with serve.http() as http:
            doc = {"url": receiver.url, "conversation_id": "handed-1"}
            assert http.post("/v1/webhooks", json=doc).status_code == 201
        wait_until(lambda: _has_group(admin), "the delivery loop's consumer group")
        event = published(client, "acme:handed-1", 1)
        wait_until(lambda: len(receiver.bodies) == 1, "the delivery of a published event")
        # Another event, added and handed to serve's consumer in one transaction: serve's own
        # blocked read finds nothing new after it.
        lost = event.model_copy(update={"event_id": "handed-over", "revision": 2})
        pipe = admin.pipeline(transaction=True)
        pipe.xadd(keys.RECENT, {"event": lost.to_json()})
        pipe.xreadgroup(GROUP, socket.gethostname(), {keys.RECENT: ">"}, count=10)
        entry_id, handed = pipe.execute()
        assert [e for _s, entries in handed for e, _f in entries] == [entry_id]
        wait_until(lambda: len(receiver.bodies) == 2, "the delivery of the handed-over entry")
        assert [b["event_id"] for b in receiver.bodies] == [event.event_id, "handed-over"]
        wait_until(lambda: admin.xpending(keys.RECENT, GROUP)["pending"] == 0, "its ack")
    finally:
        client.close()
        admin.close()


def test_an_entry_of_recent_events_that_is_not_json_does_not_stop_webhooks(
    serve: Stack, receiver: Receiver
) -> None:
    """The delivery loop acknowledges the entry with a warning and delivers what follows."""
    admin = redis.Redis.from_url(serve.redis_url)
    client = client_of(serve.redis_url)
    try:
        with serve.http() as http:
            doc = {"url": receiver.url, "conversation_id": "recent-1"}
            assert http.post("/v1/webhooks", json=doc).status_code == 201
        wait_until(lambda: _has_group(admin), "the delivery loop's consumer group")
        bad = add_unreadable(client, keys.RECENT)
        event = published(client, "acme:recent-1", 1)
        wait_until(lambda: len(receiver.bodies) == 1, "the delivery after the bad entry")
        assert receiver.bodies[0]["event_id"] == event.event_id
        wait_until(lambda: admin.xpending(keys.RECENT, GROUP)["pending"] == 0, "the acks")
        assert (serve.root / "logs" / "serve.log").read_text().count(bad) == 1
    finally:
        client.close()
        admin.close()


def _has_group(admin: redis.Redis) -> bool:
    try:
        return any(g["name"] == GROUP.encode() for g in admin.xinfo_groups(keys.RECENT))
    except redis.exceptions.ResponseError:  # the stream is not there yet
        return False
