"""The ``responses`` wire format (issue 12 §2): OpenAI Responses API input items normalize to the
internal model; calls and outputs pair by ``call_id``, reasoning travels with its call, unknown
items are kept verbatim and counted."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from worker import formats
from worker.client import project
from worker.compaction import STRIPPED_ARGUMENTS, STRIPPED_RESPONSE
from worker.config import CompactionConfig
from worker.errors import InvalidSnapshot
from worker.groups import group_messages
from worker.models import canonical_json

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
        ("ws_1", "assistant", canonical_json(WEB_SEARCH), "", [], None, None, False),
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
        ("msg_old", "assistant", '{"id":"msg_old","type":"item_reference"}', "", [], None, None,
         False),
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
    assert messages[4].content == canonical_json(items[4])
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
    "part type": ([{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                  "messages[0].content[0].type", "unexpected content part type"),
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
    "output part": ([CALL, {**OUT, "output": [{"type": "summary_text", "text": "x"}]}],
                    "messages[1].output[0].type", "unexpected content part type"),
    "orphan output": ([OUT], "messages[0]", "answers no earlier tool call"),
    "second output": ([CALL, OUT, OUT], "messages[2]", "second result"),
    "duplicate call": ([CALL, CALL], "messages[1]", "duplicate tool call id"),
    "summary not a list": ([{"type": "reasoning", "id": "rs", "summary": "x"}],
                           "messages[0].summary", "list"),
    "summary part": ([{"type": "reasoning", "id": "rs", "summary": [{"type": "x"}]}],
                     "messages[0].summary[0].type", "summary_text"),
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
