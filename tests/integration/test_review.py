"""Review before apply against a real ``compactor serve``, Redis and worker: compactions of the
tenant ``acme`` are held (``[compaction] review_tenants``) and published as
``compaction.proposed``; nothing applies them (the ``/compacted`` route the proxy uses, a
``CompactingSession``) until one is approved, over HTTP, the inspector's forms or ``Client``;
an approval may edit the summary (bounded, its facts checked again); a declined one lets the
next snapshot propose again."""

from __future__ import annotations

import html
import json
import subprocess
import sys
import time
import types
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from support.http_support import KEY_A, KEY_B, Stack, first_proxy_turn, proxy_agent
from support.inspector_support import csrf_of, sign_in, submit, wait_for_type
from support.service_support import REPO_ROOT, client_for, conversation

from worker.backend import keys
from worker.client import apply_compaction
from worker.errors import EventMismatch, InvalidInput
from worker.session import CompactingSession
from worker.testing.standin_llm import StandinLLM
from worker.wire.events import SUMMARY_MARKER, CompletedEvent, DeclinedEvent

pytestmark = pytest.mark.slow

# The commit before review before apply: its events module is an older reader.
OLDER_VERSION = "502a95b"
AGENT_KEY = "sk-agent-own-key-0123456789"


LLM_KEY = AGENT_KEY  # the stand-in demands the agent's own key


def stack_config(llm: StandinLLM) -> str:
    return f"""auto_compact_threshold_tokens = 4000
auto_compact_threshold_percent = "none"
review_tenants = ["acme"]
[proxy]
openai_base_url = "{llm.openai_base_url}"
"""


def post(stack: Stack, conversation_id: str, event_id: str, decision: str, **body: Any) -> Any:
    with stack.http() as client:
        return client.post(
            f"/v1/conversations/{conversation_id}/compactions/{event_id}/{decision}",
            content=json.dumps(body) if body else b"",
        )


def compacted(stack: Stack, conversation_id: str, messages: list[dict[str, Any]]) -> Any:
    with stack.http() as client:
        r = client.post(
            f"/v1/conversations/{conversation_id}/compacted", json={"messages": messages}
        )
        assert r.status_code == 200, r.text
        return r.json()


def proposal_of(stack: Stack, conversation_id: str, count: int = 1) -> dict[str, Any]:
    events = wait_for_type(stack, conversation_id, "compaction.proposed", count=count)
    return [e for e in events if e["type"] == "compaction.proposed"][-1]


def events_of(stack: Stack, conversation_id: str) -> list[dict[str, Any]]:
    with stack.http() as client:
        r = client.get(f"/v1/conversations/{conversation_id}/events")
        assert r.status_code == 200, r.text
        return list(r.json())


def schema_errors(event: dict[str, Any]) -> list[Any]:
    path = REPO_ROOT / f"docs/schemas/{event['type']}.schema.json"
    published = {k: v for k, v in event.items() if k != "stream_id"}
    return list(Draft202012Validator(json.loads(path.read_text())).iter_errors(published))


def _wait(condition: Any, what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s}s")
        time.sleep(0.05)


