"""The ``responses`` wire format (issue 12 §2): OpenAI Responses API input items normalize to the
internal model; calls and outputs pair by ``call_id``, reasoning travels with its call, unknown
items are kept verbatim and counted; compaction keeps all of that intact, in process and from the
command line."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.client import apply_compaction, project
from worker.config import CompactionConfig, Settings
from worker.core.groups import group_messages
from worker.core.planning import STRIPPED_ARGUMENTS, STRIPPED_RESPONSE
from worker.errors import InvalidSnapshot
from worker.pipeline import Adapters, Pipeline, tokens_of
from worker.summarize import SUMMARY_MARKER
from worker.tokens import tokenizer_for
from worker.transcripts.filesystem import FileStore
from worker.wire import formats
from worker.wire.events import CompactionEvent, parse_event
from worker.wire.models import canonical_json
from worker.wire.snapshots import parse_snapshot

if TYPE_CHECKING:
    from conftest import CliRunner

TOKENIZER = tokenizer_for("gpt-4.1")

WEB_SEARCH = {
    "type": "web_search_call",
    "id": "ws_1",
    "status": "completed",
    "action": {"type": "search", "query": "pricing decimal rounding"},
}

ITEMS: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": "You are a coding agent."},
    {
        "role": "user",  # an easy input message: no type
        "content": [
            {"type": "input_text", "text": "Fix src/app.py."},
            {"type": "input_image", "image_url": "data:image/png;base64,AA=="},
            {"type": "input_text", "text": "Thanks!"},
        ],
    },
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Where is main?"}],
        "encrypted_content": "gAAAA",
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "grep",
        "arguments": '{"pattern": "def main"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "src/app.py:3:def main():"},
    WEB_SEARCH,
    {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin"},
    {
        "type": "custom_tool_call_output",
        "call_id": "call_2",
        "output": [{"type": "input_text", "text": "patched"}],
    },
    {
        "type": "local_shell_call",
        "id": "lsh_1",
        "call_id": "call_3",
        "action": {"type": "exec", "command": ["pytest", "-q"]},
        "status": "completed",
    },
    {"type": "local_shell_call_output", "id": "call_3", "output": "1 passed"},
    {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "call_4",
        "action": {"type": "screenshot"},
        "pending_safety_checks": [],
        "status": "completed",
    },
    {
        "type": "computer_call_output",
        "call_id": "call_4",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="},
    },
    {"type": "item_reference", "id": "msg_old"},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "content": [
            {"type": "output_text", "text": "Done.", "annotations": []},
            {"type": "refusal", "refusal": "No secrets."},
        ],
    },
]


def shape(messages: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (
            m.id,
            m.role,
            m.content,
            m.reasoning,
            [(c.id, c.name, c.arguments) for c in m.tool_calls],
            m.tool_call_id,
            m.tool_name,
            m.joins_next,
        )
        for m in messages
    ]


def test_each_item_type_normalizes() -> None:
    messages = formats.to_messages("responses", ITEMS)
    ids = formats.source_ids(ITEMS)
    assert [m.source_index for m in messages] == list(range(len(ITEMS)))
    assert shape(messages) == [
        (ids[0], "system", "You are a coding agent.", "", [], None, None, False),
        (ids[1], "user", "Fix src/app.py.\nThanks!", "", [], None, None, False),
        ("rs_1", "assistant", "", "Where is main?", [], None, None, True),
        ("fc_1", "assistant", "", "", [("call_1", "grep", '{"pattern": "def main"}')],
         None, None, False),
        (ids[4], "tool", "src/app.py:3:def main():", "", [], "call_1", "grep", False),
        ("ws_1", "assistant", canonical_json({k: v for k, v in WEB_SEARCH.items() if k != "id"}),
         "", [], None, None, False),
        (ids[6], "assistant", "", "", [("call_2", "apply_patch", "*** Begin")], None, None,
         False),
        (ids[7], "tool", "patched", "", [], "call_2", "apply_patch", False),
        ("lsh_1", "assistant", "", "",
         [("call_3", "local_shell", '{"action":{"command":["pytest","-q"],"type":"exec"}}')],
         None, None, False),
        ("call_3", "tool", "1 passed", "", [], "call_3", "local_shell", False),
        ("cu_1", "assistant", "", "",
         [("call_4", "computer", '{"action":{"type":"screenshot"},"pending_safety_checks":[]}')],
         None, None, False),
        (ids[11], "tool", "", "", [], "call_4", "computer", False),
        ("msg_old", "assistant", '{"type":"item_reference"}', "", [], None, None, False),
        ("msg_1", "assistant", "Done.\nNo secrets.", "", [], None, None, False),
    ]  # fmt: skip
    # Own ids where the item has one, derived ids (position and content) otherwise.
    assert ids[2] == "rs_1" and ids[4].startswith("m4-")


def test_generic_call_items_pair_by_call_id() -> None:
    items = [
        {"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"]}},
        {"type": "shell_call_output", "call_id": "c1", "output": [{"type": "input_text",
                                                                   "text": "a"}]},
        {"type": "apply_patch_call", "call_id": "c2", "operation": {"path": "a"}},
        {"type": "apply_patch_call_output", "call_id": "c2", "output": {"status": "ok"}},
        {"type": "mcp_call", "id": "mcp_1", "name": "x", "arguments": "{}", "server_label": "s"},
    ]  # fmt: skip
    messages = formats.to_messages("responses", items)
    assert [(m.role, m.tool_call_id, m.tool_name) for m in messages] == [
        ("assistant", None, None),
        ("tool", "c1", "shell"),
        ("assistant", None, None),
        ("tool", "c2", "apply_patch"),
        ("assistant", None, None),  # no call_id: kept verbatim, counted as its JSON
    ]
    assert messages[3].content == '{"status":"ok"}'
    assert messages[4].content == canonical_json({k: v for k, v in items[4].items() if k != "id"})
    with pytest.raises(InvalidSnapshot) as info:
        formats.to_messages("responses", items[1:2])
    assert info.value.field == "messages[0]"
    assert "answers no earlier tool call" in info.value.reason


CALL = {"type": "function_call", "call_id": "c", "name": "grep", "arguments": "{}"}
OUT = {"type": "function_call_output", "call_id": "c", "output": "x"}
REJECTED: dict[str, tuple[list[Any], str, str]] = {
    "no type or role": ([{"content": "hi"}], "messages[0].type", "needs a string 'type'"),
    "bad role": ([{"type": "message", "role": "tool", "content": "x"}], "messages[0].role",
                 "unknown role"),
    "content number": ([{"role": "user", "content": 3}], "messages[0].content", "must be"),
    "part text": ([{"role": "user", "content": [{"type": "input_text", "text": 1}]}],
                  "messages[0].content[0].text", "must be a string"),
    "call without call_id": ([{**CALL, "call_id": None}], "messages[0].call_id", "non-empty"),
    "call without name": ([{**CALL, "name": ""}], "messages[0].name", "non-empty"),
    "arguments not text": ([{**CALL, "arguments": {}}], "messages[0].arguments", "string"),
    "custom without input": ([{"type": "custom_tool_call", "call_id": "c", "name": "p"}],
                             "messages[0].input", "string"),
    "output without call_id": ([CALL, {**OUT, "call_id": ""}], "messages[1].call_id",
                               "non-empty"),
    "output without output": ([CALL, {"type": "function_call_output", "call_id": "c"}],
                              "messages[1].output", "must be"),
    "orphan output": ([OUT], "messages[0]", "answers no earlier tool call"),
    "second output": ([CALL, OUT, OUT], "messages[2]", "second result"),
    "duplicate call": ([CALL, CALL], "messages[1]", "duplicate tool call id"),
    "summary not a list": ([{"type": "reasoning", "id": "rs", "summary": "x"}],
                           "messages[0].summary", "list"),
    "encrypted number": ([{"type": "reasoning", "id": "rs", "summary": [],
                           "encrypted_content": 1}], "messages[0].encrypted_content", "string"),
    "duplicate item id": ([{**CALL, "id": "fc"}, {**CALL, "call_id": "d", "id": "fc"}],
                          "messages[1].id", "duplicate message id"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_invalid_items_name_the_field(case: str) -> None:
    items, field, reason = REJECTED[case]
    with pytest.raises(InvalidSnapshot) as info:
        formats.to_messages("responses", items)
    assert info.value.field == field
    assert reason in info.value.reason


def test_top_level_system_is_refused() -> None:
    with pytest.raises(InvalidSnapshot) as info:
        formats.to_messages("responses", ITEMS, system="be brief")
    assert info.value.field == "system"


# --- groups: a reasoning item travels with what it produced ---------------------------------------


def _reasoning(k: int) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{k}", "summary": []}


def test_reasoning_and_its_calls_and_outputs_are_one_group() -> None:
    def call(k: int) -> dict[str, Any]:
        return {"type": "function_call", "call_id": f"c{k}", "name": "grep", "arguments": "{}"}

    def out(k: int) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": f"c{k}", "output": "x"}

    items = [
        {"role": "user", "content": "go"},
        _reasoning(1), call(1), call(2), out(1), out(2),  # parallel calls
        _reasoning(2), _reasoning(3), call(3), out(3),  # two reasoning items in a row
        _reasoning(4), {"type": "message", "role": "assistant", "content": "done"},
        _reasoning(5), call(5),  # pending: the agent is mid-turn
    ]  # fmt: skip
    groups = group_messages(formats.to_messages("responses", items))
    assert [(g.start, g.end, g.kind, g.complete) for g in groups] == [
        (0, 1, "user", True),
        (1, 6, "tool_exchange", True),
        (6, 10, "tool_exchange", True),
        (10, 12, "assistant", True),
        (12, 14, "tool_exchange", False),
    ]


def test_a_last_reasoning_item_is_a_group_of_its_own() -> None:
    items = [{"role": "user", "content": "go"}, _reasoning(1)]
    groups = group_messages(formats.to_messages("responses", items))
    assert [(g.start, g.end) for g in groups] == [(0, 1), (1, 2)]


# --- back to the wire -----------------------------------------------------------------------------


def test_render_copies_unchanged_items_and_rewrites_changed_ones() -> None:
    messages = formats.to_messages("responses", ITEMS)
    by_source = {m.source_index: m for m in messages}
    carried = [by_source[i] for i in (1, 3, 4, 6, 7, 8, 9)]
    carried[1] = carried[1].model_copy(  # fc_1 stripped: its output is rewritten with it
        update={
            "tool_calls": (
                carried[1].tool_calls[0].model_copy(update={"arguments": STRIPPED_ARGUMENTS}),
            )
        }
    )
    carried[6] = carried[6].model_copy(update={"content": STRIPPED_RESPONSE})  # local shell
    rendered = formats.render("responses", carried, with_ids=True, source=ITEMS)
    assert rendered == [
        ITEMS[1],  # images and all
        {"type": "function_call", "call_id": "call_1", "name": "grep",
         "arguments": STRIPPED_ARGUMENTS},
        ITEMS[4],
        ITEMS[6],
        ITEMS[7],
        {"type": "function_call", "call_id": "call_3", "name": "local_shell",
         "arguments": '{"action":{"command":["pytest","-q"],"type":"exec"}}'},
        {"type": "function_call_output", "call_id": "call_3", "output": STRIPPED_RESPONSE},
    ]  # fmt: skip
    again = formats.to_messages("responses", rendered)  # valid items, pairs intact
    assert [m.tool_call_id for m in again if m.role == "tool"] == ["call_1", "call_2", "call_3"]


def test_render_drops_api_item_ids_only_where_the_api_checks_them() -> None:
    messages = formats.to_messages("responses", ITEMS)
    rendered = formats.render("responses", messages, with_ids=True, source=ITEMS)
    assert [r.get("id") for r in rendered] == [
        None, None, "rs_1", None, None, "ws_1", None, None, "lsh_1", "call_3", "cu_1", None,
        "msg_old", None,
    ]  # fmt: skip
    assert rendered[3] == {k: v for k, v in ITEMS[3].items() if k != "id"}
    assert formats.render("responses", messages, with_ids=False) != []  # without the source


def test_text_message_is_an_input_item() -> None:
    assert formats.text_message("responses", "user", "sum", msg_id="cws-1") == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "sum"}],
    }
    assistant = formats.text_message("responses", "assistant", "ok", msg_id=None)
    assert assistant["content"] == [{"type": "output_text", "text": "ok"}]


def test_replace_tool_results_edits_outputs_in_copies() -> None:
    before = copy.deepcopy(ITEMS)
    bodies = {"call_1": "[grep]", "call_2": "[patch]", "call_3": "[shell]", "call_4": "[shot]"}
    edited = formats.replace_tool_results("responses", ITEMS, bodies)
    assert before == ITEMS
    assert edited[4]["output"] == "[grep]"
    assert edited[7]["output"] == "[patch]"
    assert edited[9]["output"] == "[shell]"
    assert edited[11] == ITEMS[11]  # a screenshot is not text: left as it is
    assert [e for i, e in enumerate(edited) if i not in (4, 7, 9)] == [
        e for i, e in enumerate(ITEMS) if i not in (4, 7, 9)
    ]


def test_project_elides_old_outputs_in_the_agents_format() -> None:
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "line\n" * 100},
        {"type": "function_call", "call_id": "c2", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": "tail\n" * 100},
    ]
    sent = project(items, format="responses", config=CompactionConfig(keep_recent_tool_results=1))
    assert sent[2]["output"] == "[Previous: used bash]"
    assert sent[4] == items[4]


# --- compaction over generated histories ----------------------------------------------------------

WORDS = ["alpha", "src/app.py", "Error: boom", "ok", "λ", "def f():", "\n", "FAILED t.py::x"]
texts = st.lists(st.sampled_from(WORDS), max_size=30).map(" ".join)
long_texts = st.lists(st.sampled_from(WORDS), max_size=300).map(" ".join)
TOOLS = ["bash", "grep", "read_file", "delegate_task"]
CALL_KINDS = ["function", "function", "custom", "local_shell", "computer", "shell"]


@st.composite
def _call_pair(draw: st.DrawFn, cid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    kind = draw(st.sampled_from(CALL_KINDS))
    body = draw(long_texts)
    if kind == "function":
        args = json.dumps({"path": draw(st.sampled_from(WORDS[:3])), "command": draw(texts)})
        call = {
            "type": "function_call",
            "call_id": cid,
            "name": draw(st.sampled_from(TOOLS)),
            "arguments": args,
        }
        return call, {"type": "function_call_output", "call_id": cid, "output": body}
    if kind == "custom":
        call = {
            "type": "custom_tool_call",
            "call_id": cid,
            "name": "apply_patch",
            "input": draw(texts),
        }
        output = [{"type": "input_text", "text": body}]
        return call, {"type": "custom_tool_call_output", "call_id": cid, "output": output}
    if kind == "local_shell":
        call = {
            "type": "local_shell_call",
            "id": f"lsh_{cid}",
            "call_id": cid,
            "action": {"type": "exec", "command": ["bash", "-c", draw(texts)]},
            "status": "completed",
        }
        return call, {"type": "local_shell_call_output", "id": cid, "output": body}
    if kind == "computer":
        call = {
            "type": "computer_call",
            "id": f"cu_{cid}",
            "call_id": cid,
            "action": {"type": "click", "x": 1, "y": 2},
            "pending_safety_checks": [],
            "status": "completed",
        }
        shot = {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="}
        return call, {"type": "computer_call_output", "call_id": cid, "output": shot}
    call = {"type": "shell_call", "call_id": cid, "action": {"commands": [draw(texts)]}}
    return call, {"type": "shell_call_output", "call_id": cid, "output": body}


@st.composite
def _turn(draw: st.DrawFn, n: int, *, answered: bool = True) -> list[dict[str, Any]]:
    """Maybe a reasoning item, then 1-3 calls (in parallel), then (when answered) their
    outputs, in order or not."""
    turn: list[dict[str, Any]] = []
    if draw(st.booleans()):
        summary = [{"type": "summary_text", "text": draw(texts)}] if draw(st.booleans()) else []
        turn.append(
            {"type": "reasoning", "id": f"rs_{n}", "summary": summary, "encrypted_content": "gAAAA"}
        )
    pairs = [draw(_call_pair(f"call_{n}_{k}")) for k in range(draw(st.integers(1, 3)))]
    turn += [call for call, _ in pairs]
    if answered:
        outputs = [out for _, out in pairs]
        turn += draw(st.permutations(outputs))
    return turn


@st.composite
def response_histories(draw: st.DrawFn, *, max_turns: int = 12) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if draw(st.booleans()):
        items.append({"type": "message", "role": "developer", "content": "be careful"})
    for n in range(draw(st.integers(1, max_turns))):
        kind = draw(st.sampled_from(["user", "assistant", "calls", "calls", "other"]))
        if kind == "user":
            text = draw(long_texts) or "go"
            easy = draw(st.booleans())
            items.append(
                {"role": "user", "content": text}
                if easy
                else {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                }
            )
        elif kind == "assistant":
            if draw(st.booleans()):
                items.append({"type": "reasoning", "id": f"rs_a{n}", "summary": []})
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": draw(texts) or "ok"}],
                }
            )
        elif kind == "other":
            items.append(
                {
                    "type": "web_search_call",
                    "id": f"ws_{n}",
                    "status": "completed",
                    "action": {"type": "search", "query": draw(texts)},
                }
            )
        else:
            items.extend(draw(_turn(n)))
    if draw(st.booleans()):
        items.extend(draw(_turn(999, answered=False)))
    if draw(st.booleans()):  # function calls carry their API item ids too
        for k, item in enumerate(items):
            if item.get("type") == "function_call":
                item["id"] = f"fc_{k}"
    return items


def _snapshot(items: list[dict[str, Any]], threshold: int, **extra: Any) -> dict[str, Any]:
    return {
        "conversation_id": "resp-1",
        "revision": len(items),
        "model": {"name": "gpt-4.1"},
        "format": "responses",
        "messages": items,
        "config": {"auto_compact_threshold_tokens": threshold, "summary_max_output_tokens": 300},
        **extra,
    }


def _compact(snap: dict[str, Any], root: Path) -> CompactionEvent:
    parsed = parse_snapshot(snap, Settings())
    return Pipeline(parsed.settings, Adapters(store=FileStore(root))).run(parsed)[-1]


def _check_pairs(items: list[dict[str, Any]]) -> None:
    """Every output answers a call before it, once; every reasoning item is followed by
    something (it came with a call or a message)."""
    calls: set[str] = set()
    answered: set[str] = set()
    for item in items:
        kind = item.get("type", "message")
        if kind.endswith("_call") and "call_id" in item:
            assert item["call_id"] not in calls
            calls.add(item["call_id"])
        elif kind.endswith("_call_output"):
            cid = item.get("call_id", item.get("id"))
            assert cid in calls and cid not in answered, (cid, items)
            answered.add(cid)


HINTS = st.dictionaries(
    st.sampled_from(["bash", "grep", "apply_patch", "local_shell", "computer", "shell", "*"]),
    st.fixed_dictionaries(
        {
            "compaction": st.sampled_from(
                ["keep", "strip", "strip-requests", "strip-responses", "omit"]
            )
        }
    ),
    max_size=3,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=response_histories(), threshold=st.integers(0, 3000), tools=HINTS)
def test_compaction_keeps_pairs_reasoning_and_ids(
    items: list[dict[str, Any]], threshold: int, tools: dict[str, Any]
) -> None:
    snap = _snapshot(items, threshold, tools=tools)
    before = copy.deepcopy(items)
    ids = formats.source_ids(items)
    with tempfile.TemporaryDirectory() as root:
        event = _compact(snap, Path(root))
    assert event.type in ("compaction.completed", "compaction.skipped")
    if event.type == "compaction.skipped":
        return
    c = event.compaction
    assert c is not None
    start, end = c.start, c.end
    assert (c.first_id, c.last_id) == (ids[start], ids[end - 1])
    # Atomic groups: no call, output or reasoning item is separated from its partners.
    _check_pairs(items[start:end])
    _check_pairs(items[:start] + items[end:])
    for j, item in enumerate(items[:-1]):
        if item.get("type") == "reasoning":
            assert j + 1 not in (start, end), (j, start, end)
    applied = apply_compaction(items, event)
    assert items == before
    assert applied[:start] == items[:start]
    assert applied[start + len(c.replacement) :] == items[end:]
    _check_pairs(applied)
    # The replacement: valid input items, without the API's ids, the summary last.
    for item in c.replacement:
        assert item.get("type", "message") in (
            "message",
            "function_call",
            "function_call_output",
            "custom_tool_call",
            "custom_tool_call_output",
            "local_shell_call",
            "local_shell_call_output",
            "computer_call",
            "computer_call_output",
            "shell_call",
            "shell_call_output",
        )
        if item.get("type", "message") in ("message", "function_call", "custom_tool_call"):
            assert "id" not in item
    summary = c.replacement[-1]
    assert summary["type"] == "message" and summary["role"] == "user"
    assert summary["content"][0]["text"].startswith(SUMMARY_MARKER)
    # The applied history is a valid snapshot of this format, its ids stable and unique.
    parsed = parse_snapshot(_snapshot(applied, threshold, tools=tools), Settings())
    assert parsed.source_ids[:start] == ids[:start]
    own = [item["id"] for item in items[end:] if "id" in item]
    assert [item["id"] for item in applied[start + len(c.replacement) :] if "id" in item] == own
    assert set(own) <= set(parsed.source_ids)
    assert tokens_of(applied, parsed, TOKENIZER) == c.tokens_after


# --- unknown items: verbatim and counted ----------------------------------------------------------


def _conversation(extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "sys"},
        {"role": "user", "content": "Fix the bug in src/app.py please."},
    ]
    for k in range(8):
        items.append(_reasoning(k))
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{k}",
                "call_id": f"c{k}",
                "name": "bash",
                "arguments": json.dumps({"command": f"run {k}"}),
            }
        )
        items.append(
            {
                "type": "function_call_output",
                "call_id": f"c{k}",
                "output": f"output {k} " + "data " * 200,
            }
        )
    items.append({"role": "user", "content": "Now also update the docs."})
    items += extra or []
    items.append({"type": "message", "id": "msg_last", "role": "assistant", "content": "On it."})
    return items


def test_unknown_items_are_counted_and_survive_apply_verbatim(tmp_path: Path) -> None:
    unknown = {"type": "future_tool_call", "id": "ft_1", "payload": {"q": "a long query " * 20}}
    plain, grown = _conversation(), _conversation([unknown])
    parsed = parse_snapshot(_snapshot(plain, 100_000), Settings())
    assert tokens_of(grown, parsed, TOKENIZER) > tokens_of(plain, parsed, TOKENIZER) + 40
    # The newest item (the protected tail) survives the compaction as it was.
    newest = [*plain, unknown]
    event = _compact(_snapshot(newest, 600), tmp_path)
    assert event.type == "compaction.completed" and event.compaction is not None
    assert event.compaction.end == len(newest) - 1
    applied = apply_compaction(newest, event)
    assert applied[-1] is unknown
    assert [item for item in applied if item.get("type") == "future_tool_call"] == [unknown]
    # Inside the range it goes to the summary input (never silently dropped) and the transcript.
    early = _conversation()
    early.insert(3, unknown)
    event = _compact(_snapshot(early, 600), tmp_path / "early")
    assert event.compaction is not None and event.compaction.transcript is not None
    assert event.compaction.start <= 3 < event.compaction.end
    transcript = json.loads(Path(event.compaction.transcript.uri).read_text())
    assert unknown in transcript["messages"]


def test_kept_tools_are_carried_as_valid_items(tmp_path: Path) -> None:
    items = _conversation()
    event = _compact(
        _snapshot(items, 600, tools={"bash": {"compaction": "strip-responses"}}), tmp_path
    )
    assert event.type == "compaction.completed" and event.compaction is not None
    carried = event.compaction.replacement[:-1]
    calls = [i for i in carried if i.get("type") == "function_call"]
    outputs = [i for i in carried if i.get("type") == "function_call_output"]
    assert calls and len(calls) == len(outputs)
    assert all("id" not in i for i in calls)  # its reasoning item is not carried
    assert {o["output"] for o in outputs} == {STRIPPED_RESPONSE}
    assert all(i.get("type") != "reasoning" for i in carried)


# --- the command line -----------------------------------------------------------------------------


def test_cli_compacts_a_responses_snapshot(run_cli: CliRunner) -> None:
    items = [*_conversation(), WEB_SEARCH]
    snap = _snapshot(items, 600)
    path = run_cli.cwd / "snapshot.json"
    path.write_text(json.dumps(snap), encoding="utf-8")
    result = run_cli("compact", path)
    assert result.code == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert [e["type"] for e in events][-1] == "compaction.completed"
    event = events[-1]
    parse_event(event)
    comp = event["compaction"]
    assert comp["format"] == "responses"
    assert comp["tokens_after"] < comp["tokens_before"]
    applied = apply_compaction(items, event)
    assert applied == items[: comp["start"]] + comp["replacement"] + items[comp["end"] :]
    assert applied[-1] == WEB_SEARCH
    formats.to_messages("responses", applied)  # still a valid history


def test_cli_rejects_a_bad_item_naming_the_field(run_cli: CliRunner) -> None:
    snap = _snapshot([{"role": "user", "content": "hi"}, OUT], 600)
    path = run_cli.cwd / "snapshot.json"
    path.write_text(json.dumps(snap), encoding="utf-8")
    result = run_cli("compact", path)
    assert result.code == 2
    error = json.loads(result.stderr.strip().splitlines()[-1])
    assert error["error"] == "invalid_snapshot"
    assert error["field"] == "messages[1]"


# --- reuse of an earlier parse ------------------------------------------------------------------


def test_a_parse_reusing_an_earlier_one_equals_a_fresh_parse() -> None:
    """Items equal under ``==`` whose JSON differs (1, 1.0, true) are normalized again."""
    first = [
        *ITEMS,
        {"type": "future_call", "id": "f1", "n": 1},  # own ids: derived ids would differ
        {"type": "shell_call", "id": "sh1", "call_id": "s1", "action": {"timeout": 1}},
        {"type": "shell_call_output", "id": "sho1", "call_id": "s1", "output": {"code": 1}},
        {"type": "x_call_output", "id": "xo1", "output": "a", "n": 1},  # no call_id: unknown
    ]
    second = copy.deepcopy(first)
    second[-4]["n"] = 1.0
    second[-3]["action"]["timeout"] = True
    second[-2]["output"]["code"] = 1.0
    second[-1]["n"] = 1.0
    second.append({"role": "user", "content": "more"})
    earlier = parse_snapshot(_snapshot(first, 100_000), Settings())
    reused = parse_snapshot(_snapshot(second, 100_000), Settings(), earlier=earlier)
    fresh = parse_snapshot(_snapshot(second, 100_000), Settings())
    assert reused.messages == fresh.messages
    assert reused.source_ids == fresh.source_ids
    # Items of unknown types are never read, only counted by the size of their JSON.
    assert (fresh.messages[-5].content, fresh.messages[-5].unknown_types) == ("", ("future_call",))
    unknown_json = '{"id":"f1","n":1.0,"type":"future_call"}'
    assert fresh.messages[-5].attachment_tokens == -(-len(unknown_json) // 3)
    assert fresh.messages[-2].unknown_types == ("x_call_output",)


# --- hostile items --------------------------------------------------------------------------------

ODD_VALUES = st.sampled_from(
    [
        None,
        0,
        1.0,
        True,
        "",
        "x",
        "\ud800",
        [],
        {},
        [{"type": 1}],
        [{"type": "input_text"}],
        {"type": "computer_screenshot"},
        [{"type": "summary_text", "text": 2}],
    ]
)
ITEM_KEYS = ["type", "role", "content", "call_id", "id", "name", "arguments", "input", "output",
             "summary", "encrypted_content", "action"]  # fmt: skip
ITEM_TYPES = ["message", "reasoning", "function_call", "function_call_output", "custom_tool_call",
              "custom_tool_call_output", "local_shell_call_output", "computer_call_output",
              "web_search_call", "x_call", "x_call_output", "", "_call"]  # fmt: skip


@st.composite
def _mutated(draw: st.DrawFn) -> list[Any]:
    items: list[Any] = copy.deepcopy(draw(response_histories(max_turns=6)))
    for _ in range(draw(st.integers(1, 3))):
        if not items:
            break
        k = draw(st.integers(0, len(items) - 1))
        op = draw(st.sampled_from(["set", "type", "delete", "replace", "duplicate"]))
        if op == "replace":
            items[k] = draw(ODD_VALUES)
        elif op == "duplicate":
            items.insert(k, copy.deepcopy(items[k]))
        elif isinstance(items[k], dict):
            key = draw(st.sampled_from(ITEM_KEYS))
            if op == "set":
                items[k][key] = draw(ODD_VALUES)
            elif op == "type":
                items[k]["type"] = draw(st.sampled_from(ITEM_TYPES))
            else:
                items[k].pop(key, None)
    return items


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=_mutated(), threshold=st.integers(0, 2000))
def test_mutated_items_are_compacted_or_rejected_with_a_field(
    items: list[Any], threshold: int
) -> None:
    snap = _snapshot(items, threshold)
    try:
        parsed = parse_snapshot(snap, Settings())
    except InvalidSnapshot as exc:
        assert exc.field.startswith("messages"), exc.field
        assert exc.reason
        return
    with tempfile.TemporaryDirectory() as root:
        event = Pipeline(parsed.settings, Adapters(store=FileStore(Path(root)))).run(parsed)
    last = event[-1]
    assert last.type in ("compaction.completed", "compaction.skipped"), last
    if last.type == "compaction.completed":
        assert last.compaction is not None
        formats.to_messages("responses", apply_compaction(items, last))  # still valid


_EDITS = st.lists(
    st.tuples(st.sampled_from(["drop", "edit", "own-id", "number", "bool"]), st.integers(0, 40)),
    max_size=4,
)


def _edited(items: list[dict[str, Any]], edits: list[tuple[str, int]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(items)
    for kind, at in edits:
        i = at % len(out)
        if kind == "drop" and len(out) > 1:
            out.pop()
        elif kind == "edit":
            out[i] = {**out[i], "x_note": f"edited {at}"}
        elif kind == "own-id":
            out[i] = {**out[i], "id": f"own-{at}"}
        elif kind in ("number", "bool"):  # == between snapshots, but not the same JSON
            out[i] = {**out[i], "id": f"flag-{i}", "x_flag": 1 if kind == "number" else True}
    return out


def _parse_outcome(snap: dict[str, Any], earlier: Any) -> Any:
    try:
        parsed = parse_snapshot(snap, Settings(), earlier=earlier)
    except InvalidSnapshot as exc:
        return ("rejected", exc.field, exc.reason)
    return (parsed.source_ids, parsed.plain, [m.model_dump() for m in parsed.messages])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=response_histories(max_turns=6), more=response_histories(max_turns=3),
       first=_EDITS, then=_EDITS)  # fmt: skip
def test_a_reusing_parse_is_the_parse_from_scratch(
    items: list[dict[str, Any]],
    more: list[dict[str, Any]],
    first: list[tuple[str, int]],
    then: list[tuple[str, int]],
) -> None:
    one = _edited(items, first)
    grown = [*one, *(m for m in more if m.get("type") not in ("function_call_output",))]
    two = _edited(grown, then)
    for item in two:  # 1 -> 1.0, true -> 1: still == to the first snapshot's items
        if "x_flag" in item:
            item["x_flag"] = 1.0 if item["x_flag"] is not True else 1
    try:
        earlier = parse_snapshot(_snapshot(one, 100_000), Settings())
    except InvalidSnapshot:
        return
    snap = {**_snapshot(two, 100_000), "revision": 10**6}
    assert _parse_outcome(snap, earlier) == _parse_outcome(snap, None)
