"""Review before apply: a reviewer's edit of a held compaction's summary, bounded and checked
against the range's must-keep facts as the pipeline checks its own summaries (and repaired the
same way), so that an edit can never silently drop what the agent cannot lose
(docs/events.md, "Review before apply"). Pure: the transcript comes in as data.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from worker.core import fidelity, provenance
from worker.core.cost import recosted
from worker.core.redaction import redact, redact_messages
from worker.errors import InvalidInput, InvalidRequest
from worker.tokens import count_tokens
from worker.wire import formats
from worker.wire.events import SUMMARY_MARKER, Compaction, CompletedEvent, Summary
from worker.wire.models import Message
from worker.wire.requests import user_text

# Characters per token above which an edit is refused before it is even tokenized: no tokenizer
# packs more, so this only spares counting an absurd text.
_CHARS_PER_TOKEN = 16


def edited_summary(
    compaction: Compaction,
    text: str,
    transcript: Mapping[str, Any],
    *,
    delegation_tools: list[str],
    max_output_tokens: int,
) -> Summary:
    """The summary ``text`` a reviewer wrote in place of ``compaction``'s, as an approval
    publishes it: at most ``max_output_tokens`` tokens (``InvalidInput`` otherwise, or when
    empty), opened by the summary marker (added when missing: later compactions recognize an
    earlier summary by it), its secrets redacted as a summarizer's input is (and counted in its
    ``redactions``; ``InvalidInput`` for a control character or a lone surrogate), checked
    against the must-keep facts of the range the ``transcript`` (the compaction's full
    pre-compaction history) holds, redacted too, missing facts repaired into its "Kept facts"
    section, and marked ``edited`` with that ``fidelity``; its only section with sources is
    the repair's."""
    if compaction.reduction != "summary":
        # Its text is only the marker of what a strategy omitted: an edit would pass off a
        # reviewer's summary as the strategy's, and the must-keep check does not apply to it.
        raise InvalidInput(
            f"summary: a {compaction.reduction} reduction has no summary to edit; "
            "approve or decline it as it is"
        )
    body = text.strip()
    if not body:
        raise InvalidInput("summary: the edited summary is empty")
    if len(body) > max_output_tokens * _CHARS_PER_TOKEN:
        raise InvalidInput(f"summary: longer than the bound of {max_output_tokens} tokens")
    try:
        user_text("summary", body)
    except InvalidRequest as exc:
        raise InvalidInput(exc.message) from None
    # Published as a summarizer's own would be: no secret in it, what was redacted counted.
    redacted = redact(body)
    body = redacted.text
    if not body.startswith(SUMMARY_MARKER):
        body = f"{SUMMARY_MARKER}\n{body}"
    model = _model_of(transcript)
    tokens = count_tokens(body, model)
    if tokens > max_output_tokens:
        raise InvalidInput(
            f"summary: {tokens} tokens, over the bound of {max_output_tokens} "
            "(summary_max_output_tokens)"
        )
    summarized, carried, where = range_messages(compaction, transcript)
    # A repair adds facts of the range: drawn from it redacted, as the pipeline's are.
    summarized, _ = redact_messages(summarized)
    facts = fidelity.extract_must_keep(summarized, delegation_tools, carried)
    counts = Counter(compaction.summary.redactions) + Counter(redacted.counts)
    summary = compaction.summary.model_copy(
        update={
            "text": body,
            "tokens": tokens,
            "truncated": False,
            "sections": [],
            "edited": True,
            "redactions": dict(sorted(counts.items())),
        }
    )
    checked = fidelity.ensure(
        summary, facts, fidelity.carried_text(carried), limit=max_output_tokens, model=model
    )
    # The reviewer's text has no known sources; a repair's section has, by wire id.
    sections = provenance.published_sections(checked.text, checked.sections, where)
    return checked.model_copy(update={"sections": sections})


def edit_of(compaction: Compaction, text: str | None) -> str | None:
    """The reviewer's edit, or None when there is none: no text, or the proposed summary as
    it was (a form that shows the summary sends it back unchanged)."""
    if text is None or text.strip() == compaction.summary.text.strip():
        return None
    return text


def range_messages(
    compaction: Compaction, transcript: Mapping[str, Any]
) -> tuple[list[Message], list[Message], dict[str, tuple[int, str]]]:
    """The compacted range of the transcript's history, normalized: the messages the summary
    replaces and those the replacement carries (``preserved_ids``), each oldest first, and
    where each is on the wire (:func:`worker.core.provenance.wire_locations`)."""
    raw = transcript.get("messages")
    if not isinstance(raw, list):
        raise InvalidInput("the compaction's transcript holds no messages")
    messages = formats.to_messages(compaction.format, raw, system=transcript.get("system"))
    ranged = [m for m in messages if compaction.start <= m.source_index < compaction.end]
    keep = set(compaction.preserved_ids)
    where = provenance.wire_locations(ranged, formats.source_ids(raw))
    summarized = [m for m in ranged if m.id not in keep]
    return summarized, [m for m in ranged if m.id in keep], where


def _model_of(transcript: Mapping[str, Any]) -> str | None:
    model = transcript.get("model")
    name = model.get("name") if isinstance(model, Mapping) else None
    return name if isinstance(name, str) and name else None


def edited_tokens_after(compaction: Compaction, edit: Summary) -> int:
    """What the request holds after ``compaction`` with ``edit`` for its summary: the summary
    is one text of it, the rest weighs what it did."""
    return max(compaction.tokens_after - compaction.summary.tokens + edit.tokens, 0)


def with_edited_counts(event: CompletedEvent, proposed: Compaction) -> CompletedEvent:
    """An approved compaction whose summary was edited (``event``'s summary is the edit,
    ``proposed`` the compaction as proposed), with the request's size and the cost recounted
    for the edit: what is published says what the edit does."""
    after = edited_tokens_after(proposed, event.compaction.summary)
    compaction = event.compaction.model_copy(update={"tokens_after": after})
    cost = None if event.cost is None else recosted(event.cost, after)
    return event.model_copy(update={"compaction": compaction, "cost": cost})
