"""``compactor serve``: every /v1 endpoint, auth, tenants, SSE resume, health, readiness,
metrics and the spec, against a real uvicorn subprocess, real Redis and a real worker."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from support.http_support import KEY_A, KEY_B, Stack, wait_events
from support.service_support import conversation

from worker.api.spec import DOC, openapi
from worker.client import apply_compaction
from worker.wire.formats import source_ids

pytestmark = pytest.mark.slow


def submit(client: httpx.Client, snap: dict[str, Any]) -> httpx.Response:
    return client.post(
        f"/v1/conversations/{snap['conversation_id']}/snapshots", content=json.dumps(snap)
    )


@pytest.fixture(scope="module")
def compacted(stack: Stack) -> dict[str, Any]:
    """c-1 of tenant acme, compacted once."""
    snap = conversation("c-1", 12)
    with stack.http() as client:
        r = submit(client, snap)
        assert r.status_code == 202, r.text
        assert r.json() == {"status": "queued", "revision": snap["revision"]}
        events = wait_events(client, "c-1", until="compaction.completed")
    return {"snap": snap, "events": events}


def test_health_spec_and_metrics(stack: Stack) -> None:
    with stack.http(key=None) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        spec = client.get("/openapi.json").json()
        assert spec == openapi() == json.loads(DOC.read_text())
        text = client.get("/metrics").text
        assert "# TYPE compactor_snapshots_evaluated_total counter" in text
        assert 'compactor_queue_length{queue="compactor.evaluate"}' in text


def test_readyz_sees_a_worker_of_each_kind(stack: Stack) -> None:
    with stack.http(key=None) as client:
        r = client.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["ready"] is True and r.json()["missing_kinds"] == []


def test_readyz_without_workers_is_503(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # another database of the same Redis: the module's worker is not on its broker
    other_db = redis_server.rsplit("/", 1)[0] + "/9"
    bare = Stack(tmp_path_factory.mktemp("bare"), other_db)
    try:
        bare.start(workers=False)
        with bare.http(key=None) as client:
            r = client.get("/readyz")
            assert r.status_code == 503
            assert r.json()["missing_kinds"] == ["evaluate", "summarize"]
            assert r.json()["redis"] is True
    finally:
        bare.stop()


ROUTES = [
    ("POST", "/v1/conversations/c-1/snapshots"),
    ("GET", "/v1/conversations/c-1/events"),
    ("GET", "/v1/conversations/c-1/transcripts/1"),
    ("GET", "/v1/conversations/c-1/messages/u0"),
    ("POST", "/v1/apply"),
]


@pytest.mark.parametrize("key", [None, "wrong-key-0123456789", KEY_A + "x"])
def test_every_v1_route_needs_a_valid_key(stack: Stack, key: str | None) -> None:
    with stack.http(key=key) as client:
        for method, path in ROUTES:
            r = client.request(method, path, content=b"{}")
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"


def test_submit_events_transcript_recall_and_apply(stack: Stack, compacted: dict[str, Any]) -> None:
    snap, events = compacted["snap"], compacted["events"]
    done = next(e for e in events if e["type"] == "compaction.completed")
    assert done["conversation_id"] == "c-1"  # the external id, not acme:c-1
    assert all(e["stream_id"] for e in events)
    with stack.http() as client:
        # after= pages on from a stream id
        rest = client.get("/v1/conversations/c-1/events", params={"after": events[0]["stream_id"]})
        assert rest.json() == events[1:]
        # the transcript of the compacted revision
        t = client.get(f"/v1/conversations/c-1/transcripts/{done['revision']}")
        assert t.status_code == 200
        assert t.json()["conversation_id"] == "c-1"
        assert t.json()["messages"] == snap["messages"]
        assert client.get("/v1/conversations/c-1/transcripts/999999").status_code == 404
        # recall: a message the compaction replaced, as it was
        c = done["compaction"]
        ids = source_ids(snap["messages"])
        replaced = ids[c["start"] : c["end"]]
        some = replaced[len(replaced) // 2]
        r = client.get(f"/v1/conversations/c-1/messages/{some}")
        assert r.status_code == 200, r.text
        assert r.json()["message"] == snap["messages"][ids.index(some)]
        assert r.json()["event_id"] == done["event_id"]
        kept = ids[-1]  # the protected tail was not replaced
        assert client.get(f"/v1/conversations/c-1/messages/{kept}").status_code == 404
        # apply: the same as the library, and 409 when applied twice
        body = {"messages": snap["messages"], "event": done, "conversation_id": "c-1"}
        a = client.post("/v1/apply", json=body)
        assert a.status_code == 200, a.text
        assert a.json()["messages"] == apply_compaction(snap["messages"], done)
        again = client.post("/v1/apply", json=body | {"messages": a.json()["messages"]})
        assert again.status_code == 409 and again.json()["error"] == "event_mismatch"
        other = client.post("/v1/apply", json=body | {"conversation_id": "c-2"})
        assert other.status_code == 409


def test_submit_is_validated_like_the_client(stack: Stack) -> None:
    good = conversation("c-val", 1)
    with stack.http() as client:
        path = "/v1/conversations/c-val/snapshots"
        r = client.post(path, content=b'{"conversation_id": ')
        assert r.status_code == 400 and r.json()["error"] == "invalid_snapshot"
        r = client.post(path, content=json.dumps(good | {"conversation_id": "c-other"}))
        assert r.status_code == 422 and r.json()["field"] == "conversation_id"
        r = client.post(path, content=json.dumps(good | {"revision": "7"}))
        assert r.status_code == 422 and r.json()["field"] == "revision"
        r = client.post(path, content=json.dumps(good | {"revision": -1}))
        assert r.status_code == 422 and r.json()["field"] == "revision"
        r = client.post(path, content=b"[1, 2]")
        assert r.status_code == 422 and r.json()["field"] == ""
        bad_id = "/v1/conversations/.hidden/snapshots"
        r = client.post(bad_id, content=json.dumps(good | {"conversation_id": ".hidden"}))
        assert r.status_code == 422 and r.json()["field"] == "conversation_id"
        big = conversation("c-val", 3, body=60_000)  # over the 1 MB body limit
        r = client.post(path, content=json.dumps(big))
        assert r.status_code == 413 and r.json()["error"] == "invalid_snapshot"

        def chunks() -> Any:  # no Content-Length: the limit holds for a streamed body too
            for _ in range(20):
                yield b" " * 100_000

        r = client.post(path, content=chunks())
        assert r.status_code == 413
        assert client.get("/v1/conversations/c-never/events").status_code == 404


def test_slow_headers_and_bodies_time_out(stack: Stack) -> None:
    """A body slower than body_timeout_s is answered 408; headers slower than
    header_timeout_s close the connection."""
    import socket
    from urllib.parse import urlsplit

    # a server of its own with a short body timeout
    (stack.root / "slow").mkdir(exist_ok=True)
    bare = Stack(
        stack.root / "slow",
        stack.redis_url,
        extra="[http]\nbody_timeout_s = 1.0\nheader_timeout_s = 1.0",
    )
    try:
        bare.start(workers=False)
        parts = urlsplit(bare.base)
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/conversations/c-slow/snapshots HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + KEY_A.encode() + b"\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            started = time.monotonic()
            reply = sock.recv(4096)
            assert reply.startswith(b"HTTP/1.1 408"), reply
            assert time.monotonic() - started < 5
        # headers trickled in: the connection is closed after header_timeout_s
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            time.sleep(0.5)
            sock.sendall(b"Host: x\r\n")
            assert sock.recv(4096) == b""  # closed, no answer
            assert 0.9 < time.monotonic() - started < 5
    finally:
        bare.stop()


def test_tenants_never_see_each_others_conversations(
    stack: Stack, compacted: dict[str, Any]
) -> None:
    done = next(e for e in compacted["events"] if e["type"] == "compaction.completed")
    some = done["compaction"]["first_id"]
    with stack.http(key=KEY_B) as b:
        assert b.get("/v1/conversations/c-1/events").status_code == 404
        assert b.get(f"/v1/conversations/c-1/transcripts/{done['revision']}").status_code == 404
        assert b.get(f"/v1/conversations/c-1/messages/{some}").status_code == 404
        # globex's own c-1: separate, and answered with its own id
        snap = conversation("c-1", 1, window=100_000)
        assert submit(b, snap).status_code == 202
        mine = wait_events(b, "c-1", until="compaction.skipped")
        assert [e["conversation_id"] for e in mine] == ["c-1"] * len(mine)
        assert "compaction.completed" not in {e["type"] for e in mine}
    with stack.http() as a:  # acme's c-1 still has only its own events
        theirs = a.get("/v1/conversations/c-1/events").json()
        assert "compaction.skipped" not in {e["type"] for e in theirs}
    stored = sorted(p.name for p in stack.transcripts.iterdir())
    assert stored == ["acme:c-1"]


class SseReader:
    """An SSE connection read in a thread: events as (id, data) as they come."""

    def __init__(self, stack: Stack, path: str, last_event_id: str | None = None) -> None:
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self.client = stack.http()
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.comments = 0
        self._cm = self.client.stream("GET", path, headers=headers, timeout=None)
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200
        assert self.response.headers["content-type"].startswith("text/event-stream")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        current: dict[str, str] = {}
        try:
            for line in self.response.iter_lines():
                if line.startswith(":"):
                    self.comments += 1
                elif line.startswith("id: "):
                    current["id"] = line[4:]
                elif line.startswith("data: "):
                    current["data"] = line[6:]
                elif line == "" and "data" in current:
                    self.events.append((current["id"], json.loads(current["data"])))
                    current = {}
        except (httpx.HTTPError, RuntimeError):
            pass  # closed by the test

    def wait(self, count: int, timeout_s: float = 30) -> list[tuple[str, dict[str, Any]]]:
        deadline = time.monotonic() + timeout_s
        while len(self.events) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.events) >= count, self.events
        return self.events

    def drop(self) -> None:
        self.client.close()  # the connection goes away mid-stream


def test_sse_resumes_after_a_dropped_connection(stack: Stack) -> None:
    path = "/v1/conversations/c-sse/events"
    with stack.http() as client:
        assert submit(client, conversation("c-sse", 1, revision=1, window=100_000)).is_success
        first = wait_events(client, "c-sse", until="compaction.skipped")
    reader = SseReader(stack, path)
    seen = reader.wait(len(first))
    assert [sid for sid, _ in seen] == [e["stream_id"] for e in first]
    assert [d for _, d in seen] == first
    time.sleep(1.5)
    assert reader.comments >= 1  # keep-alive comments while idle (sse_keepalive_s = 1)
    reader.drop()
    last_id = seen[-1][0]
    with stack.http() as client:  # events published while nobody listens
        for revision in (2, 3):
            snap = conversation("c-sse", revision, revision=revision, window=100_000)
            assert submit(client, snap).is_success
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                evs = client.get(path).json()
                if any(
                    e["revision"] == revision and e["type"] == "compaction.skipped" for e in evs
                ):
                    break
                time.sleep(0.1)
        everything = client.get(path).json()
    missed = everything[[e["stream_id"] for e in everything].index(last_id) + 1 :]
    assert missed and {e["revision"] for e in missed} == {2, 3}
    resumed = SseReader(stack, path, last_event_id=last_id)
    resumed.wait(len(missed))
    time.sleep(0.5)
    assert [d for _, d in resumed.events] == missed  # nothing missed, nothing repeated
    # and it stays live: a new event arrives on the open stream (counted before submitting:
    # the reader's list grows as soon as the event is published)
    before = len(resumed.events)
    with stack.http() as client:
        assert submit(client, conversation("c-sse", 4, revision=4, window=100_000)).is_success
    live = resumed.wait(before + 1)
    assert live[-1][1]["revision"] == 4
    resumed.drop()
