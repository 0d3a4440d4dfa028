"""Compaction events: what the service publishes, one model per event type, and their
constructors.

Events are output read by agents of other versions, so they are read tolerantly: unknown fields
are ignored, and an event of a type this version does not know parses as :class:`OtherEvent`
instead of failing (snapshots, the input, stay strict). Every event carries
``schema_version``; fields are only ever added within a version. docs/events.md is the
reference, docs/schemas/ the JSON Schemas generated from these models.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

from worker.wire.models import WireFormat, canonical_json

# The major version of the event schema. Readers ignore fields they do not know; a change that
# an older reader would misread (a field's meaning, a removal) needs a new version.
SCHEMA_VERSION = 1

EventType = Literal[
    "compaction.completed",
    "compaction.skipped",
    "compaction.failed",
    "compaction.rejected",
    "tool_results.elided",
    "compaction.reverted",
    "compaction.proposed",
    "compaction.declined",
]


class _Published(BaseModel):
    """Read tolerantly: fields a newer version added are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class ToolCallPolicy(_Published):
    """How a compaction treats one tool's calls: strip parts of them, or omit them."""

    policy: Literal["strip", "omit"] = "strip"
    request: bool = False
    response: bool = False


class Trigger(_Published):
    """The auto-compaction trigger as evaluated on the projected request. ``counted_by``: how
    ``projected_tokens`` was counted (``tiktoken``, ``estimate``, ``usage+tiktoken``,
    ``usage+estimate``); ``usage_ignored``: why the snapshot's ``usage`` was not used.

    A compaction someone asked for (``POST .../compact``, ``Client.compact_now``) has ``kind``
    ``"requested"``, its ``request_id``, and ``instructions_sha256``: the SHA-256 of the
    instructions it was given (their text never reaches an event), null without any.

    ``counted_by`` ends in ``+opaque-estimate`` when payloads the service cannot read (a
    Responses ``compaction`` item's encrypted content, a block or item of a type the formats do
    not know) were counted by the conservative estimate rather than covered by ``usage``.
    ``unknown_types``: how many blocks or items of each type the formats do not know the
    request holds (carried as they came, never read; docs/native-compaction.md). ``native_
    compaction``: the request opens at a provider-native compaction; everything before it was
    neither counted nor compacted."""

    kind: str
    threshold_tokens: int | None = None
    projected_tokens: int
    context_window: int | None = None
    counted_by: str = "tiktoken"
    usage_ignored: str | None = None
    request_id: str | None = None
    instructions_sha256: str | None = None
    unknown_types: dict[str, int] = Field(default_factory=dict)
    native_compaction: bool = False


class Fidelity(_Published):
    """How the summary was checked against the range's must-keep facts (docs/summaries.md):
    ``checked`` facts, ``kept`` (present in the summary or the carried messages as written),
    ``repaired`` (added to its "Kept facts" section), ``dropped`` (that did not fit the output
    bound: a count per kind, never their content), ``score`` (kept / checked before repair)."""

    checked: int = 0
    kept: int = 0
    repaired: int = 0
    dropped: dict[str, int] = Field(default_factory=dict)
    score: float = 1.0


class SummarySection(_Published):
    """One section of the summary's text (a Markdown heading; ``""``: the text before the first
    heading) and the messages it was drawn from: ``source_ids``, wire message ids of the range,
    in conversation order, each once. A long list keeps its first and last ids; ``omitted_ids``
    says how many more there were (docs/summaries.md, "Provenance")."""

    title: str
    source_ids: list[str] = Field(default_factory=list)
    omitted_ids: int = 0


# Opens every summary message we publish: a later compaction recognizes an earlier summary by
# it, and the checks of a summary's facts look past it.
SUMMARY_MARKER = "[compaction-worker summary]"


class LLMUsage(_Published):
    """What the model's server reported for the calls of one LLM summary: the tokens it
    counted (its own tokenizer, not ours; None when it reported none), summed over ``calls``."""

    calls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None


