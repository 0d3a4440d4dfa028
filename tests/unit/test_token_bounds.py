"""Bounded token counts (issue 11): exact against tiktoken itself wherever the text has split
points, an upper bound (its UTF-8 bytes) only for an enormous stretch without one, and never
more than a segment handed to tiktoken at a time."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.compress.tally import TokenTally, is_split_point
from worker.tokens import bounds as token_bounds
from worker.tokens import count_prefix, count_tokens, cut_to_tokens, get_encoding, tokenizer_for
from worker.tokens.bounds import (
    RUN_LIMIT,
    SEGMENT_CHARS,
    bounded_count,
    cut_prefix,
    is_exact,
    joined_count,
    segments,
    split_points,
    utf8_bytes,
)

ENCODINGS = ["o200k_base", "cl100k_base"]
MODELS = {"o200k_base": None, "cl100k_base": "gpt-4"}

# As in test_compress_tally: the fragments around which the pre-tokenizer behaves differently.
FRAGMENTS = [
    "a", "Zq", "9", "12", "1234", " ", "  ", "\t", "\n", "\n\n", " \n", "\r\n", "\r", "/",
    ":", "-", ".", "(", ")", "'", "'s", "#", "_", "é", "漢", "½", "\u00a0", "\u2028", "\x0b",
    "\x1c", "\x00", "x/", "):", "[x2]", "## ", "--", "ab", "abab", "====",
]  # fmt: skip
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join)


def _exact(encoding: str, text: str) -> int:
    return len(get_encoding(encoding).encode(text, disallowed_special=()))


def _old_cut(encoding: str, text: str, max_tokens: int) -> tuple[str, bool]:
    """cut_to_tokens as it was: the whole text through tiktoken."""
    enc = get_encoding(encoding)
    ids = enc.encode(text, disallowed_special=())
    if len(ids) <= max_tokens:
        return text, False
    cut = enc.decode(ids[: max(max_tokens, 0)]).rstrip("\ufffd")
    while cut and len(enc.encode(cut, disallowed_special=())) > max_tokens:
        cut = cut[:-1]
    return cut, True


@pytest.fixture
def tiny_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of 8 and stretches of 24 characters, so that short texts exercise every path."""
    monkeypatch.setattr(token_bounds, "SEGMENT_CHARS", 8)
    monkeypatch.setattr(token_bounds, "RUN_LIMIT", 24)


def _spy(encoding: str) -> tuple[Callable[[str], Sequence[int]], list[int]]:
    """The encoding's encode_ordinary, noting the length of every text it is given."""
    sizes: list[int] = []
    encode = get_encoding(encoding).encode_ordinary

    def spied(text: str) -> Sequence[int]:
        sizes.append(len(text))
        return encode(text)

    return spied, sizes


def _prose(size: int, *, seed: int, newlines: bool) -> str:
    rng = random.Random(seed)
    words = [
        *[
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "a",
            "lazy",
            "dog",
            "while",
            "42",
            "workers",
            "compact",
            "1.5",
            "GB",
        ],
        *[
            "of",
            "text,",
            "it's",
            "fine:",
            "naïve",
            "café",
            "漢字",
            "src/worker/tokens.py",
            "(see",
            "#11)",
            "--",
            "==>",
            "ok",
        ],
    ]
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(words) + ("\n" if newlines and rng.random() < 0.08 else " ")
        out.append(word)
        length += len(word)
    return "".join(out)[:size]


# --- split points -------------------------------------------------------------------------


@settings(deadline=None, max_examples=300)
@given(text=texts)
def test_every_cut_is_a_split_point_of_the_tally(text: str) -> None:
    for cut in split_points(text):
        assert 0 < cut < len(text)
        assert is_split_point(text[:cut], text[cut:]), (text[:cut], text[cut:])


@settings(deadline=None, max_examples=300)
@given(text=texts)
def test_every_split_point_of_the_tally_is_found(text: str) -> None:
    """The regex knows every junction the tally's rules accept (for the tally's ASCII rules)."""
    found = set(split_points(text))
    for cut in range(1, len(text)):
        if is_split_point(text[:cut], text[cut:]):
            assert cut in found, (text[:cut], text[cut:])


@pytest.mark.parametrize("encoding", ENCODINGS)
@settings(deadline=None, max_examples=200)
@given(text=texts)
def test_counts_at_every_cut_add_up_to_tiktoken(encoding: str, text: str) -> None:
    cuts = [0, *split_points(text), len(text)]
    parts = [text[a:b] for a, b in pairwise(cuts)]
    assert sum(_exact(encoding, p) for p in parts) == _exact(encoding, text)


# --- counts -------------------------------------------------------------------------------


@pytest.mark.usefixtures("tiny_limits")
@pytest.mark.parametrize("encoding", ENCODINGS)
@settings(deadline=None, max_examples=300)
@given(text=texts)
def test_bounded_count_is_exact_or_an_upper_bound(encoding: str, text: str) -> None:
    encode = get_encoding(encoding).encode_ordinary
    spans = segments(text)
    assert "".join(text[a:b] for a, b, _ in spans) == text
    assert all(a < b for a, b, _ in spans)
    counted = bounded_count(encode, text)
    exact = _exact(encoding, text)
    if is_exact(text):
        assert counted == exact
    else:
        assert exact <= counted <= utf8_bytes(text)
        # Only stretches without a split point, longer than the limit, are bounded.
        for a, b, whole in spans:
            if not whole:
                assert b - a > token_bounds.RUN_LIMIT
                assert not split_points(text, a, b)


