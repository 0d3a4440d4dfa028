"""JSON arrays of objects with the same keys, as a header and rows (the ``csv`` form).

``[{"name": "a.go", "lines": 412}, ...]`` becomes ``{"_fmt": "csv", "header": ["name",
"lines"], "rows": [["a.go", 412], ...]}``: each key once instead of once per object. Two more
things are written once instead of once per row: a column whose value is the same in every row
goes into ``constant`` as ``{column: value}`` (rows leave it out), and a string column whose
values all share a directory prefix gets it factored out into ``common_prefix`` as
``{column: prefix}``. Values are carried as they are, nested ones included.
"""

from __future__ import annotations

import json

from worker.compress.limits import ExpansionBudget
from worker.compress.node import (
    FMT,
    Json,
    check_keys,
    common_dir_prefix,
    field,
    same_json,
    strings_only,
)
from worker.errors import CompressionError

NAME = "csv"
_MIN_ROWS = 2
_MIN_PREFIX_CHARS = 8
_MIN_SAVED_KEY_CHARS = 24  # the node's own keys cost about this much


def encode(value: list[Json]) -> dict[str, Json] | None:
    header = _shared_keys(value)
    if header is None:
        return None
    if sum(len(key) + 4 for key in header) * (len(value) - 1) < _MIN_SAVED_KEY_CHARS:
        return None
    columns = {key: [row[key] for row in value] for key in header}
    constants = {key: cells[0] for key, cells in columns.items() if _all_same(cells)}
    varying = [key for key in header if key not in constants]
    prefixes = _column_prefixes({key: columns[key] for key in varying})
    rows = [
        [row[key][len(prefixes[key]) :] if key in prefixes else row[key] for key in varying]
        for row in value
    ]
    node: dict[str, Json] = {FMT: NAME}
    if constants:
        node["constant"] = constants
    if prefixes:
        node["common_prefix"] = prefixes
    node["header"] = header
    node["rows"] = rows
    return node


def dumps(value: Json) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _all_same(cells: list[Json]) -> bool:
    return all(same_json(cell, cells[0]) for cell in cells[1:])


def _shared_keys(value: list[Json]) -> list[str] | None:
    if len(value) < _MIN_ROWS or not all(isinstance(row, dict) for row in value):
        return None
    header = list(value[0])
    if not header or any(list(row) != header for row in value):
        return None
    return header


def _column_prefixes(columns: dict[str, list[Json]]) -> dict[str, str]:
    prefixes: dict[str, str] = {}
    for key, values in columns.items():
        strings = strings_only(values)
        if strings is not None:
            prefix = common_dir_prefix(strings)
            if len(prefix) >= _MIN_PREFIX_CHARS:
                prefixes[key] = prefix
    return prefixes


def decode(node: dict[str, Json], budget: ExpansionBudget) -> list[Json]:
    check_keys(node, {"constant", "common_prefix", "header", "rows"})
    header = field(node, "header", list)
    rows = field(node, "rows", list)
    constants = field(node, "constant", dict) if "constant" in node else {}
    prefixes = field(node, "common_prefix", dict) if "common_prefix" in node else {}
    if not all(isinstance(key, str) for key in header) or len(set(header)) != len(header):
        raise CompressionError("csv header must be distinct strings")
    varying = [key for key in header if key not in constants]
    if not set(constants) <= set(header) or not set(prefixes) <= set(varying):
        raise CompressionError("csv constant and common_prefix must name header columns")
    if not all(isinstance(prefix, str) for prefix in prefixes.values()):
        raise CompressionError("csv common_prefix values must be strings")
    # Each row repeats the constants and prefixes: count what they add once written out.
    budget.spend(len(rows) * (len(dumps(constants)) + sum(map(len, prefixes.values()))))
    out: list[Json] = []
    for row in rows:
        if not isinstance(row, list) or len(row) != len(varying):
            raise CompressionError("csv row does not match the header")
        cells = {
            key: _cell(prefixes.get(key), cell) for key, cell in zip(varying, row, strict=True)
        }
        out.append({key: constants[key] if key in constants else cells[key] for key in header})
    return out


def _cell(prefix: str | None, cell: Json) -> Json:
    if prefix is None:
        return cell
    if not isinstance(cell, str):
        raise CompressionError("csv prefixed column holds a non-string")
    return prefix + cell
