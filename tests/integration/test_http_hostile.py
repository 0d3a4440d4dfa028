"""Hostile path, query and header values on every route of ``compactor serve``, stream ids out
of range, and what a tenant is shown of its events (its own ids, a transcript reference the API
resolves, never where the service keeps its data). A real ``compactor serve``, Redis, a worker
and a webhook receiver on loopback."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

import httpx
import pytest
from support.http_support import KEY_A, KEY_B, Stack, wait_events
from support.service_support import client_for, conversation
from support.webhook_support import Receiver

from worker.api.auth import STORAGE_FAILED, Tenant
from worker.api.proxy import ROUTES as PROXY_ROUTES
from worker.api.spec import openapi
from worker.client import apply_compaction
from worker.wire.events import CompletedEvent

pytestmark = pytest.mark.slow

CONV = "h-1"  # acme's conversation, compacted once (the ``compacted`` fixture)
U64 = 2**64 - 1


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def stack_config() -> str:
    # Generous connection timeouts: the one-connection test must not depend on how fast the
    # test process sends its next request on a busy machine.
    return (
        "[http]\nmax_body_bytes = 1000000\nsse_keepalive_s = 1.0\n"
        "keep_alive_timeout_s = 600\nheader_timeout_s = 600\n"
        "[webhooks]\nallow_private = true\nbackoff_s = 0.2\n"
    )


@pytest.fixture(scope="module")
def compacted(stack: Stack, receiver: Receiver) -> dict[str, Any]:
    """acme's h-1, compacted once, with two webhooks registered for it before it was
    submitted: the receiver's address, and its name (localhost)."""
    snap = conversation(CONV, 12)
    with stack.http() as client:
        for url in (receiver.url, receiver.url.replace("127.0.0.1", "localhost")):
            hook = {"url": url, "conversation_id": CONV}
            assert client.post("/v1/webhooks", json=hook).status_code == 201
        r = client.post(f"/v1/conversations/{CONV}/snapshots", json=snap)
        assert r.status_code == 202, r.text
        events = wait_events(client, CONV, until="compaction.completed", timeout_s=120)
    done = next(e for e in events if e["type"] == "compaction.completed")
    return {"snap": snap, "events": events, "done": done}


# --- every route, hostile values, one keep-alive connection --------------------------------

# Raw (already percent-encoded) values, put into the URL as they are.
NUMBERS = {
    "superscript two": "%C2%B2",
    "Arabic-Indic three": "%D9%A3",
    "fullwidth one": "%EF%BC%91",
    "5,000 digits": "9" * 5000,
    "21 digits": "9" * 21,
    "negative": "-1",
    "plus sign": "+1",
    "leading space": "%201",
    "hex": "0x10",
    "decimal": "1.5",
    "NUL": "%00",
    "invalid UTF-8": "%FF",
    "very long": "x" * 8000,
}
STREAM_IDS = {
    **NUMBERS,
    "ms out of range": "99999999999999999999-0",
    "seq out of range": "1-99999999999999999999",
    "one past u64": str(U64 + 1),
    "seq past u64": f"0-{U64 + 1}",
    "empty seq": "1-",
    "two dashes": "1-2-3",
    "dollars": "$$",
    "Arabic-Indic stream id": "%D9%A3-0",
}
CONVERSATION_IDS = {
    "superscript two": "%C2%B2",
    "Arabic-Indic three": "%D9%A3",
    "5,000 digits": "9" * 5000,
    "leading dash": "-1",
    "leading dot": ".hidden",
    "NUL": "%00",
    "newline": "c%0A",
    "space": "a%20b",
    "invalid UTF-8": "%FF",
    "very long": "x" * 8000,
}


@dataclass(frozen=True)
class Case:
    """One request: what it sends and the answer it must get (``status``: one, or the
    documented ones; ``names``: what an error must name, in its message or field)."""

    label: str
    method: str
    path: str
    status: int | tuple[int, ...]
    names: str | None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes | None = None
    content_type: str = "application/json"


