"""A compaction on demand: what ``POST /v1/conversations/{id}/compact``, ``Client.compact_now``,
``CompactingSession.compact`` and ``compactor compact-now`` ask of the workers.

A request compacts the conversation's newest snapshot whatever the threshold says. It may
carry ``instructions`` (the user's focus for the summary: bounded user text, which reaches the
summarizer and never an event: events carry its SHA-256) and overrides of what to keep, the
same ``config`` / ``tools`` overrides a snapshot may carry (docs/snapshot.md), applied over the
snapshot's own. What users send is read strictly: an unknown field, a wrong type or an
instruction over :data:`MAX_INSTRUCTIONS_CHARS` is refused with the field named.

:func:`user_text` is the same check for every other text a person sends the service to be
stored or published (a reviewer's edited summary, a reason): no control characters, no lone
surrogates.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.config import Settings
from worker.errors import InvalidRequest, InvalidSnapshot
from worker.wire.snapshots import effective_settings

__all__ = [
    "MAX_INSTRUCTIONS_CHARS",
    "REQUESTED_TRIGGER",
    "CompactRequest",
    "compact_request",
    "new_request_id",
    "user_text",
]

MAX_INSTRUCTIONS_CHARS = 2000
# The trigger kind of a compaction someone asked for (events' ``trigger.kind``).
REQUESTED_TRIGGER = "requested"
REQUEST_ID_PATTERN = r"^[0-9a-f]{32}$"
# Control characters other than tab and line breaks (C0, DEL and C1) have no place in an
# instruction to a model, a summary or a reason: a terminal or a log reader would act on them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class CompactRequest(BaseModel):
    """One request, as stored for the workers (``cw:{conv}:requested``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    instructions: str | None = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)
    config: dict[str, Any] = Field(default_factory=dict)
    tools: dict[str, Any] = Field(default_factory=dict)

    @property
    def instructions_sha256(self) -> str | None:
        """What events record of the instructions: their hash, never their text."""
        if self.instructions is None:
            return None
        return hashlib.sha256(self.instructions.encode("utf-8")).hexdigest()

    def to_json(self) -> str:
        return self.model_dump_json()


def new_request_id() -> str:
    return uuid.uuid4().hex


def compact_request(
    settings: Settings,
    *,
    instructions: Any = None,
    config: Any = None,
    tools: Any = None,
    request_id: str | None = None,
) -> CompactRequest:
    """A request from what a user sent, checked strictly: ``instructions`` a string of at most
    :data:`MAX_INSTRUCTIONS_CHARS` characters (blank: none), ``config`` / ``tools`` overrides a
    snapshot could carry, validated against ``settings`` as the worker will apply them.
    :class:`InvalidRequest` names the field otherwise."""
    text = _instructions(instructions)
    overrides = {"config": config, "tools": tools}
    for name, value in overrides.items():
        if value is not None and not isinstance(value, Mapping):
            raise InvalidRequest(name, "must be an object")
    config_map = dict(config or {})
    tools_map = dict(tools or {})
    try:
        effective_settings(settings, config_map, tools_map)
    except InvalidSnapshot as exc:
        raise InvalidRequest(exc.field, exc.reason) from None
    try:
        return CompactRequest(
            request_id=request_id or new_request_id(),
            instructions=text,
            config=config_map,
            tools=tools_map,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise InvalidRequest(field, first["msg"]) from None


def _instructions(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest("instructions", "must be a string")
    if len(value) > MAX_INSTRUCTIONS_CHARS:
        raise InvalidRequest(
            "instructions",
            f"at most {MAX_INSTRUCTIONS_CHARS} characters (got {len(value)})",
        )
    return user_text("instructions", value).strip() or None


def user_text(field: str, value: str) -> str:
    """``value`` when it is text a person may send: :class:`InvalidRequest` naming ``field``
    when it holds a control character other than tab, CR and LF (C0, DEL, C1) or a lone UTF-16
    surrogate (JSON's ``\\ud800`` escape carries one; no UTF-8 encoder takes it)."""
    found = _CONTROL.search(value)
    if found:
        code = f"U+{ord(found.group()):04X}"
        raise InvalidRequest(field, f"must not contain control characters ({code})")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(
            field, "contains a lone UTF-16 surrogate (not valid Unicode)"
        ) from None
    return value
