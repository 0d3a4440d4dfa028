"""How far decompression may expand its input: compressed forms are data, so they are bounded.

Raw tool output that merely looks like a compressed form is escaped, never expanded, but
``decompress_tool_result`` (and the CLI) may still be handed a crafted form such as ten lines of
``x [x1000000]``. Every decoder adds up what it is about to produce and refuses past this size.
"""

from __future__ import annotations

from worker.errors import CompressionError

MAX_EXPANDED_CHARS = 64 * 1024 * 1024  # far above any tool result a conversation carries


class ExpansionBudget:
    """Counts the characters a decoder produces and raises once they exceed the limit."""

    def __init__(self, form: str, limit: int = MAX_EXPANDED_CHARS) -> None:
        self.form = form
        self.left = limit

    def spend(self, chars: int) -> None:
        self.left -= chars
        if self.left < 0:
            raise CompressionError(f"{self.form}: expands past {MAX_EXPANDED_CHARS} characters")
