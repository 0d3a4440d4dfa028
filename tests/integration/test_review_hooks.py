"""Review hooks: a webhook subscribed to ``compaction.proposed`` decides a held compaction by
its signed answer within ``[webhooks] review_deadline_s``; a silent hook, or one whose answer
is not signed with its secret, gets its default. A real ``compactor serve``, Redis, worker and
receivers on loopback."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from support.http_support import Stack
from support.inspector_support import submit, wait_for_type
from support.service_support import conversation

from worker.api.webhooks import SIGNATURE_HEADER, Answer, decided, read_answer, sign, verify
from worker.wire.events import SUMMARY_MARKER

pytestmark = pytest.mark.slow

# What a receiver answers to a proposal: (status, the answer's JSON or None for no body,
# the secret to sign it with or None to leave it unsigned). None: it never answers.
Policy = Callable[[dict[str, Any], str], tuple[int, dict[str, Any] | None, str | None] | None]


class ReviewReceiver:
    """A review hook: answers each delivery as ``policy`` says, signed (or not) by it."""

    def __init__(self, policy: Policy) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.secret = ""
        self.silence = threading.Event()  # set at the end: a silent receiver lets go
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                answer = policy(json.loads(body), outer.secret)
                if answer is None:
                    outer.silence.wait(120)
                    return
                status, doc, secret = answer
                payload = b"" if doc is None else json.dumps(doc).encode()
                self.send_response(status)
                if secret is not None:
                    self.send_header(SIGNATURE_HEADER, sign(secret, int(time.time()), payload))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                del format, args

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/review"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.silence.set()
        self.server.shutdown()
        self.server.server_close()


def stack_config() -> str:
    return """auto_compact_threshold_tokens = 4000
