"""The digest's "Files touched", "Latest state" and "Actions" (issue 14 §2): only paths the
conversation really used, normalized once; changes before looks; the last real conclusion."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.bash_turns import bash_call, bash_result

from worker.core.facts import extract_facts, key_argument
from worker.core.files import (
    call_file_uses,
    file_uses,
    normalize_path,
    only_lists,
    parse_arguments,
    shell_file_uses,
)
from worker.summarize import SummaryRequest
from worker.summarize.digest import DigestSummarizer, parse_files
from worker.wire.models import Message, ToolCall

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from corpus import corpus_dir


def _bash(
    command: str, output: str = "<returncode>0</returncode>\n<output>\n</output>"
) -> list[str]:
    return [p for p, _ in call_file_uses("bash", json.dumps({"command": command}), output)]


# The false positives of issue 14, each in the command that produced it.
@pytest.mark.parametrize(
    ("command", "not_files", "files"),
    [
        (
            "grep -rn 'models.Model' django/db/models/base.py",
            ["models.Model"],
            ["django/db/models/base.py"],
        ),
        ('grep -n "qs.alias" tests/queries/tests.py', ["qs.alias"], ["tests/queries/tests.py"]),
        ('python -c "import django.conf; print(django.conf.settings)"', ["django.conf"], []),
        ("python -m django.conf", ["django.conf"], []),
        ("sed -n '/def/p' a/b.py", ["/def", "/def/p"], ["a/b.py"]),
        (
            "sed -n '/def fromstring/,/return/p' astropy/io/fits/hdu/base.py",
            ["/return/p"],
            ["astropy/io/fits/hdu/base.py"],
        ),
        ("sed -i 's/return/yield/' pkg/mod.py", ["s/return", "s/return/yield/"], ["pkg/mod.py"]),
        (
            "sed -i '1819s/reuse/None/reuse/' internal/llm/client.go",
            ["1819s/reuse", "None/reuse"],
            ["internal/llm/client.go"],
        ),
        (
            "cat <<'EOF' > fix.py\nfrom a.b import c\nx = np.array([1/2])\nEOF",
            ["a.b", "np.array", "1/2"],
            ["fix.py"],
        ),
        (
            "# Look at the models.Model class\ncat django/db/models/base.py",
            ["models.Model"],
            ["django/db/models/base.py"],
        ),
    ],
)
def test_the_issues_false_positives_are_not_files(
    command: str, not_files: list[str], files: list[str]
) -> None:
    found = _bash(command)
    for word in not_files:
        assert word not in found
    assert found == files


def test_one_path_is_listed_once_however_spelled() -> None:
    assert normalize_path("./internal/llm/") == "internal/llm"
    assert normalize_path("internal//llm/./x.go") == "internal/llm/x.go"
    messages = [
        bash_call("c1", "ls internal/llm"),
        bash_result("c1", "client.go\n"),
        bash_call("c2", "ls ./internal/llm/"),
        bash_result("c2", "client.go\n"),
    ]
    assert extract_facts(messages).paths == ["internal/llm"]


def test_kinds_of_use() -> None:
    uses = shell_file_uses(
        "cat a.py && sed -i 's/x/y/' b.py && echo hi > c.txt && rm d.py && ls e/ && python f.py"
        " && pytest tests/test_g.py::test_h && cp h.py i.py && mv j.py k.py && touch l.md"
    )
    assert uses == [
        ("a.py", "read"),
        ("b.py", "edited"),
        ("c.txt", "created"),
        ("d.py", "deleted"),
        ("e/", "listed"),
        ("f.py", "ran"),
        ("tests/test_g.py", "ran"),
        ("h.py", "read"),
        ("i.py", "created"),
        ("j.py", "deleted"),
        ("k.py", "created"),
        ("l.md", "created"),
    ]


def test_a_path_the_output_reports_missing_is_dropped() -> None:
    missing = "<returncode>1</returncode>\n<output>\ncat: nope.py: No such file or directory\n"
    assert _bash("cat nope.py", missing) == []
    refused = "<returncode>2</returncode>\n<output>\nbash: -c: line 1: syntax error near `('\n"
    assert _bash("sed -i 's/a/b/' x.py (", refused) == []


def test_file_tools_use_their_path_arguments() -> None:
    args = json.dumps({"command": "str_replace", "path": "./src/app.py", "old_str": "a.b"})
    assert call_file_uses("str_replace_editor", args, "ok") == [("src/app.py", "edited")]
    assert call_file_uses("read_file", json.dumps({"file_path": "README.md"}), "x") == [
        ("README.md", "read")
    ]
    patch = "*** Begin Patch\n*** Update File: a/b.py\n@@\n-x\n+y\n*** Add File: c.py\n+z\n"
    assert call_file_uses("apply_patch", json.dumps({"input": patch}), "") == [
        ("a/b.py", "edited"),
        ("c.py", "created"),
    ]


@pytest.mark.parametrize(
    "arguments",
    [
        json.dumps({"command": "cat a.py && rm b/c.txt"}),
        json.dumps({"command": "view", "path": "./d.py", "paths": ["e.md", 1]}),
        json.dumps({"query": "x"}),
        json.dumps("cat f.py"),
        "cat g.py",  # not JSON
        "",
        "null",
        "{",
    ],
)
def test_arguments_parsed_once_give_what_the_text_gives(arguments: str) -> None:
    """extract_facts parses a call's arguments once for its files and its key argument."""
    value = parse_arguments(arguments)
    for tool in ("bash", "str_replace_editor"):
        expected = call_file_uses(tool, arguments, "ok")
        assert file_uses(tool, arguments, value, "ok") == expected
    call = ToolCall(id="c", name="bash", arguments=arguments)
    message = Message(id="a", role="assistant", tool_calls=(call,), source_index=0)
    (action,) = extract_facts([message]).actions
    assert action.key_argument == key_argument(arguments)
    assert action.files == call_file_uses("bash", arguments, "")


