"""Exact token accounting: the split-point rules and deltas agree with tiktoken itself."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.compress.tally import Delta, TokenTally, is_split_point, runs
from worker.tokens import count_tokens

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
    assert delta.removed - delta.added == before - after
    assert before >= delta.removed and after >= delta.added
    assert TokenTally().counts(delta) == (before, after)


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


def test_passes_stops_counting_once_the_bound_settles_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # grep rows: 29k tokens before, 19k after, 19k of them in lines both texts share.
    shared = [f"{n}:    unchanged line of the listing\n" for n in range(2000)]
    original = [piece for line in shared for piece in ("src/mod/a.py:", line)]
    tally = TokenTally()
    delta = tally.delta(original, ["[header]\n", *shared])
    encoded: list[str] = []
    encode = tally._encode

    def spy(text: str) -> list[int]:
        encoded.append(text)
        return encode(text)

    monkeypatch.setattr(tally, "_encode", spy)
    assert tally.passes(delta, min_tokens=200, min_saving=0.15)
    assert 0 < sum(map(len, encoded)) < 0.6 * delta.shared_bytes


def test_shared_lines_are_not_tokenized_again() -> None:
    lines = [f"line {n} of a long and unremarkable log\n" for n in range(50)]
    delta = TokenTally().delta(lines, ["[header]\n", *lines])
    assert delta.removed == 0
    assert delta.added == count_tokens("[header]\n")
    assert delta.shared_bytes == sum(len(line) for line in lines)


def test_runs_join_pieces_that_do_not_meet_at_a_split_point() -> None:
    pieces = ["a\n", "  \n", "b):\n", "", "/c\n", "d\n", "/e"]
    assert runs(pieces) == ["a\n  \n", "b):\n/c\n", "d\n", "/e"]
    assert runs(["path:", "12:x\n", "path:", "13:y"]) == ["path:", "12:x\n", "path:", "13:y"]


def test_delta_addition() -> None:
    assert Delta(3, 1, 10) + Delta(2, 2, 5) == Delta(5, 3, 15)
