"""Reading a snapshot: bytes in, a validated :class:`ParsedSnapshot` out, or InvalidSnapshot.

Everything a submitter controls is checked here, once, before any work or any write: size,
JSON syntax and depth, text encoding, the schema, the conversation id (it becomes part of
storage paths), message roles and tool-call pairing, and which settings a snapshot may override.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from worker.config import CompactionConfig, Settings
from worker.errors import ConfigError, InvalidSnapshot
from worker.wire import formats
from worker.wire.media import MediaRules
from worker.wire.models import (
    CONVERSATION_ID_RULE,
    Message,
    Snapshot,
    WireFormat,
    canonical_json,
)

# Operator-only settings: a snapshot must not move transcripts, raise limits or change retention.
OPERATOR_ONLY = frozenset(
    {
        "transcript_dir",
        "max_snapshot_bytes",
        "max_messages",
        "max_persisted_transcripts",
        "review_tenants",
    }
)
# json's C parser raises RecursionError on absurd nesting (~1,000 levels), reported as such.
# Cost bounds a snapshot may lower but never raise.
LOWER_ONLY = frozenset({"summary_max_input_chars", "summary_max_output_tokens"})
MAX_JSON_DEPTH = 1000


@dataclass(frozen=True)
class ParsedSnapshot:
    snapshot: Snapshot
    messages: list[Message]
    source_ids: list[str]
    settings: Settings
    plain: list[bool | None]  # per wire message (formats.identify)
    pairing: formats.Pairing  # the tool calls of ``messages``, for the next parse to continue
    # Made on first use by ``message_json`` (most evaluations compact nothing and never use it).
    _message_json: list[str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def conversation_id(self) -> str:
        return self.snapshot.conversation_id

    @property
    def revision(self) -> int:
        return self.snapshot.revision

    @property
    def message_json(self) -> list[str]:
        """Each wire message's canonical JSON, made once: a compaction's range digest and its
        transcript both serialize the messages. (Not a ``functools.cached_property``: on Python
        3.11 that holds one lock for every instance while it computes, and compactions run on a
        threads pool; two threads that race here both store the same list.)"""
        if self._message_json is None:
            made = [canonical_json(raw) for raw in self.snapshot.messages]
            object.__setattr__(self, "_message_json", made)  # frozen: set once, as a cache
            return made
        return self._message_json


def decode_json(data: bytes | str, *, max_bytes: int) -> Any:
    """Bytes -> JSON value, refusing oversize, invalid UTF-8, lone surrogates and deep nesting."""
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    if size > max_bytes:
        raise InvalidSnapshot("", f"snapshot is {size} bytes; the limit is {max_bytes}")
    fast = _fast_loads(data)
    if fast is not _DECLINED:
        return fast
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise InvalidSnapshot("", f"not valid UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except InvalidSnapshot:
        raise
    except json.JSONDecodeError as exc:
        raise InvalidSnapshot(
            "", f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:  # json's C parser refuses absurd nesting (about 1,000 levels)
        raise InvalidSnapshot("", "JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise InvalidSnapshot("", f"malformed JSON: {exc}") from None
    return value


def _refuse_constant(name: str) -> Any:
    raise InvalidSnapshot("", f"{name} is not valid JSON (only finite numbers are)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidSnapshot("", f"number {text[:40]} is out of range (not a finite double)")
    return value


def encode_json(value: Mapping[str, Any]) -> bytes:
    """A snapshot given as Python data -> its UTF-8 JSON, or InvalidSnapshot naming the first
    field that JSON cannot carry exactly (a lone surrogate, bytes, NaN or infinity, a key that
    is not a string)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError):
        field, reason = _json_problem(value)
        raise InvalidSnapshot(field, reason) from None


def _encodable_with_message_json(data: Mapping[str, Any]) -> list[str] | None:
    """What :func:`encode_json` checks of a snapshot given as Python data, its messages
    checked by making their canonical JSON (which a compaction then needs, for its range
    digest and its transcript: a second serialization saved). The messages' JSON, or None
    when they are not a list or a check failed (then :func:`encode_json` raises what it
    raises, or, for what it allows and canonical JSON does not, the messages are made later
    as before)."""
    messages = data.get("messages")
    if isinstance(messages, list):
        try:
            made = [canonical_json(raw, finite=True) for raw in messages]
            for text in made:
                text.encode("utf-8")  # a lone surrogate raises, as in encode_json
            encode_json({key: value for key, value in data.items() if key != "messages"})
            return made
        except (TypeError, ValueError, UnicodeEncodeError, RecursionError, InvalidSnapshot):
            pass
    encode_json(data)
    return None


