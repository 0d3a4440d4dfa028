"""Plain-text codecs: exact round trips over adversarial text, and real savings on real shapes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.compress import (
    compress_with_stats,
    decompress_tool_result,
    envelope,
    grep_text,
    long_text,
    ls_text,
    numbered_text,
    paths_text,
    rle_text,
    tree_text,
)
from worker.compress.tally import TokenTally
from worker.compress.text import TEXT_FORMS, best_form, escape, expand
from worker.compress.textform import VERBATIM_HEADER, TextForm
from worker.errors import CompressionError
from worker.tokens import count_tokens

# --- strategies: text shaped like each codec's input, with every awkward character mixed in ---

AWKWARD = [
    *" \t\r:-/\\#[]x0123456789abZé漢\u2028\x0b",
    *("## ", "--", " [x2]", " [x1]", "[x3]\r", "  12\t", "C:\\", "0e1", "05", "1.10"),
]
free_text = st.lists(st.sampled_from(AWKWARD), max_size=8).map("".join)
segment = st.text(alphabet="ab_.-:09 é漢", min_size=1, max_size=6)
posix_path = st.lists(segment, min_size=1, max_size=4).map("/".join)
windows_path = st.lists(segment, min_size=1, max_size=3).map(lambda s: "C:\\" + "\\".join(s))
path = st.one_of(posix_path, windows_path, st.sampled_from(["./a.py", "/abs/x.py", "a:b/c.py"]))
number = st.one_of(st.integers(0, 10**7).map(str), st.sampled_from(["0", "05", "0e1", "1.10"]))


def text_of(line: st.SearchStrategy[str], *, max_lines: int = 20) -> st.SearchStrategy[str]:
    return st.lists(line, max_size=max_lines).map("\n".join)


def runs_of(
    prefix: st.SearchStrategy[str], rest: st.SearchStrategy[str]
) -> st.SearchStrategy[list[str]]:
    """Lines in runs sharing a prefix, so that grouping codecs actually group."""
    run = st.tuples(prefix, st.lists(rest, min_size=1, max_size=5))
    return st.lists(run, max_size=5).map(lambda runs: [p + r for p, rs in runs for r in rs])


grep_rest = st.one_of(
    st.builds(lambda n, t: f":{n}:{t}", number, free_text),
    st.builds(lambda n, t: f"-{n}-{t}", number, free_text),
    st.builds(lambda t: f":{t}", free_text),
    st.builds(lambda t: f"-{t}", free_text),
    st.sampled_from(["", ":", "-", "--", ":--", "-1-", ":12-x"]),
)
grep_like = st.lists(
    st.one_of(runs_of(path, grep_rest), text_of(free_text, max_lines=3).map(lambda t: [t]))
).map(lambda chunks: "\n".join(line for chunk in chunks for line in chunk))
path_like = st.lists(
    st.one_of(runs_of(path.map(lambda p: p + "/"), segment), free_text.map(lambda t: [t]))
).map(lambda chunks: "\n".join(line for chunk in chunks for line in chunk))
repeated_lines = st.lists(st.tuples(free_text, st.integers(1, 6))).map(
    lambda runs: "\n".join(line for text, copies in runs for line in [text] * copies)
)
numbered = text_of(
    st.one_of(
        st.builds(lambda n, t: f"{n:>6}\t{t}", st.integers(0, 10**7), free_text),
        st.builds(lambda n, t: f"{n}\t{t}", st.integers(0, 999), free_text),
        free_text,
    )
)
listing = text_of(
    st.one_of(segment.filter(lambda s: " " not in s), st.just(""), free_text), max_lines=30
)
anything = st.one_of(grep_like, path_like, repeated_lines, numbered, listing, free_text)


def assert_round_trip(form: TextForm, text: str) -> bool:
    encoded = form.encode(text)
    if encoded is None:
        return False
    assert form.decode(encoded.payload, None) == text
    assert "".join(encoded.original_pieces) == text
    assert "".join(encoded.payload_pieces) == encoded.payload
    assert expand(form.header + encoded.payload) == text
    return True


@pytest.mark.parametrize("form", TEXT_FORMS, ids=lambda form: form.name)
@settings(deadline=None, max_examples=60)
@given(text=anything)
def test_every_form_round_trips_any_text(form: TextForm, text: str) -> None:
    form.applies(text)
    assert_round_trip(form, text)


@settings(deadline=None, max_examples=100)
@given(text=grep_like)
def test_grep_by_file_round_trips(text: str) -> None:
    assert_round_trip(grep_text.FORM, text)


@settings(deadline=None, max_examples=100)
@given(text=path_like)
def test_paths_by_dir_round_trips(text: str) -> None:
    assert_round_trip(paths_text.FORM, text)


@settings(deadline=None, max_examples=100)
@given(text=listing)
def test_listing_packed_round_trips(text: str) -> None:
    assert_round_trip(ls_text.FORM, text)
    assert_round_trip(ls_text.FORM_WITH_VERBATIM, text)


@settings(deadline=None, max_examples=100)
@given(text=repeated_lines)
def test_repeated_lines_round_trip(text: str) -> None:
    assert_round_trip(rle_text.FORM, text)


@settings(deadline=None, max_examples=100)
@given(text=numbered)
def test_numbered_lines_round_trip(text: str) -> None:
    assert_round_trip(numbered_text.FORM, text)


@settings(deadline=None, max_examples=100)
@given(text=anything, wrapped=st.booleans(), form=st.sampled_from(TEXT_FORMS))
def test_whole_outputs_round_trip_even_when_they_look_compressed(
    text: str, wrapped: bool, form: TextForm
) -> None:
    raw = form.header + text if len(text) % 3 == 0 else text
    if wrapped:
        raw = f"<returncode>0</returncode>\n<output>\n{raw}</output>"
    outcome = compress_with_stats("bash", raw, min_tokens=0, min_saving=-1.0)
    assert decompress_tool_result("bash", outcome.output) == raw
    if outcome.compressed:
        assert outcome.tokens_before == count_tokens(raw)
        assert outcome.tokens_after == count_tokens(outcome.output)


@settings(deadline=None, max_examples=100)
@given(text=anything)
def test_escape_makes_any_text_read_back_as_itself(text: str) -> None:
    for raw in (text, VERBATIM_HEADER + text, TEXT_FORMS[0].header + text):
        escaped = escape(raw)
        assert (expand(escaped) if escaped is not raw else raw) == raw


def test_headers_are_distinct_lines_none_a_prefix_of_another() -> None:
    headers = [VERBATIM_HEADER] + [form.header for form in TEXT_FORMS]
    assert all(h.startswith("[") and h.endswith("]\n") and h.count("\n") == 1 for h in headers)
    for a in headers:
        assert [b for b in headers if b.startswith(a)] == [a]


# --- real shapes: the saving each form is for, measured with the real tokenizer ---

CODE = [
    "    def __init__(self, model=None, *, cache_size=200_000):",
    "        self._cache = OrderedDict()",
    "        return len(self._encoding.encode(text, disallowed_special=()))",
    "    raise TokenizerUnavailable(f'no shipped rank file for {name}: {exc}') from exc",
    "from worker.errors import CompressionError",
]


def grep_output(*, numbered: bool) -> str:
    files = [f"src/worker/compress/module_{n}.py" for n in range(4)]
    return "".join(
        f"{path}:{10 * i + 3}:{CODE[i % 5]}\n" if numbered else f"{path}:{CODE[i % 5]}\n"
        for path in files
        for i in range(8)
    )


def saving(raw: str, *, min_saving: float = 0.15) -> float:
    outcome = compress_with_stats("bash", raw, min_saving=min_saving)
    assert decompress_tool_result("bash", outcome.output) == raw
    assert outcome.tokens_before == count_tokens(raw)
    assert outcome.tokens_after == count_tokens(outcome.output)
    return 1 - outcome.tokens_after / outcome.tokens_before


def test_grep_by_file_saves_a_fifth_of_numbered_grep_output() -> None:
    raw = grep_output(numbered=True)
    assert compress_with_stats("bash", raw).codec == "grep-by-file"
    assert saving(raw) >= 0.20


def test_grep_by_file_saves_on_unnumbered_grep_output() -> None:
    assert saving(grep_output(numbered=False)) >= 0.20


def test_grep_by_file_keeps_context_separators_and_messages_in_place() -> None:
    raw = (
        "grep: pkg/__pycache__/x.cpython-311.pyc: binary file matches\n"
        + "".join(f"pkg/module.py-{n}-    context line {n}\n" for n in range(1, 4))
        + "pkg/module.py:4:    def match(self):\n--\n"
        + "".join(f"pkg/module.py:{n}:    return {n}\n" for n in range(9, 15))
    )
    compressed = grep_text.encode(raw)
    assert compressed is not None
    assert "## pkg/module.py\n1-    context line 1\n" in compressed.payload
    assert "\n--\n9:    return 9\n" in compressed.payload
    assert grep_text.decode(compressed.payload) == raw


def test_non_contiguous_matches_of_one_file_get_a_heading_each() -> None:
    raw = "a/x.py:1:one\na/x.py:2:two\nb/y.py:1:three\nb/y.py:2:four\na/x.py:9:five\na/x.py:10:six"
    compressed = grep_text.encode(raw)
    assert compressed is not None
    assert compressed.payload.count("## a/x.py") == 2
    assert grep_text.decode(compressed.payload) == raw


def test_paths_by_dir_saves_a_quarter_of_a_find_listing() -> None:
    base = "./lib/matplotlib/tests/baseline_images"
    raw = "".join(
        f"{base}/test_{suite}/{name}_{n}.png\n"
        for suite in ("axes", "colorbar", "patches", "contour")
        for name in ("plot", "hatch")
        for n in range(6)
    )
    assert compress_with_stats("bash", raw).codec == "paths-by-dir"
    assert saving(raw) >= 0.25


def test_listing_packed_saves_on_an_ls_listing() -> None:
    stems = ("__init__", "admin", "apps", "checks", "forms", "models", "urls", "views", "tests")
    names = [f"{stem}.py" for stem in stems] + ["migrations", "templates", "locale"]
    dirs = ("auth", "admin", "sites", "sessions", "messages", "redirects", "flatpages")
    raw = "".join(f"./django/contrib/{d}:\n" + "\n".join(names) + "\n\n" for d in dirs)
    assert compress_with_stats("bash", raw).codec == "listing-packed"
    assert saving(raw) >= 0.15


def test_listing_with_a_spaced_name_keeps_it_on_a_verbatim_line() -> None:
    names = "\n".join(f"m{n}.py" for n in range(6))
    raw = f"{names}\nscript (dev).tmpl\n{names}\n\tindented\n{names}\n"
    assert ls_text.encode(raw) is None
    compressed = ls_text.encode_with_verbatim(raw)
    assert compressed is not None
    packed = names.replace("\n", " ")
    assert (
        compressed.payload == f"{packed}\n\tscript (dev).tmpl\n{packed}\n\t\tindented\n{packed}\n"
    )
    assert ls_text.decode_with_verbatim(compressed.payload) == raw


def test_repeated_lines_save_a_fifth_of_a_repetitive_log() -> None:
    lines = []
    for n in range(12):
        lines += ["Cloning test database for alias 'default'..."] * 4
        lines.append(f"test_case_{n} (queries.tests.JoinReuseTest) ... ok")
    raw = "\n".join(lines) + "\n"
    assert compress_with_stats("bash", raw).codec == "repeated-lines"
    assert saving(raw) >= 0.20


def test_repeated_lines_escape_lines_that_look_counted() -> None:
    raw = "done [x3]\ndone [x3]\ndone [x3]\nonce [x2]\r\nplain"
    compressed = rle_text.encode(raw)
    assert compressed is not None
    assert compressed.payload == "done [x3] [x3]\nonce [x2] [x1]\r\nplain"
    assert rle_text.decode(compressed.payload) == raw


def test_numbered_lines_drop_only_the_padding() -> None:
    raw = "".join(f"{n:>6}\t{CODE[n % 5]}\n" for n in range(1480, 1520))
    compressed = numbered_text.encode(raw)
    assert compressed is not None
    assert compressed.payload.startswith(f"1480\t{CODE[0]}\n1481\t")
    # Two padding spaces cost two tokens a line: about a tenth of a line of code.
    assert saving(raw, min_saving=0.0) >= 0.10


def test_plain_prose_gets_no_candidate() -> None:
    prose = "The quick brown fox jumps over the lazy dog. " * 40
    assert best_form(prose, TokenTally()) is None


def test_wrapper_is_kept_byte_for_byte_around_the_body() -> None:
    body = grep_output(numbered=True)
    raw = f"<returncode>0</returncode>\n<output>\n{body}</output>"
    outcome = compress_with_stats("bash", raw)
    assert outcome.codec == "grep-by-file"
    assert outcome.output.startswith("<returncode>0</returncode>\n<output>\n[grep output")
    assert outcome.output.endswith("</output>")
    assert decompress_tool_result("bash", outcome.output) == raw


def test_truncated_wrapper_compresses_head_and_tail_apart() -> None:
    head = grep_output(numbered=True)
    raw = (
        "<returncode>0</returncode>\n<warning>\nThe output was too long.\n</warning>"
        f"<output_head>\n{head}</output_head>\n<elided_chars>\n1234 characters elided\n"
        f"</elided_chars>\n<output_tail>\n{head}</output_tail>"
    )
    parts = envelope.split(raw)
    assert parts is not None and parts[1] == head and parts[3] == head
    outcome = compress_with_stats("bash", raw)
    assert outcome.output.count("[grep output") == 2
    assert decompress_tool_result("bash", outcome.output) == raw


# --- listing-tree ---

tree_name = st.text(alphabet="ab_.-:9é", min_size=1, max_size=4)
tree_heading = st.lists(tree_name, min_size=1, max_size=4).map(lambda names: "/".join(names) + ":")
tree_block = st.tuples(
    st.one_of(tree_heading, st.just(""), tree_name),
    st.lists(st.one_of(tree_name, st.just(""), st.just(":")), max_size=4),
).map(lambda block: "\n".join([block[0], *block[1]]))
ls_recursive = st.lists(tree_block, max_size=8).map("\n\n".join)


@settings(deadline=None, max_examples=300)
@given(text=ls_recursive)
def test_listing_tree_round_trips(text: str) -> None:
    assert_round_trip(tree_text.FORM, text)


def ls_recursive_output() -> str:
    """A small ``ls -R`` of a Django-like tree: nested directories, names repeated in each."""
    files = ["__init__.py", "apps.py", "models.py", "views.py", "urls.py", "tests.py"]
    apps = ("admin", "auth", "flatpages", "messages", "redirects", "sessions", "sites")
    blocks = [
        ".:\ndjango\nsetup.py",
        "./django:\ncontrib\ncore",
        "./django/contrib:\n" + "\n".join(apps),
    ]
    for app in apps:
        blocks.append(f"./django/contrib/{app}:\n" + "\n".join([*files, "migrations"]))
        blocks.append(f"./django/contrib/{app}/migrations:\n0001_initial.py\n__init__.py")
    blocks.append("./django/core:\n__init__.py\nmail\n\n./django/core/mail:\n__init__.py\n")
    return "\n\n".join(blocks)


def test_listing_tree_indents_subdirectories_by_name() -> None:
    raw = ls_recursive_output()
    encoded = tree_text.encode(raw)
    assert encoded is not None
    lines = encoded.payload.split("\n")
    assert lines[:3] == [
        ".: django setup.py",
        " django: contrib core",
        "  contrib: admin auth flatpages messages redirects sessions sites",
    ]
    assert lines[3].startswith("   admin: __init__.py apps.py")
    assert lines[4] == "    migrations: 0001_initial.py __init__.py"
    assert lines[-1] == "   mail: __init__.py "  # the final newline is an empty last entry
    assert tree_text.decode(encoded.payload) == raw
    outcome = compress_with_stats("bash", raw)
    assert outcome.codec == "listing-tree"
    packed = ls_text.encode(raw)
    assert packed is not None
    assert outcome.tokens_after < count_tokens(ls_text.HEADER + packed.payload)
    assert saving(raw) >= 0.2


def test_listing_tree_leaves_spaced_names_and_flat_listings_to_other_forms() -> None:
    assert tree_text.encode("./a:\nmy file.txt\n\n./a/b:\nx") is None
    assert tree_text.encode("./a:\nx\n\n./b:\ny") is None  # nothing nested under an earlier one
    assert tree_text.encode("./a:\nx\n\n\ny") is None  # a block whose first line is blank
    assert tree_text.encode("./a:\nx\n\n./a/b:\n" + "y\n" * tree_text.MAX_CHARS) is None


@pytest.mark.parametrize("payload", [" a: x", "a: x\n  b: y", "a:\n x"])
def test_listing_tree_refuses_indentation_without_a_heading_above(payload: str) -> None:
    with pytest.raises(CompressionError):
        tree_text.decode(payload)


# --- long-listing ---

long_row = st.builds(
    lambda mode, links, owner, group, size, date, name: (
        mode,
        links,
        owner,
        group,
        size,
        date,
        name,
    ),
    st.sampled_from(["drwxr-xr-x", "-rw-r--r--", "lrwxrwxrwx", "-rwxr-xr-x.", "drwxrwxrwt+"]),
    st.integers(1, 120).map(str),
    st.sampled_from(["root", "1000", "www-data", "é"]),
    st.sampled_from(["root", "staff", "1000"]),
    st.integers(0, 10**7).map(str),
    st.sampled_from(["Oct 24  2024", "Nov 19 00:06", "Jan  2 09:15", "Oct 24 2024"]),
    st.one_of(tree_name, st.sampled_from(["a b", "x -> /y", "Oct 24  2024 z", "5 q", " lead"])),
)


def ls_long(rows: list[tuple[str, ...]], *, align: bool) -> str:
    """Rows as ``ls -l`` pads them (each column to its widest), or padded at random."""
    widths = [max((len(row[column]) for row in rows), default=0) for column in range(5)]
    if not align:
        widths = [width + column % 2 for column, width in enumerate(widths)]
    return "\n".join(
        f"{r[0]:<{widths[0]}} {r[1]:>{widths[1]}} {r[2]:<{widths[2]}} {r[3]:<{widths[3]}} "
        f"{r[4]:>{widths[4]}} {r[5]} {r[6]}"
        for r in rows
    )


ls_long_like = st.lists(
    st.one_of(
        st.builds(ls_long, st.lists(long_row, min_size=1, max_size=8), align=st.booleans()),
        st.sampled_from(["total 688", "", "./docs:", "ls: cannot access 'x'"]),
        free_text,
    ),
    max_size=6,
).map("\n".join)


@settings(deadline=None, max_examples=300)
@given(text=ls_long_like)
def test_long_listing_round_trips(text: str) -> None:
    assert_round_trip(long_text.FORM, text)


@settings(deadline=None, max_examples=200)
@given(payload=st.one_of(ls_long_like, anything).map(lambda t: "root root Oct 24 2024\n" + t))
def test_long_listing_expands_any_payload_with_its_first_line(payload: str) -> None:
    assert isinstance(long_text.decode(payload), str)


def test_long_listing_refuses_a_payload_without_its_first_line() -> None:
    with pytest.raises(CompressionError):
        long_text.decode("root root\n-rw-r--r-- 1 5 x")


def test_long_listing_says_the_common_owner_and_date_once() -> None:
    names = ["README.rst", "setup.py", "tox.ini", "docs", "src", "tests", ".gitignore"]
    rows = [
        ("drwxrwxrwx", "1", "root", "root", "4096", "Oct 24  2024", "."),
        ("drwxr-xr-x", "1", "root", "root", "4096", "Nov 19 00:06", ".."),
        *(("-rw-r--r--", "1", "root", "root", str(40 * n**3), "Oct 24  2024", name)
          for n, name in enumerate(names)),
        ("-rw-r--r--", "12", "alice", "staff", "7", "Oct 24  2024", "notes -> /tmp/notes"),
    ]  # fmt: skip
    raw = "total 688\n" + ls_long(rows, align=True) + "\n"
    encoded = long_text.encode(raw)
    assert encoded is not None
    lines = encoded.payload.split("\n")
    assert lines[:4] == [
        "root root Oct 24 2024",
        "total 688",
        "drwxrwxrwx 1 4096 .",
        "drwxr-xr-x 1 4096 Nov 19 00:06 ..",
    ]
    assert lines[-2] == "-rw-r--r-- 12 alice staff 7 notes -> /tmp/notes"
    assert long_text.decode(encoded.payload) == raw
    assert saving(raw * 3) >= 0.3


def test_long_listing_declines_padding_it_cannot_restore() -> None:
    rows = [("-rw-r--r--", "1", "root", "root", str(n), "Oct 24  2024", f"f{n}") for n in range(6)]
    assert long_text.encode(ls_long(rows, align=True)) is not None
    assert long_text.encode(ls_long(rows, align=False)) is None


def test_paths_by_dir_keeps_mixed_separators_apart() -> None:
    raw = "a/b/x\na/b\\y\na/b/z\na/b\\w\na/b\\v"
    encoded = paths_text.encode(raw)
    assert encoded is not None
    assert encoded.payload == "a/b/x\na/b\\y\na/b/z\na/b\\ w v"  # only same-separator runs
    assert paths_text.decode(encoded.payload) == raw


def test_paths_by_dir_looks_for_every_ascii_whitespace_character() -> None:
    # Lines are scanned for these with str.find when the text is ASCII; the pattern decides
    # otherwise, and both must agree on what is whitespace.
    matched = {chr(c) for c in range(128) if paths_text._INLINE_WHITESPACE.match(chr(c))}
    assert set(paths_text._ASCII_WHITESPACE) == matched
    for char in matched:
        encoded = paths_text.encode(f"a/x{char}y\na/b\na/c")
        assert encoded is not None
        assert encoded.payload == f"a/x{char}y\na/ b c"  # the line with whitespace stays apart
