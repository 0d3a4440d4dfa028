"""A conversation's evaluation memo and the in-process reuse of its last parse: each may only
save work, never change a result."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.cache import ContentCache, Recorder
from worker.config import Settings
from worker.errors import InvalidSnapshot
from worker.pipeline import (
    StoredBlob,
    evaluate_with_memo,
    snapshot_context,
    tokenizer_of,
)
from worker.pipeline.evaluate import evaluate
from worker.reuse import Reuse
from worker.reuse.memo import (
    MAX_MEMO_BYTES,
    StoredMemo,
    decode_memo,
    encode_memo,
    memo_digest,
    preload,
    worth_rewriting,
)
from worker.reuse.recent import RecentConversations
from worker.tokens import CharEstimateTokenizer, TiktokenTokenizer
from worker.wire.snapshots import ParsedSnapshot, parse_snapshot

DEFAULT = Settings()

# --- the memo's encoding -------------------------------------------------------------------------

keys = st.one_of(st.binary(min_size=16, max_size=16), st.text(max_size=40))


@settings(max_examples=200)
@given(
    st.dictionaries(keys, st.integers(min_value=0, max_value=10**9), max_size=20),
    st.dictionaries(keys, st.one_of(st.none(), st.text(max_size=80)), max_size=20),
)
def test_memo_round_trips_keys_and_values_exactly(
    counts: dict[Any, int], bodies: dict[Any, str | None]
) -> None:
    recorded = {"tokens:o200k_base": counts, "compressed": bodies}
    blob = encode_memo(recorded, messages=12)
    assert blob is not None
    memo = decode_memo(blob)
    assert memo.entries == {name: v for name, v in recorded.items() if v}
    assert memo.messages == 12


def test_lone_surrogates_survive_the_memo() -> None:
    recorded = {"tokens:o200k_base": {"a\ud800b": 3}}
    assert decode_memo(encode_memo(recorded, messages=1)).entries == recorded


@pytest.mark.parametrize(
    "blob",
    [
        None,
        b"",
        b"not json",
        b"[1, 2]",
        b'{"v": 99, "messages": 1, "caches": {}}',
        b'{"v": 2, "messages": 1}',
        b'{"v": 2, "caches": {}}',
        b'{"v": 2, "messages": "1", "caches": {}}',
        b'{"v": 2, "messages": 1, "caches": {"tokens:o200k_base": [["sabc", -1]]}}',
        b'{"v": 2, "messages": 1, "caches": {"tokens:o200k_base": [["sabc", "12"]]}}',
        b'{"v": 2, "messages": 1, "caches": {"tokens:o200k_base": [["sabc", true]]}}',
        b'{"v": 2, "messages": 1, "caches": {"compressed": [["sabc", 5]]}}',
        b'{"v": 2, "messages": 1, "caches": {"tokens:o200k_base": [["xabc", 5]]}}',
        b'{"v": 2, "messages": 1, "caches": {"tokens:o200k_base": [["hzz", 5]]}}',
        b'{"v": 2, "messages": 1, "caches": {"tokens:o200k_base": [["sabc"]]}}',
    ],
)
def test_a_memo_that_cannot_be_trusted_is_ignored(blob: bytes | None) -> None:
    assert decode_memo(blob).entries == {}


def test_an_oversized_memo_keeps_its_counts_and_drops_bodies() -> None:
    big = "x" * (MAX_MEMO_BYTES // 2)
    recorded = {
        "tokens:o200k_base": {b"k" * 16: 7},
        "compressed": {b"a" * 16: big, b"b" * 16: big + "y", b"c" * 16: None},
    }
    assert decode_memo(encode_memo(recorded, messages=3)).entries == {
        "tokens:o200k_base": {b"k" * 16: 7},
        "compressed": {b"c" * 16: None},
    }


def test_preload_fills_only_the_named_caches_and_keeps_what_is_there() -> None:
    tokens: ContentCache[int] = ContentCache(10, name="tokens:x")
    tokens.get_or_compute("held", lambda: 1)
    added = preload({"tokens:x": {"held": 99, "new": 2}, "other": {"z": 3}}, {"tokens:x": tokens})
    assert added == 1
    assert tokens.get_or_compute("held", lambda: -1) == 1
    assert tokens.get_or_compute("new", lambda: -1) == 2


def test_rewrite_only_when_the_stored_memo_falls_behind() -> None:
    stored = StoredMemo(digest=b"d", messages=100, evictions=0)
    assert worth_rewriting(5, None)
    assert not worth_rewriting(110, stored)
    assert worth_rewriting(111, stored)


# --- recording -----------------------------------------------------------------------------------


def test_recording_notes_entries_used_and_computed_per_task() -> None:
    recorder = Recorder()
    cache: ContentCache[int] = ContentCache(10, name="c", recorder=recorder)
    cache.get_or_compute("warm", lambda: 1)
    with recorder.recording() as recorded:
        cache.get_or_compute("warm", lambda: -1)
        cache.get_or_compute("cold", lambda: 2)
    cache.get_or_compute("outside", lambda: 3)
    assert recorded.used == {"c": {"warm": 1, "cold": 2}}
    assert recorded.computed["c"] == 1


def test_evictions_are_counted() -> None:
    cache: ContentCache[int] = ContentCache(2, name="c")
    for key in "abcd":
        cache.get_or_compute(key, lambda: 0)
    assert cache.evictions == 2


# --- the memo through evaluation ----------------------------------------------------------------


def conversation(turns: int, *, revision: int = 1) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for k in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": f"Step {k}.",
                "tool_calls": [
                    {
                        "id": f"call{k}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": f'{{"command": "ls d{k}"}}'},
                    }
                ],
            }
        )
        listing = "\n".join(f"src/pkg{k}/module_{i}.py" for i in range(60))
        messages.append({"role": "tool", "tool_call_id": f"call{k}", "content": listing})
    return {"conversation_id": "c-memo", "revision": revision, "messages": messages}


# A process's reuse (caches) for the tests that do not make a fresh one: what a worker that has
# seen everything before has.
reuse = Reuse()


def test_a_grown_conversation_on_another_process_computes_only_its_new_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reuse = Reuse()
    first = parse_snapshot(conversation(6), DEFAULT)
    _, update = evaluate_with_memo(snapshot_context(first, reuse), reuse, None)
    assert update.blob is not None
    assert update.results_compressed == 6

    reuse = Reuse()  # the next snapshot lands on another process
    grown = parse_snapshot(conversation(8, revision=2), DEFAULT)
    with_memo, after = evaluate_with_memo(
        snapshot_context(grown, reuse), reuse, stored_blob(update.blob)
    )
    assert after.results_compressed == 2  # the two new tool results
    # Two new exchanges: the assistant's text and arguments, the results, and their
    # compressed forms; the rest came from the memo.
    assert 0 < after.texts_tokenized <= 8

    reuse = Reuse()
    without = evaluate(snapshot_context(grown, reuse))
    assert with_memo.projected_tokens == without.projected_tokens
    assert with_memo.projection.messages == without.projection.messages


def stored_blob(blob: bytes | None) -> StoredBlob | None:
    """The memo as the store returns it to a reader that does not know it."""
    return StoredBlob(memo_digest(blob), blob) if blob else None


def test_a_process_that_made_the_memo_does_not_load_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reuse = Reuse()
    first = parse_snapshot(conversation(10), DEFAULT)
    _, made = evaluate_with_memo(snapshot_context(first, reuse), reuse, None)
    assert made.blob is not None and made.stored is not None
    grown = parse_snapshot(conversation(11, revision=2), DEFAULT)  # 23 messages: no rewrite
    calls: list[bytes | None] = []
    import worker.pipeline.memo as pipeline_memo

    real = pipeline_memo.decode_memo
    monkeypatch.setattr(pipeline_memo, "decode_memo", lambda b: calls.append(b) or real(b))
    # The store sends only the digest to a reader that knows it.
    digest_only = StoredBlob(made.stored.digest)
    _, again = evaluate_with_memo(snapshot_context(grown, reuse), reuse, digest_only, made.stored)
    assert calls == [] and again.stored == made.stored
    # After evictions the process may lack some entries; it computes those again.
    tokenizer = tokenizer_of(grown, reuse)
    assert isinstance(tokenizer, TiktokenTokenizer)
    tokenizer.cache.evictions += 1
    _, later = evaluate_with_memo(snapshot_context(grown, reuse), reuse, digest_only, made.stored)
    assert calls == [] and later.stored is not None
    assert later.stored.evictions == made.stored.evictions + 1
    # Another process's memo (another digest) is loaded.
    other = encode_memo({}, messages=9)
    assert other is not None
    evaluate_with_memo(snapshot_context(grown, reuse), reuse, stored_blob(other), made.stored)
    assert calls == [other]


def test_the_store_sends_the_memo_only_to_a_reader_that_lacks_it(redis_url: str) -> None:
    from worker.backend.connection import connect
    from worker.backend.redis_state import RedisState

    state = RedisState(connect(redis_url), DEFAULT.redis)
    state.store_snapshot("c-m", 1, json.dumps(conversation(1)).encode())
    assert state.take_work("c-m").memo_digest is None
    from worker.wire.events import SkippedEvent

    event = SkippedEvent(
        reason="below",
        event_id="e1",
        conversation_id="c-m",
        revision=1,
        created_at="2026-11-30T00:00:00Z",
    )
    state.publish(event, memo=b"{memo}", memo_digest="abc")
    state.store_snapshot("c-m", 2, json.dumps(conversation(1)).encode())
    fresh = state.take_work("c-m")
    assert (fresh.memo_digest, fresh.memo) == ("abc", b"{memo}")
    state.store_snapshot("c-m", 3, json.dumps(conversation(1)).encode())
    knowing = state.take_work("c-m", known_memo="abc")
    assert (knowing.memo_digest, knowing.memo) == ("abc", None)


# --- reusing the last parse ----------------------------------------------------------------------


def same_parse(a: ParsedSnapshot, b: ParsedSnapshot) -> None:
    assert a.source_ids == b.source_ids
    assert a.messages == b.messages


def test_parsing_with_the_earlier_snapshot_reuses_its_messages() -> None:
    earlier = parse_snapshot(conversation(5), DEFAULT)
    grown = conversation(7, revision=2)
    reused = parse_snapshot(grown, DEFAULT, earlier=earlier)
    same_parse(reused, parse_snapshot(grown, DEFAULT))
    assert sum(any(m is e for e in earlier.messages) for m in reused.messages) == 11


def test_an_edited_message_is_normalized_again() -> None:
    earlier = parse_snapshot(conversation(5), DEFAULT)
    edited = conversation(5, revision=2)
    edited["messages"][3]["content"] = "Step one, reconsidered."
    reused = parse_snapshot(edited, DEFAULT, earlier=earlier)
    same_parse(reused, parse_snapshot(edited, DEFAULT))
    assert reused.messages[3].content == "Step one, reconsidered."
    assert reused.messages[3] is not earlier.messages[3]


def test_equal_but_differently_typed_json_gets_its_own_derived_id() -> None:
    # Python's == says 1 == 1.0; the derived id (a hash of the JSON) does not.
    base = conversation(2)
    base["messages"][1]["x_priority"] = 1
    earlier = parse_snapshot(base, DEFAULT)
    changed = copy.deepcopy(base)
    changed["messages"][1]["x_priority"] = 1.0
    reused = parse_snapshot(changed, DEFAULT, earlier=earlier)
    same_parse(reused, parse_snapshot(changed, DEFAULT))
    assert reused.source_ids[1] != earlier.source_ids[1]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def has_number_or_boolean(value: Any) -> bool:
    if isinstance(value, bool | int | float):
        return True
    if isinstance(value, list):
        return any(has_number_or_boolean(v) for v in value)
    if isinstance(value, dict):
        return any(has_number_or_boolean(v) for v in value.values())
    return False


@settings(max_examples=500)
@given(json_values)
def test_plain_json_is_exactly_json_without_numbers_or_booleans(value: Any) -> None:
    from worker.wire.models import is_plain_json

    assert is_plain_json(value) == (not has_number_or_boolean(value))


@settings(max_examples=500)
@given(json_values)
def test_canonical_json_is_byte_for_byte_json_dumps(value: Any) -> None:
    """Derived ids hash canonical JSON through a reused C encoder: it must be json.dumps'."""
    from worker.wire.models import canonical_json

    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == expected


