"""``compactor mcp``, driven by the official ``mcp`` SDK's own stdio client (``stdio_client`` +
``ClientSession``) as an agent host drives it: a real ``compactor mcp`` process, talking over
HTTP to a real ``compactor serve``, Redis and worker process (tests/support/http_support.py).

What the host sees: ``tools/list`` names the tools with schemas; recall gives a replaced
message's original; compact-now waits for and reports the completed event; an unknown message
id, argument, key or conversation is a tool error naming it, never a traceback; nothing opaque
(the SDKs' own signatures, encrypted content, inline data) and no secret is in any result; and
over a long session with many compactions every result stays bounded, its pages walked by
cursor exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shlex
import sys
import time
import tomllib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent
from support.docs_runner import blocks
from support.http_support import KEY_A, KEY_B, Stack
from support.inspector_support import submit
from support.redaction_samples import PLANTED as SAMPLES
from support.sdk_instances import Markers, every_member, unit
from support.service_support import conversation

from worker.cli import build_parser
from worker.cli.mcp import cmd_mcp
from worker.cli.mcp_views import MAX_ROWS, PAGE_CHARS
from worker.config import CompactionConfig
from worker.wire.events import OUTCOME_TYPES
from worker.wire.formats import source_ids
from worker.wire.formats.common import is_opaque_field

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
TOOLS = {
    "recall_message",
    "list_compactions",
    "show_compaction",
    "compact_now",
    "compaction_status",
}
SMALL = {"auto_compact_threshold_tokens": 3000}  # a snapshot's override: compact over 3,000
SETTLE_S = 120.0  # generous: the machine is shared
# A result's text: a page, plus a header and the cursor's line.
TEXT_BOUND = PAGE_CHARS + 1000
PLANTED = next(p for p in SAMPLES if p.kind == "openai_api_key")


def stack_config() -> str:
    """Compacts over 50,000 tokens unless a snapshot says otherwise (SMALL)."""
    extra = 'auto_compact_threshold_tokens = 50000\nauto_compact_threshold_percent = "none"\n'
    return extra + "[http]\nmax_body_bytes = 4000000\nsse_keepalive_s = 1.0"


@contextlib.asynccontextmanager
async def mcp(
    stack: Stack, *args: str, key: str | None = KEY_A, url: str | None = None
) -> AsyncIterator[ClientSession]:
    """A ``compactor mcp`` process (its stderr kept in the stack's logs) and an initialized
    client session with it."""
    env = {"COMPACTOR_API_KEY": key} if key else {}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "worker", "mcp", "--url", url or stack.base, *args],
        env=env,
        cwd=REPO_ROOT,
    )
    with (stack.root / "logs" / "mcp.log").open("a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def text_of(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed: its structured content (its text bounded)."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, text_of(result)
    assert len(text_of(result)) <= TEXT_BOUND
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """A tool call that must be a tool error: its text."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, text_of(result)
    text = text_of(result)
    assert "Traceback" not in text and 'File "' not in text
    return text


def events_of(stack: Stack, conversation_id: str, key: str = KEY_A) -> list[dict[str, Any]]:
    with stack.http(key) as client:
        r = client.get(f"/v1/conversations/{conversation_id}/events", params={"limit": 1000})
        assert r.status_code == 200, r.text
        events: list[dict[str, Any]] = r.json()
        return events


def wait_outcome(stack: Stack, conversation_id: str, revision: int) -> dict[str, Any]:
    """The outcome event of ``revision`` (polled: no test depends on speed)."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        with contextlib.suppress(AssertionError):
            for event in events_of(stack, conversation_id):
                if event["type"] in OUTCOME_TYPES and event["revision"] == revision:
                    return event
        time.sleep(0.1)
    raise AssertionError(f"no outcome of {conversation_id} revision {revision}")


async def recall_whole(session: ClientSession, message_id: str, **kw: Any) -> str:
    """Every page of a recalled message, joined, each page bounded."""
    pages, cursor = [], None
    while True:
        page = await call(session, "recall_message", message_id=message_id, cursor=cursor, **kw)
        assert len(page["text"]) <= PAGE_CHARS and page["offset"] == sum(map(len, pages))
        pages.append(page["text"])
        cursor = page["more"]
        if cursor is None:
            assert sum(map(len, pages)) == page["total_chars"]
            return "".join(pages)


async def show_whole(session: ClientSession, **kw: Any) -> str:
    pages, cursor = [], None
    while True:
        page = await call(session, "show_compaction", cursor=cursor, **kw)
        assert len(page["text"]) <= PAGE_CHARS
        pages.append(page["text"])
        cursor = page["more"]
        if cursor is None:
            return "".join(pages)


# --- tools/list -------------------------------------------------------------------------------


def test_tools_list_names_the_tools_with_what_an_agent_needs(stack: Stack) -> None:
    async def main() -> None:
        async with mcp(stack, "--conversation", "c-listing") as session:
            listed = (await session.list_tools()).tools
            assert {t.name for t in listed} == TOOLS
            for tool in listed:
                assert tool.description and len(tool.description) > 80, tool.name
                assert tool.input_schema["type"] == "object"
                assert tool.output_schema is not None and tool.output_schema["type"] == "object"
                assert tool.annotations is not None
                assert tool.annotations.read_only_hint is (tool.name != "compact_now")
            schema = {t.name: t.input_schema for t in listed}
            assert schema["recall_message"]["required"] == ["message_id"]
            assert "conversation_id" in schema["compact_now"]["properties"]

    asyncio.run(main())


# --- recall -----------------------------------------------------------------------------------


def test_recall_returns_a_replaced_messages_original(stack: Stack) -> None:
    snap = conversation("m-recall", 14) | {"config": SMALL}
    snap["messages"][5]["content"] = " ".join(f"long{k}" for k in range(3000))  # three pages
    submit(stack, snap)
    done = wait_outcome(stack, "m-recall", snap["revision"])
    assert done["type"] == "compaction.completed", done
    originals = {m["id"]: m for m in snap["messages"]}

    async def main() -> None:
        async with mcp(stack, "--conversation", "m-recall") as session:
            listed = await call(session, "list_compactions")
            assert listed["total"] == 1
            row = listed["compactions"][0]
            assert row["event_id"] == done["event_id"]
            assert (row["first_id"], row["last_id"]) == (
                done["compaction"]["first_id"],
                done["compaction"]["last_id"],
            )
            shown = await show_whole(session)
            replaced = [m["id"] for m in snap["messages"]][
                done["compaction"]["start"] : done["compaction"]["end"]
            ]
            for message_id in replaced:
                assert f"[{message_id}]" in shown
            assert snap["messages"][5]["id"] in replaced
            for message_id in replaced:
                whole = json.loads(await recall_whole(session, message_id))
                original = originals[message_id]
                assert whole["role"] == original["role"]
                assert whole.get("content") == original.get("content")
                # ids (provider-side, opaque) are shown as size markers, never as they are
                assert whole["id"] == f"[opaque, {len(message_id)} characters: not shown]"

    asyncio.run(main())


def test_an_unknown_message_id_is_a_tool_error(stack: Stack) -> None:
    snap = conversation("m-unknown", 14) | {"config": SMALL}
    submit(stack, snap)
    assert wait_outcome(stack, "m-unknown", snap["revision"])["type"] == "compaction.completed"

    async def main() -> None:
        async with mcp(stack, "--conversation", "m-unknown") as session:
            text = await refused(session, "recall_message", message_id="no-such-message")
            assert "not_found" in text and "no-such-message" in text
            text = await refused(session, "recall_message", message_id="x" * 257)
            assert "message_id" in text

    asyncio.run(main())


# --- compact now ------------------------------------------------------------------------------


def test_compact_now_waits_for_and_reports_the_completed_event(stack: Stack) -> None:
    snap = conversation("m-now", 12)
    submit(stack, snap)
    assert wait_outcome(stack, "m-now", snap["revision"])["type"] == "compaction.skipped"

    async def main() -> dict[str, Any]:
        async with mcp(stack, "--conversation", "m-now") as session:
            return await call(
                session, "compact_now", instructions="keep the failing test names", wait_s=SETTLE_S
            )

    outcome = asyncio.run(main())
    assert outcome["status"] == "completed", outcome
    assert outcome["tokens_after"] < outcome["tokens_before"]
    done = [e for e in events_of(stack, "m-now") if e["type"] == "compaction.completed"]
    assert [e["event_id"] for e in done] == [outcome["event_id"]]
    assert done[0]["trigger"]["kind"] == "requested"
    assert done[0]["trigger"]["request_id"] == outcome["request_id"]


def test_compact_now_without_waiting_is_pending_and_still_lands(stack: Stack) -> None:
    snap = conversation("m-pending", 12)
    submit(stack, snap)
    wait_outcome(stack, "m-pending", snap["revision"])

    async def main() -> dict[str, Any]:
        async with mcp(stack, "--conversation", "m-pending") as session:
            result = await session.call_tool("compact_now", {"wait_s": 0})
            assert "list_compactions" in text_of(result)
            assert isinstance(result.structured_content, dict)
            return result.structured_content

    asked = asyncio.run(main())
    assert asked["status"] == "pending" and asked["event_id"] is None
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        events = events_of(stack, "m-pending")
        if any((e.get("trigger") or {}).get("request_id") == asked["request_id"] for e in events):
            return
        time.sleep(0.1)
    raise AssertionError(f"no outcome of request {asked['request_id']}")


# --- errors -----------------------------------------------------------------------------------


def test_what_a_tool_refuses_is_a_tool_error_naming_it(stack: Stack) -> None:
    snap = conversation("m-errors", 14) | {"config": SMALL}
    submit(stack, snap)
    assert wait_outcome(stack, "m-errors", snap["revision"])["type"] == "compaction.completed"
    submit(stack, conversation("m-globex", 4), key=KEY_B)  # another tenant's

    async def main() -> list[str]:
        texts = []
        async with mcp(stack, "--conversation", "m-errors") as session:
            # an argument the tool does not take, never silently the default conversation
            texts.append(await refused(session, "list_compactions", conversation="m-globex"))
            assert "conversation: unknown argument" in texts[-1]
            texts.append(await refused(session, "list_compactions", limit=MAX_ROWS + 1))
            assert "limit" in texts[-1]
            texts.append(await refused(session, "list_compactions", cursor="not-a-cursor"))
            assert "cursor" in texts[-1]
            texts.append(await refused(session, "show_compaction", event_id="0" * 32))
            assert "event_id" in texts[-1]
            texts.append(await refused(session, "show_compaction", revision=10**6))
            assert "revision" in texts[-1]
            texts.append(await refused(session, "recall_message", message_id="r0", cursor="x"))
            assert "cursor" in texts[-1]
            texts.append(await refused(session, "compact_now", instructions="x" * 2001))
            assert "instructions" in texts[-1]
            # another tenant's conversation is not this key's, and one never submitted neither
            for other in ("m-globex", "m-never"):
                texts.append(await refused(session, "list_compactions", conversation_id=other))
                assert "not_found" in texts[-1]
            texts.append(await refused(session, "compact_now", conversation_id="m-never"))
            assert "not_found" in texts[-1]
            texts.append(await refused(session, "list_compactions", conversation_id="-bad id"))
            assert "conversation_id" in texts[-1]
        async with mcp(stack) as session:  # no default conversation
            texts.append(await refused(session, "list_compactions"))
            assert "conversation_id: required" in texts[-1]
            status = await call(session, "compaction_status")  # the service alone
            assert status["service"]["ready"] and status["conversation"] is None
        async with mcp(stack, "--conversation", "m-errors", key="a-key-no-tenant-has-0123") as s:
            texts.append(await refused(s, "recall_message", message_id="r0"))
            assert "unauthorized" in texts[-1] and "a-key-no-tenant-has" not in texts[-1]
        async with mcp(stack, "--conversation", "m-errors", url=closed_port_url()) as s:
            texts.append(await refused(s, "list_compactions"))
            assert "service_unavailable" in texts[-1]
        return texts

    texts = asyncio.run(main())
    assert not any(KEY_A in t or KEY_B in t for t in texts)
    log = (stack.root / "logs" / "mcp.log").read_text()
    assert KEY_A not in log and KEY_B not in log and "a-key-no-tenant-has" not in log


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_the_command_refuses_to_start_without_a_key_naming_what_is_wrong(
    run_cli_in_process: Any,
) -> None:
    code, out, err = run_cli_in_process("mcp")
    assert (code, out) == (2, "")
    assert json.loads(err)["error"] == "usage" and "COMPACTOR_API_KEY" in err
    secret = "key-that-must-not-be-shown-0123"
    code, out, err = run_cli_in_process("mcp", "--no-auth", env={"COMPACTOR_API_KEY": secret})
    assert code == 2 and "--no-auth" in err and secret not in err
    env = {"MY_KEY": secret}
    code, _, err = run_cli_in_process("mcp", "--key-env", "MY_KEY", "--url", "ftp://x", env=env)
    assert code == 2 and "--url" in err and secret not in err
    code, _, err = run_cli_in_process(
        "mcp", "--conversation", "-no", env={"COMPACTOR_API_KEY": "k"}
    )
    assert code == 2 and "--conversation" in err


# --- nothing opaque, no secret ----------------------------------------------------------------


def filler(fmt: str, role: str, n: int) -> dict[str, Any]:
    said = " ".join(
        f"Step {n}.{k}: read src/pkg/mod_{n}_{k}.py and note its role." for k in range(20)
    )
    if fmt == "responses":
        return {"type": "message", "role": role, "content": said}
    return {"role": role, "content": said}


def sdk_history(fmt: str, markers: Markers) -> list[dict[str, Any]]:
    """One instance of every type the installed SDKs define for the format (tests/
    sdk_instances.py: every opaque string a marker), between plain turns; the first turn holds
    a planted secret. A provider-native compaction (it supersedes what is before it) is left
    out."""
    out = [filler(fmt, "user", 0)]
    out[0]["content"] += " " + PLANTED.text

    def join(messages: list[dict[str, Any]]) -> None:
        last = out[-1].get("role")
        if fmt == "anthropic" and last == messages[0].get("role"):
            out.append(filler(fmt, "user" if last == "assistant" else "assistant", len(out)))
        out.extend(messages)

    for member in every_member():
        made = unit(member, markers) if member.fmt == fmt else None
        if made is not None and not made.boundary:
            join(made.messages)
    for k in range(4):
        join([filler(fmt, "user", 100 + k)])
        join([filler(fmt, "assistant", 200 + k)])
    return out


def readable_strings(value: Any) -> Iterator[str]:
    """The strings of a wire message that are not opaque (the formats' own rule)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not is_opaque_field(key):
                yield from readable_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from readable_strings(item)
    elif isinstance(value, str) and not value.startswith("data:"):
        yield value


@pytest.mark.parametrize("fmt", ["anthropic", "openai", "responses"])
def test_no_result_holds_an_opaque_value_or_a_secret(stack: Stack, fmt: str) -> None:
    markers = Markers()
    messages = sdk_history(fmt, markers)
    cid = f"m-sdk-{fmt}"
    model = "claude-sonnet-4-5" if fmt == "anthropic" else "gpt-4.1"
    snap = {
        "conversation_id": cid,
        "revision": len(messages),
        "format": fmt,
        "model": {"name": model},
        "messages": messages,
        "config": {"preserve_recent_user_tokens": 0},  # the user turns are compacted too
    }
    submit(stack, snap)
    wait_outcome(stack, cid, snap["revision"])
    ids = source_ids(messages)
    shown: list[str] = []  # every result, as text and as structured content

    async def main() -> None:
        async with mcp(stack, "--conversation", cid) as session:

            async def keep(tool: str, **arguments: Any) -> dict[str, Any]:
                result = await session.call_tool(tool, arguments)
                assert not result.is_error, text_of(result)
                shown.extend([text_of(result), json.dumps(result.structured_content)])
                assert isinstance(result.structured_content, dict)
                return result.structured_content

            await keep("compact_now", instructions="keep every file name", wait_s=SETTLE_S)
            await keep("compaction_status")
            listed = await keep("list_compactions")
            assert listed["total"] >= 1
            for row in listed["compactions"]:
                await keep("show_compaction", event_id=row["event_id"])
            event = next(e for e in events_of(stack, cid) if e["type"] == "compaction.completed")
            start, end = event["compaction"]["start"], event["compaction"]["end"]
            for index in range(start, end):
                pages, cursor = [], None
                while True:
                    page = await keep("recall_message", message_id=ids[index], cursor=cursor)
                    pages.append(page["text"])
                    if (cursor := page["more"]) is None:
                        break
                recalled = "".join(pages)
                for text in readable_strings(messages[index]):
                    if PLANTED.secret not in text:
                        assert json.dumps(text, ensure_ascii=False)[1:-1] in recalled, text
            assert f"[redacted: {PLANTED.kind}]" in "".join(shown)

    asyncio.run(main())
    everything = "\n".join(shown)
    assert [m for m in markers.secret if m in everything] == []
    assert PLANTED.secret not in everything


# --- a long session ---------------------------------------------------------------------------

TURNS = 40
KEPT = CompactionConfig().max_persisted_transcripts or TURNS


def turn(k: int) -> list[dict[str, Any]]:
    """One tool exchange of the agent's session: about 700 tokens."""
    call_id = f"call{k}"
    arguments = json.dumps({"command": f"pytest tests/test_mod_{k}.py"})
    output = " ".join(f"tests/test_mod_{k}.py::case_{i} PASSED" for i in range(90))
    return [
        {
            "id": f"a{k}",
            "role": "assistant",
            "content": f"Step {k}: run the tests of mod_{k}.",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "bash", "arguments": arguments},
                }
            ],
        },
        {"id": f"r{k}", "role": "tool", "tool_call_id": call_id, "content": output},
    ]


