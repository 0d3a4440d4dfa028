"""Signing in to the inspector (``/ui``) with plain httpx, as a browser without JavaScript
would: the login form's token, the session cookie, the CSRF token of a page's forms."""

from __future__ import annotations

import contextlib
import html
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx

from support.http_support import Stack

_LOGIN_TOKEN = re.compile(r'name="login_token" value="([^"]+)"')
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def browser(stack: Stack, **kw: Any) -> httpx.Client:
    """A client that asks for pages (Accept: text/html) and keeps cookies (``kw``: more of
    httpx.Client's arguments)."""
    return httpx.Client(
        base_url=stack.base,
        headers={"Accept": "text/html"},
        timeout=30,
        follow_redirects=False,
        **kw,
    )


@contextlib.contextmanager
def sign_in(stack: Stack, key: str, **kw: Any) -> Iterator[httpx.Client]:
    """A browser signed in with ``key`` (closed at the end of the block)."""
    with browser(stack, **kw) as client:
        _sign_in(client, key)
        yield client


def _sign_in(client: httpx.Client, key: str) -> None:
    form = client.get("/ui/login")
    assert form.status_code == 200, form.text
    token = _LOGIN_TOKEN.search(form.text)
    assert token is not None
    r = client.post("/ui/login", data={"key": key, "login_token": html.unescape(token.group(1))})
    assert r.status_code == 303, r.text
    assert r.headers["location"] == "/ui/conversations"


def csrf_of(page: str) -> str:
    found = _CSRF.search(page)
    assert found is not None, "no form with a CSRF token on the page"
    return html.unescape(found.group(1))


def wait_for_type(
    stack: Stack, conversation_id: str, kind: str, *, count: int = 1, timeout_s: float = 90
) -> list[dict[str, Any]]:
    """The conversation's events once ``count`` of type ``kind`` are there (polled)."""
    deadline = time.monotonic() + timeout_s
    events: list[dict[str, Any]] = []
    with stack.http() as client:
        while time.monotonic() < deadline:
            r = client.get(f"/v1/conversations/{conversation_id}/events")
            if r.status_code == 200:
                events = r.json()
                if sum(e["type"] == kind for e in events) >= count:
                    return events
            time.sleep(0.1)
    raise AssertionError(f"not {count} {kind} for {conversation_id}: {json.dumps(events)[:2000]}")


def submit(stack: Stack, snapshot: dict[str, Any], key: str | None = None) -> None:
    with stack.http(**({"key": key} if key else {})) as client:
        r = client.post(
            f"/v1/conversations/{snapshot['conversation_id']}/snapshots",
            content=json.dumps(snapshot),
        )
        assert r.status_code == 202, r.text