@settings(max_examples=500)
@given(json_values)
def test_canonical_json_of_a_whole_is_made_from_its_parts_canonical_json(value: Any) -> None:
    """A snapshot's messages are serialized once, for both its range digest and its transcript:
    a list or an object put together from its parts' canonical JSON is the whole's."""
    from worker.wire.models import canonical_array, canonical_json, canonical_object

    if isinstance(value, list):
        assert canonical_array([canonical_json(v) for v in value]) == canonical_json(value)
    if isinstance(value, dict):
        parts = {k: canonical_json(v) for k, v in value.items()}
        assert canonical_object(parts) == canonical_json(value)


@settings(max_examples=300)
@given(json_values, json_values)
def test_equal_plain_json_has_the_same_canonical_form(a: Any, b: Any) -> None:
    """Why a plain message equal to the prior one may keep its derived id."""
    from worker.wire.models import canonical_json, is_plain_json

    if a == b and is_plain_json(a):
        assert canonical_json(a) == canonical_json(b)


def test_plain_messages_keep_their_derived_ids_and_others_are_hashed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import worker.wire.formats as formats

    base = conversation(3)
    base["messages"][2]["x_score"] = 5  # not plain: its id is always derived again
    earlier = parse_snapshot(base, DEFAULT)
    hashed: list[int] = []
    real = formats.derived_message_id
    monkeypatch.setattr(formats, "derived_message_id", lambda i, r: hashed.append(i) or real(i, r))
    grown = {
        **conversation(4, revision=2),
        "messages": [*base["messages"], *conversation(4)["messages"][7:]],
    }
    reused = parse_snapshot(grown, DEFAULT, earlier=earlier)
    assert hashed == [2, 7, 8]
    monkeypatch.undo()
    same_parse(reused, parse_snapshot(grown, DEFAULT))


