"""JSON codecs (the seed's forms): exact round trips, byte-exact JSON text, real savings."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.compress import (
    compress_tool_result,
    compress_with_stats,
    csv_json,
    decompress_tool_result,
    glob_json,
    grep_json,
    jsontext,
    read_file,
    rle_json,
    structured,
)
from worker.compress.limits import ExpansionBudget
from worker.compress.node import same_json
from worker.compress.tally import TokenTally
from worker.errors import CompressionError
from worker.tokens import count_tokens

# --- strategies ---

awkward_text = st.text(
    alphabet=st.sampled_from(list("ab:/\\ \n\r\t\"'{}[]#_.0159é漢\u2028\x00")), max_size=12
) | st.sampled_from(["0e1", "05", "1.10", "_fmt", "[verbatim output follows]\n", "-0", "NaN"])
scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), awkward_text
)
json_value = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(awkward_text, inner, max_size=4),
    max_leaves=12,
)
segment = st.text(alphabet="ab_.-:09 é", min_size=1, max_size=5)
path = st.one_of(
    st.lists(segment, min_size=1, max_size=4).map(lambda s: "/Users/me/proj/" + "/".join(s)),
    st.lists(segment, min_size=1, max_size=3).map(lambda s: "C:\\proj\\" + "\\".join(s)),
)


@st.composite
def same_shaped_objects(draw: st.DrawFn) -> list[dict[str, Any]]:
    keys = draw(st.lists(awkward_text, min_size=1, max_size=4, unique=True))
    cell = st.one_of(scalar, path)
    return draw(st.lists(st.fixed_dictionaries({key: cell for key in keys}), max_size=6))


@st.composite
def grep_matches(draw: st.DrawFn) -> list[dict[str, Any]]:
    keys = draw(st.permutations(["file", "line_number", "line", "line_hash"]))
    files = draw(st.lists(path, min_size=1, max_size=3))
    rows = draw(
        st.lists(
            st.tuples(st.sampled_from(files), st.integers(0, 10**6), awkward_text, awkward_text),
            max_size=8,
        )
    )
    return [
        {key: {"file": f, "line_number": n, "line": line, "line_hash": h}[key] for key in keys}
        for f, n, line, h in rows
    ]


@st.composite
def read_file_results(draw: st.DrawFn) -> dict[str, Any]:
    content = draw(awkward_text)
    result: dict[str, Any] = {
        "content": content,
        "bytes_read": draw(st.sampled_from([len(content.encode("utf-8", "replace")), 7])),
        "lines_read": draw(st.sampled_from([read_file.line_count(content), 3])),
        "total_lines": draw(st.integers(0, 500)),
        "truncated": draw(st.booleans()),
    }
    keys = draw(st.permutations(list(result)))
    drop = draw(st.sets(st.sampled_from(keys), max_size=1))
    return {key: result[key] for key in keys if key not in drop}


def budget() -> ExpansionBudget:
    return ExpansionBudget("test")


def same(a: Any, b: Any) -> bool:
    return same_json(a, b)


# --- node codecs round trip ---


@settings(deadline=None, max_examples=100)
@given(value=same_shaped_objects())
def test_csv_round_trips(value: list[dict[str, Any]]) -> None:
    node = csv_json.encode(value)
    if node is not None:
        assert same(csv_json.decode(json.loads(json.dumps(node)), budget()), value)


@settings(deadline=None, max_examples=100)
@given(value=grep_matches())
def test_grep_v1_round_trips_with_non_contiguous_files(value: list[dict[str, Any]]) -> None:
    node = grep_json.encode(value)
    if node is not None:
        assert same(grep_json.decode(json.loads(json.dumps(node)), budget()), value)


@settings(deadline=None, max_examples=100)
@given(value=st.lists(st.one_of(path, awkward_text), max_size=8))
def test_glob_v1_round_trips(value: list[str]) -> None:
    node = glob_json.encode(list(value))
    if node is not None:
        assert same(glob_json.decode(node, budget()), value)


@settings(deadline=None, max_examples=100)
@given(lines=st.lists(st.tuples(awkward_text, st.integers(1, 4)), max_size=6))
def test_rle_lines_round_trips(lines: list[tuple[str, int]]) -> None:
    text = "\n".join(line for line, copies in lines for _ in range(copies))
    node = rle_json.encode(text)
    if node is not None:
        assert rle_json.decode(node, budget()) == text


@settings(deadline=None, max_examples=100)
@given(value=read_file_results())
def test_read_file_drops_round_trip(value: dict[str, Any]) -> None:
    node = read_file.encode(value)
    if node is not None:
        assert list(read_file.decode(node, budget()).items()) == list(value.items())
        assert same(read_file.decode(node, budget()), value)


@settings(deadline=None, max_examples=100)
@given(value=st.one_of(json_value, same_shaped_objects(), grep_matches()))
def test_tree_round_trips_any_json_value(value: Any) -> None:
    encoder = structured.TreeEncoder(TokenTally())
    assert same(structured.decode(encoder.value(value), budget()), value)


# --- whole results, as the projection passes them ---

TOOLS = ["delegate_task", "grep", "glob", "read_file", "bash", "web_fetch"]


@settings(deadline=None, max_examples=100)
@given(
    value=st.one_of(json_value, same_shaped_objects(), grep_matches(), read_file_results()),
    tool=st.sampled_from(TOOLS),
)
def test_json_values_round_trip(value: Any, tool: str) -> None:
    compressed = compress_tool_result(tool, value, min_tokens=0, min_saving=-1.0)
    assert same(decompress_tool_result(tool, compressed), value)


STYLES = [
    {"separators": (",", ":"), "ensure_ascii": False},
    {},
    {"indent": 2, "ensure_ascii": False},
    {"indent": 4},
]


@settings(deadline=None, max_examples=100)
@given(
    value=st.one_of(json_value, same_shaped_objects(), grep_matches(), read_file_results()),
    style=st.sampled_from(STYLES),
    newline=st.booleans(),
    tool=st.sampled_from(TOOLS),
)
def test_json_text_comes_back_byte_for_byte(
    value: Any, style: dict[str, Any], newline: bool, tool: str
) -> None:
    raw = json.dumps(value, **style) + ("\n" if newline else "")
    outcome = compress_with_stats(tool, raw, min_tokens=0, min_saving=-1.0)
    assert isinstance(outcome.output, str)
    assert decompress_tool_result(tool, outcome.output) == raw


@settings(deadline=None, max_examples=100)
@given(value=json_value, style=st.sampled_from(STYLES))
def test_parse_gives_a_style_that_reproduces_the_text(value: Any, style: dict[str, Any]) -> None:
    raw = json.dumps(value, **style)
    parsed = jsontext.parse(raw)
    if isinstance(value, (dict, list)):
        assert parsed is not None
    if parsed is not None:
        assert parsed[1].dump(parsed[0]) == raw
        assert jsontext.style_named(parsed[1].name) == parsed[1]


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": 1.10}',
        '{"a": 0e1}',
        '{"a": 05}',
        '{"a":1, "b":2}',
        '{"a": 1, "a": 2}',
        " [1]",
        "[1]  ",
    ],
)
def test_json_text_that_would_not_come_back_exactly_is_text(raw: str) -> None:
    assert jsontext.parse(raw) is None


# --- real shapes, against compact JSON, with the real tokenizer ---


def tokens(value: Any) -> int:
    return count_tokens(structured.dumps(value))


def test_grep_v1_saves_a_third_against_match_objects() -> None:
    prefix = "/Users/mchow/proj/internal/"
    matches = [
        {
            "file": f"{prefix}{pkg}/{name}.go",
            "line_number": 18 + 7 * n,
            "line": f'const removed{n} = "Tool result removed to fit context ({name})."',
            "line_hash": f"{(n * 2654435761) % 4096:03x}",
        }
        for pkg, name in (("llm", "context_reducer"), ("llm", "message"), ("tools", "grep"))
        for n in range(8)
    ]
    outcome = compress_with_stats("grep", {"matches": matches})
    assert outcome.codec == "grep-v1"
    assert outcome.output["matches"]["_fmt"] == "grep-v1"
    assert outcome.output["matches"]["common_prefix"] == prefix
    assert 1 - outcome.tokens_after / outcome.tokens_before >= 0.30
    assert same(decompress_tool_result("grep", outcome.output), {"matches": matches})


def test_glob_v1_saves_on_deep_absolute_paths() -> None:
    files = [
        f"/Users/mchow/proj/internal/{pkg}/{name}.go"
        for pkg in ("tools", "llm", "compress")
        for name in ("read_file", "grep", "glob", "context_reducer", "message", "dispatcher")
    ]
    outcome = compress_with_stats("glob", {"files": files})
    assert outcome.codec == "glob-v1"
    assert 1 - outcome.tokens_after / outcome.tokens_before >= 0.20
    assert same(decompress_tool_result("glob", outcome.output), {"files": files})


def ls_rows(count: int) -> list[dict[str, Any]]:
    """What a structured ``ls -l`` returns: owner and group alike, sizes and names not."""
    return [
        {
            "mode": ("-rw-r--r--", "drwxr-xr-x")[n % 5 == 0],
            "links": 1 + (n % 5 == 0),
            "owner": "root",
            "group": "root",
            "size": 4096 if n % 5 == 0 else 97 * n + 13,
            "modified": f"Oct {10 + n % 15} 2024",
            "name": f"module_{n}.py",
        }
        for n in range(count)
    ]


def test_csv_saves_over_a_third_of_an_array_of_objects() -> None:
    rows = ls_rows(50)
    outcome = compress_with_stats("bash", rows)
    assert outcome.codec == "csv"
    assert outcome.output["constant"] == {"owner": "root", "group": "root"}
    assert 1 - outcome.tokens_after / tokens(rows) >= 0.35
    assert same(decompress_tool_result("bash", outcome.output), rows)


def test_csv_constant_columns_keep_types_apart() -> None:
    rows = [{"a": 1, "b": 1.0, "c": True}, {"a": 1, "b": 1, "c": 1}] * 10
    node = csv_json.encode(rows)
    assert node is not None and node["constant"] == {"a": 1}
    assert same(csv_json.decode(node, budget()), rows)


def test_bash_stdout_holding_a_json_array_becomes_csv_inside_json_text() -> None:
    rows = [{"name": f"module_{n}.py", "lines": n * 13, "owner": "core"} for n in range(40)]
    result = {"exit_code": 0, "stdout": json.dumps(rows, indent=2), "stderr": ""}
    outcome = compress_with_stats("bash", result)
    stdout = outcome.output["stdout"]
    assert stdout["_fmt"] == "json-text" and stdout["value"]["_fmt"] == "csv"
    assert same(decompress_tool_result("bash", outcome.output), result)


def test_delegate_task_is_compressed_recursively_with_a_path_prefix() -> None:
    findings = [
        {"file": f"/Users/mchow/proj/internal/{c}.go", "issue": "unused import", "line": 5 + n}
        for n, c in enumerate("abcdefghijkl")
    ]
    result = {"status": "success", "report": {"summary": "12 findings", "findings": findings}}
    outcome = compress_with_stats("delegate_task", result, min_tokens=50)
    node = outcome.output["report"]["findings"]
    assert outcome.output["status"] == "success"
    assert node["_fmt"] == "csv"
    assert node["common_prefix"] == {"file": "/Users/mchow/proj/internal/"}
    assert same(decompress_tool_result("delegate_task", outcome.output), result)


def test_read_file_keeps_a_bytes_read_the_content_does_not_imply() -> None:
    content = "".join(f"{n}:a3f|line {n} of the file\n" for n in range(1, 80))
    derived = {
        "content": content,
        "bytes_read": len(content.encode()),
        "lines_read": 79,
        "total_lines": 500,
        "truncated": False,
    }
    node = read_file.encode(derived)
    assert node is not None and list(node) == ["_fmt", "content", "total_lines"]
    partial = {**derived, "bytes_read": 2048, "truncated": True}
    node = read_file.encode(partial)
    assert node is not None and list(node) == [
        "_fmt",
        "content",
        "bytes_read",
        "total_lines",
        "truncated",
    ]
    assert list(read_file.decode(node, budget()).items()) == list(partial.items())


def test_key_order_numbers_and_unicode_survive() -> None:
    rows = [{"z": "0e1", "a": "05", "m": "1.10", "é": "漢字", "n": 1.1} for _ in range(30)]
    result = {"b": rows, "a": [1, 1.0, True, "1"]}
    back = decompress_tool_result("delegate_task", compress_tool_result("delegate_task", result))
    assert json.dumps(back, ensure_ascii=False) == json.dumps(result, ensure_ascii=False)


# --- escapes and malformed input ---


def test_raw_objects_with_a_fmt_key_are_wrapped_as_literals() -> None:
    raw = {"_fmt": "csv", "header": ["a"], "rows": [[1]]}
    compressed = compress_tool_result("delegate_task", raw)
    assert compressed == {"_fmt": "literal", "value": raw}
    assert same(decompress_tool_result("delegate_task", compressed), raw)


def test_raw_strings_that_look_compressed_are_escaped_inside_json() -> None:
    raw = {"note": "[verbatim output follows]\nnot really"}
    compressed = compress_tool_result("delegate_task", raw)
    assert same(decompress_tool_result("delegate_task", compressed), raw)


@pytest.mark.parametrize(
    "bad",
    [
        {"_fmt": "no-such-form"},
        {"_fmt": "csv", "header": ["a"], "rows": [[1, 2]]},
        {"_fmt": "csv", "header": ["a", "a"], "rows": []},
        {"_fmt": "glob-v1", "common_prefix": 3, "files": []},
        {"_fmt": "grep-v1", "common_prefix": "", "keys": ["line"], "matches": {}},
        {"_fmt": "rle-lines", "lines": [["x", 0]]},
        {"_fmt": "json-text", "style": "fancy", "value": []},
        {"_fmt": "literal", "value": 1, "extra": 2},
    ],
)
def test_malformed_forms_raise_compression_error(bad: dict[str, Any]) -> None:
    with pytest.raises(CompressionError):
        decompress_tool_result("delegate_task", bad)


@pytest.mark.parametrize(
    "bomb",
    [
        {"_fmt": "rle-lines", "lines": [["a" * 100, 1_000_000]] * 100},
        {"_fmt": "glob-v1", "common_prefix": "p" * 100_000, "files": ["x"] * 100_000},
        {"_fmt": "csv", "constant": {"a": "v" * 100_000}, "header": ["a"], "rows": [[]] * 10_000},
    ],
    ids=["rle-lines", "glob-v1", "csv"],
)
def test_crafted_forms_are_not_expanded_without_bound(bomb: dict[str, Any]) -> None:
    with pytest.raises(CompressionError, match="expands past"):
        decompress_tool_result("delegate_task", bomb)
    assert compress_tool_result("delegate_task", bomb) == {"_fmt": "literal", "value": bomb}
