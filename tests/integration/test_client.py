"""The agent-side client against a real Redis: validation before anything is stored, and asyncio
use in which submits and followers never wait for each other."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
from support.service_support import Workers, conversation
from support.service_support import client_for as workers_client

from worker.backend import keys
from worker.backend.connection import connect
from worker.backend.redis_state import RedisState
from worker.client import Client
from worker.config import CompactionConfig, Settings, with_redis_url
from worker.errors import EventMismatch, InvalidSnapshot, StorageError
from worker.wire.events import CompletedEvent, SkippedEvent

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent.parent


def snapshot(conversation_id: str = "c-client", revision: int = 1, **extra: Any) -> dict[str, Any]:
    messages = [{"id": "u1", "role": "user", "content": "hello"}]
    return {"conversation_id": conversation_id, "revision": revision, "messages": messages} | extra


def client_for(url: str) -> Client:
    return Client(with_redis_url(Settings(), url))


def test_importing_the_client_imports_no_celery(subprocesses: None) -> None:
    code = (
        "import sys, worker.client; "
        "c = worker.client.Client; "
        "assert not [m for m in sys.modules if m == 'celery' or m.startswith('celery.')], "
        "sorted(m for m in sys.modules if m.startswith('celery'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (snapshot(messages=[{"role": "user", "content": "lone \ud800 surrogate"}]), "messages[0]"),
        (snapshot(messages=[{"role": "user", "content": b"bytes"}]), "messages[0].content"),
        (snapshot(config={"summary_max_input_chars": float("nan")}), "config"),
        (snapshot(model={"name": "gpt-4.1", "context_window": float("inf")}), "model"),
    ],
    ids=["surrogate", "bytes", "nan", "infinity"],
)
def test_submit_names_the_field_json_cannot_carry(bad: dict[str, Any], field: str) -> None:
    client = client_for("redis://127.0.0.1:1/0")  # nothing is sent: the check comes first
    try:
        with pytest.raises(InvalidSnapshot) as caught:
            client.submit(bad)
        assert caught.value.field.startswith(field), caught.value.field
    finally:
        client.close()


@pytest.mark.parametrize("text", ['{"revision": NaN}', '{"x": [Infinity]}', '{"x": 1e400}'])
def test_submit_refuses_json_that_strict_parsers_refuse(text: str) -> None:
    client = client_for("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(InvalidSnapshot, match="finite"):
            client.submit(text.encode())
    finally:
        client.close()


def test_a_lone_surrogate_in_text_input_is_an_invalid_snapshot() -> None:
    client = client_for("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(InvalidSnapshot, match="surrogate"):
            client.submit(json.dumps(snapshot())[:-1] + ', "x": "\ud800"}')
    finally:
        client.close()


def test_asubmit_does_not_wait_behind_idle_followers(redis_url: str) -> None:
    """Eight followers wait on conversations that get no event for a minute; a submit made
    meanwhile completes while every one of them is still waiting. (With followers and
    submits on asyncio's shared default thread pool, the submit waited for a follower's
    blocking read to time out.)"""

    async def scenario() -> tuple[str, list[bool]]:
        client = client_for(redis_url)
        waiting = [True] * 8

        async def follow(i: int) -> None:
            async for _ in client.aevents(f"c-idle-{i}", follow=True, block_ms=60_000):
                break
            waiting[i] = False

        followers = [asyncio.create_task(follow(i)) for i in range(8)]
        await asyncio.sleep(0.2)  # let them all start waiting
        try:
            result = await asyncio.wait_for(client.asubmit(snapshot("c-busy")), timeout=30)
            still = list(waiting)
        finally:
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
            client.close()
        return result.status, still

    status, still_waiting = asyncio.run(scenario())
    assert status == "queued"
    assert all(still_waiting)


class ReplyDroppingRelay:
    """A TCP relay on loopback in front of Redis that, once armed with a marker, drops the
    connection right after Redis answered the first command whose bytes hold the marker: the
    command ran, its reply never arrives (what a connection broken at the wrong moment, or a
    Redis killed between running a script and answering, does)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.marker = b""
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            marked = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, marked), daemon=True).start()
            threading.Thread(
                target=self._down, args=(upstream, client, marked), daemon=True
            ).start()

    def _up(self, client: socket.socket, upstream: socket.socket, marked: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self.marker and self.marker in data and not self.dropped.is_set():
                    marked.set()
                upstream.sendall(data)

    def _down(
        self, upstream: socket.socket, client: socket.socket, marked: threading.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if marked.is_set():  # the marked command's reply: swallowed, both ends closed
                    self.dropped.set()
                    break
                client.sendall(data)
        for end in (client, upstream):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()


def test_a_submit_whose_reply_was_lost_is_still_queued(redis_url: str) -> None:
    """The submit script runs, and the connection breaks before its reply arrives; redis-py
    runs it again on a new connection. The second run must answer ``queued`` and the client
    send the evaluation: answering ``coalesced`` (the flag the first run set) left the
    conversation without any evaluation until the reconciler ran."""
    port = urlsplit(redis_url).port
    assert port is not None
    relay = ReplyDroppingRelay(port)
    client = client_for(relay.url)
    r = redis.Redis.from_url(redis_url)
    try:
        assert client.submit(snapshot("c-before")).status == "queued"  # scripts loaded
        relay.marker = keys.queued("c-lost-reply").encode()
        result = client.submit(snapshot("c-lost-reply"))
        assert relay.dropped.is_set(), "the relay should have swallowed the script's reply"
        assert result.status == "queued"
        queued = [
            json.loads(m)["headers"]["argsrepr"] for m in r.lrange("compactor.evaluate", 0, -1)
        ]
        assert sum("c-lost-reply" in m for m in queued) == 1, queued
        # A second submission of the conversation coalesces into that evaluation, as before.
        assert client.submit(snapshot("c-lost-reply", 2)).status == "coalesced"
    finally:
        client.close()
        relay.close()
        r.close()


def test_a_lock_taken_or_released_whose_reply_was_lost_answers_as_its_first_run(
    redis_url: str,
) -> None:
    """The lock scripts run, and the connection breaks before their replies arrive; redis-py
    runs each again. Taken twice, the lock is still this worker's (answering ``held`` deferred
    its compaction for a whole lease); released twice, the release still says a snapshot came
    while it was held (the first run had taken the flag, so the evaluation waited for the
    deferred summarize, a lease later)."""
    port = urlsplit(redis_url).port
    assert port is not None
    r = redis.Redis.from_url(redis_url)
    direct = RedisState(connect(redis_url), Settings().redis)
    relays = [ReplyDroppingRelay(port) for _ in range(2)]
    marker = keys.lock_reply("c-lost-lock").encode()
    try:
        taking = RedisState(connect(relays[0].url), Settings().redis)
        assert taking.acquire_lock("c-warm", 20.0).status == "taken"  # scripts loaded
        relays[0].marker = marker
        claim = taking.acquire_lock("c-lost-lock", 20.0)
        assert relays[0].dropped.is_set(), "the relay should have swallowed the lock's reply"
        assert claim.status == "taken" and claim.token is not None
        assert r.get(keys.lock("c-lost-lock")) == claim.token.encode()
        # Another worker is still refused, and a snapshot that comes now flags a re-run.
        assert direct.acquire_lock("c-lost-lock", 20.0).status == "held"
        assert direct.defer_to_holder("c-lost-lock") > 0
        releasing = RedisState(connect(relays[1].url), Settings().redis)
        assert not releasing.release_lock("c-warm", "no-such-token").rerun  # scripts loaded
        relays[1].marker = marker
        released = releasing.release_lock("c-lost-lock", claim.token)
        assert relays[1].dropped.is_set(), "the relay should have swallowed the release's reply"
        assert released.rerun
        assert not r.exists(keys.lock("c-lost-lock"), keys.rerun("c-lost-lock"))
        # The lock is free for anyone now, and an old token's release takes nothing.
        assert direct.acquire_lock("c-lost-lock", 20.0).status == "taken"
        assert not direct.release_lock("c-lost-lock", claim.token).rerun
    finally:
        for relay in relays:
            relay.close()
        r.close()


def test_followers_receive_events_while_submits_run(redis_url: str) -> None:
    async def scenario() -> list[str]:
        client = client_for(redis_url)
        state = RedisState(connect(redis_url), Settings().redis)
        got: list[str] = []

        async def follow(i: int) -> None:
            async for _, event in client.aevents(f"c-f{i}", follow=True, block_ms=60_000):
                got.append(event.conversation_id)
                break

        followers = [asyncio.create_task(follow(i)) for i in range(8)]
        await asyncio.gather(*(client.asubmit(snapshot(f"c-s{i}")) for i in range(20)))
        for i in range(8):
            event = SkippedEvent(
                event_id=f"e{i}",
                conversation_id=f"c-f{i}",
                revision=1,
                created_at="2026-12-01T00:00:00Z",
                reason="test",
            )
            state.publish(event)
        try:
            await asyncio.wait_for(asyncio.gather(*followers), timeout=60)
        finally:
            client.close()
            state.client.close()
        return got

    assert sorted(asyncio.run(scenario())) == sorted(f"c-f{i}" for i in range(8))


def test_a_stream_entry_that_is_not_an_event_is_skipped_not_fatal(redis_url: str) -> None:
    raw = redis.Redis.from_url(redis_url)
    stream = keys.events("c-odd")
    raw.xadd(stream, {"event": json.dumps({"type": "compaction.skipped"})})  # no ids at all
    good = {
        "type": "compaction.skipped",
        "event_id": "e2",
        "conversation_id": "c-odd",
        "revision": 2,
        "created_at": "2026-12-01T00:00:00Z",
        "reason": "below",
        "from_the_future": True,
    }
    raw.xadd(stream, {"event": json.dumps(good)})
    client = client_for(redis_url)
    try:
        events = [e for _, e in client.events("c-odd")]
        assert [e.event_id for e in events] == ["e2"]

        async def read() -> list[str]:
            return [e.event_id async for _, e in client.aevents("c-odd")]

        assert asyncio.run(read()) == ["e2"]
    finally:
        client.close()
        raw.close()


# --- waiting for an outcome --------------------------------------------------------------------


def skipped(conversation_id: str, revision: int) -> SkippedEvent:
    return SkippedEvent(
        event_id=f"e-{conversation_id}-{revision}",
        conversation_id=conversation_id,
        revision=revision,
        created_at="2026-12-01T00:00:00Z",
        reason="test",
    )


def test_wait_for_returns_the_outcome_of_the_revision_asked_for(redis_url: str) -> None:
    """An outcome already published counts; an older revision's does not; one published while
    the client waits ends the wait."""
    state = RedisState(connect(redis_url), Settings().redis)
    client = client_for(redis_url)
    try:
        state.publish(skipped("c-wait", 1))
        assert client.wait_for("c-wait", timeout_s=60).revision == 1
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.wait_for, "c-wait", revision=2, timeout_s=120)
            # the waiter is blocked in its read: only the newer revision's outcome ends it
            assert_still_waiting(waiting, state, "c-wait")
            state.publish(skipped("c-wait", 2))
            assert waiting.result(timeout=120).revision == 2
    finally:
        client.close()
        state.client.close()


def assert_still_waiting(
    waiting: concurrent.futures.Future[Any], state: RedisState, conversation_id: str
) -> None:
    """The waiter's blocking XREAD is registered with Redis (it is waiting, not done)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        blocked = int(state.client.info("clients")["blocked_clients"])
        if blocked >= 1:
            assert not waiting.done()
            return
        time.sleep(0.01)
    raise AssertionError(f"no client blocked on {conversation_id}'s events")


def test_wait_for_gives_up_after_its_timeout(redis_url: str) -> None:
    client = client_for(redis_url)
    try:
        with pytest.raises(TimeoutError, match="revision 5 or later of c-none"):
            client.wait_for("c-none", revision=5, timeout_s=0.3)
    finally:
        client.close()


# --- restore: reading the transcript the event names -------------------------------------------


@pytest.fixture
def compacted(
    tmp_path: Path, service_env: tuple[Path, Callable[..., Workers]]
) -> Iterator[tuple[CompletedEvent, dict[str, Any], Workers]]:
    """A conversation compacted by a real worker, whose transcripts go to ``service_env``'s
    directory (A); the event and the snapshot."""
    _, make = service_env
    workers = make()
    workers.start("w1")
    client = workers_client(workers)
    snap = conversation("c-restore", 12)
    client.submit(snap)
    event = client.wait_for("c-restore", revision=snap["revision"], timeout_s=120)
    assert isinstance(event, CompletedEvent), event
    yield event, snap, workers


def client_with_transcripts_in(workers: Workers, directory: Path) -> Client:
    """A client of the workers' Redis whose own transcript store is ``directory``."""
    settings = workers.settings()
    compaction = settings.compaction.model_copy(update={"transcript_dir": str(directory)})
    client = Client(settings.model_copy(update={"compaction": compaction}))
    workers.clients.append(client)
    return client


def test_restore_reads_the_transcript_the_event_names_from_another_directory(
    tmp_path: Path, compacted: tuple[CompletedEvent, dict[str, Any], Workers]
) -> None:
    """The worker wrote into A, the client's own store is B (empty): the event names A, and
    restore reads it from there, in every form the event comes in."""
    event, snap, workers = compacted
    elsewhere = tmp_path / "client-transcripts"
    assert event.compaction.transcript is not None
    assert not event.compaction.transcript.uri.startswith(str(elsewhere))
    client = client_with_transcripts_in(workers, elsewhere)
    printed = cli_events_line(workers, "c-restore", "compaction.completed")
    assert "stream_id" in json.loads(printed)
    for form in (event, event.model_dump(mode="json"), event.to_json(), printed, printed.encode()):
        assert client.restore(form) == snap["messages"]
    assert not elsewhere.exists()  # nothing was written to the client's own store


def cli_events_line(workers: Workers, conversation_id: str, event_type: str) -> str:
    """The line ``compactor events`` prints for the conversation's event of that type."""
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "events", conversation_id],
        cwd=REPO_ROOT,
        env=workers.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return next(line for line in proc.stdout.splitlines() if event_type in line)