def test_a_held_compaction_is_not_applied_until_approved(stack: Stack) -> None:
    snap = conversation("h-1", 12)
    submit(stack, snap)
    proposed = proposal_of(stack, "h-1")
    assert schema_errors(proposed) == []
    assert proposed["compaction"]["summary"]["fidelity"]["checked"] > 0
    assert proposed["compaction"]["summary"]["sections"]  # provenance, as a completed one has
    assert "compaction.completed" not in {e["type"] for e in events_of(stack, "h-1")}
    redis = client_for(stack.workers).state.client
    assert redis.get(keys.composed("acme:h-1")) is None
    assert redis.llen(keys.last_compaction("acme:h-1")) == 0
    # what the proxy forwards: the full history, untouched
    held = compacted(stack, "h-1", snap["messages"])
    assert held["applied"] == 0 and held["messages"] == snap["messages"]

    # a later snapshot, over the threshold too, proposes nothing while one is held
    grown = conversation("h-1", 14)
    submit(stack, grown)
    events = wait_for_type(stack, "h-1", "compaction.skipped")
    skip = next(e for e in events if e["type"] == "compaction.skipped")
    assert skip["revision"] == grown["revision"] and "awaits review" in skip["reason"]
    assert sum(e["type"] == "compaction.proposed" for e in events) == 1

    with stack.http(key=KEY_B) as other:  # another tenant's: as if it did not exist
        url = f"/v1/conversations/h-1/compactions/{proposed['event_id']}/approve"
        assert other.post(url).status_code == 404
    assert post(stack, "h-1", "0" * 32, "approve").status_code == 404
    assert post(stack, "h-1", proposed["event_id"], "approve", extra=1).status_code == 422

    r = post(stack, "h-1", proposed["event_id"], "approve")
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["type"] == "compaction.completed" and schema_errors(done) == []
    assert done["proposal_event_id"] == proposed["event_id"] and done["approved_by"] == "api"
    assert done["compaction"] == proposed["compaction"]
    assert done["event_id"] != proposed["event_id"]
    assert events_of(stack, "h-1")[-1]["stream_id"] == done["stream_id"]
    applied = compacted(stack, "h-1", grown["messages"])
    assert applied["applied"] == 1 and applied["event_id"] == done["event_id"]
    assert applied["messages"] == apply_compaction(grown["messages"], done)
    # decided once: a second decision is refused
    again = post(stack, "h-1", proposed["event_id"], "approve")
    assert again.status_code == 409 and again.json()["error"] == "not_held"
    assert post(stack, "h-1", proposed["event_id"], "reject").status_code == 409


def test_a_requested_compaction_is_held_for_review_too(stack: Stack) -> None:
    """Asking for a compaction is no way around review: it is proposed like any other, and a
    second one asked for while it is held is answered with a skip, nothing more proposed."""
    snap = conversation("h-req", 4, body=100)  # under the threshold: nothing proposed by itself
    submit(stack, snap)
    wait_for_type(stack, "h-req", "compaction.skipped")
    with stack.http() as client:
        first = client.post("/v1/conversations/h-req/compact", json={})
        assert first.status_code == 202, first.text
        proposed = proposal_of(stack, "h-req")
        assert proposed["trigger"]["kind"] == "requested"
        assert proposed["trigger"]["request_id"] == first.json()["request_id"]
        second = client.post("/v1/conversations/h-req/compact", json={})
        assert second.status_code == 202, second.text
    request_id = second.json()["request_id"]

    def answered() -> bool:
        return any(
            e["type"] == "compaction.skipped" and e["trigger"]["request_id"] == request_id
            for e in events_of(stack, "h-req")
            if e.get("trigger")
        )

    _wait(answered, "the second request answered")
    events = events_of(stack, "h-req")
    skip = next(e for e in events if (e.get("trigger") or {}).get("request_id") == request_id)
    assert "awaits review" in skip["reason"] and schema_errors(skip) == []
    assert [e["type"] for e in events].count("compaction.proposed") == 1
    assert "compaction.completed" not in {e["type"] for e in events}

    r = post(stack, "h-req", proposed["event_id"], "approve")
    assert r.status_code == 200, r.text
    assert r.json()["compaction"] == proposed["compaction"]


