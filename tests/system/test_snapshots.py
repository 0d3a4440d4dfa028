"""Reading snapshots (DESIGN.md §3): everything a submitter controls is validated before any
work, and every rejection is an InvalidSnapshot naming the field and the reason."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.config import CompactionConfig, Settings, ToolConfig
from worker.errors import InvalidSnapshot
from worker.wire.snapshots import decode_json, parse_snapshot

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DEFAULT = Settings()


def snapshot(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "conversation_id": "c-42",
        "revision": 17,
        "model": {"name": "gpt-4.1", "context_window": 1_047_576},
        "format": "openai",
        "messages": [
            {"id": "m1", "role": "system", "content": "be brief"},
            {"id": "m2", "role": "user", "content": "hi"},
        ],
    }
    base.update(fields)
    return base


def rejected(data: Any, settings: Settings = DEFAULT) -> InvalidSnapshot:
    with pytest.raises(InvalidSnapshot) as info:
        parse_snapshot(data, settings)
    assert info.value.reason, "a rejection must say why"
    return info.value


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()


# --- accepted -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["snapshot_openai.json", "snapshot_anthropic.json"])
def test_fixtures_parse(name: str) -> None:
    parsed = parse_snapshot((FIXTURES / name).read_bytes(), DEFAULT)
    assert parsed.conversation_id.startswith("fixture-")
    assert parsed.revision == 7
    assert len(parsed.source_ids) == len(parsed.snapshot.messages)
    assert parsed.settings == DEFAULT


def test_bytes_text_and_mapping_parse_alike() -> None:
    value = snapshot()
    from_bytes = parse_snapshot(encode(value), DEFAULT)
    from_text = parse_snapshot(json.dumps(value), DEFAULT)
    from_map = parse_snapshot(value, DEFAULT)
    assert from_bytes.messages == from_text.messages == from_map.messages
    assert from_bytes.source_ids == ["m1", "m2"]


def test_a_mapping_parse_makes_the_messages_json_a_compaction_reads() -> None:
    """Python data is checked by serializing it: its messages' canonical JSON is made then, and
    is what the range digest and the transcript would have made from the bytes."""
    value = snapshot(
        messages=[
            {"id": "m1", "role": "user", "content": 'é ✓ \u2028 "q" \\ 𝄞'},
            {"role": "assistant", "content": None, "b": 1e300, "a": -0.0, "n": 10**30},
            {"role": "user", "content": "x", "meta": {"z": 1, "y": [True, None, 2.5]}},
        ]
    )
    from_map = parse_snapshot(value, DEFAULT)
    assert from_map._message_json is not None  # made by the check, not again later
    assert from_map.message_json == parse_snapshot(encode(value), DEFAULT).message_json


@pytest.mark.parametrize(
    ("where", "bad", "reason"),
    [
        ("message", float("nan"), "NaN"),
        ("message", float("inf"), "inf"),
        ("message", "\ud800", "surrogate"),
        ("message", b"bytes", "bytes"),
        ("config", float("nan"), "NaN"),
        ("config", "\udfff", "surrogate"),
    ],
)
def test_a_mapping_that_json_cannot_carry_is_refused_wherever_it_is(
    where: str, bad: Any, reason: str
) -> None:
    if where == "message":
        value = snapshot(messages=[{"role": "user", "content": "x", "meta": {"v": [bad]}}])
        field = "messages[0].meta.v[0]"
    else:
        value = snapshot(config={"note": bad})
        field = "config.note"
    error = rejected(value)
    assert reason.lower() in error.reason.lower()
    assert error.field == field


@pytest.mark.parametrize(
    "cid",
    [
        "a",
        "c-42",
        "A.b_c:d-e",
        "x" * 128,
        "_x",
        "9",
        "a..b",
        "ns:conv.1",
        "Z" * 64 + "." * 64,
    ],
)
def test_conversation_id_accepted(cid: str) -> None:
    assert parse_snapshot(snapshot(conversation_id=cid), DEFAULT).conversation_id == cid


@pytest.mark.parametrize(
    "cid",
    [
        "",
        ".hidden",
        ".",
        "..",
        "../../etc",
        "a/b",
        "/abs",
        "a\\b",
        "x" * 129,
        "a\x00b",
        "abc\n",
        "a b",
        "café",
        "ａｂｃ",  # fullwidth letters
        "١٢٣",  # Arabic-Indic digits
        "a*b",
        "a%2fb",
        "-rf",  # would read as an option to a shell command over the transcript directory
        "-x",
    ],
    ids=repr,
)
def test_conversation_id_rejected(cid: str) -> None:
    error = rejected(snapshot(conversation_id=cid))
    assert error.field == "conversation_id"
    assert "128" in error.reason


@pytest.mark.parametrize("cid", [5, None, ["a"]], ids=repr)
def test_conversation_id_wrong_type(cid: Any) -> None:
    assert rejected(snapshot(conversation_id=cid)).field == "conversation_id"


@pytest.mark.parametrize("revision", [0, 1, 17, 2**40])
def test_revision_accepted(revision: int) -> None:
    assert parse_snapshot(snapshot(revision=revision), DEFAULT).revision == revision


@pytest.mark.parametrize("revision", [1.5, 1.0, -1, True, False, "3", None, [1]], ids=repr)
def test_revision_rejected(revision: Any) -> None:
    assert rejected(snapshot(revision=revision)).field == "revision"


def test_missing_fields_named() -> None:
    for name in ("conversation_id", "revision", "messages"):
        value = snapshot()
        del value[name]
        error = rejected(value)
        assert error.field == name
        assert "missing" in error.reason


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"format": "gemini"}, "format"),
        ({"messages": "hello"}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}, 5]}, "messages[1]"),
        ({"model": {"name": "m", "context_window": 0}}, "model.context_window"),
        ({"model": {"name": "m", "context_window": -5}}, "model.context_window"),
        ({"model": {"name": "m", "context_window": 1.5}}, "model.context_window"),
        ({"model": {"name": "m", "context_window": "big"}}, "model.context_window"),
        ({"model": {"name": "m", "window": 10}}, "model.window"),
        ({"priority": "high"}, "priority"),
        ({"config": "fast"}, "config"),
        ({"system": "top-level system is anthropic-only"}, "system"),
    ],
)
def test_schema_rejections_name_the_field(fields: dict[str, Any], field: str) -> None:
    assert rejected(snapshot(**fields)).field == field


def test_unknown_top_level_field_reason() -> None:
    assert rejected(snapshot(priority=1)).reason == "unknown field"


def test_message_level_rejections_through_parse() -> None:
    bad_role = snapshot(messages=[{"role": "wizard", "content": "x"}])
    assert rejected(bad_role).field == "messages[0].role"
    orphan = snapshot(messages=[{"role": "tool", "tool_call_id": "call_1", "content": "x"}])
    error = rejected(orphan)
    assert error.field == "messages[0]"
    assert "call_1" in error.reason


def test_pending_tool_call_at_the_end_is_valid() -> None:
    messages = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
    ]
    parsed = parse_snapshot(snapshot(messages=messages), DEFAULT)
    assert parsed.messages[-1].tool_calls[0].id == "call_1"


# --- bytes-level checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b'{"conversation_id": "c", "revision": 1,', b"not json", b"{'a': 1}", b"[1,]"],
    ids=repr,
)
def test_malformed_json(data: bytes) -> None:
    assert "malformed JSON" in rejected(data).reason


@pytest.mark.parametrize("data", [b"[]", b'"text"', b"42", b"null"], ids=repr)
def test_not_an_object(data: bytes) -> None:
    assert "object" in rejected(data).reason


def test_invalid_utf8() -> None:
    data = encode(snapshot()).replace(b'"hi"', b'"h\xff\xfei"')
    assert "UTF-8" in rejected(data).reason


@pytest.mark.parametrize(
    "where",
    ["content", "key", "conversation_id"],
)
def test_lone_surrogate_escape(where: str) -> None:
    text = json.dumps(snapshot())
    if where == "content":
        text = text.replace('"hi"', '"h\\ud800i"')
    elif where == "key":
        text = text.replace('"content": "hi"', '"content": "hi", "\\udfff": 1')
    else:
        text = text.replace('"c-42"', '"c\\ud800"')
    error = rejected(text.encode())
    assert "surrogate" in error.reason or error.field == "conversation_id"


def test_valid_surrogate_pair_escape_is_accepted() -> None:
    text = json.dumps(snapshot()).replace('"hi"', '"smile \\ud83d\\ude00"')
    parsed = parse_snapshot(text.encode(), DEFAULT)
    assert parsed.messages[1].content == "smile 😀"


@pytest.mark.parametrize("escape", ["\\uD800", "\\uDbFf", "\\udc00"])
def test_lone_surrogate_escape_any_hex_case(escape: str) -> None:
    text = json.dumps(snapshot()).replace('"hi"', f'"h{escape}i"')
    assert "surrogate" in rejected(text.encode()).reason
    assert "surrogate" in rejected(text).reason


def test_lone_surrogate_character_in_str_input() -> None:
    text = json.dumps(snapshot(), ensure_ascii=False).replace('"hi"', '"h\ud800i"')
    assert "surrogate" in rejected(text).reason


def test_escaped_backslash_before_surrogate_like_text_is_accepted() -> None:
    # The text \ud800 (backslash, then letters) is not an escape: it decodes to plain ASCII.
    text = json.dumps(snapshot()).replace('"hi"', '"path C:\\\\ud800"')
    parsed = parse_snapshot(text.encode(), DEFAULT)
    assert parsed.messages[1].content == "path C:\\ud800"


def test_deep_nesting_rejected() -> None:
    depth = 10_000
    value = snapshot()
    text = json.dumps(value).replace(
        '"content": "hi"', '"content": "hi", "meta": ' + "[" * depth + "]" * depth
    )
    error = rejected(text.encode())
    assert "nested" in error.reason


def test_brackets_inside_strings_are_not_nesting() -> None:
    content = "[" * 10_000 + '{"\\"' + "}" * 10
    value = snapshot(messages=[{"role": "user", "content": content}])
    parsed = parse_snapshot(encode(value), DEFAULT)
    assert parsed.messages[0].content == content


def test_deep_nesting_in_an_already_parsed_mapping_rejected() -> None:
    nested: Any = []
    for _ in range(10_000):
        nested = [nested]
    value = snapshot(messages=[{"role": "user", "content": "x", "meta": nested}])
    assert "nested" in rejected(value).reason


def small_limit(max_bytes: int = 2048, **extra: Any) -> Settings:
    return Settings(compaction=CompactionConfig(max_snapshot_bytes=max_bytes, **extra))


def padded(total_bytes: int) -> bytes:
    """A valid snapshot of exactly ``total_bytes`` bytes."""
    empty = encode(snapshot(messages=[{"role": "user", "content": ""}]))
    pad = total_bytes - len(empty)
    data = encode(snapshot(messages=[{"role": "user", "content": "x" * pad}]))
    assert len(data) == total_bytes
    return data


def test_size_limit_boundary() -> None:
    settings = small_limit(2048)
    assert parse_snapshot(padded(2048), settings).messages[0].content.startswith("x")
    error = rejected(padded(2049), settings)
    assert "2049" in error.reason
    assert "2048" in error.reason


def test_size_limit_counts_utf8_bytes_of_text() -> None:
    text = json.dumps(
        snapshot(messages=[{"role": "user", "content": "é" * 1500}]), ensure_ascii=False
    )
    assert len(text) < 2048 < len(text.encode())
    assert "limit" in rejected(text, small_limit(2048)).reason


def test_message_count_limit() -> None:
    settings = Settings(compaction=CompactionConfig(max_messages=3))
    messages = [{"role": "user", "content": str(i)} for i in range(4)]
    assert rejected(snapshot(messages=messages), settings).field == "messages"
    assert parse_snapshot(snapshot(messages=messages[:3]), settings).messages


# --- overrides ----------------------------------------------------------------------------------


def test_allowed_overrides_apply() -> None:
    value = snapshot(
        config={
            "auto_compact_threshold_tokens": 80_000,
            "mode": "prefer_remote",
            "projected_tool_result_budget": {"max_bytes": 0},
        },
        tools={"grep": {"compaction": "strip-responses"}, "*": {"compaction": "keep"}},
    )
    settings = parse_snapshot(value, DEFAULT).settings
    assert settings.compaction.auto_compact_threshold_tokens == 80_000
    assert settings.compaction.mode == "prefer_remote"
    assert settings.compaction.projected_tool_result_budget is not None
    assert settings.tools == {
        "grep": ToolConfig(compaction="strip-responses"),
        "*": ToolConfig(compaction="keep"),
    }
    assert DEFAULT.compaction.auto_compact_threshold_tokens == 50_000  # not mutated


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("transcript_dir", "/tmp/elsewhere"),
        ("transcript_dir", "../../etc"),
        ("max_snapshot_bytes", 10**12),
        ("max_messages", 10**9),
        ("max_persisted_transcripts", None),
        ("review_tenants", []),
    ],
)
def test_operator_only_overrides_rejected(key: str, value: Any) -> None:
    error = rejected(snapshot(config={key: value}))
    assert error.field == f"config.{key}"
    assert "operator" in error.reason


def test_a_snapshot_may_turn_review_on_but_not_off() -> None:
    held = parse_snapshot(snapshot(config={"review": True}), DEFAULT)
    assert held.settings.compaction.reviews("c-1")
    operator = DEFAULT.model_copy(
        update={"compaction": DEFAULT.compaction.model_copy(update={"review": True})}
    )
    error = rejected(snapshot(config={"review": False}), operator)
    assert error.field == "config.review" and "not off" in error.reason
    assert parse_snapshot(snapshot(config={"review": True}), operator).settings.compaction.review


@pytest.mark.parametrize("key", ["summary_max_output_tokens", "summary_max_input_chars"])
@pytest.mark.parametrize("spelling", [999999, "999999", 999999.0, " 999999 ", "9.99999e5"])
def test_a_snapshot_never_raises_a_cost_bound_whatever_the_spelling(
    key: str, spelling: Any
) -> None:
    """Before, only ``int`` values were compared, and "999999" or 999999.0 reached the LLM."""
    error = rejected(snapshot(config={key: spelling}))
    assert error.field == f"config.{key}"


def test_a_snapshot_may_lower_a_cost_bound_in_any_spelling() -> None:
    for spelling in (100, "100", 100.0):
        parsed = parse_snapshot(snapshot(config={"summary_max_output_tokens": spelling}), DEFAULT)
        assert parsed.settings.compaction.summary_max_output_tokens == 100


@pytest.mark.parametrize(
    ("config", "tools", "field", "reason_part"),
    [
        ({"bogus_key": 1}, {}, "config.bogus_key", "unknown key"),
        ({"summary_max_output_tokens": "lots"}, {}, "config.summary_max_output_tokens", ""),
        ({"auto_compact_trigger": "always"}, {}, "config.auto_compact_trigger", ""),
        (
            {"projected_tool_result_budget": {"max_bytes": -1}},
            {},
            "config.projected_tool_result_budget.max_bytes",
            "",
        ),
        ({"auto_compact_threshold_percent": 300}, {}, "config.auto_compact_threshold_percent", ""),
        ({}, {"grep": {"compaction": "squash"}}, "tools.grep.compaction", ""),
        ({}, {"grep": {"compactoin": "keep"}}, "tools.grep.compactoin", "unknown key"),
        ({}, {"grep": "keep"}, "tools.grep", ""),
    ],
)
def test_invalid_overrides_named(
    config: dict[str, Any], tools: dict[str, Any], field: str, reason_part: str
) -> None:
    error = rejected(snapshot(config=config, tools=tools))
    assert error.field == field
    assert reason_part in error.reason


# --- the real corpus ----------------------------------------------------------------------------


@pytest.mark.corpus
def test_every_corpus_snapshot_parses(corpus_dir: Path) -> None:
    files = sorted(corpus_dir.glob("*.json.gz"))
    assert files
    for path in files:
        parsed = parse_snapshot(gzip.decompress(path.read_bytes()), DEFAULT)
        assert len(parsed.source_ids) == len(parsed.snapshot.messages), path.name


# --- the fast JSON path (orjson) reads exactly what json reads, or leaves the text to json -----

_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


def _refuse(_text: str) -> Any:
    raise ValueError("not a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("out of range")
    return value


def _json_reads(data: bytes) -> Any:
    """What json reads, refusing what strict JSON has no value for (NaN, infinities)."""
    try:
        return (
            "value",
            json.loads(data.decode("utf-8"), parse_constant=_refuse, parse_float=_finite),
        )
    except (ValueError, RecursionError):
        return ("refused", None)


def _decode_reads(data: bytes) -> Any:
    try:
        return ("value", decode_json(data, max_bytes=1 << 30))
    except InvalidSnapshot:
        return ("refused", None)


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same JSON text: 1, 1.0 and true differ here, as in derived ids."""
    return bool(a == b) and json.dumps(a) == json.dumps(b)


