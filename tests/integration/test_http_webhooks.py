"""Webhooks: registration per tenant, signed deliveries retried with backoff, the SSRF guard;
a real ``compactor serve``, Redis, worker and a receiver on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
from support.http_support import KEY_B, Stack
from support.service_support import conversation
from support.webhook_support import Receiver

from worker.api.webhooks import SIGNATURE_HEADER, UnsafeUrl, check_url, sign, verify

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=1)
    try:
        yield r
    finally:
        r.close()


def stack_config() -> str:
    return "[webhooks]\nallow_private = true\nbackoff_s = 0.2\n"


def test_a_registered_webhook_receives_signed_events_retried_after_a_failure(
    stack: Stack, receiver: Receiver
) -> None:
    with stack.http() as a:
        r = a.post("/v1/webhooks", json={"url": receiver.url, "conversation_id": "w-1"})
        assert r.status_code == 201, r.text
        hook = r.json()
        assert hook["id"].startswith("wh_") and hook["secret"].startswith("whsec_")
        listed = a.get("/v1/webhooks").json()
        assert [h["id"] for h in listed] == [hook["id"]] and "secret" not in listed[0]
        other = a.post("/v1/conversations/w-other/snapshots", json=conversation("w-other", 1))
        assert other.status_code == 202
        snap = conversation("w-1", 1, window=100_000)
        assert a.post("/v1/conversations/w-1/snapshots", json=snap).status_code == 202
        got = receiver.wait(2)  # the first attempt answered 500, the second 204
        time.sleep(1.0)
        assert len(receiver.received) == 2  # once delivered, never again
        (h1, b1), (h2, b2) = got
        assert b1 == b2
        assert (h1["x-compactor-attempt"], h2["x-compactor-attempt"]) == ("1", "2")
        assert verify(hook["secret"], h2[SIGNATURE_HEADER.lower()], b2)
        assert not verify("whsec_other", h2[SIGNATURE_HEADER.lower()], b2)
        event = json.loads(b2)
        assert event["conversation_id"] == "w-1"  # the tenant's own id
        assert event["type"] == "compaction.skipped"
    with stack.http(key=KEY_B) as b:  # another tenant sees and deletes nothing of acme's
        assert b.get("/v1/webhooks").json() == []
        assert b.delete(f"/v1/webhooks/{hook['id']}").status_code == 404
    with stack.http() as a:
        assert a.delete(f"/v1/webhooks/{hook['id']}").status_code == 204
        assert a.get("/v1/webhooks").json() == []


def test_registration_is_validated(stack: Stack) -> None:
    with stack.http() as a:
        for body in ({"url": "ftp://example.com/x"}, {"url": 5}, {"url": "http://u:p@h/x"}, []):
            r = a.post("/v1/webhooks", json=body)
            assert r.status_code == 422, (body, r.text)
    with stack.http(key=None) as anonymous:
        assert anonymous.post("/v1/webhooks", json={"url": "http://x"}).status_code == 401


def test_private_addresses_are_refused_unless_allowed(
    redis_server: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    other_db = redis_server.rsplit("/", 1)[0] + "/10"
    guarded = Stack(tmp_path_factory.mktemp("guarded"), other_db)
    try:
        guarded.start(workers=False)
        with guarded.http() as a:
            for url in ("http://127.0.0.1:9/x", "http://localhost/x", "http://[::1]/x"):
                r = a.post("/v1/webhooks", json={"url": url})
                assert r.status_code == 422 and r.json()["error"] == "unsafe_url", r.text
    finally:
        guarded.stop()


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "gopher://example.com/",
    ],
)
def test_check_url_refuses_inward_addresses(url: str) -> None:
    with pytest.raises(UnsafeUrl):
        asyncio.run(check_url(url, allow_private=False))


def test_signature_is_hmac_sha256_over_timestamp_and_body() -> None:
    import hashlib
    import hmac

    header = sign("s3cret", 1700000000, b'{"a":1}')
    mac = hmac.new(b"s3cret", b'1700000000.{"a":1}', hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={mac}"
    assert not verify("s3cret", header, b'{"a":1}')  # too old
    assert verify("s3cret", sign("s3cret", int(time.time()), b"x"), b"x")
