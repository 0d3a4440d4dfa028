"""The encodings a secret may be written in (:data:`DECODERS`): JSON string escapes,
percent-encoding and base64 of a plausible length, each decoded to be redacted and written back
as it was written."""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote, unquote

from worker.core.redaction.patterns import PLACEHOLDER

# --- secrets written encoded ------------------------------------------------------------------


@dataclass(frozen=True)
class Decoder:
    """One encoding a secret may be written in. ``run`` finds a run of encoded text (only where
    one starts: linear), ``needle`` must be in the text for it to be looked for at all,
    ``decode`` gives the run's text (None: nothing encoded in it, or not text: left alone) and
    ``encode`` writes redacted text back as the run wrote it (None: the run is replaced by the
    placeholders of what it held)."""

    name: str
    needle: str
    run: re.Pattern[str]
    decode: Callable[[str], str | None]
    encode: Callable[[str, str], str] | None  # (redacted text, the run it came from)
    # Searched for where the needle is, before ``run`` (slower: it is tried where any run of
    # its characters starts) is: a ``%`` with no two hex digits after it encodes nothing.
    gate: re.Pattern[str] | None = None
    # Finds ``run``'s matches faster than ``run.finditer`` (the same matches), when given.
    find: Callable[[str], Iterator[re.Match[str]]] | None = None

    def runs(self, text: str) -> Iterator[re.Match[str]]:
        return self.find(text) if self.find is not None else self.run.finditer(text)


_JSON_PLAIN = r"[A-Za-z0-9_.+/=:-]"
_JSON_ESCAPE = r"\\{1,2}u[0-9A-Fa-f]{4}"
_JSON_ESCAPES = re.compile(_JSON_ESCAPE)
_JSON_UNESCAPED = re.compile(_JSON_PLAIN)
_URL_PLAIN = "A-Za-z0-9_.~+/=:-"  # a character class's ranges
_URL_SAFE_SYMBOLS = "_.~+/=:-"  # what quote() keeps besides letters and digits


def _json_string(run: str) -> str | None:
    """A JSON string literal's value, when it holds a ``\\u`` escape (its other escapes and
    what is around the secret decoded too: ``Bearer \\u0061…``)."""
    if "\\u" not in run:
        return None
    try:
        value = json.loads(run, strict=False)
    except ValueError:  # not JSON after all (quotes in prose): its \\u escapes alone
        return _json_escapes(run)
    return value if isinstance(value, str) else None