def _json_problem(value: Any) -> tuple[str, str]:
    """Where and why ``value`` is not exact JSON (a loop, not recursion: no depth limit)."""
    pending: list[tuple[str, Any, int]] = [("", value, 0)]
    while pending:
        path, item, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            return path, "nested too deeply"
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return path, "text contains a lone UTF-16 surrogate (not valid Unicode)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path, f"{item} is not valid JSON (only finite numbers are)"
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return path, f"key {key!r} is not a string"
                pending.append((f"{path}.{key}" if path else key, child, depth + 1))
        elif isinstance(item, list | tuple):
            pending.extend((f"{path}[{i}]", child, depth + 1) for i, child in enumerate(item))
        elif not (item is None or isinstance(item, bool | int)):
            return path, f"a {type(item).__name__} is not a JSON value"
    return "", "not JSON"


# orjson parses snapshot bytes about three times faster than json. Where the two could differ,
# the text goes to json, so the values and the errors are always json's:
# - orjson reads an integer of 19 digits or more as a float (json keeps it an int); the digit
#   check also fires inside strings, and those snapshots merely take the slower parser;
# - orjson refuses what json accepts beyond RFC 8259 (NaN, Infinity, 1e400, lone surrogate
#   escapes);
# - orjson reads nesting up to 1,024 levels, json up to about 990 depending on the stack. Nesting
#   is at most the number of opening brackets; beyond 254 of them, orjson's serializer (which
#   refuses more than 254 levels) tells whether the value is shallow enough for json too.
# One C pass finds both: digits become "0", opening brackets "[", every other byte a space (a
# regular expression for 19 digits costs ten times more).
_SHAPE = bytes(
    0x30 if 0x30 <= b <= 0x39 else 0x5B if b in (0x5B, 0x7B) else 0x20 for b in range(256)
)
_LONG_INTEGER = b"0" * 19
_SURELY_SHALLOW_BRACKETS = 254
_DECLINED = object()


def _fast_loads(data: bytes | str) -> Any:
    """The value orjson reads, or _DECLINED where json must decide (text input: always)."""
    if not isinstance(data, bytes):
        return _DECLINED
    shape = data.translate(_SHAPE)
    if _LONG_INTEGER in shape:
        return _DECLINED
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return _DECLINED  # json decides, and names the problem
    if shape.count(b"[") > _SURELY_SHALLOW_BRACKETS:
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:
            return _DECLINED
    return value


def parse_snapshot(
    data: bytes | str | Mapping[str, Any],
    settings: Settings,
    *,
    earlier: ParsedSnapshot | None = None,
) -> ParsedSnapshot:
    """Validate a snapshot completely; raise InvalidSnapshot naming the field and the reason.

    ``earlier``: a snapshot of the same conversation parsed before; the messages this one
    shares with it from the start are reused instead of normalized again (the result is the
    same either way)."""
    limits = settings.compaction
    value = (
        data
        if isinstance(data, Mapping)
        else decode_json(data, max_bytes=limits.max_snapshot_bytes)
    )
    if not isinstance(value, Mapping):
        raise InvalidSnapshot("", "a snapshot must be a JSON object")
    message_json = None
    if isinstance(data, Mapping):
        message_json = _encodable_with_message_json(data)
    elif _may_hold_surrogate(data):
        _check_text_encodable(value)
    try:
        snapshot = Snapshot.model_validate(value)
    except ValidationError as exc:
        raise _snapshot_error(exc) from None
    if len(snapshot.messages) > limits.max_messages:
        raise InvalidSnapshot(
            "messages", f"{len(snapshot.messages)} messages; the limit is {limits.max_messages}"
        )
    if snapshot.usage is not None and snapshot.usage.message_count > len(snapshot.messages):
        raise InvalidSnapshot(
            "usage.message_count",
            f"the last request held {snapshot.usage.message_count} messages, but the snapshot "
            f"has only {len(snapshot.messages)}: usage must describe a prefix of messages",
        )
    effective = effective_settings(settings, snapshot.config, snapshot.tools)
    prior = _prior(earlier, snapshot, effective)
    ids, plain = formats.identify(snapshot.messages, prior)
    messages, pairing = formats.normalize(
        snapshot.format,
        snapshot.messages,
        system=snapshot.system,
        ids=ids,
        prior=prior,
        media=media_rules(snapshot.format, effective.compaction),
    )
    messages = _pinned(messages, ids, snapshot.pinned)
    parsed = ParsedSnapshot(
        snapshot=snapshot,
        messages=messages,
        source_ids=ids,
        settings=effective,
        plain=plain,
        pairing=pairing,
    )
    if message_json is not None:
        object.__setattr__(parsed, "_message_json", message_json)  # as ``message_json`` does
    return parsed