class Summary(_Published):
    """The summary that replaces the compacted range (``source``: the LLM or the digest; or
    ``strategy`` when a reduction strategy cut the range down instead, its text then the
    omission marker or empty, docs/events.md "Reduction").

    ``sections``: each section of ``text`` in order with its sources. A summarizer fills them in
    the ids of the messages it was given (normalized ids, docs/snapshot.md); the pipeline
    publishes them as wire message ids."""

    text: str
    tokens: int
    source: Literal["llm", "digest", "strategy"]
    truncated: bool = False
    fallback_reason: str | None = None
    chunks: int = 1
    fidelity: Fidelity | None = None  # None only in events of versions before it existed
    sections: list[SummarySection] = Field(default_factory=list)  # [] in older events
    # What was redacted from the range before it was summarized: a count per kind, never the
    # content ({} when nothing was; older events lack it).
    redactions: dict[str, int] = Field(default_factory=dict)
    # A reviewer replaced the proposed text (review before apply, docs/events.md): ``fidelity``
    # is then the check of the edited text, and ``sections`` are gone (the edit has no sources).
    edited: bool = False
    usage: LLMUsage | None = None  # an LLM summary's calls as the server counted them
    model: str | None = None  # the LLM that wrote it ([llm] model or a fallback model)
    # A requested compaction's instructions that this summary could not follow as an LLM
    # would (the offline digest): what it did with them instead. None: no instructions, or an
    # LLM followed them.
    instructions_note: str | None = None


DroppedKind = Literal[
    "tool_call_omitted",
    "tool_arguments_stripped",
    "tool_output_stripped",
    "user_message_shortened",
    "attachment_dropped",
    "message_omitted",
    "tool_output_omitted",
]


class DroppedItem(_Published):
    """Something the compaction removed outright instead of summarizing or carrying it (names
    and sizes only, never content): ``message_id`` is the wire message it was in, which the
    range's transcript keeps whole. ``bytes``: the UTF-8 size of what was removed (None for an
    attachment); ``attachment``: an image or file by the placeholder summaries name it with."""

    message_id: str
    kind: str  # a DroppedKind; a reader must accept kinds added later
    call_id: str | None = None
    tool: str | None = None
    bytes: int | None = None
    attachment: str | None = None


class TranscriptRef(_Published):
    """Where the full pre-compaction history is kept, and its sha256."""

    uri: str
    sha256: str
    bytes: int


class Compaction(_Published):
    """The edit a completed event describes: replace wire messages ``start..end`` (ids
    ``first_id``..``last_id``, whose canonical JSON hashes to ``range_sha256``) by
    ``replacement``."""

    start: int
    end: int
    first_id: str
    last_id: str
    # sha256 of the canonical JSON of the compacted wire messages: an event applies only to
    # exactly these messages. None only in events of versions before it existed.
    range_sha256: str | None = None
    replacement: list[dict[str, Any]]
    summary: Summary
    tool_calls: ToolCallPolicy | None = None
    tool_overrides: dict[str, ToolCallPolicy] = Field(default_factory=dict)
    tokens_before: int
    tokens_after: int
    # How each was counted (as Trigger.counted_by); "tiktoken" in events of older versions.
    tokens_before_counted_by: str = "tiktoken"
    tokens_after_counted_by: str = "tiktoken"
    transcript: TranscriptRef | None = None
    format: WireFormat = "openai"
    preserved_ids: list[str] = Field(default_factory=list)
    # What the replacement dropped outright (omitted calls, stripped bodies, ...), in
    # conversation order; [] in events of versions before it existed.
    dropped: list[DroppedItem] = Field(default_factory=list)
    # How the range was reduced ([compaction] reduction): "summary" in older events.
    reduction: str = "summary"

    def names(self, message_id: str) -> bool:
        """Whether the event itself records ``message_id`` among the messages it replaced
        (its first and last, and the messages each summary section was drawn from): what is
        known of a replaced message once its transcript is gone."""
        if message_id in (self.first_id, self.last_id):
            return True
        return any(message_id in s.source_ids for s in self.summary.sections)


class ElidedResult(_Published):
    """One tool result the projection shortened (never its content)."""

    call_id: str
    tool: str
    action: Literal["marker", "ellipsis", "emptied", "preview"]
    bytes_before: int
    bytes_after: int


class CostPrices(_Published):
    """The prices a ``cost`` object used, US dollars per million tokens, and where they come
    from (``builtin``: the table of docs/cost.md; ``config``: ``[cost.models."NAME"]``)."""

    model: str
    input: float
    cached_input: float
    cache_write: float
    output: float
    cache_ttl_s: int
    min_cacheable_tokens: int
    origin: str
    source: str = ""