def anthropic_snapshot(tool_input: dict[str, Any], *, revision: int = 1) -> dict[str, Any]:
    return {
        "conversation_id": "c-anth",
        "revision": revision,
        "format": "anthropic",
        "system": "Be brief.",
        "messages": [
            {"id": "u1", "role": "user", "content": "Go."},
            {
                "id": "a1",
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "run", "input": tool_input}],
            },
            {
                "id": "u2",
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}],
            },
        ],
    }


@pytest.mark.parametrize(
    ("before", "after"),
    [({"a": 1, "b": 2}, {"b": 2, "a": 1}), ({"n": 1}, {"n": 1.0}), ({"n": 1}, {"n": True})],
)
def test_anthropic_tool_input_that_is_equal_in_python_but_not_in_json(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    earlier = parse_snapshot(anthropic_snapshot(before), DEFAULT)
    changed = anthropic_snapshot(after, revision=2)
    reused = parse_snapshot(changed, DEFAULT, earlier=earlier)
    same_parse(reused, parse_snapshot(changed, DEFAULT))
    assert reused.messages[2].tool_calls[0].arguments == json.dumps(after)


def test_another_system_prompt_or_conversation_reuses_nothing() -> None:
    earlier = parse_snapshot(anthropic_snapshot({"a": 1}), DEFAULT)
    other = anthropic_snapshot({"a": 1}, revision=2)
    other["system"] = "Be thorough."
    reused = parse_snapshot(other, DEFAULT, earlier=earlier)
    assert reused.messages[0].content == "Be thorough."
    assert not any(m is e for m in reused.messages for e in earlier.messages)
    renamed = conversation(3)
    renamed["conversation_id"] = "c-other"
    mine = parse_snapshot(conversation(3), DEFAULT)
    theirs = parse_snapshot(renamed, DEFAULT, earlier=mine)
    assert not any(m is e for m in theirs.messages for e in mine.messages)


def test_deeply_nested_messages_are_reused_too() -> None:
    deep: Any = "leaf"
    for _ in range(600):  # fine for JSON; deeper than a recursive walk could go
        deep = [deep]
    base = conversation(1)
    base["messages"][1]["x_deep"] = deep
    earlier = parse_snapshot(json.dumps(base).encode(), DEFAULT)
    grown = json.dumps({**base, "revision": 2}).encode()
    again = parse_snapshot(grown, DEFAULT, earlier=earlier)
    assert again.source_ids == earlier.source_ids


def test_a_grown_snapshot_still_gets_every_check() -> None:
    earlier = parse_snapshot(conversation(3), DEFAULT)
    bad = conversation(4, revision=2)
    bad["messages"][-1]["tool_call_id"] = "call0"  # a second result for an answered call
    with pytest.raises(InvalidSnapshot, match="second result"):
        parse_snapshot(bad, DEFAULT, earlier=earlier)


def _anthropic(snap: dict[str, Any]) -> dict[str, Any]:
    """The same conversation in the anthropic format (tool results inside user messages)."""
    out: list[dict[str, Any]] = []
    for m in snap["messages"][1:]:
        if m["role"] == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m["content"]}]
            blocks += [
                {"type": "tool_use", "id": c["id"], "name": "bash", "input": {"command": "ls"}}
                for c in m.get("tool_calls", [])
            ]
            out.append({"role": "assistant", "content": blocks})
        else:
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"]}
            out.append({"role": "user", "content": [{**result, "content": m["content"]}]})
    return {**snap, "format": "anthropic", "system": "Be brief.", "messages": out}