def _json_escapes(run: str) -> str:
    def char(escape: re.Match[str]) -> str:
        return chr(int(escape.group(0)[-4:], 16))

    decoded = _JSON_ESCAPES.sub(char, run)
    # A pair of escaped surrogates is one character (an emoji written \\ud83d\\ude00).
    return decoded.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _json_string_encoded(text: str, _run: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _json_escaped(text: str, run: str) -> str:
    """``text`` with each character a JSON run may not hold bare escaped, as many backslashes
    before each ``u`` as the run had, its placeholders as they are."""
    slashes = "\\\\" if "\\\\u" in run else "\\"

    def escaped(c: str) -> str:
        units = c.encode("utf-16-be", "surrogatepass")
        return "".join(
            f"{slashes}u{int.from_bytes(units[k : k + 2], 'big'):04x}"
            for k in range(0, len(units), 2)
        )

    def piece(part: str) -> str:
        return "".join(c if _JSON_UNESCAPED.fullmatch(c) else escaped(c) for c in part)

    return _around_placeholders(text, piece)


def _url_encoded(text: str, _run: str) -> str:
    return _around_placeholders(text, lambda part: quote(part, safe=_URL_SAFE_SYMBOLS))


def _around_placeholders(text: str, encode: Callable[[str], str]) -> str:
    """``text`` encoded but its placeholders, kept readable (they are never a secret's shape)."""
    pieces = PLACEHOLDER.split(text)
    marks = PLACEHOLDER.findall(text)
    out = [encode(pieces[0])]
    for mark, piece in zip(marks, pieces[1:], strict=True):
        out += [mark, encode(piece)]
    return "".join(out)


# Base64 of text, long enough to hold a secret (18+ bytes) and short enough to be one (a file
# or an image is longer, and is never decoded).
_BASE64_MAX = 8192
_PRINTABLE = bytes(range(32, 127)) + b"\t\n\r"
_URL_SAFE = str.maketrans("-_", "+/")


def _base64_decoded(run: str) -> str | None:
    """The ASCII text ``run`` (standard or URL-safe base64) encodes, if it encodes text."""
    if run.islower() or run.isupper() or len(run) > _BASE64_MAX:
        return None  # paths, words and hex: base64 of text has both cases
    body = run.rstrip("=").translate(_URL_SAFE)
    if len(body) % 4 == 1:
        return None
    try:
        data = binascii.a2b_base64(body + "=" * (-len(body) % 4), strict_mode=True)
    except binascii.Error:
        return None
    if not data or data.translate(None, _PRINTABLE):
        return None  # bytes that are not text: a hash, an image, a key's DER
    return data.decode("ascii")


_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{24,}+={0,2}(?![A-Za-z0-9+/=_-])")
# Each character of a base64 run marked "a", every other ASCII character " ": a run long
# enough to be decoded is then found by str.find, five times faster than the regex tries each
# run start of ordinary text (paths and names are runs too), and only such runs are matched.
_BASE64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-"
_BASE64_MARKS = str.maketrans(
    {chr(c): "a" if chr(c) in _BASE64_ALPHABET else " " for c in range(128)}
)
_LONG_RUN = "a" * 24
_NOT_MARKED = re.compile("[^a]")


def _base64_runs(text: str) -> Iterator[re.Match[str]]:
    """``_BASE64_RUN``'s matches in ``text``, in order."""
    if len(text) < len(_LONG_RUN):
        return
    marked = text.translate(_BASE64_MARKS)
    start = marked.find(_LONG_RUN)
    while start >= 0:
        after = _NOT_MARKED.search(marked, start)
        end = after.start() if after is not None else len(marked)
        # The characters around [start, end) are no base64 characters: the regex's look-arounds
        # see what they would in the whole text.
        yield from _BASE64_RUN.finditer(text, start, end)
        start = marked.find(_LONG_RUN, end)


DECODERS: tuple[Decoder, ...] = (
    Decoder(
        "json_string",
        "\\u",
        # A JSON string literal (an opening quote not escaped, then to its closing quote: a
        # start that finds none leaves no later bare quote to start from).
        # Only one holding a \\u escape is matched: one without fails at its closing quote.
        re.compile(r'(?<!\\)"(?:[^"\\]|\\[^u])*+\\u(?:[^"\\]|\\[\s\S])*+"'),
        _json_string,
        _json_string_encoded,
        _JSON_ESCAPES,
    ),
    Decoder(
        "json_escapes",
        "\\u",
        # Escapes outside a string literal: a run of JSON string characters with at least one
        # \\uXXXX escape (or a doubly escaped one), starting where such a run starts.
        re.compile(
            rf"(?<![A-Za-z0-9_.+/=:\\-])(?:{_JSON_PLAIN}|{_JSON_ESCAPE})*?{_JSON_ESCAPE}"
            rf"(?:{_JSON_PLAIN}|{_JSON_ESCAPE})*+"
        ),
        _json_escapes,
        _json_escaped,
        _JSON_ESCAPES,
    ),
    Decoder(
        "percent_encoding",
        "%",
        re.compile(
            rf"(?<![%{_URL_PLAIN}])(?:[{_URL_PLAIN}]|%[0-9A-Fa-f]{{2}})*?%[0-9A-Fa-f]{{2}}"
            rf"(?:[{_URL_PLAIN}]|%[0-9A-Fa-f]{{2}})*+"
        ),
        unquote,
        _url_encoded,
        re.compile(r"%[0-9A-Fa-f]{2}"),
    ),
    Decoder(
        "base64",
        "",
        _BASE64_RUN,
        _base64_decoded,
        None,
        find=_base64_runs,
    ),
)
# Every pattern's needles (lower case) and every decoder's: a decoded run holding none of them