def _header_value(raw: str) -> bytes | None:
    """``raw`` decoded as a header value, or None where HTTP cannot carry it (controls, or
    spaces around it, which are not part of a value)."""
    value = unquote_to_bytes(raw)
    controls = any(b < 0x20 or b == 0x7F for b in value)
    return None if controls or value != value.strip(b" ") else value


def cases() -> list[Case]:
    conv = f"/v1/conversations/{CONV}"
    snapshot = json.dumps(conversation("x", 1)).encode()
    sse = (b"accept", b"text/event-stream")
    out: list[Case] = []
    for label, cid in CONVERSATION_IDS.items():
        for method, tail, body in (
            ("POST", "snapshots", snapshot),
            ("GET", "events", None),
            ("GET", "transcripts/1", None),
            ("GET", "messages/u0", None),
            ("POST", "compacted", b'{"messages": []}'),
            ("POST", "compactions/e-1/restore", b"{}"),
            ("POST", "compact", b"{}"),
            ("POST", "compactions/e-1/approve", b"{}"),
            ("POST", "compactions/e-1/reject", b"{}"),
        ):
            path = f"/v1/conversations/{cid}/{tail}"
            out.append(
                Case(f"conversation_id {label}", method, path, 422, "conversation_id", (), body)
            )
        header = _header_value(cid)
        for route in PROXY_ROUTES if header is not None else ():
            # the conversation is checked before anything goes upstream (none runs here)
            proxied = (
                (b"x-compactor-conversation", header),
                (b"x-compactor-key", KEY_A.encode()),
            )
            body = b'{"model": "m", "messages": [], "input": []}'
            name = f"X-Compactor-Conversation {label} {route}"
            out.append(Case(name, "POST", route, 422, "conversation_id", proxied, body))
    for label, value in NUMBERS.items():
        out.append(Case(f"revision {label}", "GET", f"{conv}/transcripts/{value}", 422, "revision"))
        out.append(Case(f"limit {label}", "GET", f"{conv}/events?limit={value}", 422, "limit"))
        out.append(
            Case(f"webhook_id {label}", "DELETE", f"/v1/webhooks/{value}", 422, "webhook_id")
        )
        out.append(
            Case(f"list limit {label}", "GET", f"/v1/conversations?limit={value}", 422, "limit")
        )
    for label, value in {"past MAX_REVISION": str(2**53), "u64": str(U64)}.items():
        out.append(Case(f"revision {label}", "GET", f"{conv}/transcripts/{value}", 422, "revision"))
    for label, value in {"zero": "0", "over 1000": "1001", "empty": ""}.items():
        out.append(Case(f"limit {label}", "GET", f"{conv}/events?limit={value}", 422, "limit"))
    for label, value in {**STREAM_IDS, "empty": ""}.items():
        out.append(Case(f"after {label}", "GET", f"{conv}/events?after={value}", 422, "after"))
        out.append(
            Case(
                f"after {label} (SSE)", "GET", f"{conv}/events?after={value}", 422, "after", (sse,)
            )
        )
    for label, value in STREAM_IDS.items():
        last_event_id = _header_value(value)
        if last_event_id is None:
            continue
        header = (b"last-event-id", last_event_id)
        for accept in ((), (sse,)):
            out.append(
                Case(
                    f"Last-Event-ID {label}{' (SSE)' if accept else ''}",
                    "GET",
                    f"{conv}/events",
                    422,
                    "Last-Event-ID",
                    (header, *accept),
                )
            )
    for label, value in {"not a cursor": "%FF", "no time": ":c-1", "text time": "x:c-1"}.items():
        path = f"/v1/conversations?after={value}"
        out.append(Case(f"list after {label}", "GET", path, 422, "after"))
    for label, value in {"5,000 digits": "9" * 5000, "very long": "x" * 8000}.items():
        out.append(
            Case(f"message_id {label}", "GET", f"{conv}/messages/{value}", 422, "message_id")
        )
    # A message id is any string of 1-256 characters: these are simply not there.
    for label in ("superscript two", "Arabic-Indic three", "negative", "NUL", "invalid UTF-8"):
        path = f"{conv}/messages/{NUMBERS[label]}"
        out.append(Case(f"message_id {label}", "GET", path, 404, "message"))
    # An empty path segment matches no route (and is not redirected): a JSON 404.
    for path in (
        "/v1/conversations//events",
        "/v1/conversations//snapshots",
        f"{conv}/transcripts/",
        f"{conv}/messages/",
        "/v1/webhooks/",
    ):
        method = "POST" if path.endswith("snapshots") else "DELETE" if "webhooks" in path else "GET"
        out.append(Case(f"empty segment {path}", method, path, 404, None))
    # Routes without parameters: unknown query values are ignored, bodies are checked.
    junk = "?after=%FF&limit=%C2%B2&revision=%00"
    out += [
        Case("apply, not an object", "POST", f"/v1/apply{junk}", 422, "messages", (), b"[]"),
        Case("compacted, not an object", "POST", f"{conv}/compacted", 422, "messages", (), b"[]"),
        Case(
            "compacted, unknown format",
            "POST",
            f"{conv}/compacted{junk}",
            422,
            "format",
            (),
            b'{"messages": [], "format": "x"}',
        ),
        Case("webhook url not text", "POST", f"/v1/webhooks{junk}", 422, "url", (), b'{"url": 5}'),
        Case(
            "webhook url unparsable",
            "POST",
            "/v1/webhooks",
            422,
            "url",
            (),
            b'{"url": "http://[::1"}',
        ),
        Case(
            "restore, not an event id",
            "POST",
            f"{conv}/compactions/{'x' * 300}/restore",
            422,
            "event_id",
            (),
            b"{}",
        ),
        Case(
            "restore, reason not text",
            "POST",
            f"{conv}/compactions/e-1/restore",
            422,
            "reason",
            (),
            b'{"reason": 5}',
        ),
        *compact_cases(conv),
        *responses_compact_cases(),
        Case(
            "approve, not an event id",
            "POST",
            f"{conv}/compactions/{'x' * 300}/approve",
            422,
            "event_id",
            (),
            b"{}",
        ),
        Case(
            "approve, summary not text",
            "POST",
            f"{conv}/compactions/e-1/approve",
            422,
            "summary",
            (),
            b'{"summary": 5}',
        ),
        Case(
            "reject, not an event id",
            "POST",
            f"{conv}/compactions/{'x' * 300}/reject",
            422,
            "event_id",
            (),
            b"{}",
        ),
        Case(
            "reject, reason not text",
            "POST",
            f"{conv}/compactions/e-1/reject",
            422,
            "reason",
            (),
            b'{"reason": 5}',
        ),
        Case("conversations, junk query", "GET", "/v1/conversations?revision=%00", 200, None),
        Case("webhooks, junk query", "GET", f"/v1/webhooks{junk}", 200, None),
        Case("healthz, junk query", "GET", f"/healthz{junk}", 200, None),
        Case("openapi, junk query", "GET", f"/openapi.json{junk}", 200, None),
        Case("readyz, junk query", "GET", f"/readyz{junk}", (200, 503), None),  # both JSON
        Case("metrics, junk query", "GET", f"/metrics{junk}", 200, None, content_type="text/plain"),
    ]
    return out


