"""Non-LLM compaction strategies, one small module each, with a validated config.

Each strategy reduces a message list to fit its bound and never raises on content. They work
on atomic groups (:mod:`worker.core.groups`): a tool call and its results are kept or dropped
together, the leading system messages and the newest group always stay, and so does an
unfinished tool exchange. The dropping strategies return the input's own message objects.
"""

from worker.core.strategies._base import OMITTED_TOOL_RESULT, CompactionStrategy
from worker.core.strategies.selective_tool_result import (
    SelectiveToolResult,
    SelectiveToolResultConfig,
)
from worker.core.strategies.sliding_window import SlidingWindow, SlidingWindowConfig
from worker.core.strategies.token_budget import TokenBudget, TokenBudgetConfig
from worker.core.strategies.truncation import Truncation, TruncationConfig

__all__ = [
    "OMITTED_TOOL_RESULT",
    "CompactionStrategy",
    "SelectiveToolResult",
    "SelectiveToolResultConfig",
    "SlidingWindow",
    "SlidingWindowConfig",
    "TokenBudget",
    "TokenBudgetConfig",
    "Truncation",
    "TruncationConfig",
]
