"""read_file results without the fields their content already implies (``read_file-v1``).

``lines_read`` is dropped when it equals the number of lines in ``content``, ``bytes_read`` when
it equals the UTF-8 size of ``content`` (otherwise it says something the content does not, e.g.
for a partial read, and stays), and ``truncated`` when it is false. The node keeps every other
field in order, and dropped ones go back where the tool writes them (content, bytes_read,
lines_read, total_lines, truncated); a result laid out differently is left alone.
"""

from __future__ import annotations

from worker.compress.limits import ExpansionBudget
from worker.compress.node import FMT, Json, field

NAME = "read_file-v1"
_TOOL_ORDER = ("content", "bytes_read", "lines_read", "total_lines", "truncated")


def line_count(content: str) -> int:
    """Lines as a reader counts them: a final newline ends the last line, it does not add one."""
    if not content:
        return 0
    return content.count("\n") + (not content.endswith("\n"))


def _byte_size(content: str) -> int | None:
    try:
        return len(content.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates: no size is implied
        return None


def _derived(content: str) -> dict[str, Json]:
    return {
        "bytes_read": _byte_size(content),
        "lines_read": line_count(content),
        "truncated": False,
    }


def _is_same(value: Json, derived: Json) -> bool:
    return type(value) is type(derived) and value == derived


def encode(value: dict[str, Json]) -> dict[str, Json] | None:
    content = value.get("content")
    if not isinstance(content, str) or FMT in value:
        return None
    derived = _derived(content)
    node: dict[str, Json] = {FMT: NAME}
    node.update((k, v) for k, v in value.items() if not (k in derived and _is_same(v, derived[k])))
    if len(node) == len(value) + 1:
        return None
    return (
        node if list(decode(node, ExpansionBudget(NAME)).items()) == list(value.items()) else None
    )


def decode(node: dict[str, Json], budget: ExpansionBudget) -> dict[str, Json]:
    del budget  # the fields put back are a few numbers
    content = field(node, "content", str)
    derived = _derived(content)
    missing = [key for key in _TOOL_ORDER if key in derived and key not in node]
    out: dict[str, Json] = {}
    for key, item in node.items():
        if key == FMT:
            continue
        if key in _TOOL_ORDER:
            # Put back, before this field, the dropped ones the tool writes before it.
            rank = _TOOL_ORDER.index(key)
            while missing and _TOOL_ORDER.index(missing[0]) < rank:
                dropped = missing.pop(0)
                out[dropped] = derived[dropped]
        out[key] = item
    out.update((key, derived[key]) for key in missing)
    return out