async def every_row(session: ClientSession, limit: int) -> list[dict[str, Any]]:
    """All compactions, newest first, page by page."""
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await call(session, "list_compactions", limit=limit, cursor=cursor)
        assert len(page["compactions"]) <= limit
        rows += page["compactions"]
        if (cursor := page["more"]) is None:
            assert len(rows) == page["total"]
            return rows


def test_a_long_session_of_tool_calls_stays_bounded(stack: Stack) -> None:
    """40 turns of an agent that submits its full history after each, compacting over 3,000
    tokens, and calls every tool along the way: each answer bounded, the listing walked by
    cursor exactly once, the oldest compaction's messages still recalled whole, one compaction
    asked for with instructions among the automatic ones."""
    cid = "m-long"
    history: list[dict[str, Any]] = [
        {"id": "sys", "role": "system", "content": "You are a coding agent."},
        {"id": "u0", "role": "user", "content": "Make the whole test suite pass."},
    ]
    sizes: list[int] = []
    by_id = {m["id"]: m for k in range(TURNS) for m in turn(k)} | {"u0": history[1]}

    async def main() -> None:
        async with mcp(stack, "--conversation", cid) as session:
            for k in range(TURNS):
                history.extend(turn(k))
                snap = {"conversation_id": cid, "revision": k + 1, "messages": history}
                await asyncio.to_thread(submit, stack, snap | {"config": SMALL})
                await asyncio.to_thread(wait_outcome, stack, cid, k + 1)
                status = await call(session, "compaction_status")
                conv = status["conversation"]
                assert conv["newest_outcome"]["revision"] == k + 1
                sizes.append(conv["tokens"])
                if k == TURNS // 2:
                    asked = await call(session, "compact_now", instructions="keep mod names")
                    assert asked["status"] in ("completed", "skipped"), asked
                if k % 8 == 7:
                    rows = await every_row(session, limit=3)
                    assert len({r["event_id"] for r in rows}) == len(rows) == conv["compactions"]
                    await show_whole(session)
            rows = await every_row(session, limit=4)
            kept = rows[:KEPT]  # the newest transcripts are kept, the older ones pruned
            oldest = kept[-1]
            shown = await show_whole(session, event_id=oldest["event_id"])
            assert f"[{oldest['first_id']}]" in shown and f"[{oldest['last_id']}]" in shown
            for message_id in (oldest["first_id"], oldest["last_id"]):
                whole = json.loads(await recall_whole(session, message_id))
                assert whole["content"] == by_id[message_id]["content"]
            if len(rows) > KEPT:  # the summary is what remains of the oldest ones
                gone = rows[-1]
                shown = await show_whole(session, event_id=gone["event_id"])
                assert "transcript is no longer kept" in shown
                text = await refused(session, "recall_message", message_id=gone["last_id"])
                assert "expired" in text

    asyncio.run(main())
    events = events_of(stack, cid)
    done = [e for e in events if e["type"] == "compaction.completed"]
    assert len(done) >= 5, [e["type"] for e in events]
    assert any(e["trigger"]["kind"] == "requested" for e in events if "trigger" in e)
    # every outcome left the next request under the threshold (the whole history grew to about
    # 45,000 tokens)
    assert max(sizes) < SMALL["auto_compact_threshold_tokens"], sizes


