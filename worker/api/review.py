"""Review before apply, for ``compactor serve``: approving or declining the compaction a
conversation holds (``compaction.proposed``), from the HTTP API, the inspector's forms and the
webhooks' answers alike. One :class:`Reviewer` per process, held by the ``Api`` state object.

An approval may carry an edited summary: bounded and re-checked against the must-keep facts of
the range, read from the compaction's transcript (:func:`worker.client.checked_edit`, shared
with ``Client.approve``). An edit and a reason are text a person sent, to be published: one
holding a control character or a lone surrogate is refused (422, naming the field) before
anything is published (:func:`worker.wire.requests.user_text`). :meth:`Reviewer.preview`
checks an edit as an approval would, publishing nothing: the inspector counts an edit with it.
The Redis side is one script each (:meth:`worker.backend.redis_state.RedisState.approve`,
``decline``), so a proposal is published as completed, or declined, exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import anyio.to_thread

from worker.api.common import ApiError
from worker.backend.redis_state import RedisState
from worker.client import checked_edit
from worker.config import Settings
from worker.core.cost import recosted
from worker.core.review import edit_of, edited_tokens_after
from worker.errors import EventMismatch, InvalidInput, InvalidRequest
from worker.transcripts import TranscriptStore
from worker.wire.composed import HeldProposal
from worker.wire.events import Compaction, CompletedEvent, Cost, DeclinedEvent, Summary
from worker.wire.requests import user_text

# What a reviewer may send as an edited summary, in characters (the token bound, the operator's
# summary_max_output_tokens, is checked after).
MAX_EDIT_CHARS = 100_000


@dataclass(frozen=True)
class Decision:
    """What approving or declining did: the published event and its stream id."""

    event: CompletedEvent | DeclinedEvent
    stream_id: str


@dataclass(frozen=True)
class Preview:
    """An edit of a held compaction's summary as an approval would publish it: the checked
    ``summary`` (facts repaired, tokens counted by the project's tokenizer), the proposed
    summary's tokens, and the next request's tokens and ``cost`` with the edit in place of
    the proposed summary (``edited`` False: no edit, the proposal's own figures)."""

    summary: Summary
    proposed_tokens: int
    tokens_before: int
    tokens_after: int
    cost: Cost | None
    edited: bool

    @classmethod
    def of(cls, compaction: Compaction, cost: Cost | None, edit: Summary | None) -> Preview:
        proposed = compaction.summary
        if edit is None:
            return cls(
                proposed, proposed.tokens, compaction.tokens_before, compaction.tokens_after,
                cost, edited=False,
            )  # fmt: skip
        after = edited_tokens_after(compaction, edit)
        return cls(
            edit, proposed.tokens, compaction.tokens_before, after,
            None if cost is None else recosted(cost, after), edited=True,
        )  # fmt: skip


class Reviewer:
    """Approves and declines held compactions (docs/events.md, "Review before apply")."""

    def __init__(self, state: RedisState, store: TranscriptStore, settings: Settings) -> None:
        self.state = state
        self.store = store
        self.settings = settings

    async def held(self, internal: str, event_id: str) -> HeldProposal:
        """The held compaction ``event_id`` of the conversation; 404 when it holds none by
        that id (callers that know it was proposed answer 409 instead)."""
        held = await anyio.to_thread.run_sync(self.state.held_proposal, internal)
        if held is None or held.event.event_id != event_id:
            raise ApiError.of(404, "not_found", f"no compaction {event_id} is held for review")
        return held

    async def approve(
        self, internal: str, event_id: str, summary_text: str | None, *, by: str = "api"
    ) -> Decision:
        """Publish the held compaction as ``compaction.completed``, with ``summary_text`` as
        its summary if given (checked: 422 when empty or over the bound)."""
        held = await self.held(internal, event_id)
        text = edit_of(held.event.compaction, summary_text)
        summary = None if text is None else await self._edited(held, text)
        now = datetime.now(UTC)
        status, event, stream_id = await anyio.to_thread.run_sync(
            lambda: self.state.approve(held, now, by=by, summary=summary)
        )
        if status == "changed":
            raise ApiError.of(
                409,
                "compactions_changed",
                "the conversation's compactions changed since this one was proposed (a "
                "restore): it no longer applies; decline it, and the next snapshot proposes again",
            )
        if event is None:
            raise _not_held(event_id)
        return Decision(event, stream_id)

    async def decline(
        self, internal: str, event_id: str, reason: str | None, *, by: str = "api"
    ) -> Decision:
        """Publish ``compaction.declined`` and drop the held compaction."""
        if reason is not None:
            reason = _text_of("reason", reason)
        held = await self.held(internal, event_id)
        now = datetime.now(UTC)
        _status, event, stream_id = await anyio.to_thread.run_sync(
            lambda: self.state.decline(held, now, by=by, reason=reason)
        )
        if event is None:
            raise _not_held(event_id)
        return Decision(event, stream_id)

    async def preview(self, internal: str, event_id: str, summary_text: str | None) -> Preview:
        """What approving the held compaction with ``summary_text`` would publish, checked and
        counted as :meth:`approve` does it (422 for an edit it would refuse), and what the
        next request would weigh and cost with it; nothing is published. No text, or the
        proposed one, previews the proposal."""
        held = await self.held(internal, event_id)
        text = edit_of(held.event.compaction, summary_text)
        summary = None if text is None else await self._edited(held, text)
        return Preview.of(held.event.compaction, held.event.cost, summary)

    async def _edited(self, held: HeldProposal, text: str) -> Summary:
        if len(text) > MAX_EDIT_CHARS:
            raise ApiError.of(
                422, "invalid_request", f"summary: at most {MAX_EDIT_CHARS} characters"
            )
        text = _text_of("summary", text)
        config = self.settings.compaction
        try:
            return await anyio.to_thread.run_sync(
                lambda: checked_edit(held, text, self.store, config)
            )
        except InvalidInput as exc:
            raise ApiError.of(422, "invalid_request", exc.message) from None
        except EventMismatch as exc:  # its transcript is gone: the edit cannot be checked
            raise ApiError.of(409, "edit_not_checkable", f"{exc.message}; approve as is") from None


def _text_of(field: str, text: str) -> str:
    """``text`` when it may be published (:func:`user_text`); 422 naming ``field`` if not."""
    try:
        return user_text(field, text)
    except InvalidRequest as exc:
        raise ApiError(422, exc.to_dict()) from None


def _not_held(event_id: str) -> ApiError:
    return ApiError.of(
        409, "not_held", f"compaction {event_id} is no longer held: it was approved or declined"
    )