_EDITS = st.lists(
    st.tuples(
        st.sampled_from(
            ["grow", "drop", "edit", "own-id", "duplicate-id", "answer-again", "number", "bool"]
        ),
        st.integers(0, 30),
    ),
    max_size=4,
)


def _edited(snap: dict[str, Any], edits: list[tuple[str, int]]) -> dict[str, Any]:
    out = copy.deepcopy(snap)
    messages = out["messages"]
    for kind, at in edits:
        i = at % len(messages)
        if kind == "grow":
            more = conversation(len(messages) // 2 + 1)["messages"][-2:]
            messages += (
                _anthropic({"messages": [{}, *more]})["messages"]
                if out.get("format") == "anthropic"
                else more
            )
        elif kind == "drop" and len(messages) > 1:
            messages.pop()
        elif kind == "edit":
            messages[i] = {**messages[i], "x_note": f"edited {at}"}
        elif kind == "own-id":
            messages[i] = {**messages[i], "id": f"own-{at}"}
        elif kind == "duplicate-id":
            messages[i] = {**messages[i], "id": "twice"}
            messages[-1] = {**messages[-1], "id": "twice"}
        elif kind == "answer-again" and out.get("format") != "anthropic":
            answered = [m for m in messages if m["role"] == "tool"]
            if answered:
                messages.append({**answered[0], "content": "again"})
        elif kind in ("number", "bool"):
            messages[i] = {**messages[i], "x_flag": 1 if kind == "number" else True}
    return out


def _outcome(data: dict[str, Any], earlier: ParsedSnapshot | None) -> Any:
    try:
        parsed = parse_snapshot(data, DEFAULT, earlier=earlier)
    except InvalidSnapshot as exc:
        return ("rejected", exc.field, exc.reason)
    return (parsed.source_ids, parsed.plain, [m.model_dump() for m in parsed.messages])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["openai", "anthropic"]), st.integers(1, 6), _EDITS, _EDITS)