def test_restore_prefers_the_configured_store_and_checks_every_copy(
    tmp_path: Path, compacted: tuple[CompletedEvent, dict[str, Any], Workers]
) -> None:
    """A copy in the client's store under the transcript's name is read first (a migrated
    store); a copy with other bytes there is passed over for the one the event names; when
    no copy matches the event's sha256, EventMismatch; when none is anywhere, StorageError."""
    event, snap, workers = compacted
    ref = event.compaction.transcript
    assert ref is not None
    named = Path(ref.uri)
    key = f"{named.parent.name}/{named.name}"
    mine = tmp_path / "client-transcripts"
    (mine / named.parent.name).mkdir(parents=True)
    client = client_with_transcripts_in(workers, mine)

    (mine / key).write_bytes(named.read_bytes())
    named.rename(named.with_suffix(".moved"))  # only the client's copy is left
    assert client.restore(event) == snap["messages"]

    (mine / key).write_bytes(json.dumps({"messages": []}).encode())  # other bytes, same name
    named.with_suffix(".moved").rename(named)
    assert client.restore(event) == snap["messages"]  # from the store the event names

    named.write_bytes(json.dumps({"messages": []}).encode())
    with pytest.raises(EventMismatch, match="sha256"):
        client.restore(event)

    named.unlink()
    (mine / key).unlink()
    with pytest.raises(StorageError, match=key):
        client.restore(event)


