"""Lossless tool-output compression (placeholder until the codec layer lands: returns input)."""

from __future__ import annotations

from typing import Any


def compress_tool_result(
    tool_name: str,
    output: Any,
    *,
    min_tokens: int = 200,
    min_saving: float = 0.15,
    model: str | None = None,
) -> Any:
    del tool_name, min_tokens, min_saving, model
    return output


def decompress_tool_result(tool_name: str, compressed: Any) -> Any:
    del tool_name
    return compressed