def responses_compact_cases() -> list[Case]:
    """``POST /v1/responses/compact`` (and its proxy path): a bad body or conversation is
    refused naming it, before anything is submitted."""
    route = "/v1/responses/compact"
    out = [
        Case("responses compact, unknown field", "POST", route, 422, "stream", (),
             b'{"model": "m", "input": "x", "stream": true}'),
        Case("responses compact, input", "POST", route, 422, "input", (),
             b'{"model": "m", "input": 5}'),
        Case("responses compact, previous response", "POST", route, 422, "previous_response_id",
             (), b'{"model": "m", "previous_response_id": "r"}'),
        Case("responses compact, not JSON", "POST", route, 400, None, (), b"{nope"),
    ]  # fmt: skip
    body = b'{"model": "m", "input": "x"}'
    for label, cid in CONVERSATION_IDS.items():
        header = _header_value(cid)
        if header is None:
            continue
        named = (b"x-compactor-conversation", header)
        out.append(
            Case(f"responses compact {label}", "POST", route, 422, "X-Compactor-Conversation",
                 (named,), body)
        )  # fmt: skip
        proxied = (named, (b"x-compactor-key", KEY_A.encode()))
        out.append(
            Case(f"proxied responses compact {label}", "POST",
                 "/proxy/openai/v1/responses/compact", 422, "X-Compactor-Conversation",
                 proxied, body)
        )  # fmt: skip
    return out


