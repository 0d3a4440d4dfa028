"""Which tool results are left alone (docs/compression.md, "Left alone")."""

from __future__ import annotations

from typing import Any

# ask_user answers and write/edit status maps are tiny; MCP results have their own cache.
_LEFT_ALONE = frozenset({"call_mcp_tool", "ask_user", "write_file", "edit_file"})
# read_file's "truncated" means a partial file view, which is still worth compressing.
_TRUNCATION_MEANS_PARTIAL_VIEW = frozenset({"read_file"})


def leaves_alone(tool_name: str) -> bool:
    """MCP results (``call_mcp_tool``, ``mcp__*``, ``mcp_*``), ``ask_user``, ``write_file``,
    ``edit_file``: never compressed, and never expanded either."""
    return tool_name in _LEFT_ALONE or tool_name.startswith("mcp_")


def is_truncated_preview(tool_name: str, value: Any) -> bool:
    """A bash or web_fetch result marked ``truncated: true`` already is a bounded preview of an
    output kept elsewhere, so it is left unchanged."""
    return (
        isinstance(value, dict)
        and value.get("truncated") is True
        and tool_name not in _TRUNCATION_MEANS_PARTIAL_VIEW
    )
