"""Fuzzing (issue 6): the snapshot parser and the tool-output codecs, a bounded number of cases.

- ``parse_snapshot`` on arbitrary JSON values (as a mapping, as text, as bytes), on valid
  snapshots with random structural mutations, and on their bytes with random byte edits: it
  returns a ParsedSnapshot or raises InvalidSnapshot, never anything else.
- ``compress_tool_result`` never raises and ``decompress_tool_result`` gives back exactly the
  original (same text; same JSON value with its key order and types); ``decompress_tool_result``
  on arbitrary text or JSON (often dressed up as one of our forms) returns a value or raises
  CompressionError, never anything else.
"""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.service_support import REPO_ROOT

from worker.compress import compress_tool_result, decompress_tool_result
from worker.compress.grep_text import HEADER as GREP_HEADER
from worker.compress.ls_text import HEADER as LS_HEADER
from worker.compress.numbered_text import HEADER as NUMBERED_HEADER
from worker.compress.paths_text import HEADER as PATHS_HEADER
from worker.compress.rle_text import HEADER as RLE_HEADER
from worker.compress.textform import VERBATIM_HEADER
from worker.config import Settings
from worker.errors import CompactorError, CompressionError, InvalidSnapshot
from worker.pipeline import Adapters, Pipeline
from worker.transcripts.filesystem import FileStore
from worker.wire.snapshots import ParsedSnapshot, parse_snapshot

SETTINGS = Settings()
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ_CODECS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- values --------------------------------------------------------------------------------------

SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
# Text with the characters that break things: NULs, controls, line separators, lookalikes,
# astral characters, and (sometimes) lone surrogates.
awkward_char = st.one_of(
    st.characters(codec="utf-8"),
    st.sampled_from(["\x00", "\n", "\r", "\t", "\u2028", "\ufeff", "\uff0f", "/", ".", "\\"]),
)
awkward_text = st.text(awkward_char, max_size=40)
text_with_surrogates = st.lists(st.one_of(awkward_char, SURROGATES), max_size=20).map("".join)
any_text = st.one_of(awkward_text, text_with_surrogates)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([0, -1, 2**53 + 1, 10**18 - 1, 10**18, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, any_text)


def json_values(leaves: st.SearchStrategy[Any] = scalars) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5), st.dictionaries(any_text, inner, max_size=5)
        ),
        max_leaves=30,
    )


# Keys and values that the snapshot schema knows, so random values reach deep validation.
SNAPSHOT_KEYS = [
    "conversation_id", "revision", "model", "format", "messages", "system", "config", "tools",
    "role", "content", "id", "tool_calls", "tool_call_id", "function", "name", "arguments",
    "type", "text", "tool_use_id", "input", "thinking", "context_window", "compaction",
    "transcript_dir", "mode", "keep_recent_tool_results", "projected_tool_result_budget",
]  # fmt: skip
SNAPSHOT_WORDS = [
    "openai", "anthropic", "user", "assistant", "system", "tool", "developer", "text",
    "tool_use", "tool_result", "function", "thinking", "image", "c-1", "m1", "call_1", "bash",
    "omit", "keep", "strip", "prefer_remote", "../x", ".hidden", "a/b", "",
]  # fmt: skip
schema_scalars = st.one_of(scalars, st.sampled_from(SNAPSHOT_WORDS))
schema_values = st.recursive(
    schema_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.sampled_from(SNAPSHOT_KEYS), any_text), inner, max_size=6),
    ),
    max_leaves=40,
)


def _openai_messages(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"id": "s", "role": "system", "content": "be brief"}]
    for k in range(n):
        out.append({"id": f"u{k}", "role": "user", "content": f"task {k}"})
        out.append({"id": f"a{k}", "role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{k}", "type": "function",
             "function": {"name": "grep", "arguments": '{"q": "x"}'}}]})  # fmt: skip
        out.append({"id": f"r{k}", "role": "tool", "tool_call_id": f"c{k}", "content": "a:1:x"})
    return out


