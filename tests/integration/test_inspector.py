"""The inspector without JavaScript (plain httpx, as a browser with scripts off), the tenant's
conversation listing (``GET /v1/conversations``) and ``compactor show``, against a real
``compactor serve``, Redis and worker: every page reads, sections link to the messages they
were drawn from, sign-in, sessions and CSRF hold, and another tenant's conversation is not
reachable."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from typing import Any

import httpx
import pytest
from support.http_support import KEY_A, KEY_B, Stack
from support.inspector_support import browser, csrf_of, sign_in, submit, wait_for_type
from support.service_support import REPO_ROOT, conversation

from worker.api.pages import message_anchor, path_part
from worker.wire.formats import source_ids

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def compacted(stack: Stack) -> dict[str, Any]:
    """c-1 of acme compacted; c-small of acme skipped; g-1 of globex compacted."""
    snap = conversation("c-1", 12)
    submit(stack, snap)
    submit(stack, conversation("c-small", 1))
    submit(stack, conversation("g-1", 12), key=KEY_B)
    events = wait_for_type(stack, "c-1", "compaction.completed")
    wait_for_type(stack, "c-small", "compaction.skipped")
    with stack.http(key=KEY_B) as client:
        assert client.get("/v1/conversations/g-1/events").status_code == 200
    done = next(e for e in events if e["type"] == "compaction.completed")
    return {"snap": snap, "events": events, "done": done}


def test_the_tenant_lists_its_conversations_newest_activity_first(
    stack: Stack, compacted: dict[str, Any]
) -> None:
    for name in ("p-1", "p-2", "p-3"):  # each one's outcome before the next one's submit
        submit(stack, conversation(name, 1))
        wait_for_type(stack, name, "compaction.skipped")
    with stack.http() as client:
        whole = client.get("/v1/conversations").json()
        ids = [row["conversation_id"] for row in whole["conversations"]]
        assert ids[:3] == ["p-3", "p-2", "p-1"]
        assert {"c-1", "c-small"} <= set(ids) and "g-1" not in ids
        assert whole["next"] is None
        row = next(r for r in whole["conversations"] if r["conversation_id"] == "c-1")
        assert row["last_outcome"]["type"] == "compaction.completed"
        assert row["tokens"] == compacted["done"]["compaction"]["tokens_after"]
        assert row["threshold"] == compacted["done"]["trigger"]["threshold_tokens"]
        assert row["revision"] == compacted["snap"]["revision"]
        # one at a time, each exactly once, in the same order
        paged, after = [], ""
        while True:
            page = client.get("/v1/conversations", params={"limit": 1, "after": after}).json()
            paged += [r["conversation_id"] for r in page["conversations"]]
            if page["next"] is None:
                break
            after = page["next"]
        assert paged == ids
        bad = client.get("/v1/conversations", params={"after": "yesterday"})
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"
        assert client.get("/v1/conversations", params={"limit": 0}).status_code == 422
    with stack.http(key=KEY_B) as client:
        theirs = [
            r["conversation_id"] for r in client.get("/v1/conversations").json()["conversations"]
        ]
        assert theirs == ["g-1"]
    with stack.http(key=None) as client:
        assert client.get("/v1/conversations").status_code == 401


def test_every_page_reads_without_javascript(stack: Stack, compacted: dict[str, Any]) -> None:
    done, snap = compacted["done"], compacted["snap"]
    with sign_in(stack, KEY_A) as client:
        listing = client.get("/ui/conversations")
        assert listing.status_code == 200
        assert 'href="/ui/conversations/c-1"' in listing.text
        assert "g-1" not in listing.text
        for name, value in {
            "content-security-policy": "default-src 'none'; script-src 'self'",
            "x-content-type-options": "nosniff",
            "cache-control": "no-store",
        }.items():
            assert value in listing.headers[name]

        line = client.get("/ui/conversations/c-1")
        assert line.status_code == 200
        assert '<svg class="chart"' in line.text and "<title>revision" in line.text
        assert "compaction.completed" in line.text and "compaction.skipped" not in line.text
        compaction_url = f"/ui/conversations/c-1/compactions/{done['event_id']}"
        assert f'href="{compaction_url}"' in line.text
        assert f'action="{compaction_url}/restore"' in line.text
        small = client.get("/ui/conversations/c-small").text
        assert "compaction.skipped" in small and "tokens &lt;= threshold" in small

        page = client.get(compaction_url)
        assert page.status_code == 200
        c = done["compaction"]
        ids = source_ids(snap["messages"])
        for mid in ids[c["start"] : c["end"]]:  # every replaced message, with its anchor
            assert f'id="{html.escape(message_anchor(mid))}"' in page.text
        sections = [s for s in c["summary"]["sections"] if s["source_ids"]]
        assert sections, "the digest names the sources of its sections"
        for section in sections:
            for mid in section["source_ids"]:
                assert f'href="#{path_part(message_anchor(mid))}"' in page.text
        fidelity = c["summary"]["fidelity"]
        assert f"<td>{fidelity['checked']}</td>" in page.text
        for dropped in c["dropped"]:
            assert html.escape(dropped["kind"]) in page.text
        saved = done["cost"]["saved_tokens_per_turn"]
        assert f"<dt>Cost</dt><dd>{saved:,} tokens saved per later turn" in page.text

        some = ids[c["start"] + 1]
        recalled = client.get(f"/ui/conversations/c-1/messages/{some}")
        assert recalled.status_code == 200
        message = snap["messages"][ids.index(some)]
        shown = re.search(r'<pre class="json">(.*?)</pre>', recalled.text, re.DOTALL)
        assert shown is not None and json.loads(html.unescape(shown.group(1))) == message

        sid = client.cookies.get("cw_ui")
        assert sid
        for text in (listing.text, line.text, page.text, recalled.text):
            assert KEY_A not in text and sid not in text


def test_the_timeline_lists_its_compactions_only_when_asked(
    stack: Stack, compacted: dict[str, Any]
) -> None:
    done = compacted["done"]
    with sign_in(stack, KEY_A) as client:
        small = client.get("/ui/conversations/c-small", params={"show": "compactions"}).text
        assert "No compaction yet" in small and 'class="t-compaction-skipped"' not in small
        assert 'aria-current="page">Compactions only <span class="count">(0)' in small
        every = client.get("/ui/conversations/c-small", params={"show": "all"}).text
        assert 'class="t-compaction-skipped"' in every
        assert '<span class="word">compaction.</span><span class="word">skipped</span>' in every
        line = client.get("/ui/conversations/c-1?show=compactions").text
        assert f'id="e-{done["stream_id"]}" class="t-compaction-completed"' in line
        assert 'data-show="compactions"' in line  # the live rows follow the filter too
        bad = client.get("/ui/conversations/c-1", params={"show": "skips"})
        assert bad.status_code == 422 and "show: all or compactions" in bad.text
    with stack.http() as api:  # the listing counts the compaction the next request carries
        rows = {r["conversation_id"]: r for r in api.get("/v1/conversations").json()[
            "conversations"
        ]}  # fmt: skip
    c = done["compaction"]
    assert rows["c-1"]["compactions"] == 1
    assert rows["c-1"]["tokens_saved"] == c["tokens_before"] - c["tokens_after"]
    assert rows["c-small"]["compactions"] == 0 and rows["c-small"]["tokens_saved"] == 0


def test_signing_in_and_out(stack: Stack, compacted: dict[str, Any]) -> None:
    with browser(stack) as anonymous:
        r = anonymous.get("/ui/conversations/c-1")
        assert r.status_code == 303
        assert r.headers["location"] == "/ui/login?next=/ui/conversations/c-1"
        # a page's data for a script without a session: JSON, not a redirect
        r = anonymous.get("/ui/conversations", headers={"Accept": "application/json"})
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        form = anonymous.get("/ui/login?next=https://evil.example/")
        assert 'name="next" value="/ui/conversations"' in form.text  # never another site
        token = re.search(r'name="login_token" value="([^"]+)"', form.text)
        assert token is not None
        wrong = anonymous.post(
            "/ui/login", data={"key": KEY_A + "x", "login_token": token.group(1)}
        )
        assert wrong.status_code == 401 and "not a valid API key" in wrong.text
        assert "cw_ui" not in wrong.cookies
        stale = anonymous.post("/ui/login", data={"key": KEY_A, "login_token": "forged"})
        assert stale.status_code == 403 and "cw_ui" not in stale.cookies

    with sign_in(stack, KEY_A) as client:
        cookie = client.cookies.jar._cookies  # type: ignore[attr-defined]
        set_cookie = next(
            c
            for domain in cookie.values()
            for path in domain.values()
            for c in path.values()
            if c.name == "cw_ui"
        )
        assert set_cookie.path == "/" and not set_cookie.secure
        assert set_cookie.has_nonstandard_attr("HttpOnly")
        assert set_cookie.get_nonstandard_attr("SameSite") == "strict"
        sid = client.cookies.get("cw_ui")
        page = client.get("/ui/conversations")
        out = client.post("/ui/logout", data={"csrf": csrf_of(page.text)})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    with browser(stack) as replay:  # the old session id is worth nothing now
        replay.cookies.set("cw_ui", sid or "")
        assert replay.get("/ui/conversations").status_code == 303


def test_every_post_needs_the_pages_csrf_token(stack: Stack, compacted: dict[str, Any]) -> None:
    done = compacted["done"]
    action = f"/ui/conversations/c-1/compactions/{done['event_id']}/restore"
    with sign_in(stack, KEY_A) as client:
        token = csrf_of(client.get("/ui/conversations/c-1").text)
        missing = client.post(action, data={})
        assert missing.status_code == 403 and "CSRF" in missing.text
        forged = client.post(action, data={"csrf": "x" * len(token)})
        assert forged.status_code == 403
        elsewhere = client.post(
            action, data={"csrf": token}, headers={"Origin": "https://evil.example"}
        )
        assert elsewhere.status_code == 403
        logout = client.post("/ui/logout", data={})
        assert logout.status_code == 403
        # nothing was restored
        events = client.get(
            "/v1/conversations/c-1/events", headers={"Authorization": f"Bearer {KEY_A}"}
        )
        assert "compaction.reverted" not in {e["type"] for e in events.json()}


def test_another_tenants_conversation_is_not_reachable(
    stack: Stack, compacted: dict[str, Any]
) -> None:
    done = compacted["done"]
    with sign_in(stack, KEY_B) as client:
        token = csrf_of(client.get("/ui/conversations").text)
        base = "/ui/conversations/c-1"
        for path in (
            base,
            f"{base}/compactions/{done['event_id']}",
            f"{base}/messages/u0",
            f"{base}/events",
        ):
            r = client.get(path)
            assert r.status_code == 404, (path, r.status_code)
            assert "c-1" not in client.get("/ui/conversations").text
        r = client.post(f"{base}/compactions/{done['event_id']}/restore", data={"csrf": token})
        assert r.status_code == 404
        # errors for a non-browser are JSON
        r = client.get(base, headers={"Accept": "application/json"})
        assert r.status_code == 404 and r.json()["error"] == "not_found"
    with stack.http() as client:
        kinds = {e["type"] for e in client.get("/v1/conversations/c-1/events").json()}
        assert "compaction.reverted" not in kinds


def test_deciding_a_compaction_that_is_not_held(stack: Stack, compacted: dict[str, Any]) -> None:
    """Nothing is held here (test_review.py holds and decides them): a decision on a
    proposal the conversation never made is a 404 page, and publishes nothing."""
    with sign_in(stack, KEY_A) as client:
        token = csrf_of(client.get("/ui/conversations/c-1").text)
        for decision in ("approve", "reject"):
            r = client.post(
                f"/ui/conversations/c-1/proposals/{'0' * 32}/{decision}", data={"csrf": token}
            )
            assert r.status_code == 404 and "held for review" in r.text
    with stack.http() as client:
        kinds = {e["type"] for e in client.get("/v1/conversations/c-1/events").json()}
        assert not kinds & {"compaction.declined", "compaction.proposed"}


def _show(
    stack: Stack, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "show", *args],
        env=stack.workers.env() | (env or {}),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compactor_show_prints_a_compaction_plain_when_piped(
    stack: Stack, compacted: dict[str, Any]
) -> None:
    done, snap = compacted["done"], compacted["snap"]
    shown = _show(stack, "acme:c-1")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "\033[" not in out  # piped: no colour
    c = done["compaction"]
    assert f"revision {done['revision']}: compaction.completed" in out
    assert f"REPLACED ({c['end'] - c['start']} messages)" in out
    assert f"INSTEAD ({len(c['replacement'])} messages)" in out
    ids = source_ids(snap["messages"])
    for mid in ids[c["start"] : c["end"]]:
        assert f"┌ {mid} · " in out
    for number, section in enumerate(s for s in c["summary"]["sections"] if s["title"]):
        assert section["title"] in out, number
    assert "FIDELITY" in out and "DROPPED" in out
    skipped = _show(
        stack, "acme:c-small", "--revision", str(conversation("c-small", 1)["revision"])
    )
    assert skipped.returncode == 0, skipped.stderr
    assert "compaction.skipped" in skipped.stdout
    missing = _show(stack, "acme:nothing-here")
    assert missing.returncode == 2
    assert json.loads(missing.stderr.splitlines()[-1])["error"] == "usage"


def test_show_is_coloured_on_a_terminal_unless_no_color(
    stack: Stack, compacted: dict[str, Any]
) -> None:
    import pty

    def run(env: dict[str, str]) -> str:
        main, child = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "show", "acme:c-1"],
            env=stack.workers.env() | {"COLUMNS": "160", "TERM": "xterm"} | env,
            cwd=REPO_ROOT,
            stdin=child,
            stdout=child,
            stderr=subprocess.DEVNULL,
        )
        os.close(child)
        chunks = []
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        os.close(main)
        assert proc.wait(timeout=120) == 0
        return b"".join(chunks).decode()

    coloured = run({})
    assert "\033[1m" in coloured and " │ " in coloured  # side by side at 160 columns
    assert "\033[" not in run({"NO_COLOR": "1"})


def test_static_files_are_served_and_nothing_else(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base) as client:
        css = client.get("/ui/static/inspector.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        js = client.get("/ui/static/inspector.js")
        assert js.status_code == 200 and "EventSource" in js.text
        assert client.get("/ui/static/..%2Fapp.py").status_code == 404
        assert client.get("/ui/static/other.js").status_code == 404
