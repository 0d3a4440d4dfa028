"""Wire formats: agents' messages <-> the internal :class:`~worker.wire.models.Message` model.

One module per format (``openai``, ``anthropic``, ``responses``). Each offers the same functions,
dispatched here: ``system_messages``, ``reusable`` and ``wire_message`` (validate and normalize:
``to_messages``), ``render`` (internal -> wire, for replacements),
``text_message`` and ``replace_tool_results`` (the projected request, edited in the agent's own
wire format so that everything we do not understand, such as images, passes through untouched).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from worker.errors import InvalidSnapshot
from worker.wire.formats import anthropic, openai, responses
from worker.wire.media import MediaRules, Provider
from worker.wire.models import (
    Message,
    WireFormat,
    derived_message_id,
    is_plain_json,
)

_MODULES = {"openai": openai, "anthropic": anthropic, "responses": responses}
MAX_ID_CHARS = 256


@dataclass(frozen=True)
class Pairing:
    """What the tool-pairing check knows after a list of messages: each call's tool by call id,
    and the call ids a result has answered. Filled while a parse checks its messages, never
    changed after: a grown snapshot whose parse reuses every earlier message continues from a
    copy."""

    calls: dict[str, str]
    answered: set[str]


@dataclass(frozen=True)
class Prior:
    """An earlier parse of the same conversation, with the same format and system prompt, whose
    first ``equal`` wire messages equal (``==``) these: what may be reused from it."""

    ids: list[str]
    plain: list[bool | None]  # per wire message: no number or boolean (None: has its own id)
    messages: list[Message]
    equal: int
    pairing: Pairing | None = None  # of ``messages``


def equal_prefix(earlier: list[dict[str, Any]], raw_messages: list[dict[str, Any]]) -> int:
    count = 0
    for old, new in zip(earlier, raw_messages, strict=False):
        if old != new:
            break
        count += 1
    return count


def source_ids(raw_messages: list[dict[str, Any]]) -> list[str]:
    """Each wire message's id: its own ``id`` when it has one, else a stable derived id."""
    return identify(raw_messages)[0]


def identify(
    raw_messages: list[dict[str, Any]], prior: Prior | None = None
) -> tuple[list[str], list[bool | None]]:
    """Each wire message's id, and for a message without its own id whether it is plain (holds
    no number or boolean; None for the others).

    A derived id hashes the message's JSON, where 1, 1.0 and true differ though Python's ``==``
    holds them equal; so only a plain message equal to the prior one reuses its derived id.
    Plainness is found out along with the hash (a walk costs a sixth of hashing) and carried
    along with the ids."""
    ids, plain = _prior_ids(raw_messages, prior)
    seen = set(ids)
    if len(seen) < len(ids):  # a recomputed id collides: the full walk names the duplicate
        ids, plain, seen = [], [], set()
    for index in range(len(ids), len(raw_messages)):
        raw = raw_messages[index]
        if not isinstance(raw, dict):
            raise InvalidSnapshot(f"messages[{index}]", "must be an object")
        own = raw.get("id")
        if own is not None and (not isinstance(own, str) or not own or len(own) > MAX_ID_CHARS):
            raise InvalidSnapshot(
                f"messages[{index}].id", f"must be a string of 1-{MAX_ID_CHARS} characters"
            )
        is_plain: bool | None = None
        if own is not None:
            mid = own
        else:
            mid, is_plain = derived_message_id(index, raw), is_plain_json(raw)
        if mid in seen:
            raise InvalidSnapshot(f"messages[{index}].id", f"duplicate message id {mid!r}")
        seen.add(mid)
        ids.append(mid)
        plain.append(is_plain)
    return ids, plain


