"""The webhook guard and sender, and ``verify``: IPv6 forms that embed a refused IPv4 address,
deliveries pinned to the address the guard checked (plain HTTP and TLS receivers on loopback),
and a receiver's signature check that answers every malformed header False."""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.webhook_support import Receiver

from worker.api import webhooks
from worker.api.webhooks import (
    UnsafeUrl,
    check_url,
    embedded_ipv4,
    post_pinned,
    refusal,
    sign,
    verify,
)

# --- IPv6 forms embedding an IPv4 address -------------------------------------------------------

EMBEDDING_REFUSED = {
    "NAT64 of loopback": ("64:ff9b::7f00:1", "127.0.0.1"),
    "NAT64 of cloud metadata": ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
    "NAT64 of a private address": ("64:ff9b::c0a8:101", "192.168.1.1"),
    "6to4 of loopback": ("2002:7f00:1::1", "127.0.0.1"),
    "6to4 of cloud metadata": ("2002:a9fe:a9fe::", "169.254.169.254"),
    "IPv4-compatible loopback": ("::7f00:1", "127.0.0.1"),
    "IPv4-compatible private": ("::a00:1", "10.0.0.1"),
    "IPv4-translated loopback": ("::ffff:0:7f00:1", "127.0.0.1"),
    "IPv4-mapped private": ("::ffff:10.0.0.1", "10.0.0.1"),
    # Teredo: server 65.54.227.120, client 127.0.0.1 XOR-ed into the last 32 bits
    "Teredo client loopback": ("2001:0:4136:e378:8000:63bf:80ff:fffe", "127.0.0.1"),
}


@pytest.mark.parametrize("address, inner", EMBEDDING_REFUSED.values(), ids=EMBEDDING_REFUSED)
def test_ipv6_literals_embedding_a_refused_ipv4_are_refused(address: str, inner: str) -> None:
    ip = ipaddress.IPv6Address(address)
    assert ipaddress.IPv4Address(inner) in embedded_ipv4(ip)
    why = refusal(ip)
    assert why is not None and inner in why
    with pytest.raises(UnsafeUrl, match=inner.replace(".", r"\.")):
        asyncio.run(check_url(f"http://[{address}]:8080/hook", allow_private=False))