# --- the hosts' configuration -----------------------------------------------------------------

READ = {"COMPACTOR_URL", "COMPACTOR_API_KEY", "COMPACTOR_CONVERSATION"}


def host_snippets() -> list[tuple[str, str, list[str], set[str]]]:
    """Each host's snippet in docs/mcp.md: (where, command, its arguments, the variables set)."""
    found = []
    for block in blocks(REPO_ROOT / "docs" / "mcp.md"):
        if block.lang == "json" and "mcpServers" in block.text:
            for server in json.loads(block.text)["mcpServers"].values():
                env = set(server.get("env", {}))
                found.append((block.where, server["command"], server["args"], env))
        elif block.text.startswith("[mcp_servers."):  # Codex's config.toml
            table = tomllib.loads(block.text)["mcp_servers"]["compactor"]
            env = set(table.get("env", {})) | set(table.get("env_vars", []))
            found.append((block.where, table["command"], table["args"], env))
        elif block.text.startswith("claude mcp add"):
            words = shlex.split(block.text.replace("\\\n", " "))
            command = words[words.index("--") + 1 :]
            env = {
                w.split("=", 1)[0] for before, w in itertools.pairwise(words) if before == "--env"
            }
            found.append((block.where, command[0], command[1:], env))
    return found


def test_the_documented_host_configurations_run_this_command() -> None:
    snippets = host_snippets()
    assert len(snippets) == 4, snippets  # Claude Code (two forms), Codex, Cursor
    for where, command, args, env in snippets:
        assert command.endswith("/.venv/bin/compactor"), where
        parsed = build_parser().parse_args(args)
        assert parsed.func is cmd_mcp, where
        assert "COMPACTOR_API_KEY" in env and env <= READ, (where, env)