def test_an_edited_summary_is_checked_and_applied(stack: Stack) -> None:
    snap = conversation("h-edit", 12)
    submit(stack, snap)
    proposed = proposal_of(stack, "h-edit")
    url_id = proposed["event_id"]
    too_long = "word " * 20_000
    for bad in ("", "   ", too_long):
        r = post(stack, "h-edit", url_id, "approve", summary=bad)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
    r = post(stack, "h-edit", url_id, "approve", summary=7)
    assert r.status_code == 422

    edit = "The agent read the modules one by one. Keep going with the fix."
    r = post(stack, "h-edit", url_id, "approve", summary=edit)
    assert r.status_code == 200, r.text
    done = r.json()
    summary = done["compaction"]["summary"]
    assert summary["edited"] is True and schema_errors(done) == []
    assert summary["text"].startswith(SUMMARY_MARKER) and edit in summary["text"]
    # what is published says what the edit does: the request's size and the cost recounted
    c, proposed_c = done["compaction"], proposed["compaction"]
    shift = summary["tokens"] - proposed_c["summary"]["tokens"]
    assert c["tokens_after"] == proposed_c["tokens_after"] + shift
    assert done["cost"]["tokens_after"] == c["tokens_after"]
    # the edit kept none of the range's facts (the task, the files read): checked again and
    # repaired, as the pipeline repairs its own summaries
    fidelity = summary["fidelity"]
    assert fidelity["checked"] == proposed["compaction"]["summary"]["fidelity"]["checked"]
    assert fidelity["repaired"] > 0 and fidelity["score"] < 1
    kept = summary["text"].split("## Kept facts", 1)[1]
    assert "src/pkg/mod_" in kept and "(read)" in kept
    # the reviewer's text has no known sources; the repair's section has the facts' messages
    assert [s["title"] for s in summary["sections"]] == ["Kept facts"]
    assert set(summary["sections"][0]["source_ids"]) <= {m["id"] for m in snap["messages"]}
    # the applied history carries the edited summary, not the proposed one
    applied = compacted(stack, "h-edit", snap["messages"])
    assert applied["applied"] == 1
    texts = json.dumps(applied["messages"])
    assert json.dumps(summary["text"])[1:-1] in texts
    assert json.dumps(proposed["compaction"]["summary"]["text"])[1:-1] not in texts
    assert applied["messages"][-2]["content"] == summary["text"]


def test_a_declined_compaction_lets_the_next_snapshot_propose_again(stack: Stack) -> None:
    submit(stack, conversation("h-no", 12))
    first = proposal_of(stack, "h-no")
    r = post(stack, "h-no", first["event_id"], "reject", reason="it drops the plan")
    assert r.status_code == 200, r.text
    declined = r.json()
    assert declined["type"] == "compaction.declined" and schema_errors(declined) == []
    assert declined["proposal_event_id"] == first["event_id"]
    assert declined["reason"] == "it drops the plan" and declined["declined_by"] == "api"
    assert post(stack, "h-no", first["event_id"], "approve").status_code == 409
    assert compacted(stack, "h-no", conversation("h-no", 12)["messages"])["applied"] == 0

    submit(stack, conversation("h-no", 14))
    second = proposal_of(stack, "h-no", count=2)
    assert second["event_id"] != first["event_id"]
    assert second["revision"] > first["revision"]


def test_client_approves_and_rejects(stack: Stack) -> None:
    client = client_for(stack.workers)
    submit(stack, conversation("h-client", 12))
    proposed = proposal_of(stack, "h-client")
    with pytest.raises(EventMismatch):
        client.approve("acme:h-client", "0" * 32)
    with pytest.raises(InvalidInput):
        client.approve("acme:h-client", proposed["event_id"], summary=" ")
    declined = client.reject("acme:h-client", proposed["event_id"], reason="not now")
    assert isinstance(declined, DeclinedEvent) and declined.reason == "not now"
    with pytest.raises(EventMismatch):
        client.approve("acme:h-client", proposed["event_id"])

    submit(stack, conversation("h-client", 14))
    again = proposal_of(stack, "h-client", count=2)
    done = client.approve("acme:h-client", again["event_id"], summary="Reading modules.")
    assert isinstance(done, CompletedEvent) and done.compaction.summary.edited
    assert done.proposal_event_id == again["event_id"]
    outcome = client.wait_for("acme:h-client", timeout_s=5)  # the proposal was the outcome
    assert outcome.type == "compaction.proposed"

    # the proposed summary sent back unchanged (as a form that shows it does) is no edit
    submit(stack, conversation("h-client-same", 12))
    proposed = proposal_of(stack, "h-client-same")
    text = proposed["compaction"]["summary"]["text"]
    same = client.approve("acme:h-client-same", proposed["event_id"], summary=f"{text}\n")
    assert not same.compaction.summary.edited
    unchanged = same.compaction.model_dump(mode="json", exclude={"transcript"})
    assert unchanged == {k: v for k, v in proposed["compaction"].items() if k != "transcript"}