class Cost(_Published):
    """What a compaction costs and saves (docs/cost.md): tokens always; US dollars only where
    the conversation's model has prices (``priced``; ``note`` says why not).

    ``cache_write_tokens``: the prefix the next request writes to the provider's cache after
    the compaction; ``saved_tokens_per_turn``: how much shorter each later request is.
    ``cache_warm``: whether the provider's cache would still hold the prefix at the next
    request (from the conversation's own turn rate; None: unknown, assumed warm).
    ``summary_usd``: the summary call (0 for the offline digest); ``cache_write_usd``: the cache
    write the compaction causes beyond what the next request would pay without it;
    ``saving_per_turn_usd``: what each later turn saves; ``break_even_turns``: later turns
    until the saving pays for both (None: never); ``expected_net_usd``: the saving over
    ``horizon_turns`` minus both costs. ``decision``: what the cost policy concluded, when it
    decided, and ``estimated_net_usd`` the net gain it estimated before the compaction was
    made (the other numbers are those of the compaction as made, so the two may differ)."""

    policy: str = "threshold"
    priced: bool = False
    note: str | None = None
    tokens_before: int
    tokens_after: int
    saved_tokens_per_turn: int
    cache_write_tokens: int
    summary_input_tokens: int = 0
    summary_output_tokens: int = 0
    horizon_turns: int = 0
    turn_interval_s: float | None = None
    cache_warm: bool | None = None
    summary_usd: float | None = None
    cache_write_usd: float | None = None
    saving_per_turn_usd: float | None = None
    break_even_turns: int | None = None
    expected_net_usd: float | None = None
    decision: str | None = None
    estimated_net_usd: float | None = None
    prices: CostPrices | None = None
    summary_prices: CostPrices | None = None


class EventError(_Published):
    """Why a compaction failed or a snapshot was rejected: a stable ``code``, a message, and
    for rejections the dotted ``field``."""

    code: str
    message: str
    field: str | None = None


class _Event(_Published):
    schema_version: int = SCHEMA_VERSION
    event_id: str
    conversation_id: str
    revision: int
    created_at: datetime

    def to_json(self) -> str:
        """The event as published: every field of its type present, nulls included."""
        return self.model_dump_json()


class CompletedEvent(_Event):
    """A compaction: apply it with ``apply_compaction`` whenever you like. A held compaction,
    once approved, names its ``compaction.proposed`` (``proposal_event_id``) and who approved
    it (``approved_by``: ``api``, ``inspector``, ``webhook``, or ``default`` when no hook
    answered within its deadline); both None otherwise, and in older events."""

    type: Literal["compaction.completed"] = "compaction.completed"
    trigger: Trigger
    compaction: Compaction
    proposal_event_id: str | None = None
    approved_by: str | None = None
    cost: Cost | None = None  # None only in events of versions before it existed


class ProposedEvent(_Event):
    """A compaction held for review (``[compaction] review``): the full proposal, as the
    completed event would carry it. Nothing applies it; approving it publishes a
    ``compaction.completed`` (possibly with an edited summary), declining it a
    ``compaction.declined``. A reader of a version before it reads it as :class:`OtherEvent`."""

    type: Literal["compaction.proposed"] = "compaction.proposed"
    trigger: Trigger
    compaction: Compaction
    cost: Cost | None = None


class DeclinedEvent(_Event):
    """A held compaction was declined (``proposal_event_id``: its ``compaction.proposed``);
    ``reason``: why, if the reviewer said; ``declined_by`` as ``CompletedEvent.approved_by``.
    The next snapshot over the threshold proposes again. (Not ``compaction.rejected``: that
    names an invalid snapshot, with an ``error``, and an older reader would take a declined
    proposal for one.)"""

    type: Literal["compaction.declined"] = "compaction.declined"
    proposal_event_id: str
    reason: str | None = None
    declined_by: str = "api"


class Floor(_Published):
    """The least a compaction of the request would leave, in tokens, by part: the leading
    ``system`` messages, a ``native_compaction`` (the provider's own, with what it holds), the
    ``pinned`` messages, the user turns and delegation results ``carried`` verbatim, the
    ``protected`` newest exchange (and calls still waiting for results), what the provider
    counts ``beyond`` the snapshot (its usage: tool definitions and the like) and the room the
    ``summary`` may take (its bound). ``total``: their sum, what the request would be after."""

    system: int = 0
    native_compaction: int = 0
    pinned: int = 0
    carried: int = 0
    protected: int = 0
    beyond: int = 0
    summary: int = 0
    total: int = 0


class SkippedEvent(_Event):
    """The revision needs no compaction (under the threshold, or nothing to compact), or a
    compaction would not pay. ``why``: the kind of skip (docs/events.md); ``floor``: with
    ``why`` ``floor`` or ``no_gain``, what a compaction cannot remove."""

    type: Literal["compaction.skipped"] = "compaction.skipped"
    trigger: Trigger | None = None
    reason: str
    cost: Cost | None = None  # set when the cost policy decided the skip
    why: str | None = None
    floor: Floor | None = None