def _prior_ids(
    raw_messages: list[dict[str, Any]], prior: Prior | None
) -> tuple[list[str], list[bool | None]]:
    """The ids and plainness of the leading messages equal to the prior parse's, which checked
    them: their own ids, and their derived ids where the message is plain; a derived id of a
    message that is not plain is computed again (its JSON may differ though ``==`` holds)."""
    if prior is None or not prior.equal:
        return [], []
    ids, plain = prior.ids[: prior.equal], prior.plain[: prior.equal]
    if False in plain:
        for index, is_plain in enumerate(plain):
            if is_plain is False:
                ids[index] = derived_message_id(index, raw_messages[index])
    return ids, plain


def provider_of(fmt: WireFormat) -> Provider:
    """Whose image rule a format's images are counted by."""
    return "anthropic" if fmt == "anthropic" else "openai"


def media_rules(
    fmt: WireFormat, *, width: int = 1024, height: int = 1024, file_tokens: int = 1500
) -> MediaRules:
    return MediaRules(
        provider=provider_of(fmt),
        default_width=width,
        default_height=height,
        file_tokens=file_tokens,
    )


def to_messages(
    fmt: WireFormat,
    raw_messages: list[dict[str, Any]],
    *,
    system: Any = None,
    ids: list[str] | None = None,
    prior: Prior | None = None,
    media: MediaRules | None = None,
) -> list[Message]:
    """Validate and normalize; ``ids`` are the wire messages' ids when already computed.

    With a ``prior`` parse, each of its first ``equal`` wire messages that has the same id and
    is of a kind for which equal means the same normalized message is reused, not normalized
    again (the prior parse must have counted attachments by the same ``media`` rules).
    ``media``: how images and files are counted (default: the format's provider, 1024×1024
    for an image by reference, 1500 tokens per file)."""
    return normalize(fmt, raw_messages, system=system, ids=ids, prior=prior, media=media)[0]


def normalize(
    fmt: WireFormat,
    raw_messages: list[dict[str, Any]],
    *,
    system: Any = None,
    ids: list[str] | None = None,
    prior: Prior | None = None,
    media: MediaRules | None = None,
) -> tuple[list[Message], Pairing]:
    """:func:`to_messages`, with the pairing its check ended with (for the next parse)."""
    ids = source_ids(raw_messages) if ids is None else ids
    rules = media if media is not None else media_rules(fmt)
    module = _MODULES[fmt]
    start = _reusable_run(module, raw_messages, ids, prior)
    if prior is not None and start:
        # The leading run is taken whole: prior.messages are in source order, the top-level
        # system's (source_index -1) first.
        cut = bisect.bisect_left(prior.messages, start, key=lambda m: m.source_index)
        out = prior.messages[:cut]
    else:
        cut, out = 0, module.system_messages(system)
    if prior is not None and prior.pairing is not None and cut == len(prior.messages):
        # Every earlier message is reused, and was checked: only the new ones are.
        pairing = Pairing(dict(prior.pairing.calls), set(prior.pairing.answered))
        names, checked = dict(pairing.calls), cut
    else:
        pairing = Pairing({}, set())
        names, checked = {c.id: c.name for m in out for c in m.tool_calls}, 0
    reuse = _reusable_after(prior, cut)
    for index in range(start, len(raw_messages)):
        raw = raw_messages[index]
        if (
            index in reuse
            and prior is not None
            and ids[index] == prior.ids[index]
            and module.reusable(raw)
        ):
            normalized = reuse[index]
        else:
            normalized = module.wire_message(index, raw, ids[index], names, rules)
        for message in normalized:
            if message.tool_calls:
                names.update((c.id, c.name) for c in message.tool_calls)
            out.append(message)
    _continue_pairing(out[checked:], pairing)
    link = getattr(module, "link", None)
    if link is not None:  # pairs across wire messages (Anthropic's server tools, pause_turn)
        out = link(raw_messages, out, start)
    return supersede(out), pairing