def test_restore_refuses_an_event_without_a_transcript_and_a_revision_with_an_event(
    redis_url: str,
) -> None:
    client = client_for(redis_url)
    try:
        with pytest.raises(EventMismatch, match=r"compaction\.skipped event has no transcript"):
            client.restore(skipped("c-x", 1).to_json())
        with pytest.raises(TypeError, match="revision= goes with a conversation id"):
            client.restore(skipped("c-x", 1).model_dump(mode="json"), revision=1)
    finally:
        client.close()


def test_restore_reads_the_store_the_event_names_of_every_kind(
    store_url: str, run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compactor compact`` writes to a store of each kind; a client whose own store is a
    directory of its own restores from the store the event names, with what a host reading
    that store has in its environment (the endpoint, the database user: references carry
    neither credentials nor endpoints)."""
    snap = conversation("c-any-store", 12)
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(snap))
    compacted = run_cli("compact", path, env={"COMPACTOR_TRANSCRIPTS_URL": store_url})
    assert compacted.code == 0, compacted.stderr
    line = next(ln for ln in compacted.stdout.splitlines() if '"compaction.completed"' in ln)
    if store_url.startswith("s3://"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", parse_qs(urlsplit(store_url).query)["endpoint"][0])
    if store_url.startswith("postgresql://"):
        monkeypatch.setenv("PGUSER", "postgres")
    mine = Settings(compaction=CompactionConfig(transcript_dir=tmp_path / "mine"))
    client = Client(with_redis_url(mine, "redis://127.0.0.1:1/0"))  # Redis is not needed
    try:
        assert client.restore(line) == snap["messages"]
    finally:
        client.close()
    assert not (tmp_path / "mine").exists()  # read from the named store, not the client's