def _anthropic_messages(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(n):
        out.append({"role": "user", "content": f"task {k}"})
        out.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": f"t{k}", "name": "grep", "input": {"q": k}}]})  # fmt: skip
        out.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{k}", "content": "a:1:x"}]})  # fmt: skip
    return out


CID = r"[A-Za-z0-9_:\-][A-Za-z0-9._:\-]{0,20}"


@st.composite
def valid_snapshots(draw: st.DrawFn) -> dict[str, Any]:
    fmt = draw(st.sampled_from(["openai", "anthropic"]))
    n = draw(st.integers(0, 4))
    doc: dict[str, Any] = {
        "conversation_id": draw(st.from_regex(CID, fullmatch=True)),
        "revision": draw(st.integers(0, 10**6)),
        "model": {"name": "gpt-4.1", "context_window": draw(st.integers(1, 10**6))},
        "format": fmt,
        "messages": _openai_messages(n) if fmt == "openai" else _anthropic_messages(n),
    }  # fmt: skip
    if fmt == "anthropic" and draw(st.booleans()):
        doc["system"] = "be brief"
    if draw(st.booleans()):
        doc["config"] = {"auto_compact_threshold_tokens": draw(st.integers(0, 10**6))}
    if draw(st.booleans()):
        doc["tools"] = {"grep": {"compaction": draw(st.sampled_from(["keep", "omit", "strip"]))}}
    return doc


def _containers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every dict and list inside ``value`` (the root is ``()``)."""
    out: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        out.append(path)
        for k, v in value.items():
            out += _containers(v, (*path, k))
    elif isinstance(value, list):
        out.append(path)
        for i, v in enumerate(value):
            out += _containers(v, (*path, i))
    return out


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


@st.composite
def mutated_snapshots(draw: st.DrawFn) -> Any:
    """A valid snapshot with 1-4 random edits: replace, delete, insert, duplicate, swap."""
    doc: Any = json.loads(json.dumps(draw(valid_snapshots())))
    for _ in range(draw(st.integers(1, 4))):
        if not isinstance(doc, (dict, list)):
            break
        target = _at(doc, draw(st.sampled_from(_containers(doc))))
        keys = list(target.keys()) if isinstance(target, dict) else list(range(len(target)))
        op = draw(st.sampled_from(["replace", "delete", "insert", "duplicate", "swap"]))
        if op == "insert" or not keys:
            new = draw(schema_values)
            if isinstance(target, dict):
                target[draw(st.one_of(st.sampled_from(SNAPSHOT_KEYS), any_text))] = new
            else:
                target.insert(draw(st.integers(0, len(target))), new)
            continue
        key = draw(st.sampled_from(keys))
        if op == "replace":
            target[key] = draw(schema_values)
        elif op == "delete":
            del target[key]
        elif op == "duplicate" and isinstance(target, list):
            target.insert(key, json.loads(json.dumps(target[key])))
        elif op == "swap" and isinstance(target, list) and len(target) > 1:
            other = draw(st.sampled_from(keys))
            target[key], target[other] = target[other], target[key]
    return doc


def _parses_or_rejects(data: Any) -> None:
    try:
        result = parse_snapshot(data, SETTINGS)
    except InvalidSnapshot as exc:
        assert isinstance(exc.field, str) and exc.reason
        return
    assert isinstance(result, ParsedSnapshot)
    assert len(result.source_ids) == len(result.snapshot.messages)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, allow_nan=True)


# --- the parser ----------------------------------------------------------------------------------


@FUZZ
@given(value=st.one_of(json_values(), schema_values))
def test_parser_on_arbitrary_values(value: Any) -> None:
    if isinstance(value, dict):
        _parses_or_rejects(value)
    text = _dumps(value)
    _parses_or_rejects(text)
    _parses_or_rejects(text.encode("ascii"))


@FUZZ
@given(doc=mutated_snapshots())
def test_parser_on_mutated_snapshots(doc: Any) -> None:
    if isinstance(doc, dict):
        _parses_or_rejects(doc)
    _parses_or_rejects(_dumps(doc).encode("ascii"))


# Raw byte edits, and a few tokens that are valid JSON to Python's parser but no snapshot's.
BYTE_TOKENS = [
    b"NaN", b"-Infinity", b"1e999", b"-0", b"\\ud800", b"\\u0000", b"\xff", b"\xc0\xaf",
    b"\xed\xa0\x80", b"\xef\xbb\xbf", b"[" * 3000, b"{", b"}", b'"', b",", b":", b"null",
]  # fmt: skip


@FUZZ
@given(
    doc=valid_snapshots(),
    edits=st.lists(
        st.tuples(
            st.sampled_from(["insert", "delete", "replace", "digits"]),
            st.floats(0, 1),
            st.one_of(st.binary(max_size=8), st.sampled_from(BYTE_TOKENS)),
            st.integers(1, 16),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_parser_on_byte_edits(
    doc: dict[str, Any], edits: list[tuple[str, float, bytes, int]]
) -> None:
    data = bytearray(_dumps(doc).encode("ascii"))
    for op, where, blob, length in edits:
        at = int(where * len(data))
        if op == "insert":
            data[at:at] = blob
        elif op == "delete":
            del data[at : at + length]
        elif op == "replace":
            data[at : at + len(blob)] = blob
        else:  # a long digit run where a number (or anything) was
            data[at : at + 1] = b"9" * (4290 + length)
    _parses_or_rejects(bytes(data))


@FUZZ
@given(digits=st.integers(1, 6000), where=st.sampled_from(["revision", "context_window", "deep"]))
def test_parser_on_long_integers(digits: int, where: str) -> None:
    """CPython refuses to convert integers over 4,300 digits (ValueError, not JSONDecodeError)."""
    number = "7" * digits
    revision = number if where == "revision" else "1"
    window = number if where == "context_window" else "1000"
    extra = f', "n": [{{"x": {number}}}]' if where == "deep" else ""
    text = (
        f'{{"conversation_id": "c", "revision": {revision}, "model": {{"context_window": '
        f'{window}}}, "messages": [{{"role": "user", "content": "hi"}}]{extra}}}'
    )
    _parses_or_rejects(text)
    _parses_or_rejects(text.encode())


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=mutated_snapshots(), compact=st.booleans())
def test_pipeline_on_whatever_parses(doc: Any, compact: bool, tmp_path_factory: Any) -> None:
    """What the parser accepts, the pipeline handles: an event, or a CompactorError."""
    if compact and isinstance(doc, dict):  # a threshold so low that everything compacts
        config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
        doc = {**doc, "config": {**config, "auto_compact_threshold_tokens": 1}}
        if isinstance(doc.get("model"), dict):
            doc["model"] = {k: v for k, v in doc["model"].items() if k != "context_window"}
    try:
        parsed = parse_snapshot(_dumps(doc), SETTINGS)
    except (InvalidSnapshot, ValueError, TypeError):
        return  # the parser's own tests report these
    store = FileStore(tmp_path_factory.mktemp("fuzz-transcripts"))
    try:
        events = Pipeline(parsed.settings, Adapters(store=store)).run(parsed)
    except CompactorError:
        return
    assert events and events[-1].type in {
        "compaction.completed",
        "compaction.skipped",
        "compaction.failed",
    }


# --- the codecs ----------------------------------------------------------------------------------

TOOLS = ["bash", "grep", "glob", "read_file", "ls", "find", "delegate_task", "web_fetch",
         "call_mcp_tool", "mcp__gh__search", "write_file", "unknown_tool", ""]  # fmt: skip
segment = st.text(st.characters(codec="utf-8", exclude_characters="\n/:"), max_size=12)
directory = st.lists(
    st.sampled_from(["src", "pkg", "tests", "a b", "..", ".git", "ü"]), min_size=1, max_size=4
).map("/".join)
path = st.tuples(directory, segment).map(lambda t: f"{t[0]}/{t[1]}.py")
line_kinds = st.one_of(
    st.tuples(path, st.integers(1, 999), segment).map(lambda t: f"{t[0]}:{t[1]}:{t[2]}"),
    path,
    st.tuples(st.integers(1, 9999), segment).map(lambda t: f"{t[0]:>6}\t{t[1]}"),
    segment,
    st.sampled_from(["", " ", "]", " [x2]", " [x1]\r", "## src/a.py", "\r"]),
)


@st.composite
def tool_texts(draw: st.DrawFn) -> str:
    """Text shaped like tool output (so the codecs engage), sometimes with repeats, wrappers,
    our own headers, CRLF or no final newline."""
    lines = draw(st.lists(line_kinds, max_size=60))
    if lines and draw(st.booleans()):
        k = draw(st.integers(0, len(lines) - 1))
        lines[k:k] = [lines[k]] * draw(st.integers(2, 30))
    text = draw(st.sampled_from(["\n", "\r\n"])).join(lines)
    if draw(st.booleans()):
        text += "\n"
    prefix = draw(st.sampled_from(["", "", GREP_HEADER, RLE_HEADER, VERBATIM_HEADER, LS_HEADER]))
    wrapper = draw(st.sampled_from(["{}", "<returncode>0</returncode><output>{}</output>"]))
    return wrapper.replace("{}", prefix + text)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values, with types (1 vs 1.0 vs True) and key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (a != a and b != b))
    return bool(a == b)


def _round_trip(tool: str, value: Any, min_tokens: int, min_saving: float) -> None:
    compressed = compress_tool_result(tool, value, min_tokens=min_tokens, min_saving=min_saving)
    assert isinstance(compressed, str) == isinstance(value, str)
    restored = decompress_tool_result(tool, compressed)
    assert _same(restored, value), (tool, value, compressed, restored)


@FUZZ_CODECS
@given(
    tool=st.sampled_from(TOOLS),
    text=st.one_of(tool_texts(), any_text),
    min_tokens=st.sampled_from([0, 1, 200]),
    min_saving=st.sampled_from([0.0, 0.15]),
)
def test_codecs_round_trip_text(tool: str, text: str, min_tokens: int, min_saving: float) -> None:
    _round_trip(tool, text, min_tokens, min_saving)


json_safe = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    awkward_text,
    tool_texts(),
    path,
)
grep_match = st.fixed_dictionaries(
    {"file": path, "line_number": st.integers(1, 999), "line": segment}
)
fmt_node = st.dictionaries(
    st.sampled_from(["_fmt", "lines", "value", "header", "rows", "common_prefix", "keys"]),
    st.one_of(st.sampled_from(["rle-lines", "csv", "glob-v1", "grep-v1", "literal",
                               "json-text", "read_file-v1"]), json_safe),
    max_size=4,
)  # fmt: skip
tool_json = st.recursive(
    st.one_of(json_safe, st.lists(grep_match, max_size=6), st.lists(path, max_size=8), fmt_node),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(awkward_text, inner, max_size=5)
    ),
    max_leaves=25,
)


@FUZZ_CODECS
@given(
    tool=st.sampled_from(TOOLS),
    value=tool_json,
    min_tokens=st.sampled_from([0, 200]),
    min_saving=st.sampled_from([0.0, 0.15]),
)
def test_codecs_round_trip_json(tool: str, value: Any, min_tokens: int, min_saving: float) -> None:
    _round_trip(tool, value, min_tokens, min_saving)


HEADERS = [GREP_HEADER, LS_HEADER, NUMBERED_HEADER, PATHS_HEADER, RLE_HEADER, VERBATIM_HEADER]


@FUZZ_CODECS
@given(
    tool=st.sampled_from(TOOLS),
    text=st.one_of(
        any_text,
        st.tuples(st.sampled_from(HEADERS), st.one_of(tool_texts(), any_text)).map("".join),
        st.tuples(st.sampled_from(["", "<output>"]), st.just(RLE_HEADER),
                  st.lists(st.tuples(segment, st.integers(0, 2000)), max_size=8)).map(
            lambda t: t[0] + t[1] + "\n".join(f"{s} [x{n}]" for s, n in t[2])),
        json_values(json_safe).map(json.dumps),
        fmt_node.map(json.dumps),
    ),
)  # fmt: skip
def test_decompress_arbitrary_text(tool: str, text: str) -> None:
    try:
        out = decompress_tool_result(tool, text)
    except CompressionError:
        return
    assert isinstance(out, str)


@FUZZ_CODECS
@given(tool=st.sampled_from(TOOLS), value=st.one_of(fmt_node, tool_json))
def test_decompress_arbitrary_json(tool: str, value: Any) -> None:
    try:
        out = decompress_tool_result(tool, value)
    except CompressionError:
        return
    json.dumps(out, allow_nan=False)  # a JSON value


# --- decompression bombs -------------------------------------------------------------------------

_BOMB = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from worker.compress import compress_tool_result, decompress_tool_result
from worker.compress.rle_text import HEADER
from worker.errors import CompressionError
line = "a" * 100
forms = {
    "text": HEADER + "\n".join([f"{line} [x1000000]"] * 100),
    "json": {"_fmt": "rle-lines", "lines": [[line, 1000000]] * 100},
    "json-text": json.dumps({"_fmt": "rle-lines", "lines": [[line, 1000000]] * 100}),
}
report = {}
for name, bomb in forms.items():
    try:
        decompress_tool_result("bash", bomb)
        report[name + ":decompress"] = "expanded"
    except CompressionError:
        report[name + ":decompress"] = "refused"
    except MemoryError:
        report[name + ":decompress"] = "MemoryError"
    try:
        out = compress_tool_result("bash", bomb)
        same = decompress_tool_result("bash", out) == bomb
        report[name + ":compress"] = "round-trips" if same else "changed"
    except MemoryError:
        report[name + ":compress"] = "MemoryError"
    except Exception as exc:
        report[name + ":compress"] = type(exc).__name__
print(json.dumps(report))
"""


def test_decompression_bombs_are_refused_and_escaped(subprocesses: None) -> None:
    """~11 KB that would expand to ~10 GB: decompressing refuses it (CompressionError) and
    compressing it (it is raw output that looks like our form) escapes it, in bounded memory."""
    proc = subprocess.run(
        [sys.executable, "-c", _BOMB],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CPU, (60, 60)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == {
        "text:decompress": "refused",
        "text:compress": "round-trips",
        "json:decompress": "refused",
        "json:compress": "round-trips",
        "json-text:decompress": "refused",
        "json-text:compress": "round-trips",
    }