def _pinned(messages: list[Message], ids: list[str], pinned: list[str]) -> list[Message]:
    """``messages`` with those of the pinned wire messages marked (and no other); each pinned
    id must be a message's (``pinned[k]`` names the one that is not). Only messages whose mark
    changes are copied."""
    wanted: set[int] = set()
    if pinned:
        where = {mid: index for index, mid in enumerate(ids)}
        for k, mid in enumerate(pinned):
            if mid not in where:
                raise InvalidSnapshot(f"pinned[{k}]", f"no message has the id {mid!r}")
            wanted.add(where[mid])
    out = messages
    for i, m in enumerate(messages):
        mark = m.source_index in wanted
        if m.pinned != mark:
            if out is messages:
                out = list(messages)
            out[i] = m.model_copy(update={"pinned": mark})
    return out


def media_rules(fmt: WireFormat, config: CompactionConfig) -> MediaRules:
    """How the snapshot's images and files are counted, under its settings."""
    return formats.media_rules(
        fmt,
        width=config.image_default_width,
        height=config.image_default_height,
        file_tokens=config.file_part_tokens,
    )


def _media_settings(config: CompactionConfig) -> tuple[int, int, int]:
    return (config.image_default_width, config.image_default_height, config.file_part_tokens)


def _prior(
    earlier: ParsedSnapshot | None, snapshot: Snapshot, effective: Settings
) -> formats.Prior | None:
    """What ``snapshot`` may reuse of an earlier parse of its conversation."""
    if (
        earlier is None
        or earlier.conversation_id != snapshot.conversation_id
        or earlier.snapshot.format != snapshot.format
        or earlier.snapshot.system != snapshot.system
        or _media_settings(earlier.settings.compaction) != _media_settings(effective.compaction)
    ):
        return None
    return formats.Prior(
        ids=earlier.source_ids,
        plain=earlier.plain,
        messages=earlier.messages,
        equal=formats.equal_prefix(earlier.snapshot.messages, snapshot.messages),
        pairing=earlier.pairing,
    )


# Decoded JSON can only hold a lone surrogate that came as a \uD800-\uDFFF escape (strict
# UTF-8 decoding refuses encoded ones) or, in str input, as the character itself. Text with
# neither skips the full check: a second serialization of the whole snapshot.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_IN_STR = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


def _may_hold_surrogate(data: bytes | str) -> bool:
    if isinstance(data, bytes):
        return _SURROGATE_ESCAPE.search(data) is not None
    return _SURROGATE_IN_STR.search(data) is not None


def _check_text_encodable(value: Mapping[str, Any]) -> None:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSnapshot(
            "", "text contains a lone UTF-16 surrogate (not valid Unicode)"
        ) from None
    except RecursionError:
        raise InvalidSnapshot("", "JSON nested too deeply") from None
    except (TypeError, ValueError) as exc:  # a Mapping from Python: a cycle, a non-JSON value
        raise InvalidSnapshot("", f"not JSON: {exc}") from None


def effective_settings(
    settings: Settings, config: Mapping[str, Any], tools: Mapping[str, Any]
) -> Settings:
    """``settings`` with a submitter's ``config`` and ``tools`` overrides (a snapshot's, or a
    compaction request's) applied, as far as a submitter may override them
    (docs/snapshot.md, "What a snapshot may override"); InvalidSnapshot naming the key
    otherwise."""
    denied = OPERATOR_ONLY & set(config)
    if denied:
        raise InvalidSnapshot(f"config.{sorted(denied)[0]}", "only the operator may set this")
    try:
        effective = settings.with_overrides(config, tools)
    except ConfigError as exc:
        raise InvalidSnapshot(exc.key, exc.reason) from None
    # Compared after validation, as the numbers the service will use: "999999", 999999.0 and
    # 999999 are one value to the settings model, and each must be refused alike.
    for key in sorted(LOWER_ONLY):
        limit = getattr(settings.compaction, key)
        if getattr(effective.compaction, key) > limit:
            reason = f"may only lower the operator's limit of {limit}"
            raise InvalidSnapshot(f"config.{key}", reason)
    if settings.compaction.review and not effective.compaction.review:
        # The operator's hold is not the agent's to lift; a snapshot may only ask for it.
        raise InvalidSnapshot("config.review", "may only turn review on, not off")
    return effective


def _snapshot_error(exc: ValidationError) -> InvalidSnapshot:
    first = exc.errors()[0]
    field = ""
    for part in first["loc"]:
        field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
    reason = first["msg"]
    if first["type"] == "extra_forbidden":
        reason = "unknown field"
    elif first["type"] == "missing":
        reason = "required field is missing"
    elif first["type"] == "string_pattern_mismatch" and field == "conversation_id":
        reason = CONVERSATION_ID_RULE
    return InvalidSnapshot(field, reason)
