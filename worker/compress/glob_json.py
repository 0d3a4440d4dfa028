"""JSON lists of paths with their common directory written once (``glob-v1``)."""

from __future__ import annotations

from worker.compress.limits import ExpansionBudget
from worker.compress.node import FMT, Json, check_keys, common_dir_prefix, field, strings_only
from worker.errors import CompressionError

NAME = "glob-v1"
_MIN_PATHS = 2
_MIN_SAVED_CHARS = 40  # the node's own keys cost about this much


def encode(value: list[Json]) -> dict[str, Json] | None:
    paths = strings_only(value) if len(value) >= _MIN_PATHS else None
    if paths is None:
        return None
    prefix = common_dir_prefix(paths)
    if len(prefix) * (len(paths) - 1) < _MIN_SAVED_CHARS:
        return None
    return {FMT: NAME, "common_prefix": prefix, "files": [path[len(prefix) :] for path in paths]}


def decode(node: dict[str, Json], budget: ExpansionBudget) -> list[Json]:
    check_keys(node, {"common_prefix", "files"})
    prefix = field(node, "common_prefix", str)
    files = field(node, "files", list)
    if strings_only(files) is None:
        raise CompressionError("glob-v1 files must be strings")
    budget.spend(len(prefix) * len(files))
    return [prefix + name for name in files]
