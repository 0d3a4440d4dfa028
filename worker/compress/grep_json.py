"""JSON grep matches grouped by file with positional rows (``grep-v1``).

``[{"file": "/p/a.go", "line_number": 18, "line": "...", "line_hash": "978"}, ...]`` becomes::

    {"_fmt": "grep-v1", "common_prefix": "/p/", "keys": ["file", "line_number", "line", ...],
     "matches": {"a.go": [[18, "...", "978"], ...]}}

``keys`` is the objects' key order; each row holds the values of every key but ``file``, in that
order. Files whose matches are not contiguous are written as a list of ``[file, rows]`` pairs
instead of an object, so the original match order is kept.
"""

from __future__ import annotations

from worker.compress.limits import ExpansionBudget
from worker.compress.node import FMT, Json, check_keys, common_dir_prefix, field, strings_only
from worker.errors import CompressionError

NAME = "grep-v1"
FILE_KEY = "file"
_MIN_MATCHES = 2


def applies(value: list[Json]) -> bool:
    if len(value) < _MIN_MATCHES or not isinstance(value[0], dict):
        return False
    keys = list(value[0])
    return FILE_KEY in keys and "line_number" in keys


def encode(value: list[Json]) -> dict[str, Json] | None:
    if not applies(value):
        return None
    keys = list(value[0])
    if any(not isinstance(m, dict) or list(m) != keys for m in value):
        return None
    files = strings_only([m[FILE_KEY] for m in value])
    if files is None:
        return None
    prefix = common_dir_prefix(files)
    other_keys = [key for key in keys if key != FILE_KEY]
    groups: list[tuple[str, list[Json]]] = []
    for match, path in zip(value, files, strict=True):
        relative = path[len(prefix) :]
        if not groups or groups[-1][0] != relative:
            groups.append((relative, []))
        groups[-1][1].append([match[key] for key in other_keys])
    contiguous = len({name for name, _ in groups}) == len(groups)
    matches: Json = dict(groups) if contiguous else [[name, rows] for name, rows in groups]
    return {FMT: NAME, "common_prefix": prefix, "keys": keys, "matches": matches}


def decode(node: dict[str, Json], budget: ExpansionBudget) -> list[Json]:
    check_keys(node, {"common_prefix", "keys", "matches"})
    prefix = field(node, "common_prefix", str)
    keys = field(node, "keys", list)
    matches = field(node, "matches", (dict, list))
    if strings_only(keys) is None or keys.count(FILE_KEY) != 1 or len(set(keys)) != len(keys):
        raise CompressionError("grep-v1 keys must be distinct strings including 'file' once")
    other_keys = [key for key in keys if key != FILE_KEY]
    out: list[Json] = []
    for name, rows in _groups(matches):
        for row in rows:
            if not isinstance(row, list) or len(row) != len(other_keys):
                raise CompressionError("grep-v1 row does not match its keys")
            values = dict(zip(other_keys, row, strict=True))
            budget.spend(len(prefix) + len(name))
            values[FILE_KEY] = prefix + name
            out.append({key: values[key] for key in keys})
    return out


def _groups(matches: Json) -> list[tuple[str, list[Json]]]:
    pairs = list(matches.items()) if isinstance(matches, dict) else matches
    groups: list[tuple[str, list[Json]]] = []
    for pair in pairs:
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], list)
        ):
            raise CompressionError("grep-v1 matches must pair a file with its rows")
        groups.append((pair[0], pair[1]))
    return groups
