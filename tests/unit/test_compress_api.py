"""The public API: the gate, the tools left alone, escapes, kinds, determinism and stats."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.compress import (
    CompressionOutcome,
    compress_tool_result,
    compress_with_stats,
    decompress_tool_result,
)
from worker.compress.grep_text import HEADER as GREP_HEADER
from worker.compress.rle_text import HEADER as RLE_HEADER
from worker.compress.textform import VERBATIM_HEADER
from worker.errors import CompressionError
from worker.tokens import count_tokens


def grep_lines(files: int, per_file: int) -> str:
    return "".join(
        f"src/pkg/module_{f}.py:{10 + n}:    result = compute_value(config, retries={n})\n"
        for f in range(files)
        for n in range(per_file)
    )


LARGE_GREP = grep_lines(4, 10)  # several hundred tokens, saves well over 15%
LEFT_ALONE = [
    "call_mcp_tool",
    "mcp__github__search",
    "mcp_files_read",
    "ask_user",
    "write_file",
    "edit_file",
]


def test_large_grep_output_is_compressed_and_expands_exactly() -> None:
    compressed = compress_tool_result("bash", LARGE_GREP)
    assert isinstance(compressed, str)
    assert compressed.startswith(GREP_HEADER)
    assert count_tokens(compressed) < 0.85 * count_tokens(LARGE_GREP)
    assert decompress_tool_result("bash", compressed) == LARGE_GREP


def test_short_output_is_returned_as_the_same_object() -> None:
    short = grep_lines(1, 3)
    assert count_tokens(short) <= 200
    assert compress_tool_result("bash", short) is short


def test_min_tokens_is_the_size_gate() -> None:
    medium = grep_lines(2, 5)
    tokens = count_tokens(medium)
    assert compress_tool_result("bash", medium, min_tokens=tokens) is medium
    assert compress_tool_result("bash", medium, min_tokens=tokens - 1) is not medium


def test_min_saving_is_the_saving_gate() -> None:
    outcome = compress_with_stats("bash", LARGE_GREP)
    saved = 1 - outcome.tokens_after / outcome.tokens_before
    assert compress_tool_result("bash", LARGE_GREP, min_saving=saved + 0.01) is LARGE_GREP
    assert compress_tool_result("bash", LARGE_GREP, min_saving=saved - 0.01) is not LARGE_GREP


@pytest.mark.parametrize("tool", LEFT_ALONE)
def test_mcp_ask_user_write_and_edit_are_left_alone(tool: str) -> None:
    assert compress_tool_result(tool, LARGE_GREP) is LARGE_GREP
    rows = [{"name": f"f{n}", "size": n} for n in range(100)]
    assert compress_tool_result(tool, rows) is rows
    looks_compressed = GREP_HEADER + "## a.py\n1:x\n2:y"
    assert decompress_tool_result(tool, looks_compressed) is looks_compressed


@pytest.mark.parametrize("tool", ["bash", "web_fetch"])
def test_truncated_bash_and_web_fetch_previews_are_left_alone(tool: str) -> None:
    result = {"exit_code": 0, "stdout": LARGE_GREP, "content": LARGE_GREP, "truncated": True}
    assert compress_tool_result(tool, result) is result
    text = json.dumps(result)
    assert compress_tool_result(tool, text) is text


def test_the_same_result_untruncated_is_compressed() -> None:
    result = {"exit_code": 0, "stdout": LARGE_GREP, "stderr": "", "truncated": False}
    compressed = compress_tool_result("bash", result)
    assert isinstance(compressed, dict)
    assert compressed["stdout"].startswith(GREP_HEADER)
    assert decompress_tool_result("bash", compressed) == result


def test_a_string_comes_back_a_string_and_an_object_an_object() -> None:
    matches = [{"file": f"/p/q/{n % 3}.go", "line_number": n, "line": "x" * 40} for n in range(30)]
    as_text = json.dumps({"matches": matches})
    as_object = json.loads(as_text)
    assert isinstance(compress_tool_result("grep", as_text), str)
    assert isinstance(compress_tool_result("grep", as_object), dict)
    assert decompress_tool_result("grep", compress_tool_result("grep", as_text)) == as_text


@pytest.mark.parametrize("empty", ["", {}, [], "\n", "\r\n"])
def test_empty_outputs_are_unchanged(empty: Any) -> None:
    assert compress_tool_result("bash", empty, min_tokens=0, min_saving=-1.0) is empty
    assert decompress_tool_result("bash", empty) == empty


@pytest.mark.parametrize("value", [None, 42, 3.5, True])
def test_non_json_containers_pass_through(value: Any) -> None:
    assert compress_tool_result("bash", value) is value
    assert decompress_tool_result("bash", value) is value


def test_raw_text_that_starts_like_a_compressed_form_is_escaped() -> None:
    raw = GREP_HEADER + "## not/really.py\n1:a\n2:b\n"
    outcome = compress_with_stats("bash", raw)
    assert outcome.output == VERBATIM_HEADER + raw
    assert outcome.codec == "verbatim" and outcome.compressed
    assert decompress_tool_result("bash", outcome.output) == raw


def test_raw_json_text_with_a_fmt_key_is_escaped() -> None:
    raw = json.dumps({"_fmt": "grep-v1", "note": "made by some other tool"})
    compressed = compress_tool_result("delegate_task", raw)
    assert compressed != raw
    assert decompress_tool_result("delegate_task", compressed) == raw


def test_crlf_output_round_trips() -> None:
    raw = LARGE_GREP.replace("\n", "\r\n")
    assert decompress_tool_result("bash", compress_tool_result("bash", raw)) == raw


def test_no_trailing_newline_round_trips() -> None:
    raw = LARGE_GREP.rstrip("\n")
    compressed = compress_tool_result("bash", raw)
    assert compressed is not raw
    assert decompress_tool_result("bash", compressed) == raw


def test_compression_is_deterministic() -> None:
    first = compress_tool_result("bash", LARGE_GREP)
    second = compress_tool_result("bash", "".join(list(LARGE_GREP)))
    assert first == second


@pytest.mark.parametrize("model", [None, "gpt-4o", "gpt-4"])
def test_stats_are_exact_counts_for_the_model(model: str | None) -> None:
    outcome = compress_with_stats("bash", LARGE_GREP, model=model)
    assert isinstance(outcome, CompressionOutcome)
    assert outcome.compressed and outcome.codec == "grep-by-file"
    assert outcome.tokens_before == count_tokens(LARGE_GREP, model)
    assert outcome.tokens_after == count_tokens(outcome.output, model)


def test_stats_of_an_unchanged_result_count_it_once() -> None:
    prose = "Nothing here repeats or shares a prefix, so nothing compresses. " * 20
    outcome = compress_with_stats("bash", prose)
    assert outcome == CompressionOutcome(
        prose, None, count_tokens(prose), count_tokens(prose), False
    )


def test_stats_of_json_are_counted_on_compact_json() -> None:
    rows = [{"name": f"file_{n}.py", "owner": "root", "size": n * 31} for n in range(60)]
    outcome = compress_with_stats("bash", rows)
    compact = json.dumps(rows, separators=(",", ":"), ensure_ascii=False)
    assert outcome.tokens_before == count_tokens(compact)
    assert outcome.tokens_after < outcome.tokens_before


def test_crafted_text_forms_are_refused_not_expanded() -> None:
    rle_bomb = RLE_HEADER + "\n".join(["a" * 100 + " [x1000000]"] * 100)
    grep_bomb = GREP_HEADER + "## " + "p" * 100_000 + "\n1:x" * 100_000
    for bomb in (rle_bomb, grep_bomb):
        with pytest.raises(CompressionError, match="expands past"):
            decompress_tool_result("bash", bomb)


def test_raw_output_that_looks_like_a_bomb_is_escaped_not_expanded() -> None:
    raw = RLE_HEADER + "\n".join(["a" * 100 + " [x1000000]"] * 100)
    compressed = compress_tool_result("bash", raw)
    assert compressed == VERBATIM_HEADER + raw
    assert decompress_tool_result("bash", compressed) == raw


def test_values_json_cannot_write_are_returned_as_they_are() -> None:
    huge = {"n": 10**5000, "rows": [{"a": 1, "b": 2}] * 50}
    assert compress_tool_result("delegate_task", huge) is huge
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    assert compress_tool_result("delegate_task", deep) is deep