def test_a_session_applies_a_held_compaction_only_once_approved(stack: Stack) -> None:
    history = conversation("unused", 12)["messages"]
    session = CompactingSession(
        "acme:h-session", client=client_for(stack.workers), model="gpt-4.1", context_window=8000
    )
    try:
        session.extend(history)
        assert session.wait_settled(timeout_s=120)
        proposed = proposal_of(stack, "h-session")
        session.drain()
        assert session.compactions == [] and session.messages == history
        r = post(stack, "h-session", proposed["event_id"], "approve")
        assert r.status_code == 200, r.text
        _wait(lambda: bool(session.drain() or session.compactions), "applied")
        assert session.compactions[-1].event_id == r.json()["event_id"]
        assert session.messages == apply_compaction(history, r.json())
    finally:
        session.close()


def test_the_proxy_forwards_the_whole_history_until_approved(stack: Stack, llm: StandinLLM) -> None:
    with proxy_agent(stack, "h-proxy", AGENT_KEY) as client:
        history = first_proxy_turn(client)
        proposed = proposal_of(stack, "h-proxy")
        history.append({"role": "user", "content": "Now run the tests."})
        held = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=history)
        assert llm.requests[-1].body["messages"] == history  # held: nothing applied
        assert held.headers["x-compactor-compactions"] == "0"

        r = post(stack, "h-proxy", proposed["event_id"], "approve")
        assert r.status_code == 200, r.text
        history.append({"role": "assistant", "content": "ok"})
        history.append({"role": "user", "content": "And commit."})
        reply = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=history)
        assert len(llm.requests[-1].body["messages"]) < len(history)  # compacted now
        assert reply.headers["x-compactor-compactions"] == "1"


def test_the_inspector_forms_approve_and_reject(stack: Stack) -> None:
    submit(stack, conversation("h-ui", 12))
    first = proposal_of(stack, "h-ui")
    with sign_in(stack, KEY_A) as browser:
        page = browser.get("/ui/conversations/h-ui").text
        assert "Held for review" in page
        token = csrf_of(page)
        base = f"/ui/conversations/h-ui/proposals/{first['event_id']}"
        r = browser.post(f"{base}/reject", data={"csrf": token, "reason": "too short"})
        assert r.status_code == 303, r.text
        assert r.headers["location"].endswith("?done=rejected")
        submit(stack, conversation("h-ui", 14))
        second = proposal_of(stack, "h-ui", count=2)
        page = browser.get("/ui/conversations/h-ui").text
        base = f"/ui/conversations/h-ui/proposals/{second['event_id']}"
        assert f'action="{base}/approve"' in page
        # its own page shows what it would replace and its summary, editable
        review = browser.get(f"/ui/conversations/h-ui/compactions/{second['event_id']}")
        assert review.status_code == 200 and 'name="summary"' in review.text
        assert html.escape(second["compaction"]["summary"]["text"].splitlines()[0]) in review.text
        edit = "Edited in the inspector: the modules were read."
        r = browser.post(f"{base}/approve", data={"csrf": csrf_of(review.text), "summary": edit})
        assert r.status_code == 303, r.text
        assert r.headers["location"].endswith("?done=approved")
        assert "Held for review" not in browser.get("/ui/conversations/h-ui").text
    events = events_of(stack, "h-ui")
    kinds = [e["type"] for e in events]
    assert kinds.count("compaction.declined") == 1 and kinds[-1] == "compaction.completed"
    summary = events[-1]["compaction"]["summary"]
    assert summary["edited"] and edit in summary["text"]


def test_an_older_reader_reads_a_proposal_as_another_event(stack: Stack) -> None:
    """The events module of the version before review before apply, on the events we publish
    now: each new type reads as its OtherEvent, not as an error or a compaction to apply."""
    try:
        source = subprocess.run(
            ["git", "show", f"{OLDER_VERSION}:worker/wire/events.py"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no git history to read the older version from: {exc}")
    older = types.ModuleType("older_events")
    sys.modules[older.__name__] = older  # pydantic resolves the annotations through it
    try:
        exec(compile(source, "older_events.py", "exec"), older.__dict__)
    finally:
        del sys.modules[older.__name__]
    submit(stack, conversation("h-old", 12))
    proposed = proposal_of(stack, "h-old")
    r = post(stack, "h-old", proposed["event_id"], "reject")
    assert r.status_code == 200, r.text
    for doc in (proposed, r.json()):
        event = older.parse_event({k: v for k, v in doc.items() if k != "stream_id"})
        assert type(event).__name__ == "OtherEvent" and event.type == doc["type"]
        assert event.type not in older.OUTCOME_TYPES
