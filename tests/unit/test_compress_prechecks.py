"""The C-level pre-checks that rule text forms out cheaply never rule out a form that applies.

Each pre-check is a necessary condition of the per-line Python check it guards: where it says no,
the full check must say no too, on any text (false alarms only cost the full check).
"""

from __future__ import annotations

import re
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.compress import grep_text, long_text, numbered_text, paths_text
from worker.compress.textform import LineStart, sample_chars, sample_lines

# Every character the detectors treat specially: separators, whitespace of each kind (ASCII,
# Unicode, line-breaking but not "\n"), digits, heading and context markers, ls -l fields.
FRAGMENTS = [
    *("a", "Zq", "é", "漢", "b.py", "src/", "./x", "/abs", "C:\\", "\\", "/", ".", ":", "-"),
    *("--", "## ", "#", "0", "12", "-4-", ":5:", "-0-", ":", "x:1:", "a.py:3:", "a.py-3-"),
    *(" ", "  ", "\t", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\u00a0", "\u2028"),
    *("drwxr-xr-x", "-rw-r--r--.", "----------", " 2 root root 4096 ", "Oct 24  2024 ", "12:30 "),
    *("     7\t", "  12\t", "    12\t", "123456\t", "1234567\t", " 12345\t", "   0\t"),
]
PATH_FRAGMENTS = ["a", "b.py", "src", "/", "\\", ".", "é", "\u00a0", "\x1c", "\x85", " ", ":"]
line = st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join)
path_line = st.lists(st.sampled_from(PATH_FRAGMENTS), min_size=1, max_size=6).map("".join)
ls_row = st.builds(
    "{} {:>2} {} root {:>5} {} {}".format,
    st.sampled_from(["drwxr-xr-x", "-rw-r--r--.", "lrwxrwxrwx", "----------", "drwxr-xr-"]),
    st.integers(0, 99),
    st.sampled_from(["root", "a b", "\t", ""]),
    st.integers(0, 10**6),
    st.sampled_from(["Oct 24  2024", "Jan  1 12:30", "Oct 24 2024", "oct 24  2024"]),
    line,
)
any_line = st.one_of(line, path_line, ls_row)
# Runs of lines that share a prefix, so that the grouping forms really apply now and then.
name = st.sampled_from(["x", "y.py", "/z", "\\z", "", ":1:x", "-2-y"])
shared_prefix = st.tuples(
    st.one_of(line, path_line), st.lists(st.one_of(any_line, name), min_size=1, max_size=4)
)
# Runs of paths in one directory (some with whitespace or nothing after the separator).
directory_run = st.tuples(
    st.sampled_from(["a/", "a/b/", "C:\\x\\", "./", "/", "é/", "a b/", "a\u00a0/", "a\\", ""]),
    st.lists(st.sampled_from(["x", "y.py", "", "z/", "é", "x y", "q\x1c", "r\x85"]), max_size=3),
)
text = st.one_of(
    st.lists(any_line, max_size=16).map("\n".join),
    st.lists(directory_run, max_size=5).map(
        lambda runs: "\n".join(folder + entry for folder, entries in runs for entry in entries)
    ),
    st.lists(st.one_of(ls_row, line), min_size=4, max_size=8).map("\n".join),
    st.lists(shared_prefix, max_size=4).map(
        lambda runs: "\n".join(prefix + rest for prefix, rests in runs for rest in rests)
    ),
)


def test_regex_whitespace_is_str_isspace() -> None:
    r"""The pre-checks say "\s" where the full checks say str.isspace() (or list ASCII
    whitespace): the two must agree on every character."""
    space = re.compile(r"\s")
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        assert (space.match(char) is not None) == char.isspace(), hex(code)


@settings(deadline=None, max_examples=400)
@given(text=text, end=st.integers(0, 200) | st.none())
def test_line_start_finds_what_a_multiline_search_finds(text: str, end: int | None) -> None:
    for pattern in (r"[0-9]+\t", r"(?!\s)[^:\n]*:", r"a[^\n]*+\nb"):
        limit = len(text) if end is None else end
        expected = re.compile(f"(?m)^(?:{pattern})").search(text, 0, limit) is not None
        assert LineStart(pattern).found_in(text, end) == expected


@settings(deadline=None, max_examples=400)
@given(text=text)
def test_grep_pre_check_never_rules_out_a_path_line(text: str) -> None:
    sample = text.split("\n")
    paths = grep_text._Paths(sample)
    for index, one in enumerate(sample):
        if paths.starting(index) is not None:
            assert grep_text._PATH_LED_LINE.match(one) is not None
    if grep_text._shares_a_path(text):
        assert grep_text.may_apply(text)


@settings(deadline=None, max_examples=400)
@given(text=text)
def test_paths_pre_check_never_rules_out_a_directory_pair(text: str) -> None:
    if paths_text._shares_a_directory(text):
        assert paths_text.may_apply(text)


@settings(deadline=None, max_examples=400)
@given(text=text)
def test_long_listing_pre_check_never_rules_out_a_row(text: str) -> None:
    for one in text.split("\n"):
        if long_text._RAW_ROW.fullmatch(one) is not None:
            assert long_text._RAW_ROW_HEAD.found_in(one)
    sample_rows = sum(long_text._RAW_ROW.fullmatch(one) is not None for one in sample_lines(text))
    if sample_rows:
        assert long_text._RAW_ROW_HEAD.found_in(text, sample_chars())


@settings(deadline=None, max_examples=400)
@given(text=text)
def test_numbered_pre_check_finds_exactly_the_lines_that_lose_padding(text: str) -> None:
    def loses_padding(one: str) -> bool:
        number = numbered_text._PADDED.match(one)
        return (
            number is not None
            and number.end(1) > 0
            and number.group(2).rjust(numbered_text._WIDTH) == one[: number.end(2)]
        )

    padded = any(map(loses_padding, text.split("\n")))
    assert numbered_text._SIX_COLUMNS_PADDED.found_in(text) == padded
