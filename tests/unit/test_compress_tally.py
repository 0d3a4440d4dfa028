"""Exact token accounting: the split-point rules and deltas agree with tiktoken itself."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.compress.tally import TokenTally, chunks, is_split_point, runs
from worker.tokens import _RANKS_OF, count_tokens, get_encoding

MODELS = [None, "gpt-4"]  # o200k_base and cl100k_base

# Fragments around which tiktoken's pre-tokenizer behaves differently: digits, letters,
# contractions, punctuation runs, every kind of whitespace, "/" after newlines, non-ASCII.
FRAGMENTS = [
    "a", "Zq", "9", "12", "1234", " ", "  ", "\t", "\n", "\n\n", " \n", "\r\n", "\r", "/",
    ":", "-", ".", "(", ")", "'", "'s", "#", "_", "é", "漢", "½", "\u00a0", "\u2028", "\x0b",
    "x/", "):", "[x2]", "## ", "--",
]  # fmt: skip
piece = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=4).map("".join)
pieces = st.lists(piece, max_size=12)


@pytest.mark.parametrize("model", MODELS)
@settings(deadline=None, max_examples=150)
@given(parts=pieces)
def test_count_of_pieces_is_the_count_of_their_concatenation(
    model: str | None, parts: list[str]
) -> None:
    assert TokenTally(model).count(parts) == count_tokens("".join(parts), model)


@pytest.mark.parametrize("model", MODELS)
@settings(deadline=None, max_examples=150)
@given(left=piece, right=piece)
def test_split_points_are_real(model: str | None, left: str, right: str) -> None:
    if is_split_point(left, right):
        together = count_tokens(left + right, model)
        assert together == count_tokens(left, model) + count_tokens(right, model)


@settings(deadline=None, max_examples=100)
@given(original=pieces, candidate=pieces)
def test_delta_is_the_exact_difference(original: list[str], candidate: list[str]) -> None:
    delta = TokenTally().delta(original, candidate)
    before = count_tokens("".join(original))
    after = count_tokens("".join(candidate))
    assert delta.removed.exact() - delta.added == before - after
    assert before >= delta.removed.exact() and after >= delta.added
    assert TokenTally().counts(TokenTally().delta(original, candidate)) == (before, after)


@settings(deadline=None, max_examples=150)
@given(
    original=pieces,
    candidate=pieces,
    min_tokens=st.integers(0, 20),
    min_saving=st.floats(-1, 0.9),
)
def test_passes_decides_the_gate_exactly(
    original: list[str], candidate: list[str], min_tokens: int, min_saving: float
) -> None:
    tally = TokenTally()
    before = count_tokens("".join(original))
    after = count_tokens("".join(candidate))
    exact = before > min_tokens and before - after > min_saving * before
    assert (
        tally.passes(tally.delta(original, candidate), min_tokens=min_tokens, min_saving=min_saving)
        is exact
    )


def _spied(tally: TokenTally, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ``tally`` hands to tiktoken from now on."""
    encoded: list[str] = []
    encode = tally._encode

    def spy(text: str) -> list[int]:
        encoded.append(text)
        return encode(text)

    monkeypatch.setattr(tally, "_encode", spy)
    return encoded


def test_passes_stops_counting_once_the_bound_settles_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # grep rows: 29k tokens before, 19k after, 19k of them in lines both texts share.
    shared = [f"{n}:    unchanged line of the listing\n" for n in range(2000)]
    original = [piece for line in shared for piece in ("src/mod/a.py:", line)]
    tally = TokenTally()
    delta = tally.delta(original, ["[header]\n", *shared])
    shared_bytes = delta.shared.rest
    encoded = _spied(tally, monkeypatch)
    assert tally.passes(delta, min_tokens=200, min_saving=0.15)
    assert 0 < sum(map(len, encoded)) < 0.6 * shared_bytes


def test_a_candidate_sharing_nothing_counts_only_part_of_the_original(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A path listing against its grouped form: whole texts, no run in common.
    original = "".join(f"./pkg/mod{n // 20}/file_{n}.py\n" for n in range(20_000))
    candidate = "[grouped]\n" + "".join(
        f"./pkg/mod{d}/ " + " ".join(f"file_{n}.py" for n in range(20 * d, 20 * d + 20)) + "\n"
        for d in range(1000)
    )
    tally = TokenTally()
    encoded = _spied(tally, monkeypatch)
    delta = tally.delta([original], [candidate])
    assert delta.added == count_tokens(candidate)  # the candidate is counted whole, once
    assert tally.saves(delta)
    assert tally.passes(delta, min_tokens=200, min_saving=0.15)
    original_counted = sum(map(len, encoded)) - len(candidate)
    assert 0 < original_counted < 0.8 * len(original)
    assert count_tokens(original) - count_tokens(candidate) > 0.15 * count_tokens(original)


def test_shared_lines_are_not_tokenized_again(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [f"line {n} of a long and unremarkable log\n" for n in range(50)]
    tally = TokenTally()
    encoded = _spied(tally, monkeypatch)
    delta = tally.delta(lines, ["[header]\n", *lines])
    assert encoded == ["[header]\n"]
    assert delta.removed.exact() == 0
    assert delta.added == count_tokens("[header]\n")
    assert delta.shared.rest == sum(len(line) for line in lines)


def test_runs_join_pieces_that_do_not_meet_at_a_split_point() -> None:
    pieces = ["a\n", "  \n", "b):\n", "", "/c\n", "d\n", "/e"]
    assert runs(pieces) == ["a\n  \n", "b):\n/c\n", "d\n", "/e"]
    assert runs(["path:", "12:x\n", "path:", "13:y"]) == ["path:", "12:x\n", "path:", "13:y"]
    assert runs(["a:", "b", "c", " d\n", "", "e"]) == ["a:bc", " d\n", "e"]


@settings(deadline=None, max_examples=100)
@given(parts=pieces, more=pieces)
def test_a_pending_count_is_always_within_its_bounds(parts: list[str], more: list[str]) -> None:
    tally = TokenTally()
    pending = tally.pending(Counter(runs(parts))) + tally.pending(Counter(runs(more)))
    exact = count_tokens("".join(parts)) + count_tokens("".join(more))
    while pending.rest:
        assert pending.low <= exact <= pending.high
        pending.refine()
    assert pending.low == pending.high == exact == pending.exact()


# Lines as tool output has them: indented, blank, all-whitespace, "/"-led, CRLF, numbered.
LINE = st.lists(st.sampled_from(FRAGMENTS), max_size=5).map("".join)
TEXT = st.lists(LINE, min_size=1, max_size=30).map("\n".join)


@pytest.mark.parametrize("model", MODELS)
@settings(deadline=None, max_examples=300)
@given(text=TEXT, size=st.integers(1, 40))
def test_chunks_add_up_to_the_whole(model: str | None, text: str, size: int) -> None:
    parts = list(chunks(text, size))
    assert "".join(parts) == text
    assert all(parts) or parts == [""]
    assert all(len(part) >= size for part in parts[:-1])
    assert sum(count_tokens(part, model) for part in parts) == count_tokens(text, model)


def test_every_encoding_in_use_has_a_pattern_the_split_rules_were_checked_against() -> None:
    # The split-point rules (and so the chunk cuts) are proven for these two pre-tokenizer
    # patterns only; an encoding with another one must not be counted in pieces unchecked.
    checked = {get_encoding("o200k_base")._pat_str, get_encoding("cl100k_base")._pat_str}
    assert {get_encoding(name)._pat_str for name in _RANKS_OF} <= checked
