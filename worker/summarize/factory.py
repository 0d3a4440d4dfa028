"""Builds the LLM summarizer a mode needs (None for ``local_only``)."""

from __future__ import annotations

from typing import Protocol

from worker.config import Settings
from worker.summarize import Summarizer


class ClosableSummarizer(Summarizer, Protocol):
    def close(self) -> None: ...


def llm_summarizer(settings: Settings) -> ClosableSummarizer | None:
    if settings.compaction.mode == "local_only":
        return None
    from worker.summarize.llm import LLMSummarizer

    config = settings.llm
    summarizer: ClosableSummarizer = LLMSummarizer(config)
    if not config.fallback_models:
        return summarizer
    from worker.summarize.chain import FallbackChain

    names = [config.model, *config.fallback_models]
    links = [summarizer] + [
        LLMSummarizer(config.model_copy(update={"model": name, "fallback_models": []}))
        for name in config.fallback_models
    ]
    return FallbackChain(links, names)