def test_a_parse_that_reuses_the_last_one_is_the_parse_from_scratch(
    fmt: str, turns: int, first: list[tuple[str, int]], then: list[tuple[str, int]]
) -> None:
    """Whatever edits come between two snapshots of a conversation, parsing the second with the
    first's parse gives what parsing it alone gives: ids, plainness, messages or the rejection."""
    base = conversation(turns)
    base = _anthropic(base) if fmt == "anthropic" else base
    one = _edited(base, first)
    two = {**_edited(one, then), "revision": 2}
    try:
        earlier = parse_snapshot(one, DEFAULT)
    except InvalidSnapshot:  # the first snapshot itself is invalid: nothing to reuse
        return
    before = copy.deepcopy(earlier.pairing)
    assert _outcome(two, earlier) == _outcome(two, None)
    assert earlier.pairing == before  # the next parse continues from a copy


def test_recent_snapshots_are_bounded_by_payload_bytes() -> None:
    recent = RecentConversations(max_bytes=250)
    parsed = {
        cid: parse_snapshot({**conversation(1), "conversation_id": cid}, DEFAULT)
        for cid in ("a", "b", "c")
    }
    recent.put(parsed["a"], 100)
    recent.put(parsed["b"], 100)
    assert recent.get("a") is parsed["a"]  # now the most recent
    recent.put(parsed["c"], 100)  # 300 > 250: the least recent (b) goes
    assert recent.get("b") is None
    assert recent.get("a") is parsed["a"] and recent.get("c") is parsed["c"]
    recent.put(parsed["b"], 1000)  # bigger than the whole bound: not kept
    assert recent.get("b") is None
    memo = StoredMemo(digest="d", messages=1, evictions=0)
    recent.remember_memo("a", memo)
    recent.remember_memo("b", memo)  # not kept: no memo either
    assert recent.stored_memo("a") == memo and recent.stored_memo("b") is None
    # The conversation's next parse keeps what its evaluation will reuse.
    recent.put(parse_snapshot({**conversation(2), "conversation_id": "a"}, DEFAULT), 100)
    assert recent.stored_memo("a") == memo