class FailedEvent(_Event):
    """The compaction could not be made (the LLM in ``remote_only``, storage); the agent keeps
    its history, and its next snapshot tries again."""

    type: Literal["compaction.failed"] = "compaction.failed"
    trigger: Trigger | None = None
    reason: str
    error: EventError


class RejectedEvent(_Event):
    """The snapshot was invalid; ``error.field`` names where."""

    type: Literal["compaction.rejected"] = "compaction.rejected"
    reason: str
    error: EventError


class ElidedEvent(_Event):
    """The projection shortened tool results (what the next request carries of them)."""

    type: Literal["tool_results.elided"] = "tool_results.elided"
    elided: list[ElidedResult]


class RevertedEvent(_Event):
    """A completed compaction was restored (undone) on request: ``reverted_event_id`` names
    it. A reader that applied it puts back what it replaced (``CompactingSession`` does);
    one that has not applies it no more. ``revision`` is the reverted compaction's;
    ``reason``: what the person who restored it said, if anything."""

    type: Literal["compaction.reverted"] = "compaction.reverted"
    reverted_event_id: str
    reason: str | None = None


class OtherEvent(_Event):
    """An event of a type this version does not know (published by a newer one): kept, with
    its fields, so that a stream never becomes unreadable."""

    model_config = ConfigDict(frozen=True, extra="allow")

    type: str


_KNOWN = {
    "compaction.completed",
    "compaction.skipped",
    "compaction.failed",
    "compaction.rejected",
    "tool_results.elided",
    "compaction.reverted",
    "compaction.proposed",
    "compaction.declined",
}


def _event_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in _KNOWN else "other"


CompactionEvent = Annotated[
    Annotated[CompletedEvent, Tag("compaction.completed")]
    | Annotated[SkippedEvent, Tag("compaction.skipped")]
    | Annotated[FailedEvent, Tag("compaction.failed")]
    | Annotated[RejectedEvent, Tag("compaction.rejected")]
    | Annotated[ElidedEvent, Tag("tool_results.elided")]
    | Annotated[RevertedEvent, Tag("compaction.reverted")]
    | Annotated[ProposedEvent, Tag("compaction.proposed")]
    | Annotated[DeclinedEvent, Tag("compaction.declined")]
    | Annotated[OtherEvent, Tag("other")],
    Discriminator(_event_kind),
]
# The eight types this version publishes, discriminated by ``type`` (the JSON Schema of "an event"
# is made from it; readers use :data:`CompactionEvent`, which also keeps unknown types).
PublishedEvent = Annotated[
    CompletedEvent
    | SkippedEvent
    | FailedEvent
    | RejectedEvent
    | ElidedEvent
    | RevertedEvent
    | ProposedEvent
    | DeclinedEvent,
    Field(discriminator="type"),
]
# A revision's outcome: a held compaction (proposed) is its revision's outcome too.
OUTCOME_TYPES = frozenset(
    {
        "compaction.completed",
        "compaction.skipped",
        "compaction.failed",
        "compaction.rejected",
        "compaction.proposed",
    }
)
EVENT_ADAPTER: TypeAdapter[CompactionEvent] = TypeAdapter(CompactionEvent)


def parse_event(data: dict[str, Any] | str | bytes) -> CompactionEvent:
    """An event from its JSON (or a decoded dict), tolerantly: a line printed by
    ``compactor events`` (which adds ``stream_id``) reads as the event it shows."""
    if isinstance(data, dict):
        return EVENT_ADAPTER.validate_python(data)
    return EVENT_ADAPTER.validate_json(data)


def event_id_for(conversation_id: str, revision: int, kind: str, *parts: object) -> str:
    """Deterministic, so a redelivered task re-creates the same event, not a second one."""
    key = canonical_json([conversation_id, revision, kind, *map(str, parts)])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


# --- constructors ---------------------------------------------------------------------------


# The reason of the skip a conversation gets while a compaction of it awaits review.
HELD_REASON = "a compaction of this conversation awaits review (compaction.proposed)"


def skipped_event(
    conversation_id: str,
    revision: int,
    now: datetime,
    *,
    why: str,
    reason: str,
    trigger: Trigger | None,
    cost: Cost | None = None,
    floor: Floor | None = None,
) -> SkippedEvent:
    """``why`` tells apart skips of the same revision (it is part of the event id)."""
    return SkippedEvent(
        event_id=event_id_for(conversation_id, revision, "compaction.skipped", why),
        conversation_id=conversation_id,
        revision=revision,
        created_at=now,
        trigger=trigger,
        reason=reason,
        cost=cost,
        why=why,
        floor=floor,
    )