def compact_cases(conv: str) -> list[Case]:
    """``POST .../compact``: every bad body is refused with its field named (nothing asked)."""
    bodies = {
        "instructions over 2,000 characters": ("instructions", {"instructions": "x" * 2001}),
        "instructions not text": ("instructions", {"instructions": 5}),
        "instructions with a NUL": ("instructions", {"instructions": "a\u0000b"}),
        "unknown field": ("instruction", {"instruction": "keep the tests"}),
        "config not an object": ("config", {"config": [1]}),
        "config operator-only": ("config.transcript_dir", {"config": {"transcript_dir": "/"}}),
        "config unknown key": ("config.nope", {"config": {"nope": 1}}),
        "config raises a cost bound": (
            "config.summary_max_output_tokens",
            {"config": {"summary_max_output_tokens": 10**9}},
        ),
        "tools bad hint": ("tools.grep", {"tools": {"grep": {"compaction": "shred"}}}),
        "not an object": ("body", ["keep"]),
    }
    out = [
        Case(
            f"compact, {label}", "POST", f"{conv}/compact", 422, name, (), json.dumps(doc).encode()
        )
        for label, (name, doc) in bodies.items()
    ]
    out.append(Case("compact, not JSON", "POST", f"{conv}/compact", 400, None, (), b"{nope"))
    return out


def test_the_table_covers_every_route() -> None:
    routes = [(m.upper(), p) for p, ops in openapi()["paths"].items() for m in ops]
    routes += [("POST", path) for path in PROXY_ROUTES]
    sent = {(c.method, c.path.split("?")[0]) for c in cases()}
    for method, template in routes:
        pattern = re.compile(re.sub(r"\\{[a-z_]+\\}", "[^/]+", re.escape(template)))
        assert any(m == method and pattern.fullmatch(p) for m, p in sent), (method, template)


def _client_addr(r: httpx.Response) -> Any:
    return r.extensions["network_stream"].get_extra_info("client_addr")


def test_every_route_answers_hostile_values_in_json_on_one_connection(
    stack: Stack, compacted: dict[str, Any]
) -> None:
    del compacted  # the conversation exists: the parameter, not the conversation, is at fault
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    all_cases = cases()
    with stack.http(limits=limits) as client:
        addresses = set()
        for case in all_cases:
            # header values as bytes: sent as they are, non-ASCII included
            headers = list(case.headers)
            request = client.build_request(
                case.method, case.path, content=case.body, headers=headers
            )
            r = client.send(request)
            statuses = case.status if isinstance(case.status, tuple) else (case.status,)
            assert r.status_code in statuses, (case, r.status_code, r.text[:500])
            assert r.headers["content-type"].startswith(case.content_type), (case, r.text[:200])
            if 400 <= r.status_code < 500:
                body = r.json()
                assert isinstance(body, dict) and body.get("error"), (case, body)
                said = " ".join(str(body.get(k, "")) for k in ("field", "message", "reason"))
                assert case.names is None or case.names in said, (case, body)
            # the same connection still serves the next request
            ok = client.get(f"/v1/conversations/{CONV}/events", params={"limit": "1"})
            assert ok.status_code == 200 and len(ok.json()) == 1, (case, ok.text)
            addresses.add(_client_addr(r))
            addresses.add(_client_addr(ok))
        assert len(addresses) == 1, addresses  # never closed, never a second connection


