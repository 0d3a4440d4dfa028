"""worker.wire.splice: the proxy rewrites only the messages a compaction changed; every other
element of the history, and the rest of the body, keeps the bytes the agent sent."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from worker.wire.splice import splice_array

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.floats(allow_nan=False)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
# How an agent's JSON library may write the same body: compact, spaced, ASCII-escaped.
STYLES = [
    {"separators": (",", ":")},
    {"indent": 2},
    {"ensure_ascii": False, "separators": (", ", ": ")},
]


@given(
    messages=st.lists(st.dictionaries(st.text(max_size=6), VALUES, max_size=3), max_size=6),
    extra=st.dictionaries(
        st.text(max_size=6).filter(lambda k: k != "messages"), VALUES, max_size=3
    ),
    style=st.sampled_from(STYLES),
    cut=st.tuples(st.integers(0, 6), st.integers(0, 6)),
    new=st.lists(st.dictionaries(st.text(max_size=6), VALUES, max_size=2), max_size=3),
)
def test_untouched_elements_keep_their_bytes(
    messages: list[dict[str, Any]],
    extra: dict[str, Any],
    style: dict[str, Any],
    cut: tuple[int, int],
    new: list[dict[str, Any]],
) -> None:
    raw = json.dumps({**extra, "messages": messages}, **style).encode()
    parsed = json.loads(raw)
    original = parsed["messages"]
    start, end = sorted(c % (len(original) + 1) for c in cut)
    forwarded = [*original[:start], *new, *original[end:]]
    spliced = splice_array(raw, "messages", original, forwarded)
    assert spliced is not None
    assert json.loads(spliced) == {**parsed, "messages": forwarded}
    if "indent" not in style:  # (indented, an element's text depends on its depth)
        for value in [*original[:start], *original[end:]]:
            assert json.dumps(value, **style) in spliced.decode()  # as the agent wrote it
    head = raw.decode().split('"messages"', 1)[0]
    assert spliced.decode().startswith(head)  # the rest of the body untouched


def test_a_provider_block_goes_upstream_byte_for_byte() -> None:
    block = (
        '{"type":"compaction","content":"Earlier: caf\\u00e9 \\"quoted\\"",'
        '"signature":"c2lnbmF0dXJl"}'
    )
    raw = (
        '{"model": "claude-x",  "messages" :[ {"role":"user","content":"old"},\n'
        f'{{"role":"assistant","content":[{block}]}} ,{{"role":"user","content":"go"}}] }}'
    ).encode()
    original = json.loads(raw)["messages"]
    summary = {"role": "user", "content": "summary"}
    spliced = splice_array(raw, "messages", original, [original[0], original[1], summary])
    assert spliced is not None and block.encode() in spliced
    assert spliced.startswith(b'{"model": "claude-x",  "messages" :[')
    assert json.loads(spliced)["messages"][2] == summary


def test_what_cannot_be_read_so_is_left_to_the_caller() -> None:
    original = [{"a": 1}]
    assert (
        splice_array(b'{"messages": [{"a": 1}], "messages": []}', "messages", original, []) is None
    )
    assert splice_array(b'[{"a": 1}]', "messages", original, []) is None
    assert splice_array(b'{"messages": [{"a": 1}, 2]}', "messages", original, []) is None
    assert splice_array(b'{"input": "text"}', "input", original, []) is None
