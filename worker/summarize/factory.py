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

    summarizer: ClosableSummarizer = LLMSummarizer(settings.llm)
    return summarizer
