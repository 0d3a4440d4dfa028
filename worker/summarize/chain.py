"""``[llm] fallback_models``: the summarizing models tried in order before the digest.

Each model is its own :class:`~worker.summarize.llm.LLMSummarizer` (same provider, URL and key),
so each has its own deadline (``deadline_s`` from its first call) and its own circuit breaker: a
primary model that is down does not stop the fallback from being called. Every failure moves on
to the next model, a permanent one too (a 404 for a model the server does not serve is exactly
the case for a fallback). The summary says which model wrote it (``summary.model``) and, when it
was not the first, why the ones before it failed (``summary.fallback_reason``). When every model
fails, the first model's error is raised (the first real cause), its message naming each one's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from worker.errors import CompactorError
from worker.summarize import Summarizer, SummaryRequest
from worker.wire.events import Summary


class _Link(Summarizer, Protocol):
    def close(self) -> None: ...


class FallbackChain:
    """Summarizers tried in order; ``names``: the model each one calls, for the messages."""

    def __init__(self, summarizers: Sequence[_Link], names: Sequence[str]) -> None:
        if not summarizers or len(summarizers) != len(names):
            raise ValueError("a fallback chain needs one name per summarizer")
        self._summarizers = list(summarizers)
        self._names = list(names)

    def summarize(self, request: SummaryRequest) -> Summary:
        failures: list[tuple[str, CompactorError]] = []
        for name, summarizer in zip(self._names, self._summarizers, strict=True):
            try:
                summary = summarizer.summarize(request)
            except CompactorError as exc:
                failures.append((name, exc))
                continue
            if not failures:
                return summary
            return summary.model_copy(update={"fallback_reason": _reasons(failures)})
        first = failures[0][1]
        raise type(first)(_reasons(failures), code=first.code) from first

    def close(self) -> None:
        for summarizer in self._summarizers:
            summarizer.close()


def _reasons(failures: list[tuple[str, CompactorError]]) -> str:
    """``"CODE: model m failed: message; ..."``: the first failure's code leads."""
    said = "; ".join(f"model {name} failed: {exc.code}: {exc.message}" for name, exc in failures)
    return f"{failures[0][1].code}: {said}"