@given(_JSON_VALUES, st.sampled_from([None, (",", ":"), (", ", ": ")]))
def test_fast_parse_reads_what_json_reads(value: Any, separators: Any) -> None:
    data = json.dumps(value, separators=separators, ensure_ascii=False).encode()
    assert _same(_decode_reads(data), _json_reads(data))


@pytest.mark.parametrize(
    "data",
    [
        b"123456789012345678901234567890",  # orjson would read a float
        b"-9223372036854775809",
        b"[18446744073709551616, 1]",
        b"NaN",
        b"[Infinity, -Infinity]",
        b"1e400",
        b"-1e-400",
        b'{"a": 1, "b": 2, "a": 3}',
        b'"\\ud800"',
        b'"\\udc00\\ud800"',
        b'"\xed\xa0\x80"',  # an encoded surrogate: not UTF-8
        b"\xef\xbb\xbf{}",
        b'"a\x01"',
        b"[1,]",
        b"[" * 254 + b"]" * 254,
        b"[" * 255 + b"]" * 255,
        b"[" * 1010 + b"]" * 1010,  # orjson reads this; json refuses it
        b'{"k": ' * 600 + b"1" + b"}" * 600,
        b'["' + b"[" * 2000 + b'"]',
        b"0.1e1",
        b"5e-324",
        b"-0",
        b"-0.0",
    ],
)
def test_fast_parse_edge_cases_read_as_json_does(data: bytes) -> None:
    assert _same(_decode_reads(data), _json_reads(data))