# --- the defects, one by one ------------------------------------------------------------------


def test_an_out_of_range_stream_id_is_a_422_before_redis_sees_it(
    stack: Stack, compacted: dict[str, Any]
) -> None:
    path = f"/v1/conversations/{CONV}/events"
    sse = {"Accept": "text/event-stream"}
    with stack.http() as client:
        for after in ("99999999999999999999", "99999999999999999999-0", "1-99999999999999999999"):
            r = client.get(path, params={"after": after})
            assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
            assert r.json()["message"].startswith("after: not a stream id")
            # an SSE follower is answered at once, instead of a stream retrying forever
            r = client.get(path, headers=sse | {"Last-Event-ID": after}, timeout=30)
            assert r.status_code == 422, r.text
            assert r.json()["message"].startswith("Last-Event-ID: not a stream id")
        # the largest stream id is valid: nothing comes after it
        top = f"{U64}-{U64}"
        r = client.get(path, params={"after": top})
        assert r.status_code == 200 and r.json() == []
        with client.stream("GET", path, headers=sse | {"Last-Event-ID": top}) as stream:
            assert stream.status_code == 200
            assert next(stream.iter_lines()) == "retry: 1000"
        # and ids of this conversation still page as before
        first = compacted["events"][0]["stream_id"]
        assert client.get(path, params={"after": first}).json() == compacted["events"][1:]


def test_digits_of_other_scripts_never_read_another_revision(
    stack: Stack, compacted: dict[str, Any]
) -> None:
    revision = compacted["done"]["revision"]
    arabic_indic = "".join(chr(0x660 + int(d)) for d in str(revision))
    assert int(arabic_indic) == revision  # what int() alone would have read
    with stack.http() as client:
        r = client.get(f"/v1/conversations/{CONV}/transcripts/{revision}")
        assert r.status_code == 200
        r = client.get(f"/v1/conversations/{CONV}/transcripts/{arabic_indic}")
        assert r.status_code == 422 and r.json()["message"].startswith("revision:"), r.text
        for limit in ("²", "9" * 5000, "١"):
            r = client.get(f"/v1/conversations/{CONV}/events", params={"limit": limit})
            assert r.status_code == 422 and r.json()["message"].startswith("limit:"), r.text