auto_compact_threshold_percent = "none"
review_tenants = ["acme"]
[webhooks]
allow_private = true
review_deadline_s = 2
review_default = "reject"
"""


@pytest.fixture
def receivers() -> Iterator[list[ReviewReceiver]]:
    made: list[ReviewReceiver] = []
    try:
        yield made
    finally:
        for r in made:
            r.close()


def hook_for(
    stack: Stack,
    receivers: list[ReviewReceiver],
    conversation_id: str,
    policy: Policy,
    **extra: Any,
) -> ReviewReceiver:
    receiver = ReviewReceiver(policy)
    receivers.append(receiver)
    with stack.http() as client:
        r = client.post(
            "/v1/webhooks",
            json={
                "url": receiver.url,
                "conversation_id": conversation_id,
                "types": ["compaction.proposed"],
                **extra,
            },
        )
        assert r.status_code == 201, r.text
    receiver.secret = r.json()["secret"]
    return receiver


def outcome(stack: Stack, conversation_id: str, kind: str) -> tuple[dict[str, Any], list[Any]]:
    events = wait_for_type(stack, conversation_id, kind)
    return next(e for e in events if e["type"] == kind), events


def applied(stack: Stack, conversation_id: str, messages: list[dict[str, Any]]) -> Any:
    with stack.http() as client:
        r = client.post(
            f"/v1/conversations/{conversation_id}/compacted", json={"messages": messages}
        )
        assert r.status_code == 200, r.text
        return r.json()


def test_a_webhook_veto_within_the_deadline_blocks_the_compaction(
    stack: Stack, receivers: list[ReviewReceiver]
) -> None:
    def veto(event: dict[str, Any], secret: str) -> Any:
        return 200, {"event_id": event["event_id"], "decision": "reject", "reason": "no"}, secret

    receiver = hook_for(stack, receivers, "k-veto", veto)
    snap = conversation("k-veto", 12)
    submit(stack, snap)
    declined, events = outcome(stack, "k-veto", "compaction.declined")
    proposed = next(e for e in events if e["type"] == "compaction.proposed")
    assert declined["proposal_event_id"] == proposed["event_id"]
    assert declined["declined_by"] == "webhook" and declined["reason"] == "no"
    assert "compaction.completed" not in {e["type"] for e in events}
    assert applied(stack, "k-veto", snap["messages"])["applied"] == 0
    # our request was signed with the hook's secret, and it was the proposal
    headers, body = receiver.received[0]
    assert verify(receiver.secret, headers[SIGNATURE_HEADER.lower()], body)
    assert json.loads(body)["event_id"] == proposed["event_id"]
    assert headers["x-compactor-review-deadline"] == "2"


def test_a_webhook_approves_with_an_edit(stack: Stack, receivers: list[ReviewReceiver]) -> None:
    def edit(event: dict[str, Any], secret: str) -> Any:
        answer = {"event_id": event["event_id"], "decision": "approve", "summary": "Edited."}
        return 200, answer, secret

    hook_for(stack, receivers, "k-edit", edit)
    snap = conversation("k-edit", 12)
    submit(stack, snap)
    done, _events = outcome(stack, "k-edit", "compaction.completed")
    assert done["approved_by"] == "webhook"
    summary = done["compaction"]["summary"]
    assert summary["edited"] and summary["text"].startswith(f"{SUMMARY_MARKER}\nEdited.")
    assert summary["fidelity"]["checked"] > 0
    result = applied(stack, "k-edit", snap["messages"])
    assert result["applied"] == 1
    assert any(m.get("content") == summary["text"] for m in result["messages"])


def test_a_silent_hook_follows_its_default(stack: Stack, receivers: list[ReviewReceiver]) -> None:
    receiver = hook_for(
        stack, receivers, "k-silent", lambda _event, _secret: None, review_default="approve"
    )
    submit(stack, conversation("k-silent", 12))
    done, events = outcome(stack, "k-silent", "compaction.completed")
    assert done["approved_by"] == "default"
    assert receiver.received  # it was asked, and said nothing
    assert "compaction.declined" not in {e["type"] for e in events}


def test_an_answer_not_signed_with_the_secret_follows_the_configured_default(
    stack: Stack, receivers: list[ReviewReceiver]
) -> None:
    def forged(event: dict[str, Any], _secret: str) -> Any:
        return 200, {"event_id": event["event_id"], "decision": "approve"}, "whsec_not-its-own"

    hook_for(stack, receivers, "k-forged", forged)
    submit(stack, conversation("k-forged", 12))
    declined, events = outcome(stack, "k-forged", "compaction.declined")
    assert declined["declined_by"] == "default"  # [webhooks] review_default = "reject"
    assert "compaction.completed" not in {e["type"] for e in events}


def test_answers_are_read_strictly_and_a_veto_wins() -> None:
    secret, event_id = "whsec_x", "e" * 32

    def answer(doc: Any, *, key: str = secret, status: int = 200) -> Answer | None:
        body = json.dumps(doc).encode()
        headers = httpx.Headers({SIGNATURE_HEADER: sign(key, int(time.time()), body)})
        return read_answer(secret, event_id, status, headers, body)

    ok = {"event_id": event_id, "decision": "approve"}
    assert answer(ok) == Answer("approve", "webhook")
    assert answer(ok, key="whsec_y") is None
    assert answer(ok, status=500) is None
    assert answer(ok | {"event_id": "f" * 32}) is None  # an answer about another proposal
    assert answer(ok | {"decision": "maybe"}) is None
    assert answer(ok | {"summary": 5}) is None
    assert answer([ok]) is None
    unsigned = json.dumps(ok).encode()
    assert read_answer(secret, event_id, 200, httpx.Headers(), unsigned) is None
    veto = Answer("reject", "webhook", reason="no")
    edit = Answer("approve", "webhook", summary="s")
    assert decided([Answer("approve", "default"), edit, veto]) == veto
    assert decided([Answer("approve", "webhook"), edit]) == edit


def test_a_review_default_is_approve_or_reject(
    stack: Stack, receivers: list[ReviewReceiver]
) -> None:
    receiver = ReviewReceiver(lambda _event, _secret: (204, None, None))
    receivers.append(receiver)
    with stack.http() as client:
        r = client.post("/v1/webhooks", json={"url": receiver.url, "review_default": "maybe"})
        assert r.status_code == 422 and "review_default" in r.json()["message"], r.text
        r = client.post("/v1/webhooks", json={"url": receiver.url, "review_default": "approve"})
        assert r.status_code == 201, r.text
        listed = {h["id"]: h for h in client.get("/v1/webhooks").json()}
        assert listed[r.json()["id"]]["review_default"] == "approve"
        assert client.delete(f"/v1/webhooks/{r.json()['id']}").status_code == 204
