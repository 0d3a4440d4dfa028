"""How a history is projected (:mod:`worker.core.projection`): the compaction settings that
shape what the next request sees, and the model whose tokenizer counts it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from worker.config import CompactionConfig, ProjectedToolResultBudget


class ProjectionPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    keep_recent_tool_results: int | None = None
    projected_tool_result_budget: ProjectedToolResultBudget | None = None
    compress_tool_results: bool = False
    compress_min_tokens: int = 200
    compress_min_saving: float = 0.15
    model: str | None = None

    @classmethod
    def from_config(cls, config: CompactionConfig, *, model: str | None = None) -> ProjectionPolicy:
        return cls(
            keep_recent_tool_results=config.keep_recent_tool_results,
            projected_tool_result_budget=config.projected_tool_result_budget,
            compress_tool_results=config.compress_tool_results,
            compress_min_tokens=config.compress_min_tokens,
            compress_min_saving=config.compress_min_saving,
            model=model,
        )