def _sse_events(stack: Stack, path: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` events of an SSE stream."""
    out: list[dict[str, Any]] = []
    with (
        stack.http() as client,
        client.stream("GET", path, headers={"Accept": "text/event-stream"}) as stream,
    ):
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if len(out) == count:
                    break
    return out


def test_a_tenant_is_shown_its_own_ids_and_a_transcript_reference_the_api_resolves(
    stack: Stack, compacted: dict[str, Any], receiver: Receiver
) -> None:
    snap, done = compacted["snap"], compacted["done"]
    revision = done["revision"]
    reference = f"/v1/conversations/{CONV}/transcripts/{revision}"
    # delivered to both hooks, each to an address its URL's host was checked at, with the
    # URL's host in the Host header
    deliveries = receiver.events("compaction.completed", 2)
    port = receiver.url.split(":")[2].split("/")[0]
    assert sorted(host for host, _ in deliveries) == [f"127.0.0.1:{port}", f"localhost:{port}"]
    delivered = deliveries[0][1]
    assert deliveries[1][1] == delivered
    streamed = _sse_events(stack, f"/v1/conversations/{CONV}/events", len(compacted["events"]))
    assert streamed == compacted["events"]
    for shown in (done, delivered, next(e for e in streamed if e["type"] == done["type"])):
        assert shown["conversation_id"] == CONV
        assert shown["compaction"]["transcript"]["uri"] == reference
        text = json.dumps(shown)
        assert "acme:" not in text and str(stack.root) not in text  # no internal id, no path
    assert {k: v for k, v in done.items() if k != "stream_id"} == delivered

    with stack.http() as client:
        # the reference resolves, with the key, to the transcript the event's digest names
        t = client.get(reference)
        assert t.status_code == 200, t.text
        assert t.headers["x-transcript-sha256"] == done["compaction"]["transcript"]["sha256"]
        assert t.json()["conversation_id"] == CONV and t.json()["messages"] == snap["messages"]
        # apply and recall work with the event as shown
        body = {"messages": snap["messages"], "event": done, "conversation_id": CONV}
        a = client.post("/v1/apply", json=body)
        assert a.status_code == 200, a.text
        assert a.json()["messages"] == apply_compaction(snap["messages"], done)
        first = done["compaction"]["first_id"]
        recalled = client.get(f"/v1/conversations/{CONV}/messages/{first}")
        assert recalled.status_code == 200, recalled.text
        assert recalled.json()["conversation_id"] == CONV
    with stack.http(key=KEY_B) as other:  # the same reference names nothing of another tenant
        assert other.get(reference).status_code == 404

    # internal readers keep the event as published: the store's own uri, which restores
    internal = client_for(stack.workers)
    published = [e for _, e in internal.events(f"acme:{CONV}") if isinstance(e, CompletedEvent)]
    assert [e.event_id for e in published] == [done["event_id"]]
    ref = published[0].compaction.transcript
    assert ref is not None and ref.uri.startswith(str(stack.transcripts))
    assert internal.restore(published[0]) == snap["messages"]


def test_tenant_view_of_events_names_no_store() -> None:
    """The shaping alone, for each store's uri and a storage failure's message."""
    acme = Tenant("acme")
    for uri in (
        "/srv/transcripts/acme:c-9/000000000000000007-0123456789abcdef.json",
        "postgresql://db.internal:5432/compactor/transcripts/acme:c-9/000000000000000007-0123456789abcdef.json",
        "s3://bucket/prefix/acme:c-9/000000000000000007-0123456789abcdef.json",
    ):
        doc = {
            "type": "compaction.completed",
            "conversation_id": "acme:c-9",
            "revision": 7,
            "compaction": {"start": 1, "transcript": {"uri": uri, "sha256": "ab", "bytes": 3}},
        }
        shown = acme.event(doc)
        assert shown["conversation_id"] == "c-9"
        assert shown["compaction"] == {
            "start": 1,
            "transcript": {
                "uri": "/v1/conversations/c-9/transcripts/7",
                "sha256": "ab",
                "bytes": 3,
            },
        }
        assert doc["compaction"]["transcript"]["uri"] == uri  # the published event is unchanged
    failed = {
        "type": "compaction.failed",
        "conversation_id": "acme:c-9",
        "revision": 7,
        "reason": "cannot write transcript to postgresql://db.internal:5432/compactor/t: down",
        "error": {"code": "storage_unavailable", "message": "cannot write ... db.internal"},
    }
    shown = acme.event(failed)
    assert shown["reason"] == shown["error"]["message"] == STORAGE_FAILED
    conflict = failed | {
        "reason": "a transcript of acme:c-9 exists",
        "error": {"code": "transcript_conflict", "message": "a transcript of acme:c-9 exists"},
    }
    shown = acme.event(conflict)
    assert shown["reason"] == shown["error"]["message"] == "a transcript of c-9 exists"