def supersede(messages: list[Message]) -> list[Message]:
    """``messages`` with every message before the newest provider-native compaction marked
    ``superseded`` (the provider reads nothing before it; docs/native-compaction.md), and no
    other. System messages are never superseded: the system prompt goes with every request.
    Only messages whose mark changes are copied, so a grown snapshot's reused messages stay the
    very same objects."""
    boundary = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].native_compaction), -1
    )
    source = messages[boundary].source_index if boundary >= 0 else None
    out = messages
    for i, m in enumerate(messages):
        wanted = i < boundary and m.source_index != source and m.role != "system"
        if m.superseded != wanted:
            if out is messages:
                out = list(messages)
            out[i] = m.model_copy(update={"superseded": wanted})
    return out


def _reusable_run(
    module: Any, raw_messages: list[dict[str, Any]], ids: list[str], prior: Prior | None
) -> int:
    """How many leading wire messages reuse the prior parse's messages as they are."""
    if prior is None or not prior.equal:
        return 0
    equal = prior.equal
    if ids[:equal] == prior.ids[:equal] and all(map(module.reusable, raw_messages[:equal])):
        return equal
    run = 0
    while run < equal and ids[run] == prior.ids[run] and module.reusable(raw_messages[run]):
        run += 1
    return run


def _reusable_after(prior: Prior | None, cut: int) -> dict[int, list[Message]]:
    """The prior parse's normalized messages from position ``cut`` on that belong to its equal
    wire messages, by wire index: reused one by one after the leading run breaks."""
    reuse: dict[int, list[Message]] = {}
    if prior is None:
        return reuse
    for m in prior.messages[cut:]:  # in source order
        if m.source_index >= prior.equal:
            break
        reuse.setdefault(m.source_index, []).append(m)
    return reuse


def check_tool_pairing(messages: list[Message]) -> None:
    """Every tool result answers an earlier call, once; every call id is unique."""
    _continue_pairing(messages, Pairing({}, set()))


def _continue_pairing(messages: list[Message], pairing: Pairing) -> None:
    """Check ``messages`` as coming after those ``pairing`` has seen, recording them in it."""
    calls, answered = pairing.calls, pairing.answered
    for m in messages:
        for call in m.tool_calls:
            if call.id in calls:
                raise InvalidSnapshot(_where(m), f"duplicate tool call id {call.id!r}")
            calls[call.id] = call.name
        if m.role == "tool":
            cid = m.tool_call_id or ""
            if cid not in calls:
                raise InvalidSnapshot(
                    _where(m), f"tool result {cid!r} answers no earlier tool call"
                )
            if cid in answered:
                raise InvalidSnapshot(_where(m), f"second result for tool call {cid!r}")
            answered.add(cid)


def _where(m: Message) -> str:
    return f"messages[{m.source_index}]" if m.source_index >= 0 else "system"


def render(
    fmt: WireFormat,
    messages: list[Message],
    *,
    with_ids: bool,
    source: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Wire messages for ``messages`` (carried into a replacement). ``source``: the wire
    messages their ``source_index`` points into; every format copies from it what it cannot
    rebuild: an unchanged message (or block, or item) as it was, images and all, and the
    images and files of a changed user turn."""
    rendered: list[dict[str, Any]] = _MODULES[fmt].render(
        messages, with_ids=with_ids, source=source
    )
    return rendered


def opens_with_user(fmt: WireFormat) -> bool:
    """Whether the format's API refuses a history that does not open with a user turn."""
    return bool(_MODULES[fmt].OPENS_WITH_USER)


def text_message(fmt: WireFormat, role: str, text: str, *, msg_id: str | None) -> dict[str, Any]:
    out: dict[str, Any] = _MODULES[fmt].text_message(role, text, msg_id=msg_id)
    return out


def replace_tool_results(
    fmt: WireFormat, raw_messages: list[dict[str, Any]], bodies: dict[str, str]
) -> list[dict[str, Any]]:
    """Copies of ``raw_messages`` with the results of the given call ids replaced by new text."""
    out: list[dict[str, Any]] = _MODULES[fmt].replace_tool_results(raw_messages, bodies)
    return out