def failed_event(
    conversation_id: str,
    revision: int,
    now: datetime,
    *,
    code: str,
    message: str,
    trigger: Trigger | None = None,
) -> FailedEvent:
    return FailedEvent(
        event_id=event_id_for(conversation_id, revision, "compaction.failed", code),
        conversation_id=conversation_id,
        revision=revision,
        created_at=now,
        trigger=trigger,
        reason=message,
        error=EventError(code=code, message=message),
    )


def rejected_event(
    conversation_id: str,
    revision: int,
    now: datetime,
    *,
    code: str,
    field: str,
    reason: str,
    message: str,
) -> RejectedEvent:
    return RejectedEvent(
        event_id=event_id_for(conversation_id, revision, "compaction.rejected", field, reason),
        conversation_id=conversation_id,
        revision=revision,
        created_at=now,
        reason=message,
        error=EventError(code=code, message=reason, field=field or None),
    )


def elided_event(
    conversation_id: str, revision: int, now: datetime, *, elided: list[ElidedResult]
) -> ElidedEvent:
    return ElidedEvent(
        event_id=event_id_for(conversation_id, revision, "tool_results.elided", len(elided)),
        conversation_id=conversation_id,
        revision=revision,
        created_at=now,
        elided=elided,
    )


def completed_event(
    conversation_id: str,
    revision: int,
    now: datetime,
    *,
    event_id: str,
    trigger: Trigger,
    compaction: Compaction,
    cost: Cost | None = None,
) -> CompletedEvent:
    return CompletedEvent(
        event_id=event_id,
        conversation_id=conversation_id,
        revision=revision,
        created_at=now,
        trigger=trigger,
        compaction=compaction,
        cost=cost,
    )


def reverted_event(
    conversation_id: str,
    revision: int,
    now: datetime,
    *,
    reverted_event_id: str,
    reason: str | None = None,
) -> RevertedEvent:
    """``revision``: the reverted compaction's. A compaction is reverted at most once (it is no
    longer the newest afterwards), so its id alone tells the revert apart."""
    return RevertedEvent(
        event_id=event_id_for(conversation_id, revision, "compaction.reverted", reverted_event_id),
        conversation_id=conversation_id,
        revision=revision,
        created_at=now,
        reverted_event_id=reverted_event_id,
        reason=reason,
    )


def proposed_event(completed: CompletedEvent) -> ProposedEvent:
    """The completed event ``completed`` held for review: the same id, revision and proposal."""
    return ProposedEvent(
        event_id=completed.event_id,
        conversation_id=completed.conversation_id,
        revision=completed.revision,
        created_at=completed.created_at,
        trigger=completed.trigger,
        compaction=completed.compaction,
        cost=completed.cost,
    )


def approved_event(
    proposal: ProposedEvent, now: datetime, *, by: str, summary: Summary | None = None
) -> CompletedEvent:
    """The completed event of an approved proposal; with ``summary`` (an edit, checked), its
    text replaces the proposed one in the replacement's summary message as well. The id is
    derived from the proposal's, so an approval is published once."""
    compaction = proposal.compaction
    if summary is not None:
        compaction = with_summary(compaction, summary)
    return CompletedEvent(
        event_id=event_id_for(
            proposal.conversation_id, proposal.revision, "compaction.approved", proposal.event_id
        ),
        conversation_id=proposal.conversation_id,
        revision=proposal.revision,
        created_at=now,
        trigger=proposal.trigger,
        compaction=compaction,
        proposal_event_id=proposal.event_id,
        approved_by=by,
        cost=proposal.cost,
    )


def with_summary(compaction: Compaction, summary: Summary) -> Compaction:
    """``compaction`` with ``summary`` in place of its own, in the event and in the
    replacement's summary message (the last one, whose text content is the summary's)."""
    replacement = [*compaction.replacement]
    replacement[-1] = replace_text(replacement[-1], compaction.summary.text, summary.text)
    return compaction.model_copy(update={"summary": summary, "replacement": replacement})


def replace_text(message: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """``message`` (any wire format) with every text equal to ``old`` replaced by ``new``: the
    summary message holds the summary as its ``content`` string or as one text part."""

    def swap(value: Any) -> Any:
        if value == old:
            return new
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    out: dict[str, Any] = swap(message)
    return out


def declined_event(
    proposal: ProposedEvent, now: datetime, *, by: str, reason: str | None
) -> DeclinedEvent:
    return DeclinedEvent(
        event_id=event_id_for(
            proposal.conversation_id, proposal.revision, "compaction.declined", proposal.event_id
        ),
        conversation_id=proposal.conversation_id,
        revision=proposal.revision,
        created_at=now,
        proposal_event_id=proposal.event_id,
        reason=reason,
        declined_by=by,
    )