# --- reusing the last counted projection ---------------------------------------------------------


def grep_conversation(turns: int, *, revision: int = 1, **config: Any) -> dict[str, Any]:
    """Tool results that compress (grep over several files), so projections change bodies."""
    snap = conversation(turns, revision=revision)
    for k, m in enumerate(snap["messages"]):
        if m["role"] == "tool":
            m["content"] = "\n".join(
                f"src/pkg{k}/mod_{i // 20}.py:{i}: value = compute_{i}(x)" for i in range(60)
            )
    snap["config"] = config
    return snap


def evaluated_in_steps(snapshots: list[dict[str, Any]]) -> list[Any]:
    """Evaluate each snapshot reusing the last parse and counted projection, as a worker does."""
    out, parsed, counted = [], None, None
    for snap in snapshots:
        parsed = parse_snapshot(snap, DEFAULT, earlier=parsed)
        evaluation = evaluate(snapshot_context(parsed, reuse), counted)
        counted = evaluation.counted
        out.append(evaluation)
    return out


@pytest.mark.parametrize(
    "config", [{}, {"keep_recent_tool_results": 2}, {"compress_tool_results": False}]
)
def test_a_reused_counted_projection_is_the_full_evaluation(config: dict[str, Any]) -> None:
    steps = [grep_conversation(n, revision=n, **config) for n in range(1, 7)]
    steps.append(grep_conversation(4, revision=9, **config))  # history rewritten shorter
    for snap, reused in zip(steps, evaluated_in_steps(steps), strict=True):
        full_parse = parse_snapshot(snap, DEFAULT)
        full = evaluate(snapshot_context(full_parse, reuse))
        assert reused.projected_tokens == full.projected_tokens
        assert reused.projection.messages == full.projection.messages
        assert reused.projection.bodies == full.projection.bodies
        assert reused.projection.elided == full.projection.elided
    if config.get("compress_tool_results", True):  # the bodies did change
        assert any(e.projection.bodies for e in evaluated_in_steps(steps))


def test_only_new_messages_are_projected_when_the_prefix_is_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = grep_conversation(5), grep_conversation(6, revision=2)
    parsed = parse_snapshot(first, DEFAULT)
    counted = evaluate(snapshot_context(parsed, reuse)).counted
    grown = parse_snapshot(second, DEFAULT, earlier=parsed)
    context = snapshot_context(grown, reuse)
    # Watched at the tokenizer, which every message's count goes through (the projection's
    # own functions may be compiled, and call each other directly).
    texts: list[str] = []
    real = context.tokenizer.count
    monkeypatch.setattr(context.tokenizer, "count", lambda t: texts.append(t) or real(t))

    def counted_messages(evaluation: Any) -> list[int]:
        return [m.source_index for m in evaluation.projection.messages if m.content in texts]

    assert counted_messages(evaluate(context, counted)) == [11, 12]
    texts.clear()
    # Without a prior: every message.
    assert counted_messages(evaluate(context, None)) == list(range(13))


