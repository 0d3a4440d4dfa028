"""Rewriting one array member of a JSON request body while keeping the bytes of everything
that did not change: what the proxy forwards when it applies a compaction.

A provider's compaction block, signed thinking and encrypted items are checked by the
provider; they are carried as the agent sent them, down to the byte, when only the messages
around them change. :func:`splice_array` re-serializes only the elements that are new, and
copies every other element (and the rest of the body) from the original text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")

Span = tuple[int, int]


def splice_array(
    raw: bytes, key: str, original: Sequence[Any], forwarded: Sequence[Any]
) -> bytes | None:
    """``raw`` (a JSON object, UTF-8) with its top-level ``key`` array replaced by
    ``forwarded``, where an element that is (``is``) one of ``original`` (the array as parsed
    from ``raw``) keeps its bytes, and any other is written as JSON. None when ``raw`` cannot be
    read so (not an object, a duplicated key, an array other than ``original``): the caller
    writes the whole body then."""
    try:
        text = raw.decode("utf-8")
        spans = _object_spans(text)
        if spans is None or key not in spans:
            return None
        start, end = spans[key]
        elements = _array_spans(text, start)
    except (ValueError, IndexError):
        return None
    if elements is None or len(elements) != len(original):
        return None
    position = {id(value): k for k, value in enumerate(original)}
    parts = []
    for value in forwarded:
        k = position.get(id(value))
        if k is not None and original[k] is value:
            parts.append(text[elements[k][0] : elements[k][1]])
        else:
            parts.append(json.dumps(value, ensure_ascii=False))
    return (text[:start] + "[" + ", ".join(parts) + "]" + text[end:]).encode("utf-8")


def _space(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    return match.end() if match else at


def _object_spans(text: str) -> dict[str, Span] | None:
    """The span of each top-level member's value; None for a duplicated key."""
    at = _space(text, 0)
    if text[at] != "{":
        return None
    at = _space(text, at + 1)
    spans: dict[str, Span] = {}
    if text[at] == "}":
        return spans
    while True:
        key, at = _DECODER.raw_decode(text, at)
        at = _space(text, at)
        if not isinstance(key, str) or key in spans or text[at] != ":":
            return None
        start = _space(text, at + 1)
        _, end = _DECODER.raw_decode(text, start)
        spans[key] = (start, end)
        at = _space(text, end)
        if text[at] == "}":
            return spans
        if text[at] != ",":
            return None
        at = _space(text, at + 1)


def _array_spans(text: str, at: int) -> list[Span] | None:
    """The span of each element of the array that opens at ``at``; None if none opens there."""
    if text[at] != "[":
        return None
    at = _space(text, at + 1)
    spans: list[Span] = []
    if text[at] == "]":
        return spans
    while True:
        _, end = _DECODER.raw_decode(text, at)
        spans.append((at, end))
        at = _space(text, end)
        if text[at] == "]":
            return spans
        if text[at] != ",":
            return None
        at = _space(text, at + 1)