def test_local_use_nat64_is_refused_whatever_it_embeds() -> None:
    for address in ("64:ff9b:1::808:808", "64:ff9b:1:ffff::1"):
        assert refusal(ipaddress.IPv6Address(address)) == "a local-use NAT64 address"


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808", "2002:808:808::1"],
)
def test_public_addresses_and_forms_embedding_them_are_allowed(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_urls_that_cannot_be_called_are_refused_with_a_reason() -> None:
    for url, reason in (
        ("http://[::1", "not a valid URL"),
        ("http://h:99999/x", "out of range"),
        ("ftp://example.com/", "http or https"),
        ("http://user:pw@example.com/", "credentials"),
        ("http://nothing.invalid/", "does not resolve"),
    ):
        with pytest.raises(UnsafeUrl, match=reason):
            asyncio.run(check_url(url, allow_private=True))


# --- deliveries pinned to the checked address ---------------------------------------------------


class Resolver:
    """Stands in for DNS (not ours) in the guard's one lookup: answers ``answers`` in turn
    (the last one from then on), and counts the lookups."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = [[ipaddress.ip_address(a) for a in answer] for answer in answers]
        self.lookups: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[Any]:
        self.lookups.append((host, port))
        return self.answers[min(len(self.lookups), len(self.answers)) - 1]


async def _deliver(url: str, client: httpx.AsyncClient, *, allow_private: bool) -> int:
    target = await check_url(url, allow_private=allow_private)
    reply = await post_pinned(client, target, b'{"a": 1}', {"Content-Type": "application/json"})
    return reply.status_code


def test_the_sender_connects_to_the_checked_address_and_never_looks_up_again(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # .invalid never resolves (RFC 6761): a sender that looked the name up again would fail.
    # After the check the name "rebinds" to an address nothing listens on.
    resolver = Resolver(["127.0.0.1"], ["192.0.2.1"])
    monkeypatch.setattr(webhooks, "resolve", resolver)
    url = f"http://hooks.invalid:{receiver.port}/hook"

    async def run() -> int:
        async with httpx.AsyncClient(timeout=30) as client:
            return await _deliver(url, client, allow_private=True)

    assert asyncio.run(run()) == 204
    assert resolver.lookups == [("hooks.invalid", receiver.port)]  # one lookup: the guard's
    assert receiver.hosts_and_bodies() == [(f"hooks.invalid:{receiver.port}", b'{"a": 1}')]


def test_a_name_that_rebinds_inward_is_refused_at_the_next_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolver = Resolver(["93.184.216.34"], ["10.0.0.1"], ["2002:a9fe:a9fe::1"])
    monkeypatch.setattr(webhooks, "resolve", resolver)
    target = asyncio.run(check_url("https://hooks.example.test/x", allow_private=False))
    assert target.addresses == (ipaddress.ip_address("93.184.216.34"),)
    assert str(target.at(target.addresses[0])) == "https://93.184.216.34/x"
    for inner in ("10.0.0.1", "169.254.169.254"):
        with pytest.raises(UnsafeUrl, match=inner.replace(".", r"\.")):
            asyncio.run(check_url("https://hooks.example.test/x", allow_private=False))


def test_the_next_checked_address_is_tried_when_one_refuses_connections(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 127.0.0.2 is loopback too, but the receiver listens on 127.0.0.1 only
    monkeypatch.setattr(webhooks, "resolve", Resolver(["127.0.0.2", "127.0.0.1"]))

    async def run() -> int:
        async with httpx.AsyncClient(timeout=30) as client:
            return await _deliver(
                f"http://hooks.invalid:{receiver.port}/", client, allow_private=True
            )

    assert asyncio.run(run()) == 204
    assert len(receiver.received) == 1


def _certificates(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key): a throwaway CA and a certificate
    for the DNS name ``name`` only, made with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl CLI to make a test certificate")
    ca_key, ca, key, csr, cert, ext = (
        directory / f for f in ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem", "ext.cnf")
    )
    ext.write_text(f"subjectAltName=DNS:{name}\n")
    for step in (  # (tmp_path has no spaces)
        f"req -x509 -newkey rsa:2048 -nodes -keyout {ca_key} -out {ca} -days 1"
        " -subj /CN=compactor-test-ca",
        f"req -newkey rsa:2048 -nodes -keyout {key} -out {csr} -subj /CN={name}",
        f"x509 -req -in {csr} -CA {ca} -CAkey {ca_key} -CAcreateserial -out {cert} -days 1"
        f" -extfile {ext}",
    ):
        subprocess.run([openssl, *step.split()], capture_output=True, timeout=60, check=True)
    return ca, cert, key


@pytest.mark.parametrize("certified", ["hooks.example.test", "other.example.test"])
def test_a_pinned_tls_delivery_checks_the_certificate_against_the_urls_host(
    certified: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, subprocesses: None
) -> None:
    ca, cert, key = _certificates(tmp_path, certified)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    receiver = Receiver(tls=server_tls)
    monkeypatch.setattr(webhooks, "resolve", Resolver(["127.0.0.1"]))
    url = f"https://hooks.example.test:{receiver.port}/hook"

    async def run() -> int:
        trusted = ssl.create_default_context(cafile=str(ca))
        async with httpx.AsyncClient(timeout=30, verify=trusted) as client:
            return await _deliver(url, client, allow_private=True)

    try:
        if certified == "hooks.example.test":
            assert asyncio.run(run()) == 204
            assert receiver.hosts_and_bodies() == [
                (f"hooks.example.test:{receiver.port}", b'{"a": 1}')
            ]
        else:  # the address answered, with a certificate for another name: refused
            with pytest.raises(httpx.ConnectError, match="certificate"):
                asyncio.run(run())
            assert receiver.received == []
        assert receiver.server_names[:1] == ["hooks.example.test"]  # SNI: the URL's host
    finally:
        receiver.close()


# --- verify ---------------------------------------------------------------------------------


def _valid(secret: str, body: bytes) -> str:
    return sign(secret, int(time.time()), body)


def test_verify_accepts_its_own_signature_and_refuses_hostile_headers() -> None:
    body = b'{"type": "compaction.completed"}'
    now = int(time.time())
    good = sign("whsec_x", now, body)
    mac = good.split("v1=")[1]
    assert verify("whsec_x", good, body)
    assert verify("whsec_x", f"v1={mac},t={now}", body)  # order does not matter
    hostile = [
        f"t={now},v1={'é' * 64}",  # non-ASCII v1 (compare_digest raised TypeError)
        f"t={now},v1=ａ{mac[1:]}",  # a fullwidth letter
        f"t={'9' * 400},v1={mac}",  # 400 digits (float conversion overflowed)
        f"t={'9' * 5000},v1={mac}",  # past int()'s digit limit
        f"t={'٣' * 10},v1={mac}",  # Arabic-Indic digits, which int() reads
        f"t=-{now},v1={mac}",
        f"t={now}",
        f"v1={mac}",
        "",
        ",,,=,=",
        f"t={now},t={now},v1={mac}",  # a repeated part
        f"t={now},v1={mac},v1={mac}",
        f"t={now},v1={mac.upper()}",
        f"t={now},v1={mac[:-1]}",
        f"t= {now},v1={mac}",
        f"t={now}.0,v1={mac}",
        good + "\x00",
    ]
    for header in hostile:
        assert verify("whsec_x", header, body) is False, header
    wrong_types: list[tuple[Any, Any, Any]] = [
        (None, good, body),
        ("whsec_x", None, body),
        ("whsec_x", good.encode(), body),
        ("whsec_x", good, body.decode()),
        (b"whsec_x", good, body),
        ("whsec_x", ["t", now], body),
        ("whsec_x", good, None),
    ]
    for secret, header, data in wrong_types:
        assert verify(secret, header, data) is False, (secret, header, data)
    assert verify("whsec_x", good, body, tolerance_s="300") is False  # type: ignore[arg-type]
    assert verify("whsec_x", good, body, tolerance_s=float("nan")) is False
    assert verify("\ud800", good, body) is False  # a secret that cannot be encoded


@settings(max_examples=300, deadline=None)
@given(secret=st.text(), header=st.text(), body=st.binary())
def test_verify_answers_any_text_with_a_bool(secret: str, header: str, body: bytes) -> None:
    assert verify(secret, header, body) in (True, False)


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(min_size=1),
    body=st.binary(),
    t=st.one_of(
        st.integers(min_value=-(10**500), max_value=10**500).map(str),
        st.text(alphabet=st.characters(categories=["Nd", "No"]), min_size=1, max_size=600),
    ),
    v1=st.one_of(st.text(), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)),
    junk=st.lists(st.tuples(st.text(), st.text()), max_size=3),
)
def test_verify_refuses_forged_or_malformed_parts(
    secret: str, body: bytes, t: str, v1: str, junk: list[tuple[str, str]]
) -> None:
    # v1 was not computed with the secret (a 1 in 2**256 chance to match): always False
    header = ",".join([f"t={t}", f"v1={v1}", *(f"{k}={v}" for k, v in junk)])
    assert verify(secret, header, body) is False


@settings(max_examples=200, deadline=None)
@given(secret=st.text(min_size=1), body=st.binary(), flip=st.integers(min_value=0))
def test_verify_accepts_exactly_the_signature_of_the_secret_and_body(
    secret: str, body: bytes, flip: int
) -> None:
    header = _valid(secret, body)
    assert verify(secret, header, body)
    assert not verify(secret + "x", header, body)
    assert not verify(secret, header, body + b"x")
    position = header.index("v1=") + 3 + flip % 64
    changed = "0" if header[position] != "0" else "1"
    assert not verify(secret, header[:position] + changed + header[position + 1 :], body)
    stale = sign(secret, int(time.time()) - 3600, body)
    assert not verify(secret, stale, body)
