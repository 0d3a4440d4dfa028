"""Compaction on demand, with instructions: ``POST /v1/conversations/{id}/compact``,
``Client.compact_now``, ``CompactingSession.compact`` (and the async one), ``compactor
compact-now`` and the agent's ``compact_history`` tool, against a real ``compactor serve``,
Redis, worker process and the stand-in LLM (which records every request).

Each compacts a conversation far below the threshold: the event is ``compaction.completed``
with ``trigger.kind == "requested"``, the request's id and the instructions' SHA-256; the
instructions are in the LLM's system prompt (after our rules, with the operator's template
first) and nowhere in any event."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import CliRunner
from support.fault_support import UNSET_KEY_ENV
from support.http_support import KEY_B, Stack
from support.inspector_support import submit, wait_for_type
from support.service_support import client_for, conversation

from worker.backend import keys
from worker.client import Client
from worker.config import LLMConfig
from worker.errors import ConfigError, InvalidRequest, NoSnapshot
from worker.session import AsyncCompactingSession, CompactingSession
from worker.summarize import SummaryRequest
from worker.summarize.digest import DigestSummarizer
from worker.summarize.llm import prompt_templates
from worker.summarize.prompt import DEFAULT_TEMPLATE, system_prompt
from worker.testing.standin_llm import StandinLLM
from worker.wire.events import CompactionEvent, CompletedEvent
from worker.wire.formats import to_messages
from worker.wire.requests import MAX_INSTRUCTIONS_CHARS, compact_request

THRESHOLD = 50_000  # far above every conversation here: nothing compacts unless asked
SETTLE_S = 120.0  # generous: the machine is shared
OPERATOR_TEMPLATE = "OPERATOR-TEMPLATE: summarize for the on-call engineer."
ACME_TEMPLATE = "ACME-TEMPLATE: summarize for acme's reviewers."


def stack_config(llm: StandinLLM, root: Path) -> str:
    """The stand-in writes the summaries, with the operator's template and acme's (written
    into the stack's directory here)."""
    (root / "operator.txt").write_text(OPERATOR_TEMPLATE)
    (root / "acme.txt").write_text(ACME_TEMPLATE)
    return f"""auto_compact_threshold_tokens = {THRESHOLD}
auto_compact_threshold_percent = "none"
mode = "prefer_remote"
[llm]
base_url = "{llm.openai_base_url}"
model = "stand-in"
api_key_env = "{UNSET_KEY_ENV}"
max_retries = 1
prompt_file = "{root / "operator.txt"}"
tenant_prompt_files = {{acme = "{root / "acme.txt"}"}}
"""


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def requests_with(llm: StandinLLM, instructions: str) -> list[Any]:
    return [r for r in llm.requests if instructions in r.system_text]


def assert_requested(event: dict[str, Any], request_id: str, instructions: str | None) -> None:
    """A completed compaction of a request, far below the threshold."""
    assert event["type"] == "compaction.completed", event
    trigger = event["trigger"]
    assert trigger["kind"] == "requested"
    assert trigger["request_id"] == request_id
    assert trigger["instructions_sha256"] == (sha256(instructions) if instructions else None)
    assert trigger["projected_tokens"] < trigger["threshold_tokens"] == THRESHOLD
    assert event["compaction"]["tokens_after"] < event["compaction"]["tokens_before"]


def outcome_of(client: Client, conversation_id: str, revision: int, request_id: str) -> Any:
    event = client.wait_for(
        conversation_id, revision=revision, request_id=request_id, timeout_s=SETTLE_S
    )
    return json.loads(event.to_json())


# --- HTTP -------------------------------------------------------------------------------------


def test_http_compacts_on_demand_with_instructions(stack: Stack, llm: StandinLLM) -> None:
    snap = conversation("h-1", 12)
    submit(stack, snap)
    skipped = wait_for_type(stack, "h-1", "compaction.skipped")
    assert [e["type"] for e in skipped if e["type"].startswith("compaction.")] == [
        "compaction.skipped"
    ]
    instructions = "HTTP-FOCUS-7781: keep the failing test names and every mod_3 detail"
    with stack.http() as client:
        r = client.post("/v1/conversations/h-1/compact", json={"instructions": instructions})
    assert r.status_code == 202, r.text
    answer = r.json()
    assert answer["status"] == "requested" and answer["revision"] == snap["revision"]
    assert answer["events"] == "/v1/conversations/h-1/events"

    events = wait_for_type(stack, "h-1", "compaction.completed")
    done = next(e for e in events if e["type"] == "compaction.completed")
    assert_requested(done, answer["request_id"], instructions)
    assert instructions not in json.dumps(events)  # only its hash, in every event
    # the instructions reached the LLM after our rules, the tenant's template first
    sent = requests_with(llm, instructions)
    assert sent, [r.system_text[-300:] for r in llm.requests]
    system = sent[-1].system_text
    assert system.startswith(ACME_TEMPLATE)
    assert system.index("Keep the summary under") < system.index(instructions)
    assert instructions not in sent[-1].user_text  # never mixed into the conversation text


def test_http_compact_without_a_body_and_with_overrides(stack: Stack, llm: StandinLLM) -> None:
    submit(stack, conversation("h-2", 12))
    wait_for_type(stack, "h-2", "compaction.skipped")
    with stack.http() as client:
        r = client.post("/v1/conversations/h-2/compact")  # no body: no instructions
        assert r.status_code == 202, r.text
        first = r.json()
    done = wait_for_type(stack, "h-2", "compaction.completed")[-1]
    assert_requested(done, first["request_id"], None)
    # overrides of what to keep, as a snapshot's: the offline digest this time
    submit(stack, conversation("h-2b", 12))
    wait_for_type(stack, "h-2b", "compaction.skipped")
    llm_calls = len(llm.requests)
    with stack.http() as client:
        r = client.post(
            "/v1/conversations/h-2b/compact",
            json={"instructions": "mod_1", "config": {"mode": "local_only"}},
        )
        assert r.status_code == 202, r.text
    second = wait_for_type(stack, "h-2b", "compaction.completed")[-1]
    assert_requested(second, r.json()["request_id"], "mod_1")
    assert second["compaction"]["summary"]["source"] == "digest"
    assert "## Requested focus" in second["compaction"]["summary"]["text"]
    assert len(llm.requests) == llm_calls  # local_only: no LLM call


def test_http_compact_refusals(stack: Stack) -> None:
    with stack.http() as client:
        r = client.post("/v1/conversations/never-seen/compact", json={})
        assert r.status_code == 404 and r.json()["error"] == "not_found"
    submit(stack, conversation("h-3", 4))
    wait_for_type(stack, "h-3", "compaction.skipped")
    with stack.http(key=KEY_B) as other:  # another tenant's: as if it did not exist
        assert other.post("/v1/conversations/h-3/compact", json={}).status_code == 404
    with stack.http() as client:
        long = "x" * (MAX_INSTRUCTIONS_CHARS + 1)
        r = client.post("/v1/conversations/h-3/compact", json={"instructions": long})
        assert r.status_code == 422 and r.json()["field"] == "instructions", r.text
        r = client.post("/v1/conversations/h-3/compact", json={"instructions": "x", "keep": 1})
        assert r.status_code == 422 and r.json()["field"] == "keep", r.text
    redis = client_for(stack.workers).state.client
    assert redis.get(keys.requested("acme:h-3")) is None  # nothing was asked
    # events are kept longer than the snapshot: once it expired there is nothing to compact
    redis.delete(keys.snapshot("acme:h-3"), keys.latest("acme:h-3"))
    with stack.http() as client:
        r = client.post("/v1/conversations/h-3/compact", json={})
    assert r.status_code == 409 and r.json()["error"] == "no_snapshot", r.text


# --- the client and the CLI ---------------------------------------------------------------------


def test_client_compact_now_uses_the_operator_template_and_notes_the_focus_in_the_digest(
    stack: Stack, llm: StandinLLM
) -> None:
    client = client_for(stack.workers)
    snap = conversation("c-1", 12)
    client.submit(snap)
    assert client.wait_for("c-1", revision=snap["revision"], timeout_s=SETTLE_S).type == (
        "compaction.skipped"
    )
    instructions = "CLIENT-FOCUS-4410 keep what mod_5 printed"
    asked = client.compact_now("c-1", instructions)
    assert asked.revision == snap["revision"] and asked.replaced is None
    done = outcome_of(client, "c-1", asked.revision, asked.request_id)
    assert_requested(done, asked.request_id, instructions)
    sent = requests_with(llm, instructions)
    assert sent and sent[-1].system_text.startswith(OPERATOR_TEMPLATE)  # no tenant: the file's

    # the digest (a snapshot override) notes the focus with the lines it points at, never the
    # instructions themselves
    snap = conversation("c-2", 12)
    client.submit(snap)
    client.wait_for("c-2", revision=snap["revision"], timeout_s=SETTLE_S)
    asked = client.compact_now("c-2", instructions, config={"mode": "local_only"})
    digest = outcome_of(client, "c-2", asked.revision, asked.request_id)
    assert_requested(digest, asked.request_id, instructions)
    text = digest["compaction"]["summary"]["text"]
    assert "## Requested focus" in text and "mod_5" in text.split("## Files touched")[0]
    for conversation_id in ("c-1", "c-2"):
        events = [json.loads(e.to_json()) for _, e in client.events(conversation_id)]
        assert instructions not in json.dumps(events)
    with pytest.raises(InvalidRequest) as caught:
        client.compact_now("c-1", "x" * (MAX_INSTRUCTIONS_CHARS + 1))
    assert caught.value.field == "instructions"
    with pytest.raises(NoSnapshot):
        client.compact_now("c-never-submitted")


def test_a_request_with_nothing_to_compact_is_answered_each_time(stack: Stack) -> None:
    client = client_for(stack.workers)
    snap = conversation("n-1", 0)  # the system prompt, the task and one reply: nothing to fold
    client.submit(snap)
    client.wait_for("n-1", revision=snap["revision"], timeout_s=SETTLE_S)
    seen = set()
    for _ in range(2):
        asked = client.compact_now("n-1", "keep it")
        event = client.wait_for(
            "n-1", revision=asked.revision, request_id=asked.request_id, timeout_s=SETTLE_S
        )
        assert event.type == "compaction.skipped", event
        assert event.reason.startswith("requested, but nothing")
        seen.add(event.event_id)
    assert len(seen) == 2  # each request its own event, not a duplicate of the first


def test_cli_compact_now_waits_for_the_outcome(
    stack: Stack, llm: StandinLLM, run_cli: CliRunner
) -> None:
    client = client_for(stack.workers)
    snap = conversation("cli-1", 12)
    client.submit(snap)
    client.wait_for("cli-1", revision=snap["revision"], timeout_s=SETTLE_S)
    instructions = "CLI-FOCUS-5521 keep the bash commands"
    result = run_cli(
        "compact-now",
        "cli-1",
        "--instructions",
        instructions,
        "--wait",
        str(SETTLE_S),
        env=stack.workers.env(),
    )
    assert result.code == 0, result.stderr
    asked, event = (json.loads(line) for line in result.stdout.splitlines())
    assert asked["status"] == "requested" and asked["revision"] == snap["revision"]
    assert_requested(event, asked["request_id"], instructions)
    assert instructions not in result.stdout
    assert requests_with(llm, instructions)
    assert event["compaction"]["summary"]["instructions_note"] is None  # an LLM followed them
    assert "instructions_not_followed" not in result.stderr
    # the offline digest cannot: the event and the command say so
    other = conversation("cli-2", 12)
    client.submit(other)
    client.wait_for("cli-2", revision=other["revision"], timeout_s=SETTLE_S)
    digest = run_cli(
        "compact-now",
        "cli-2",
        "--instructions",
        instructions,
        "--config-json",
        '{"mode": "local_only"}',
        "--wait",
        str(SETTLE_S),
        env=stack.workers.env(),
    )
    assert digest.code == 0, digest.stderr
    _, done = (json.loads(line) for line in digest.stdout.splitlines())
    assert done["type"] == "compaction.completed", done
    assert "cannot follow instructions" in done["compaction"]["summary"]["instructions_note"]
    warning = json.loads(digest.stderr.splitlines()[-1])
    assert warning["warning"] == "instructions_not_followed"
    # a bad argument: exit 2 with the field named, nothing asked
    bad = run_cli("compact-now", "cli-1", "--config-json", "[", env=stack.workers.env())
    assert bad.code == 2 and json.loads(bad.stderr.splitlines()[-1])["field"] == "config"


def test_a_newer_request_replaces_a_waiting_one_and_is_the_one_kept(stack: Stack) -> None:
    """The request key as the workers see it (no task is sent here, so none takes it)."""
    state = client_for(stack.workers).state
    settings = stack.workers.settings()
    with pytest.raises(NoSnapshot):
        state.store_request("q-1", compact_request(settings))
    state.client.set(keys.latest("q-1"), 7)
    first = state.store_request("q-1", compact_request(settings, instructions="first"))
    assert (first.revision, first.replaced) == (7, None)
    second = state.store_request("q-1", compact_request(settings, instructions="second"))
    assert second.replaced == first.request_id
    assert 0 < state.client.ttl(keys.requested("q-1")) <= settings.redis.snapshot_ttl_s
    taken = state.take_request("q-1")
    assert taken.request is not None and taken.request.instructions == "second"
    assert taken.latest == 7 and taken.payload is None  # (its snapshot key is not set here)
    state.done_request("q-1", first.request_id)  # a worker done with the older one: kept
    assert state.take_request("q-1").request is not None
    state.done_request("q-1", second.request_id)
    assert state.take_request("q-1").request is None
    state.client.delete(keys.latest("q-1"))


# --- sessions and the tool ------------------------------------------------------------------------


def wait_applied(session: CompactingSession, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        request = session.request_messages()
        if len(session.compactions) >= count:
            return request
        time.sleep(0.05)
    raise AssertionError(f"{session.conversation_id}: {session.status}")


def last_requested(session: CompactingSession) -> CompletedEvent:
    event = session.compactions[-1]
    assert event.trigger.kind == "requested"
    return event


def test_session_compact_applies_the_requested_compaction(stack: Stack, llm: StandinLLM) -> None:
    messages = conversation("s-1", 12)["messages"]
    session = CompactingSession("s-1", client=client_for(stack.workers), model="gpt-4.1")
    try:
        session.extend(messages)
        assert session.wait_settled(timeout_s=SETTLE_S)
        before = session.request_messages()
        assert session.compactions == []  # below the threshold
        instructions = "SESSION-FOCUS-9001 keep mod_7"
        asked = session.compact(instructions)
        after = wait_applied(session, 1)
        event = last_requested(session)
        assert event.trigger.request_id == asked.request_id
        assert event.trigger.instructions_sha256 == sha256(instructions)
        assert len(after) < len(before)
        assert requests_with(llm, instructions)
    finally:
        session.close()


def test_the_compact_tool_triggers_a_compaction(stack: Stack, llm: StandinLLM) -> None:
    session = CompactingSession("t-1", client=client_for(stack.workers), model="gpt-4.1")
    try:
        tool = session.compact_tool()
        assert tool.name == "compact_history"
        assert tool.openai["function"]["name"] == tool.name
        assert tool.anthropic["name"] == tool.name and "input_schema" in tool.anthropic
        assert tool.responses["type"] == "function" and tool.responses["name"] == tool.name
        assert "when" in tool.description.lower()  # it says when compacting helps
        assert tool.handler("[1]").startswith("error:")
        assert tool.handler({}).startswith("error:")  # no snapshot yet: said, not raised

        session.extend(conversation("t-1", 12)["messages"])
        assert session.wait_settled(timeout_s=SETTLE_S)
        instructions = "TOOL-FOCUS-3141 keep the command lines"
        answer = tool.handler(json.dumps({"instructions": instructions}))
        assert answer.startswith("Compaction requested"), answer
        wait_applied(session, 1)
        event = last_requested(session)
        assert event.trigger.instructions_sha256 == sha256(instructions)
        assert requests_with(llm, instructions)
    finally:
        session.close()


def test_the_langchain_compact_tool_triggers_a_compaction(stack: Stack, llm: StandinLLM) -> None:
    pytest.importorskip("langchain", reason="the langchain extra is not installed")
    from worker.integrations.langchain import CompactingMiddleware

    session = CompactingSession("lc-1", client=client_for(stack.workers), model="gpt-4.1")
    try:
        session.extend(conversation("lc-1", 12)["messages"])
        assert session.wait_settled(timeout_s=SETTLE_S)
        tool = CompactingMiddleware(session).compact_tool()
        assert tool.name == "compact_history" and "when" in tool.description.lower()
        instructions = "LANGCHAIN-FOCUS-6174 keep mod_8"
        answer = tool.invoke({"instructions": instructions})
        assert answer.startswith("Compaction requested"), answer
        wait_applied(session, 1)
        assert last_requested(session).trigger.instructions_sha256 == sha256(instructions)
        assert requests_with(llm, instructions)
    finally:
        session.close()


async def applied_count(session: AsyncCompactingSession, count: int) -> None:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and len(session.compactions) < count:
        await session.request_messages()
        await asyncio.sleep(0.05)
    assert len(session.compactions) >= count, session.status


def test_async_session_compact_and_tool(stack: Stack) -> None:
    async def run() -> list[CompactionEvent]:
        client = client_for(stack.workers)
        async with AsyncCompactingSession("as-1", client=client, model="gpt-4.1") as session:
            await session.extend(conversation("as-1", 12)["messages"])
            assert await session.wait_settled(timeout_s=SETTLE_S)
            first = await session.compact("keep mod_2")
            await applied_count(session, 1)
            # The agent works on: a second compaction right away would not pay (it would only
            # summarize the first one's summary again), so it is answered as a skip.
            more = conversation("as-1", 12, id_prefix="more-")["messages"][2:-1]
            await session.extend(more)
            assert await session.wait_settled(timeout_s=SETTLE_S)
            # (asked while the first still waited, the second would have replaced it)
            answer = await session.compact_tool().handler({"instructions": "keep mod_9"})
            assert answer.startswith("Compaction requested"), answer
            await applied_count(session, 2)
            applied = list(session.compactions)
            assert applied and applied[0].trigger.request_id == first.request_id
            return list(applied)

    applied = asyncio.run(run())
    assert [e.trigger.kind for e in applied] == ["requested", "requested"]
    assert applied[1].trigger.instructions_sha256 == sha256("keep mod_9")


# --- the parts, without the service ---------------------------------------------------------------


def test_the_focus_comes_after_our_rules_and_the_template_before_them() -> None:
    system = system_prompt(
        "Summarize.", budget_tokens=100, extra="Name the ticket.", focus="keep the tests"
    )
    assert system.startswith(DEFAULT_TEMPLATE)
    order = ["## Goal", "Keep the summary under 100 tokens", "Summarize.", "Name the ticket."]
    positions = [system.index(part) for part in [*order, "keep the tests"]]
    assert positions == sorted(positions)
    replaced = system_prompt("Summarize.", budget_tokens=100, extra="", template="Be terse.")
    assert replaced.startswith("Be terse.") and "Keep the summary under 100 tokens" in replaced
    assert DEFAULT_TEMPLATE not in replaced and "requested-focus" not in replaced
    # a template that says otherwise never removes the bound: ours comes after it
    empty = system_prompt("Summarize.", budget_tokens=100, extra="", template="   ")
    assert empty.startswith("Write Markdown")


def test_prompt_files_are_read_once_and_checked(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("Be terse.")
    templates = prompt_templates(
        LLMConfig(
            prompt_file=tmp_path / "ok.txt", tenant_prompt_files={"acme": tmp_path / "ok.txt"}
        )
    )
    assert templates == {"": "Be terse.", "acme": "Be terse."}
    with pytest.raises(ConfigError) as caught:
        prompt_templates(LLMConfig(prompt_file=tmp_path / "missing.txt"))
    assert caught.value.key == "llm.prompt_file"
    (tmp_path / "big.txt").write_text("x" * 20_001)
    with pytest.raises(ConfigError) as caught:
        prompt_templates(LLMConfig(tenant_prompt_files={"acme": tmp_path / "big.txt"}))
    assert caught.value.key == "llm.tenant_prompt_files.acme"


def test_requests_are_read_strictly() -> None:
    from worker.config import Settings

    settings = Settings()
    ok = compact_request(settings, instructions="  keep the tests  ", config={"mode": "local_only"})
    assert ok.instructions == "keep the tests" and ok.config == {"mode": "local_only"}
    assert ok.instructions_sha256 == sha256("keep the tests")
    assert compact_request(settings, instructions="   ").instructions is None
    for kwargs, field in (
        ({"instructions": 5}, "instructions"),
        ({"instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)}, "instructions"),
        ({"instructions": "a\x00b"}, "instructions"),
        ({"config": {"max_messages": 5}}, "config.max_messages"),
        ({"config": {"summary_max_input_chars": 10**9}}, "config.summary_max_input_chars"),
        ({"config": "x"}, "config"),
        ({"tools": {"grep": {"compaction": "shred"}}}, "tools.grep.compaction"),
    ):
        with pytest.raises(InvalidRequest) as caught:
            compact_request(settings, **kwargs)
        assert caught.value.field == field, (kwargs, caught.value.field)


def test_the_digest_notes_the_requested_focus_without_repeating_it() -> None:
    snap = conversation("d-1", 6)
    messages = to_messages("openai", snap["messages"])
    instructions = "DIGEST-FOCUS-2718 keep what mod_4 showed"

    def digest(focus: str | None) -> str:
        request = SummaryRequest(
            conversation_id="d-1",
            revision=1,
            messages=messages[1:-1],
            max_input_chars=80_000,
            max_output_tokens=2_000,
            source_tokens=100_000,
            instructions=focus,
        )
        return DigestSummarizer().summarize(request).text

    noted = digest(instructions)
    assert "## Requested focus" in noted and "src/pkg/mod_4.py" in noted.split("## Files")[0]
    assert instructions not in noted and "DIGEST-FOCUS" not in noted
    assert "Requested focus" not in digest(None)
    assert "nothing in the summarized messages matches" in digest("zzzz-nowhere")


def test_the_documented_default_template_is_ours() -> None:
    text = (Path(__file__).resolve().parent.parent.parent / "docs" / "summaries.md").read_text()
    block = re.search(r"```text\n(.*?)```", text, re.S)
    assert block is not None
    documented = "\n".join(line.strip() for line in block.group(1).splitlines()).strip()
    assert documented == DEFAULT_TEMPLATE
