"""The shape every compressed JSON node shares: an object whose ``_fmt`` names its form."""

from __future__ import annotations

from typing import Any

from worker.errors import CompressionError

FMT = "_fmt"
Json = Any  # a JSON value as json.loads returns it


def field(node: dict[str, Json], key: str, kind: type | tuple[type, ...]) -> Json:
    """``node[key]``, which must be of ``kind``; a CompressionError names what is wrong."""
    if key not in node:
        raise CompressionError(f"{node.get(FMT)!r} node has no {key!r}")
    value = node[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise CompressionError(f"{node.get(FMT)!r} node has a malformed {key!r}")
    return value


def check_keys(node: dict[str, Json], allowed: set[str]) -> None:
    extra = set(node) - allowed - {FMT}
    if extra:
        raise CompressionError(f"{node.get(FMT)!r} node has unexpected keys {sorted(extra)}")


def common_dir_prefix(values: list[str]) -> str:
    """The longest prefix of all ``values`` that ends with a path separator ('' if none)."""
    if not values:
        return ""
    low, high = min(values), max(values)  # the common prefix of all is that of these two
    size = 0
    for a, b in zip(low, high, strict=False):
        if a != b:
            break
        size += 1
    prefix = low[:size]
    cut = max(prefix.rfind("/"), prefix.rfind("\\"))
    return prefix[: cut + 1]


def strings_only(values: list[Json]) -> list[str] | None:
    return values if all(isinstance(value, str) for value in values) else None


def same_json(a: Json, b: Json) -> bool:
    """Equal as JSON, strictly: same types (``1`` is not ``1.0`` or ``true``) and key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_json(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)