@pytest.mark.usefixtures("tiny_limits")
def test_a_line_break_inside_whitespace_is_a_cut() -> None:
    text = "x" * 7 + " " * 20 + "\n" + " " * 40 + "y"  # splits after the line break
    assert segments(text) == [(0, 28, True), (28, 69, False)]
    assert bounded_count(get_encoding("o200k_base").encode_ordinary, text) == (
        _exact("o200k_base", text[:28]) + 41
    )


@pytest.mark.usefixtures("tiny_limits")
@settings(deadline=None, max_examples=200)
@given(left=texts, right=texts)
def test_bounded_count_adds_up_at_split_points(left: str, right: str) -> None:
    """What the codecs' accounting needs: f(a + b) = f(a) + f(b) where a and b split."""
    encode = get_encoding("o200k_base").encode_ordinary
    if left and right and is_split_point(left, right):
        together = bounded_count(encode, left + right)
        assert together == bounded_count(encode, left) + bounded_count(encode, right)


def _joined(encoding: str, left: str, right: str) -> int:
    encode = get_encoding(encoding).encode_ordinary
    left_tokens, right_tokens = bounded_count(encode, left), bounded_count(encode, right)
    return joined_count(encode, left, left_tokens, right, right_tokens)


@pytest.mark.parametrize("encoding", ENCODINGS)
@settings(deadline=None, max_examples=300)
@given(left=texts, right=texts)
def test_a_joined_count_is_tiktokens_count_of_the_joined_text(
    encoding: str, left: str, right: str
) -> None:
    assert _joined(encoding, left, right) == _exact(encoding, left + right)


