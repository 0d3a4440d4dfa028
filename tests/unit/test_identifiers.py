"""The code names a range taught the agent: their shapes, their rank, and the digest that keeps
the best ranked of them within its bound; the LLM's checklist; one carried copy of a repeated
user turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.bash_turns import bash_call, bash_result

from worker.config import Settings
from worker.core.identifiers import (
    CALLS,
    OUTPUT,
    TEXT,
    code_names,
    names_in,
    names_shown,
    shown_by,
)
from worker.pipeline import Adapters, Pipeline
from worker.summarize import SummaryRequest, digest
from worker.summarize.digest import CODE_NAMES, OUTPUT_NAMES, DigestSummarizer, render_names
from worker.tokens import count_tokens
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent, Summary
from worker.wire.models import Message
from worker.wire.snapshots import parse_snapshot


def test_each_shape_of_code_name_is_found_and_prose_is_not() -> None:
    text = (
        "from django.db.models import QuerySet; x = construct_instance(form); "
        "settings.configure(INSTALLED_APPS=[]); class Meta: pass; getValue; _cstack; "
        "grep -rn foo astropy/modeling/separable.py:12 and setup.py; models.Model"
    )
    assert names_in(text) == [
        "django.db.models",
        "QuerySet",
        "construct_instance",
        "configure",  # called: a plain name code calls
        "INSTALLED_APPS",
        "getValue",
        "_cstack",
        "astropy/modeling/separable.py",
        "setup.py",
        "models.Model",
        "Meta",  # defined: names a definition gives come last
    ]


def test_keywords_builtins_methods_of_builtin_types_and_sed_scripts_are_not_names() -> None:
    text = (
        "for item in items: print(len(item)); lines.append(x); s.strip(); __init__; "
        "os.path.join(a, b); self.value.other; sed -i 's/old/new/' it; ab"
    )
    assert (names_in(text)) == []


def test_a_string_escape_in_a_script_ends_the_name_before_it() -> None:
    """``python -c`` scripts and JSON-quoted code hold ``\\n`` and ``\\t`` as two characters:
    the letter of an escape is no part of the word after it."""
    script = r"""python -c "import sys\nclass Meta:\n\tprint('\nFAILURE: nested_model')\n" """
    assert names_in(script) == ["nested_model", "Meta"]
    assert names_in(r"print('\nSeparability\nSUCCESS\tisOK')") == ["isOK"]


def test_a_word_inside_a_path_or_dotted_name_is_not_listed_again() -> None:
    assert (names_in("python tests/test_forms.py and forms.models.construct_instance")) == [
        "tests/test_forms.py",
        "forms.models.construct_instance",
    ]
    assert shown_by("django/db/query.py") >= {"db/query.py", "query.py", "query", "django/db"}
    assert shown_by("a.b.Model") == {"a", "b", "Model", "a.b", "b.Model"}


def _session() -> list[Message]:
    return [
        bash_call("1", "grep -rn 'def construct_instance' django/forms", "Where is it defined?"),
        bash_result("1", "django/forms/models.py:31:def construct_instance(form, instance):\n"),
        bash_call(
            "2", "python -c 'from django.forms import construct_instance'", "Now `QuerySet`."
        ),
        bash_result("2", "QuerySet_helper fields_for_model ModelFormMetaclass\n"),
        bash_call("3", "python -m pytest tests/model_forms -k test_default_not_populated"),
        bash_result("3", "1 passed\n"),
    ]


def test_names_rank_by_where_they_were_seen_then_by_how_often() -> None:
    ranked = code_names(_session())
    tiers = {n.text: n.tier for n in ranked}
    assert tiers["construct_instance"] == CALLS  # called, printed and mentioned: the best tier
    assert tiers["QuerySet"] == TEXT
    assert tiers["fields_for_model"] == OUTPUT
    assert [n.tier for n in ranked] == sorted(n.tier for n in ranked)
    by_name = {n.text: n for n in ranked}
    assert by_name["construct_instance"].count == 2  # the count of its best tier


def _request(messages: list[Message], bound: int, previous: str | None = None) -> SummaryRequest:
    return SummaryRequest(
        conversation_id="c",
        revision=1,
        messages=messages,
        previous_summary=previous,
        max_input_chars=100_000,
        max_output_tokens=bound,
        source_tokens=100_000,
    )


def _section(text: str, title: str) -> str:
    if f"## {title}\n" not in text:
        return ""
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _digest(messages: list[Message], bound: int = 2000, previous: str | None = None) -> Summary:
    return DigestSummarizer().summarize(_request(messages, bound, previous))


def test_the_digest_lists_used_names_apart_from_names_only_a_tool_printed() -> None:
    text = _digest(_session()).text
    used = _section(text, CODE_NAMES)
    printed = _section(text, OUTPUT_NAMES)
    assert "In the agent's commands and edits: " in used
    for name in ("construct_instance", "test_default_not_populated"):
        assert name in used.split("\n")[0].split()
    assert "In its notes: QuerySet" in used
    # Only a tool printed them (the grep hit's path too: the agent searched a folder).
    assert set(printed.split(": ", 1)[1].split()) == {
        "QuerySet_helper",
        "fields_for_model",
        "ModelFormMetaclass",
        "django/forms/models.py",
    }


def _names_of(text: str, title: str) -> list[str]:
    return [
        n for line in _section(text, title).splitlines() for n in line.split(": ", 1)[1].split()
    ]


def test_a_tighter_bound_gives_way_by_value_and_each_name_list_loses_its_last_names() -> None:
    many = [
        bash_call(str(i), f"python run_{i}.py --flag value_{i}", f"Checking helper_{i}.")
        for i in range(40)
    ] + [bash_result("0", " ".join(f"printed_name_{i}" for i in range(200)))]
    full = _digest(many, bound=4000)
    assert len(_names_of(full.text, OUTPUT_NAMES)) == 200 and not full.truncated
    used_all = _names_of(full.text, CODE_NAMES)
    printed_all = _names_of(full.text, OUTPUT_NAMES)
    stages = []
    for bound in range(full.tokens, 300, -40):
        text = _digest(many, bound=bound).text
        used, printed = _names_of(text, CODE_NAMES), _names_of(text, OUTPUT_NAMES)
        assert used == used_all[: len(used)] and printed == printed_all[: len(printed)]
        stages.append(("## Actions" in text, len(printed), len(used)))
    # The action log goes before any printed name, and every printed name before a used one.
    assert any(not actions and printed == 200 for actions, printed, _ in stages)
    assert any(printed == 0 and used == len(used_all) for _, printed, used in stages)
    assert stages[-1][2] < len(used_all)
    assert printed_all[0] == "printed_name_199"  # same count and tier: the newest first


_LABELS = ["In the agent's commands and edits", "In its notes", "Seen in outputs"]
_NAME = st.from_regex(r"[A-Za-z_][\w.:/()\-]{0,16}[\w)]?", fullmatch=True)
_ITEMS = st.lists(st.tuples(st.sampled_from(_LABELS), _NAME), max_size=60)


def _largest_fitting(items: list[tuple[str, str]], max_tokens: int, model: str | None) -> int:
    fitting = [
        m
        for m in range(len(items) + 1)
        if count_tokens(render_names(items[:m]), model) <= max_tokens
    ]
    return max(fitting, default=0)


@settings(deadline=None, max_examples=150)
@given(
    items=_ITEMS,
    max_tokens=st.integers(0, 300),
    model=st.sampled_from([None, "gpt-4"]),
    grouped=st.booleans(),
)
def test_the_names_kept_are_the_longest_prefix_that_fits(
    items: list[tuple[str, str]], max_tokens: int, model: str | None, grouped: bool
) -> None:
    """The search from an estimate keeps what halving the names kept: the most best-ranked
    names within the bound, counted exactly (each label's names together, as a section lists
    them, or apart)."""
    if grouped:
        items = sorted(items, key=lambda item: _LABELS.index(item[0]))
    full = render_names(items)
    text, tokens = digest._fitting_prefix(
        items, (full, count_tokens(full, model)), max_tokens, model
    )
    assert text == render_names(items[: _largest_fitting(items, max_tokens, model)])
    assert tokens == count_tokens(text, model)


_TEXT = st.lists(
    st.sampled_from([*"ab Z9_./:#(-'", "\n", "\n\n", "  ", "é", "日本", "## ", "\t", "x" * 40]),
    max_size=120,
).map("".join)


@settings(deadline=None, max_examples=150)
@given(
    texts=st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), _TEXT), max_size=8),
    commands=st.lists(_TEXT, max_size=4),
    bound=st.integers(30, 600),
    model=st.sampled_from([None, "gpt-4"]),
)
def test_a_digest_reports_its_own_exact_count(
    texts: list[tuple[str, str]], commands: list[str], bound: int, model: str | None
) -> None:
    """The count a digest reports is its text's, whether it fits at once, after its sections
    were cut (the count then comes from the sections' counts) or after a cut of the whole."""
    messages = [bash_call(str(k), command, "see `Z_9`") for k, command in enumerate(commands)]
    messages += [
        Message(id=f"m{k}", role=role, content=text, source_index=0)
        for k, (role, text) in enumerate(texts)
        if role != "tool"
    ]
    messages += [
        bash_result(str(k), text) for k, (role, text) in enumerate(texts) if role == "tool"
    ]
    summary = DigestSummarizer().summarize(
        _request(messages, bound).model_copy(update={"model": model})
    )
    assert summary.tokens == count_tokens(summary.text, model)
    assert summary.tokens <= bound


def test_names_an_earlier_digest_listed_are_carried_into_the_next() -> None:
    first = _digest(_session()).text
    later = _digest(
        [bash_call("9", "cat docs/ref.rst"), bash_result("9", "text\n")], previous=first
    )
    carried = _section(later.text, CODE_NAMES)
    assert "From earlier summaries: " in carried
    assert "construct_instance" in carried
    # Only a tool printed it: it stays among the printed names, after this range's own.
    assert "fields_for_model" not in carried
    assert "fields_for_model" in _section(later.text, OUTPUT_NAMES)


def test_an_earlier_summarys_printed_names_come_after_this_ranges_printed_names() -> None:
    """Recency first among the printed names: what this range's tools printed, then what an
    earlier range's printed (BENCHMARKS.md, "Replayed sessions")."""
    first = _digest([bash_call("1", "cat a.py"), bash_result("1", "older_printed_name\n")]).text
    assert "older_printed_name" in _section(first, OUTPUT_NAMES)
    later = _digest(
        [bash_call("2", "cat b.py"), bash_result("2", "newer_printed_name\n")], previous=first
    ).text
    printed = _names_of(later, OUTPUT_NAMES)
    assert printed.index("newer_printed_name") < printed.index("older_printed_name")
    assert "older_printed_name" not in _section(later, CODE_NAMES)


def test_a_name_a_longer_dotted_name_shows_is_listed_once_at_the_better_rank() -> None:
    """``Model`` in the agent's call and ``app.models.Model`` printed later: one entry, the
    longer name, where the agent's ranked; a path never absorbs a name (``setup.cfg`` is not
    ``setup``)."""
    text = _digest(
        [
            bash_call("1", "python -c 'Model_check(); setup_helper()'"),
            bash_result("1", "app.models.Model_check\nsetup_helper.cfg\n"),
        ]
    ).text
    used, printed = _names_of(text, CODE_NAMES), _names_of(text, OUTPUT_NAMES)
    assert "app.models.Model_check" in used and "Model_check" not in used
    assert "app.models.Model_check" not in printed
    assert "setup_helper" in used


def test_names_only_a_directory_listing_printed_come_last() -> None:
    """``ls -R`` prints file names by the hundred, which the agent seldom names again: they
    rank after every name a read or a run printed, on their own line."""
    listing = "\n".join(f"listed_module_{k}.py" for k in range(5))
    text = _digest(
        [
            bash_call("1", "ls -R"),
            bash_result("1", listing + "\nrun_tests.py\n"),
            bash_call("2", "cat run_tests.py"),
            bash_result("2", "def read_printed_name():\n    pass\n"),
        ]
    ).text
    printed = _section(text, OUTPUT_NAMES)
    lines = dict(line.split(": ", 1) for line in printed.splitlines())
    assert "read_printed_name" in lines["Seen in outputs"]
    assert "listed_module_0.py" in lines["In directory listings"]
    assert "listed_module_0.py" not in lines["Seen in outputs"]
    names = _names_of(text, OUTPUT_NAMES)
    assert names.index("read_printed_name") < names.index("listed_module_0.py")
    # Passed on, they stay listing names, after the next range's own.
    later = _digest(
        [bash_call("3", "ls docs"), bash_result("3", "newer_listed_page.rst\n")], previous=text
    ).text
    lines = dict(line.split(": ", 1) for line in _section(later, OUTPUT_NAMES).splitlines())
    assert "listed_module_0.py" not in lines["Seen in outputs"]
    listed = lines["In directory listings"].split()
    assert listed.index("newer_listed_page.rst") < listed.index("listed_module_0.py")


def test_a_listings_entries_beside_what_the_range_works_on_come_first() -> None:
    """Of the names an ``ls -R`` printed, those sharing a word with what the range touched or
    said come first (the agent read ``pkg/sampled.py``: ``test_sampled.py`` is the test it
    goes on to run, and its directory), so they are the ones a tight bound keeps; a word most
    entries hold (``module``) relates none of them, and the others keep the listing's order."""
    listing = "\n".join(f"module_{k}.py" for k in range(60)) + "\npkg/tests:\ntest_sampled.py\n"
    messages = [
        bash_call("1", "ls -R", "Listing the package to find each module."),
        bash_result("1", listing),
        bash_call("2", "cat pkg/sampled.py"),
        bash_result("2", "x = 1\n"),
    ]
    listed = _names_of(_digest(messages).text, OUTPUT_NAMES)
    # ``pkg/tests`` shares ``pkg`` with the file read: related too.
    assert set(listed[:2]) == {"test_sampled.py", "pkg/tests"}, listed[:5]
    assert listed[2:5] == ["module_0.py", "module_1.py", "module_2.py"]
    tight = _names_of(_digest(messages, bound=120).text, OUTPUT_NAMES)
    assert "test_sampled.py" in tight and "module_59.py" not in tight


def _snapshot(messages: list[dict[str, Any]], **compaction: Any) -> dict[str, Any]:
    return {
        "conversation_id": "names",
        "revision": 1,
        "format": "openai",
        "model": {"name": "gpt-4o"},
        "messages": messages,
        "config": {"mode": "local_only", **compaction},
    }


def _openai_session(reminders: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix construct_instance in django/forms/models.py."},
    ]
    for i in range(6):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": f"cat f_{i}.py"})},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        output = "\n".join(f"result {i}.{k}: {k * 7919 % 104729}" for k in range(150))
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": output})
        if i < reminders:
            messages.append({"role": "user", "content": "Reply with exactly one command."})
    messages.append({"role": "assistant", "content": "Done reading."})
    return messages


def _compact(snapshot: dict[str, Any], tmp_path: Path) -> CompletedEvent:
    parsed = parse_snapshot(snapshot, Settings())
    event = Pipeline(parsed.settings, Adapters(store=FileStore(tmp_path))).run(parsed)[-1]
    assert isinstance(event, CompletedEvent), event
    return event


def test_a_user_turn_repeated_word_for_word_is_carried_once(tmp_path: Path) -> None:
    event = _compact(
        _snapshot(
            _openai_session(4), auto_compact_threshold_tokens=2000, summary_max_output_tokens=300
        ),
        tmp_path,
    )
    carried = [m["content"] for m in event.compaction.replacement if m.get("role") == "user"]
    reminders = [c for c in carried if c == "Reply with exactly one command."]
    assert len(reminders) == 1
    assert "Fix construct_instance in django/forms/models.py." in carried
    assert "Reply with exactly one command." in event.compaction.summary.text  # summarized once


class _Checklist:
    """The LLM's place in the pipeline: keeps each request; answers with the digest."""

    def __init__(self) -> None:
        self.requests: list[SummaryRequest] = []

    def summarize(self, request: SummaryRequest) -> Summary:
        self.requests.append(request)
        return DigestSummarizer().summarize(request)


def test_the_llm_gets_the_names_the_agent_used_in_its_checklist(tmp_path: Path) -> None:
    messages = _openai_session(0)
    messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps(
        {"command": "python -c 'from app.forms import construct_instance, ModelFormMetaclass'"}
    )
    snapshot = _snapshot(
        messages,
        mode="prefer_remote",
        auto_compact_threshold_tokens=2000,
        summary_max_output_tokens=300,
    )
    parsed = parse_snapshot(snapshot, Settings())
    llm = _Checklist()
    Pipeline(parsed.settings, Adapters(store=FileStore(tmp_path), llm=llm)).run(parsed)
    (request,) = llm.requests
    assert {"construct_instance", "ModelFormMetaclass"} <= set(request.must_keep)
    assert request.must_keep.index("f_1.py") < request.must_keep.index("construct_instance")


def test_names_the_messages_kept_beside_the_summary_show_are_not_listed_again(
    tmp_path: Path,
) -> None:
    """The task, the system prompt and the newest exchange stay verbatim beside the summary:
    a name they show whole is not listed (its room goes to one they do not show); what only a
    kept tool output shows is listed all the same (an older output may be elided later)."""
    messages = _openai_session(0)
    command = "python -c 'from app import range_only_helper, tail_helper, construct_instance'"
    messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": command})
    messages[3]["content"] += "\nprinted_only_name printed_beside_name app.core.InnerThing"
    messages[-1]["content"] = "Next: `tail_helper`, `printed_beside_name`, `core.InnerThing`."
    snapshot = _snapshot(
        messages, auto_compact_threshold_tokens=2000, summary_max_output_tokens=300
    )
    text = _compact(snapshot, tmp_path).compaction.summary.text
    names = _names_of(text, CODE_NAMES) + _names_of(text, OUTPUT_NAMES)
    assert {"range_only_helper", "printed_only_name"} <= set(names), names
    assert not {"tail_helper", "printed_beside_name", "construct_instance"} & set(names), names
    assert "app.core.InnerThing" in names  # the kept text shows only a part of it


def test_what_kept_messages_show_whole() -> None:
    kept = [
        bash_call("1", "cat /testbed/pkg/sub/mod.py", "Then `django.db.models.Model`."),
        bash_result("1", "printed_by_a_tool"),
    ]
    shown = names_shown(kept)
    assert {"/testbed/pkg/sub/mod.py", "pkg/sub/mod.py", "sub/mod.py", "mod.py"} <= shown
    assert "pkg/sub" not in shown and "/testbed/pkg" not in shown  # a directory is not seen whole
    assert {"django.db.models.Model", "db.models", "models.Model", "Model"} <= shown
    assert "printed_by_a_tool" not in shown


def test_in_a_provider_format_the_range_is_told_from_what_is_kept_by_wire_index(
    tmp_path: Path,
) -> None:
    """An Anthropic history's system prompt and tool results are messages of their own, so the
    parsed messages do not line up with the wire's: every name of every assistant message is
    in the compacted history (the summary or a message kept), none taken for a kept one's."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser."}]
    for i in range(6):  # two tool calls a turn: their results are two messages here
        uses = [
            {"type": "tool_use", "id": f"t{i}{j}", "name": "bash", "input": {"command": "ls"}}
            for j in range(2)
        ]
        text = {"type": "text", "text": f"Looking at `step_helper_{i}`."}
        messages.append({"role": "assistant", "content": [text, *uses]})
        output = "\n".join(f"line {i}.{k}: {k * 7919 % 104729}" for k in range(80))
        results = [
            {"type": "tool_result", "tool_use_id": f"t{i}{j}", "content": output} for j in range(2)
        ]
        messages.append({"role": "user", "content": results})
    messages.append({"role": "assistant", "content": "Going on with `newest_helper`."})
    snapshot = {
        **_snapshot(messages, auto_compact_threshold_tokens=2000, summary_max_output_tokens=300),
        "format": "anthropic",
        "model": {"name": "claude-sonnet-4-5"},
        "system": "You are a coding agent.",
    }
    compaction = _compact(snapshot, tmp_path).compaction
    history = json.dumps(compaction.replacement) + json.dumps(messages[compaction.end :])
    names = [f"step_helper_{i}" for i in range(6)] + ["newest_helper"]
    assert [n for n in names if n not in history] == []
