"""Nothing hostile renders: ``compactor show`` never writes a conversation's control
characters raw (window titles, clipboard writes, hyperlinks, screen clears and bidirectional
overrides in messages, ids, summaries and titles come out escaped, coloured or not: the bytes
are read), and the inspector's sign-in goes on only to a page under ``/ui``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from worker.cli.show import Style, render, visible
from worker.config import CompactionConfig, Settings
from worker.core.inspection import compaction_view
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent

HOSTILE = [
    "\x1b]0;owned\x07",  # window title
    "\x1b]52;c;cm0gLXJmIC8=\x07",  # clipboard write
    "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",  # hyperlink
    "\x1b[2J\x1b[H",  # clear the screen
    "\x9b31m",  # C1 CSI
    "\u202egnp.exe",  # right-to-left override
    "\r\x08\x7f",
]
# What our own colours are: ESC [ digits (;digits) m, nothing else.
OURS = re.compile(r"\x1b\[[0-9;]*m")


def event_with_hostile_content(tmp: Path) -> tuple[CompletedEvent, list[dict[str, object]]]:
    bad = "".join(HOSTILE)
    messages: list[dict[str, object]] = [
        {"id": f"u{bad}", "role": "user", "content": f"Fix {bad} now."}
    ]
    for k in range(12):
        arguments = json.dumps({"cmd": f"cat {bad}{k}"})
        call = {
            "id": f"c{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        output = f"Error: {bad}\n" + "x " * 200
        messages += [
            {
                "id": f"a{k}",
                "role": "assistant",
                "content": f"# Step {bad}\n",
                "tool_calls": [call],
            },
            {"id": f"r{k}{bad}", "role": "tool", "tool_call_id": f"c{k}", "content": output},
        ]
    messages.append({"id": "end", "role": "assistant", "content": "Done."})
    snap = {
        "conversation_id": "show-1",
        "revision": 1,
        "model": {"name": "gpt-4.1"},
        "messages": messages,
    }
    settings = Settings(compaction=CompactionConfig(auto_compact_threshold_tokens=2000))
    p = Pipeline(settings, Adapters(store=FileStore(tmp)), Reuse())
    event = p.run(p.parse(json.dumps(snap).encode()))[-1]
    assert isinstance(event, CompletedEvent), event
    return event, messages


@pytest.mark.parametrize("colour", [True, False])
def test_no_control_character_of_a_conversation_is_written_raw(
    tmp_path: Path, colour: bool
) -> None:
    event, messages = event_with_hostile_content(tmp_path)
    view = compaction_view(event, messages)
    text = "\n".join(render(view, width=160, style=Style(colour), full=True))
    rest = OURS.sub("", text) if colour else text
    assert not [
        ch for ch in rest if (ord(ch) < 0x20 and ch not in "\n\t") or 0x7F <= ord(ch) <= 0x9F
    ]
    assert "\u202e" not in rest
    assert "\\x1b]0;owned\\x07" in rest  # shown, escaped
    assert colour == bool(OURS.search(text))


def test_visible_escapes_what_a_terminal_would_act_on() -> None:
    assert visible("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert visible("x\u2067y") == "x\\u2067y"
    assert visible("keep\nlines\tand tabs, café") == "keep\nlines\tand tabs, café"


@pytest.mark.parametrize(
    ("asked", "goes"),
    [
        ("/ui/../../evil", "/ui/conversations"),
        ("/ui/%2e%2e/%2e%2e/evil", "/ui/conversations"),
        ("//evil.example/ui/x", "/ui/conversations"),
        ("/ui/conversations/acme%3Ac-1?limit=5", "/ui/conversations/acme%3Ac-1?limit=5"),
        ("/ui/conversations/a/../b", "/ui/conversations/b"),
        ("https://evil.example/ui/", "/ui/conversations"),
    ],
)
def test_sign_in_goes_on_only_to_a_page_under_ui(asked: str, goes: str) -> None:
    from worker.api.inspector import _next_path

    assert _next_path(asked) == goes
