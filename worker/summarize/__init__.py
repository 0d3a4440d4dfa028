"""Summarizers: the offline digest and the LLM, behind one small interface.

The pipeline builds a :class:`SummaryRequest` from the range it compacts (per-tool policies
already applied: omitted calls removed, stripped parts replaced by markers) and asks a
:class:`Summarizer` for a :class:`~worker.wire.models.Summary`. Both bounds travel in the request:
no call carries more than ``max_input_chars`` of conversation text, and the answer never has
more than ``max_output_tokens`` tokens.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from worker.wire.events import SUMMARY_MARKER, Summary
from worker.wire.models import Message

__all__ = ["SUMMARY_MARKER", "Summarizer", "SummaryRequest"]


class SummaryRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    conversation_id: str
    revision: int
    messages: list[Message]  # the range, oldest first, policies applied
    previous_summary: str | None = None  # the earlier summary this range starts with, if any
    previous_summary_ids: list[str] = Field(default_factory=list)  # its message(s)
    must_keep: list[str] = Field(default_factory=list)  # paths, commands, errors to keep verbatim
    # Code names the messages kept verbatim beside the summary show (the system prompt, carried
    # turns, the newest ones): a summary need not list them again.
    shown_beside: frozenset[str] = frozenset()
    max_input_chars: int
    max_output_tokens: int
    source_tokens: int  # tokens of the text being replaced; a longer summary is refused
    model: str | None = None  # the agent's model: whose tokenizer bounds the output
    # A requested compaction's focus (user text, at most 2,000 characters): after our rules in
    # the LLM's prompt, never replacing them; the digest notes it. Never in an event.
    instructions: str | None = None


class Summarizer(Protocol):
    """Returns a bounded summary, or raises a CompactorError (transient or permanent)."""

    def summarize(self, request: SummaryRequest) -> Summary: ...