@pytest.mark.usefixtures("tiny_limits")
@settings(deadline=None, max_examples=300)
@given(left=texts, right=texts, window=st.integers(1, 12))
def test_a_joined_count_is_the_bounded_count_near_any_window(
    left: str, right: str, window: int
) -> None:
    """Split points only a few characters from the junction, or none (counted whole), and
    enormous stretches on either side: still the count of the joined text."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(token_bounds, "JOIN_WINDOW", window)
        joined = _joined("o200k_base", left, right)
    assert joined == bounded_count(get_encoding("o200k_base").encode_ordinary, left + right)


@pytest.mark.parametrize("encoding", ENCODINGS)
@settings(deadline=None, max_examples=300)
@given(text=texts, data=st.data())
def test_a_prefix_is_counted_from_the_whole_text(
    encoding: str, text: str, data: st.DataObject
) -> None:
    end = data.draw(st.integers(0, len(text)))
    model = MODELS[encoding]
    counted = count_prefix(text, count_tokens(text, model), end, model)
    assert counted == _exact(encoding, text[:end])


def test_a_joined_count_tokenizes_only_around_the_junction() -> None:
    left = _prose(50_000, seed=3, newlines=True) + "fine:"
    right = "\n\n## Kept facts\n" + _prose(50_000, seed=4, newlines=True)
    encode = get_encoding("o200k_base").encode_ordinary
    counts = bounded_count(encode, left), bounded_count(encode, right)
    spied, sizes = _spy("o200k_base")
    assert joined_count(spied, left, counts[0], right, counts[1]) == _exact(
        "o200k_base", left + right
    )
    assert 0 < sum(sizes) <= 4 * token_bounds.JOIN_WINDOW


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("newlines", [True, False], ids=["text", "one-line"])
def test_megabytes_of_text_count_exactly(encoding: str, newlines: bool) -> None:
    text = _prose(3 * 2**20, seed=7, newlines=newlines)
    assert len(text) > 40 * SEGMENT_CHARS and is_exact(text)
    spied, sizes = _spy(encoding)
    assert bounded_count(spied, text) == _exact(encoding, text)
    assert max(sizes) <= SEGMENT_CHARS + RUN_LIMIT
    model = MODELS[encoding]
    assert count_tokens(text, model) == _exact(encoding, text)
    assert tokenizer_for(model).count(text) == _exact(encoding, text)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("unit", ["ab", " ", "\n", "=", "é"], ids=repr)
def test_an_enormous_pretoken_is_bounded_by_its_bytes(encoding: str, unit: str) -> None:
    text = unit * (600_000 // len(unit))  # tiktoken itself fails on a million spaces
    spied, sizes = _spy(encoding)
    counted = bounded_count(spied, text)
    assert counted == utf8_bytes(text)
    assert counted >= _exact(encoding, text)  # never an under-count
    assert sizes == []  # not one byte of it merged


def test_a_24_mb_pretoken_is_counted_without_merging_it() -> None:
    text = "ab" * (12 * 2**20)
    spied, sizes = _spy("o200k_base")
    assert bounded_count(spied, text) == len(text)
    assert sizes == []
    assert count_tokens(text) == len(text)


@pytest.mark.parametrize("unit", [" ", "\t", "\u3000"], ids=repr)
def test_a_million_spaces_count_where_tiktoken_gives_up(unit: str) -> None:
    text = "x" + unit * 2_000_000 + "x"
    with pytest.raises(ValueError, match="backtracking"):  # what the old count ran into
        get_encoding("o200k_base").encode(text, disallowed_special=())
    assert count_tokens(text) == utf8_bytes(text)
    assert cut_to_tokens(text, 10)[1]


def test_text_around_an_enormous_pretoken_stays_exact() -> None:
    head = _prose(300_000, seed=1, newlines=True)
    tail = _prose(300_000, seed=2, newlines=False)
    run = "ab" * 400_000
    text = f"{head} {run} {tail}"
    spied, sizes = _spy("o200k_base")
    counted = bounded_count(spied, text)
    expected = _exact("o200k_base", f"{head} ") + len(run) + _exact("o200k_base", f" {tail}")
    assert counted == expected
    assert max(sizes) <= SEGMENT_CHARS + RUN_LIMIT
    assert counted >= _exact("o200k_base", text)


def test_a_stretch_just_within_the_limit_is_merged_exactly() -> None:
    text = "ab" * (RUN_LIMIT // 2)
    assert is_exact(text)
    assert count_tokens(text) == _exact("o200k_base", text)


# --- cuts ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("tiny_limits")
@pytest.mark.parametrize("encoding", ENCODINGS)
@settings(deadline=None, max_examples=300)
@given(text=texts, max_tokens=st.integers(-1, 40))
def test_cut_prefix_is_the_old_cut_or_within_the_bound(
    encoding: str, text: str, max_tokens: int
) -> None:
    enc = get_encoding(encoding)
    cut, was_cut = cut_prefix(enc, text, max_tokens)
    assert text.startswith(cut)
    assert _exact(encoding, cut) <= max(max_tokens, 0)
    if is_exact(text):
        assert (cut, was_cut) == _old_cut(encoding, text, max_tokens)
    elif not was_cut:
        assert cut == text


@pytest.mark.parametrize("max_tokens", [0, 1, 600, 50_000])
def test_cut_of_megabytes_is_the_old_cut(max_tokens: int) -> None:
    text = _prose(2 * 2**20, seed=3, newlines=False)
    assert cut_to_tokens(text, max_tokens) == _old_cut("o200k_base", text, max_tokens)


@pytest.mark.parametrize("max_tokens", [0, 7, 600, 100_000])
def test_cut_inside_an_enormous_pretoken_is_bounded(
    max_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "Fix this: " + "ab" * (4 * 2**20)
    sizes: list[int] = []
    enc = get_encoding("o200k_base")
    real = enc.encode_ordinary

    def spied(piece: str) -> list[int]:
        sizes.append(len(piece))
        return real(piece)

    monkeypatch.setattr(enc, "encode_ordinary", spied)
    cut, was_cut = cut_to_tokens(text, max_tokens)
    monkeypatch.undo()
    assert was_cut and text.startswith(cut)
    assert _exact("o200k_base", cut) <= max_tokens
    assert max(sizes) <= SEGMENT_CHARS + RUN_LIMIT


# --- the codecs' accounting ---------------------------------------------------------------


def test_tally_counts_an_enormous_line_within_bounds() -> None:
    line = "ab" * (3 * 2**20)
    tally = TokenTally()
    assert tally.count([line, "\n", "done\n"]) == len(line) + count_tokens("\ndone\n")


def _lines(text: str) -> Iterator[str]:
    yield from text.splitlines(keepends=True)


def test_tally_stays_exact_on_ordinary_megabytes() -> None:
    text = _prose(2 * 2**20, seed=4, newlines=True)
    assert TokenTally().count(list(_lines(text))) == _exact("o200k_base", text)


# --- the LLM's answer ---------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["prose", "abab"])
def test_a_huge_llm_answer_is_fitted_in_bounded_work(
    answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.summarize.llm import fit_tokens

    text = _prose(8 * 2**20, seed=5, newlines=True) if answer == "prose" else "ab" * (4 * 2**20)
    enc = get_encoding("o200k_base")
    sizes: list[int] = []
    for name in ("encode", "encode_ordinary"):
        real = getattr(enc, name)

        def spied(piece: str, *args: Any, real: Any = real, **kwargs: Any) -> Any:
            sizes.append(len(piece))
            return real(piece, *args, **kwargs)

        monkeypatch.setattr(enc, name, spied)
    cut, was_cut = fit_tokens(text, 600, None)
    monkeypatch.undo()
    assert max(sizes) <= SEGMENT_CHARS + RUN_LIMIT  # the answer was never tokenized whole
    assert was_cut and text.startswith(cut) and cut == cut.rstrip()
    assert 0 < _exact("o200k_base", cut) <= 600
    if answer == "prose":  # exact: the cut the whole text's tokens give
        ids = get_encoding("o200k_base").encode_ordinary(text)
        assert cut == get_encoding("o200k_base").decode(ids[:600]).rstrip()
