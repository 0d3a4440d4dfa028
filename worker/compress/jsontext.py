"""JSON text that can be parsed and written back byte for byte.

A string is handled as JSON only when re-serializing its value in one of a few canonical styles
(what ``json.dumps``, ``JSON.stringify`` and ``jq`` print) reproduces it exactly. Anything else,
such as ``1.10``, ``0e1``, duplicate keys or hand-made spacing, stays text. That way a JSON tool
result comes back from decompression with the same bytes, not only the same value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class JsonStyle:
    """How a JSON text was laid out; ``name`` is how a compressed form records it."""

    indent: int | None
    spaced: bool
    ascii: bool
    newline: bool

    @property
    def name(self) -> str:
        if self.indent is not None:
            layout = f"indent{self.indent}"
        else:
            layout = "spaced" if self.spaced else "compact"
        return layout + ("-ascii" if self.ascii else "") + ("-nl" if self.newline else "")

    def dump(self, value: Any) -> str:
        if self.indent is not None:
            separators = (",", ": ")
        else:
            separators = (", ", ": ") if self.spaced else (",", ":")
        text = json.dumps(
            value,
            indent=self.indent,
            separators=separators,
            ensure_ascii=self.ascii,
            allow_nan=True,
        )
        return text + "\n" if self.newline else text


COMPACT = JsonStyle(indent=None, spaced=False, ascii=False, newline=False)
_STYLES_BY_NAME = {
    JsonStyle(indent, spaced, ascii, newline).name: JsonStyle(indent, spaced, ascii, newline)
    for indent in (None, 2, 4)
    for spaced in ((False, True) if indent is None else (False,))
    for ascii in (False, True)
    for newline in (False, True)
}


def style_named(name: str) -> JsonStyle | None:
    return _STYLES_BY_NAME.get(name)


def parse(text: str) -> tuple[Any, JsonStyle] | None:
    """The value of an object or array text and the style that reproduces it exactly."""
    if text[:1] not in ("{", "[") or not text.rstrip("\n").endswith(("}", "]")):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    for style in _candidate_styles(text):
        if style.dump(value) == text:
            return value, style
    return None


def _candidate_styles(text: str) -> list[JsonStyle]:
    newline = text.endswith("\n")
    if text[1:2] == "\n":
        second_line = text[2:12]
        indent = len(second_line) - len(second_line.lstrip(" "))
        indents: tuple[int | None, ...] = (indent,) if indent in (2, 4) else ()
        spacings: tuple[bool, ...] = (False,)
    else:
        indents = (None,)
        head = text[:4096]
        spacings = (True, False) if '": ' in head or ", " in head else (False, True)
    if not text.isascii():
        asciis: tuple[bool, ...] = (False,)
    else:
        # Without "\u" escapes an ASCII text holds only ASCII, and both settings print it alike.
        asciis = (True, False) if "\\u" in text else (True,)
    return [
        JsonStyle(indent, spaced, ascii, newline)
        for indent in indents
        for spaced in spacings
        for ascii in asciis
    ]
