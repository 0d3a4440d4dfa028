"""JSON tool results: node codecs applied through the whole value, and the exact inverse.

The value is walked recursively (nested reports such as ``delegate_task`` results, and every
other JSON result): arrays of grep match objects become ``grep-v1``, other arrays of same-shaped
objects ``csv``, arrays of paths ``glob-v1``; long strings take whichever is cheapest in tokens of a
plain-text form, ``rle-lines``, or, for JSON text, its own compressed tree (``json-text``). A
compressed node's payload is never walked again, so its values need no escaping. A raw object that
already has a ``_fmt`` key is wrapped as ``{"_fmt": "literal", "value": ...}`` and a raw string
that starts like a text form gets the verbatim header, so expanding never misreads raw data.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.compress import (
    csv_json,
    glob_json,
    grep_json,
    jsontext,
    read_file,
    rle_json,
    text,
)
from worker.compress.limits import ExpansionBudget
from worker.compress.node import FMT, Json, check_keys
from worker.compress.node import field as node_field
from worker.compress.tally import TokenTally
from worker.errors import CompressionError

LITERAL = "literal"
JSON_TEXT = "json-text"
_MIN_STRING_CHARS = 256  # shorter strings cannot save enough to pay for a header
_LIST_CODECS = (grep_json, csv_json, glob_json)
_NODE_DECODERS: dict[str, Callable[[dict[str, Json], ExpansionBudget], Json]] = {
    csv_json.NAME: csv_json.decode,
    glob_json.NAME: glob_json.decode,
    grep_json.NAME: grep_json.decode,
    rle_json.NAME: rle_json.decode,
    read_file.NAME: read_file.decode,
}


def dumps(value: Json) -> str:
    """The serialization token counts of JSON values are measured on (compact, UTF-8)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class TreeEncoder:
    """Compresses one JSON value; ``forms`` collects the names of the forms it used."""

    tally: TokenTally
    forms: set[str] = field(default_factory=set)

    def top(self, tool_name: str, value: Json) -> Json:
        if tool_name == "read_file" and isinstance(value, dict):
            node = read_file.encode(value)
            if node is not None:
                self.forms.add(read_file.NAME)
                return node
        return self.value(value)

    def value(self, value: Json) -> Json:
        if isinstance(value, dict):
            if FMT in value:
                self.forms.add(LITERAL)
                return {FMT: LITERAL, "value": value}
            return {key: self.value(item) for key, item in value.items()}
        if isinstance(value, list):
            return self._list(value)
        if isinstance(value, str):
            return self._string(value)
        return value

    def _list(self, items: list[Json]) -> Json:
        for codec in _LIST_CODECS:
            node = codec.encode(items)
            if node is not None:
                self.forms.add(codec.NAME)
                return node
        return [self.value(item) for item in items]

    def _string(self, raw: str) -> Json:
        escaped = text.escape(raw)
        if escaped is not raw:
            self.forms.add(text.VERBATIM)
        candidates = self._string_candidates(raw) if len(raw) >= _MIN_STRING_CHARS else []
        if not candidates:
            return escaped
        # Inside JSON a string costs the tokens of its escaped form, so compare those.
        best_tokens = self.tally.count_text(dumps(escaped))
        best: tuple[Json, frozenset[str]] = (escaped, frozenset())
        for candidate, forms in candidates:
            tokens = self.tally.count_text(dumps(candidate))
            if tokens < best_tokens:
                best_tokens, best = tokens, (candidate, forms)
        self.forms.update(best[1])
        return best[0]

    def _string_candidates(self, raw: str) -> list[tuple[Json, frozenset[str]]]:
        candidates: list[tuple[Json, frozenset[str]]] = []
        choice = text.best_form(raw, self.tally)
        if choice is not None:
            candidates.append((choice.text, frozenset({choice.form})))
        runs = rle_json.encode(raw)
        if runs is not None:
            candidates.append((runs, frozenset({rle_json.NAME})))
        parsed = jsontext.parse(raw)
        if parsed is not None:
            inner = TreeEncoder(self.tally)
            tree = inner.value(parsed[0])
            if inner.forms - {LITERAL, text.VERBATIM}:
                node = {FMT: JSON_TEXT, "style": parsed[1].name, "value": tree}
                candidates.append((node, frozenset({JSON_TEXT, *inner.forms})))
        return candidates


def decode(value: Json, budget: ExpansionBudget) -> Json:
    """The original of a value ``TreeEncoder`` produced (raw values come back as they are)."""
    if isinstance(value, dict):
        if FMT in value:
            return _decode_node(value, budget)
        return {key: decode(item, budget) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item, budget) for item in value]
    if isinstance(value, str):
        expanded = text.expand(value, budget)
        return value if expanded is None else expanded
    return value


def mentions_forms(value: Json) -> bool:
    """Whether :func:`decode` would read anything in ``value`` as a compressed form (raw values
    like that get escaped; this only looks, never expands, and copes with any depth)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if FMT in item:
                return True
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str) and text.is_framed(item):
            return True
    return False


def _decode_node(node: dict[str, Json], budget: ExpansionBudget) -> Json:
    form = node[FMT]
    if form == LITERAL:
        check_keys(node, {"value"})
        return node_field(node, "value", object)
    if form == JSON_TEXT:
        check_keys(node, {"style", "value"})
        style = jsontext.style_named(node_field(node, "style", str))
        if style is None:
            raise CompressionError(f"json-text node has an unknown style {node['style']!r}")
        return style.dump(decode(node_field(node, "value", object), budget))
    decoder = _NODE_DECODERS.get(form) if isinstance(form, str) else None
    if decoder is None:
        raise CompressionError(f"unknown compressed form {form!r}")
    return decoder(node, budget)