def test_an_output_is_searched_only_when_the_call_used_files() -> None:
    refused = "bash: -c: line 1: syntax error near `('\ncat: x.py: No such file or directory\n"
    assert _bash("true", refused) == []
    assert _bash("cat x.py y.py", refused) == []  # refused: none
    assert _bash("cat x.py y.py", refused.split("\n", 1)[1]) == ["y.py"]  # x.py is missing


def _digest(messages: list[Message], previous: str | None = None) -> str:
    request = SummaryRequest(
        conversation_id="c",
        revision=1,
        messages=messages,
        previous_summary=previous,
        max_input_chars=100_000,
        max_output_tokens=2000,
        source_tokens=100_000,
    )
    return DigestSummarizer().summarize(request).text


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _session() -> list[Message]:
    return [
        Message(
            id="u", role="user", content="Fix the alias bug in qs.alias handling.", source_index=0
        ),
        bash_call("1", "grep -rn 'qs.alias' django/db/models/query.py", "Let me look for it."),
        bash_result("1", "120:    qs.alias(x)\n"),
        bash_call(
            "2",
            "sed -i 's/return/yield/' django/db/models/query.py",
            "The bug is that alias() returns early, so the annotation is lost. I will fix it.",
        ),
        bash_result("2", ""),
        bash_call("3", "python reproduce.py", "Let me run the reproduction."),
        bash_result("3", "OK\n"),
    ]


def test_the_digest_lists_changed_files_apart_from_read_ones() -> None:
    files = _section(_digest(_session()), "Files touched")
    assert files.splitlines() == [
        "Changed:",
        "- `django/db/models/query.py` (read, edited)",
        "Read, listed or run:",
        "- `reproduce.py` (ran)",
    ]
    assert "qs.alias" not in files and "s/return" not in files


def test_actions_show_changes_with_their_files_first() -> None:
    actions = _section(_digest(_session()), "Actions").splitlines()
    assert actions[1] == "Changes:"
    assert actions[2].startswith("- edited `django/db/models/query.py`: bash `sed -i")
    assert actions.index("Looked at or ran:") > 2


def test_latest_state_is_the_last_conclusion_not_an_announcement() -> None:
    state = _section(_digest(_session()), "Latest state")
    assert state.startswith("The bug is that alias() returns early")
    assert "Last call: bash `python reproduce.py` -> ok" in state
    assert "Next step: Let me run the reproduction." in state


def test_files_accumulate_from_an_earlier_digest_with_their_kinds() -> None:
    first = _digest(_session())
    later = [bash_call("9", "cat docs/ref.rst"), bash_result("9", "text\n")]
    files = dict(parse_files(_section(_digest(later, previous=first), "Files touched")))
    assert files["django/db/models/query.py"] == ["read", "edited"]
    assert files["docs/ref.rst"] == ["read"]


@pytest.mark.corpus
@pytest.mark.skipif(corpus_dir() is None, reason="corpus absent: set COMPACTOR_CORPUS_DIR")
def test_digest_files_precision_and_recall_on_the_corpus() -> None:
    from digest_files_bench import measure

    result = measure()
    assert result["conversations"] == 100
    assert result["precision"] >= 0.95, result
    assert result["recall"] >= 0.98, result


@pytest.mark.parametrize(
    ("tool", "arguments", "lists"),
    [
        ("bash", {"command": "ls -R"}, True),
        ("bash", {"command": "cd /testbed && ls -la tests"}, True),
        ("bash", {"command": "find . -name '*.py' | head -20"}, True),
        ("bash", {"command": "tree src | grep models"}, True),
        ("bash", "ls -F", True),  # arguments that are not JSON: the command itself
        ("bash", {"command": "cat setup.py"}, False),
        ("bash", {"command": "ls; cat setup.py"}, False),
        ("bash", {"command": "grep -rn construct_instance ."}, False),
        ("bash", {"command": "find . -name '*.pyc' -delete"}, False),
        ("bash", {"command": "find . -exec grep -l x {} +"}, False),
        ("bash", {"command": "cat <<'EOF' > ls.py\nls\nEOF"}, False),
        ("bash", {"command": ""}, False),
        ("list_files", {"path": "src"}, True),
        ("glob", {"pattern": "**/*.py"}, True),
        ("read_file", {"path": "src/app.py"}, False),
        ("str_replace_editor", {"command": "view", "path": "src"}, False),
    ],
)
def test_a_call_that_only_lists_directories(tool: str, arguments: object, lists: bool) -> None:
    """What only lists directories prints names of files, not code it read (the digest ranks
    such names last)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    assert only_lists(tool, raw) is lists