def test_a_memo_written_by_a_process_that_reuses_is_still_complete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process reuses its counted projection between rewrites, yet each memo it writes
    carries every entry: the other process then computes only what came after it."""
    reuse = Reuse()
    parsed = counted = stored = blob = None
    n = 1
    while n < 20 or (stored is not None and stored.messages == 2 * n + 1):
        n += 1  # one exchange per turn; the memo is rewritten every few turns
        parsed = parse_snapshot(grep_conversation(n, revision=n), DEFAULT, earlier=parsed)
        evaluation, update = evaluate_with_memo(
            snapshot_context(parsed, reuse), reuse, stored_blob(blob), stored, counted
        )
        counted, stored, blob = evaluation.counted, update.stored, update.blob or blob
    assert stored is not None and stored.messages < 2 * n + 1  # the memo is behind
    reuse = Reuse()
    last = parse_snapshot(grep_conversation(n, revision=n), DEFAULT)
    _, other = evaluate_with_memo(snapshot_context(last, reuse), reuse, stored_blob(blob))
    assert other.results_compressed == (2 * n + 1 - stored.messages) // 2


# --- from the review: keys, bounds, versions, memo lifecycle ----------------------------------


def test_content_keys_of_different_parts_never_collide() -> None:
    """A separator byte would let ("grep", "HEADER\\0" + body) and ("grep\\0HEADER", body)
    share a key, and one conversation's compressed body answer for another's."""
    from worker.cache import content_key

    assert content_key("grep", "HEADER\0body") != content_key("grep\0HEADER", "body")
    assert content_key("ab", "c") != content_key("a", "bc")
    assert content_key("a") == content_key("a")


def test_a_tool_name_with_a_nul_does_not_borrow_another_results_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reuse = Reuse()
    body = "\n".join(f"src/pkg/module_{i}.py" for i in range(80))
    first = {
        "conversation_id": "c-nul-a",
        "revision": 1,
        "messages": [
            {"role": "assistant", "tool_calls": [_call("x", "bash")]},
            {"role": "tool", "tool_call_id": "x", "content": "HEADER\0" + body},
        ],
    }
    second = {
        "conversation_id": "c-nul-b",
        "revision": 1,
        "messages": [
            {"role": "assistant", "tool_calls": [_call("y", "bash\0HEADER")]},
            {"role": "tool", "tool_call_id": "y", "content": body},
        ],
    }
    for snap in (first, second):
        parsed = parse_snapshot(snap, DEFAULT)
        warm = evaluate(snapshot_context(parsed, reuse))
        reuse = Reuse()
        cold = evaluate(snapshot_context(parsed, reuse))
        assert warm.projection.messages == cold.projection.messages


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_front_caches_are_bounded_by_entries_and_count_empty_texts() -> None:
    from worker.cache import FRONT_ENTRY_OVERHEAD, FrontCache

    front: FrontCache[str, int] = FrontCache(
        ContentCache(100, name="c"), max_size=10**9, max_entries=3, size_of=len, key_of=str
    )
    for text in ["", "a", "b", "c", "d"]:
        front.get_or_compute(text, lambda: 0)
    assert len(front) == 3
    small: FrontCache[str, int] = FrontCache(
        ContentCache(100, name="c"),
        max_size=2 * FRONT_ENTRY_OVERHEAD + 2,
        max_entries=100,
        size_of=len,
        key_of=str,
    )
    for i in range(5):
        small.get_or_compute("" if i == 0 else str(i), lambda: 0)
    assert len(small) == 2  # empty texts are not free


def test_the_compression_cache_is_named_after_the_codecs() -> None:
    """Memos from workers running other codecs (a rolling deploy) are not preloaded here."""
    import worker.core.projection as projection
    from worker.compress import CODECS_VERSION

    assert f"compressed:v{CODECS_VERSION}" == projection.COMPRESSED_CACHE
    stale = {f"compressed:v{CODECS_VERSION - 1}": {b"k" * 16: "a body from other codecs"}}
    assert preload(stale, Reuse().memo_caches(CharEstimateTokenizer())) == 0


def test_the_memo_is_rewritten_after_the_conversation_shrinks() -> None:
    stored = StoredMemo(digest="d", messages=80, evictions=0)
    assert worth_rewriting(79, stored)
    assert not worth_rewriting(80, stored)


def test_a_memo_too_big_to_store_is_not_tried_again_on_every_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import worker.reuse.memo as memo

    reuse = Reuse()
    monkeypatch.setattr(memo, "MAX_MEMO_BYTES", 10)
    first = parse_snapshot(conversation(10), DEFAULT)
    one, made = evaluate_with_memo(snapshot_context(first, reuse), reuse, None)
    assert made.blob is None and made.stored is not None and made.stored.digest == ""
    grown = parse_snapshot(conversation(11, revision=2), DEFAULT, earlier=first)
    encoded: list[int] = []
    real = memo.encode_memo
    import worker.pipeline.memo as pipeline_memo

    monkeypatch.setattr(
        pipeline_memo, "encode_memo", lambda r, **k: encoded.append(1) or real(r, **k)
    )
    _, again = evaluate_with_memo(
        snapshot_context(grown, reuse), reuse, None, made.stored, one.counted
    )
    assert encoded == [] and again.stored == made.stored


@pytest.mark.parametrize("blob", [b"[" * 100_000 + b"]" * 100_000, b"{" + b" " * (5 << 20) + b"}"])
def test_a_hostile_or_oversized_memo_is_ignored(blob: bytes) -> None:
    assert decode_memo(blob).entries == {}
