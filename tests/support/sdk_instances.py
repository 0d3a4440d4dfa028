"""One instance of every type the installed ``anthropic`` and ``openai`` SDKs define for what an
agent sends back, built from the SDKs' own type definitions (tests/integration/test_sdk_types.py).

The unions walked (:data:`FAMILIES`): Anthropic's content blocks (``ContentBlockParam``, the
beta ``BetaContentBlockParam`` with the response blocks it takes back, the blocks a
``tool_result`` holds, the sources of an image and a document), the Chat Completions messages
(one per ``role``), their content parts (per role: the ``content`` union of each role's
message) and tool calls, and the Responses input items (``ResponseInputItemParam``) with the
content parts of their messages and outputs. A member's type string is its ``type`` Literal (a
chat message's ``role`` Literal). An SDK that adds a member adds a case; the tests name it by
that string.

:class:`Builder` walks a TypedDict (or a pydantic model: the beta union takes response blocks)
through ``typing.get_type_hints(include_extras=True)``: Required/NotRequired, ``total=False``,
Optional and Union (the first member that can be built), Literal (its first value),
Iterable/List/Sequence (one element), Dict/Mapping (one entry), nested TypedDicts, Annotated
(a ``PropertyInfo`` alias names the wire key), type aliases and forward references. Every key
is filled, optional ones too, so that every opaque field is exercised; a TypedDict met again
inside itself cannot be built there (the recursion guard), so the union or list around it
takes its next choice.

The opaque rule. A string under a key that ``worker.wire.formats.common.is_opaque_field``
names (``encrypted_content``, ``signature``, ``data``, ``file_data``, ``encrypted_index``,
``image_url``, ``id`` and every ``*_id``), at any depth below it (an ``image_url`` object's
``url``), is a unique marker ``OPAQUE-<type>-<field>-<n>`` (``<type>``: the enclosing type's
``type`` Literal; letters, digits, ``_`` and ``-`` only, so it reads the same in any JSON and
in a log line). Every other string is readable words. Two exceptions, where the formats may
publish the value:

- a plain-text document source's ``data`` (its ``media_type`` is ``text/plain``) is the
  document's text: readable words, summarized like any text;
- *structural* markers: a wire message's own top-level ``id`` (the message id an event names:
  ``first_id``, ``last_id``, ``source_ids``, ``preserved_ids``) and a value that pairs a call
  with its result (a ``tool_use``'s ``id`` and its result's ``tool_use_id``, a ``call_id``, a
  chat tool call's ``id`` and ``tool_call_id``, an MCP approval's request ``id``). They may
  appear in an event, its summary included (a summary names an image or a file by its
  message's id), and in what the summarizer is sent (its prompt pairs calls and results by
  id); never in a log.

Every other marker is *secret*: it is carried byte for byte with its block or item, or gone
with it, and never appears in a summary, an event (outside the replacement's carried blocks
and items), a request to the summarizing model or a log.

The fix-ups the types cannot tell (:func:`unit`): which role an Anthropic block belongs to,
pairing (a result names its call, a Responses output its call, an MCP approval response its
request), and the provider boundaries (an Anthropic ``compaction`` block with content, a
Responses ``compaction`` item), which supersede everything before them.
"""

from __future__ import annotations

import collections.abc
import datetime as dt
import itertools
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin

import anthropic.types as anthropic_types
import anthropic.types.beta as beta_types
import openai.types.chat as chat_types
import openai.types.responses as responses_types
import pydantic
from openai.types.responses import response_input_item_param
from typing_extensions import is_typeddict

from worker.wire.formats.common import is_opaque_field

MARKER = "OPAQUE-"
Json = Any
WireMessage = dict[str, Any]


# --- markers ---------------------------------------------------------------------------------


@dataclass
class Markers:
    """The opaque values handed out for one history: each unique (a global counter, so that no
    marker is a prefix of another) and either secret or structural (see the module)."""

    secret: set[str] = field(default_factory=set)
    structural: set[str] = field(default_factory=set)
    _count: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def new(self, owner: str, key: str) -> str:
        marker = f"{MARKER}{owner}-{key}-{next(self._count):05d}"
        self.secret.add(marker)
        return marker

    def link(self, value: Any) -> Any:
        """``value`` names a message or pairs a call with its result: structural."""
        if value in self.secret:
            self.secret.discard(value)
            self.structural.add(value)
        return value

    def pair(self, target: dict[str, Any], key: str, value: Any) -> None:
        """``target[key] = value``, a pairing (structural); the marker it held is no more."""
        self.secret.discard(target.get(key))
        self.structural.discard(target.get(key))
        target[key] = self.link(value)

    @property
    def every(self) -> set[str]:
        return self.secret | self.structural


# --- the generator ---------------------------------------------------------------------------


class _Unbuildable(Exception):
    """A type that cannot be built here: a TypedDict inside itself, a file handle."""


_SEQUENCES = {
    list,
    tuple,
    set,
    frozenset,
    collections.abc.Iterable,
    collections.abc.Sequence,
    collections.abc.Collection,
    collections.abc.Set,
}
_MAPPINGS = {dict, collections.abc.Mapping, collections.abc.MutableMapping}
_NONE = type(None)


class Builder:
    """Builds one instance of a type, every key filled (see the module)."""

    def __init__(self, markers: Markers) -> None:
        self.markers = markers
        self._stack: list[type] = []

    def build(self, tp: Any) -> Json:
        return self._value(tp, owner="", key="", opaque=False)

    def _value(self, tp: Any, *, owner: str, key: str, opaque: bool) -> Json:
        origin = get_origin(tp)
        if origin in (typing.Annotated, Required, NotRequired):
            return self._value(get_args(tp)[0], owner=owner, key=key, opaque=opaque)
        if origin in (Union, types.UnionType):
            return self._union(get_args(tp), owner=owner, key=key, opaque=opaque)
        if origin is Literal:
            return get_args(tp)[0]
        if _is_sequence(origin):
            return self._sequence(get_args(tp), owner=owner, key=key, opaque=opaque)
        if origin in _MAPPINGS:
            return self._mapping(get_args(tp), owner=owner, opaque=opaque)
        if is_typeddict(tp):
            return self._typeddict(tp, opaque)
        if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
            return self._model(tp, opaque)
        return _scalar(tp, self.markers, owner=owner, key=key, opaque=opaque)

    def _union(self, members: tuple[Any, ...], *, owner: str, key: str, opaque: bool) -> Json:
        for member in members:
            if member is _NONE:
                continue
            try:
                return self._value(member, owner=owner, key=key, opaque=opaque)
            except _Unbuildable:
                continue
        if _NONE in members:
            return None
        raise _Unbuildable(f"no member of {members} can be built")

    def _sequence(self, args: tuple[Any, ...], *, owner: str, key: str, opaque: bool) -> Json:
        if not args:
            return []
        try:
            return [self._value(args[0], owner=owner, key=key, opaque=opaque)]
        except _Unbuildable:
            return []

    def _mapping(self, args: tuple[Any, ...], *, owner: str, opaque: bool) -> Json:
        value_type = args[1] if len(args) == 2 else object
        try:
            return {"entry": self._value(value_type, owner=owner, key="entry", opaque=opaque)}
        except _Unbuildable:
            return {}

    def _typeddict(self, cls: type, opaque: bool) -> Json:
        fields = [
            (_wire_key(key, hint), hint, key in cls.__required_keys__)  # type: ignore[attr-defined]
            for key, hint in _hints(cls).items()
        ]
        return self._object(cls, fields, opaque)

    def _model(self, cls: type[pydantic.BaseModel], opaque: bool) -> Json:
        fields = [
            (info.alias or name, info.annotation, info.is_required())
            for name, info in cls.model_fields.items()
        ]
        built = self._object(cls, fields, opaque)
        cls.model_validate(built)  # the SDK's own model takes it
        return built

    def _object(self, cls: type, fields: list[tuple[str, Any, bool]], opaque: bool) -> Json:
        if cls in self._stack:
            raise _Unbuildable(f"{cls.__name__} inside itself")
        self._stack.append(cls)
        try:
            hints = {key: hint for key, hint, _ in fields}
            owner = _literal_of(hints.get("type")) or _literal_of(hints.get("role"))
            owner = owner or cls.__name__
            out: dict[str, Json] = {}
            for key, hint, required in fields:
                secret = opaque or (is_opaque_field(key) and not _plain_text_data(key, hints))
                try:
                    out[key] = self._value(hint, owner=owner, key=key, opaque=secret)
                except _Unbuildable:
                    if required:
                        raise
            return out
        finally:
            self._stack.pop()


def _scalar(tp: Any, markers: Markers, *, owner: str, key: str, opaque: bool) -> Json:
    if tp is str:
        return markers.new(owner, key) if opaque else f"{key or 'text'} of the {owner} here"
    if tp is bool:
        return True
    if tp is int:
        return 1
    if tp is float:
        return 0.5
    if tp is _NONE:
        return None
    if tp in (object, Any):
        return {"note": f"{key or 'value'} of the {owner} here"}
    if tp is dt.datetime:
        return "2025-01-02T03:04:05Z"
    if tp is dt.date:
        return "2025-01-02"
    raise _Unbuildable(f"{tp!r}")


def _is_sequence(origin: Any) -> bool:
    """A list on the wire: Iterable, List, Sequence, the SDKs' own ``SequenceNotStr``."""
    return origin in _SEQUENCES or getattr(origin, "__name__", None) == "SequenceNotStr"


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _wire_key(key: str, hint: Any) -> str:
    """The key on the wire: a ``PropertyInfo(alias=...)`` in the hint's Annotated, else ``key``."""
    for meta in getattr(hint, "__metadata__", ()):
        alias = getattr(meta, "alias", None)
        if isinstance(alias, str):
            return alias
    return key


def _literal_of(hint: Any) -> str | None:
    """The first value of the Literal in ``hint`` (through Required, Optional, Annotated)."""
    if hint is None:
        return None
    origin = get_origin(hint)
    if origin is Literal:
        first = get_args(hint)[0]
        return first if isinstance(first, str) else None
    if origin in (typing.Annotated, Required, NotRequired, Union, types.UnionType):
        for arg in get_args(hint):
            found = _literal_of(arg)
            if found is not None:
                return found
    return None


def _plain_text_data(key: str, hints: dict[str, Any]) -> bool:
    """A plain-text source's ``data``: the document's text, which is readable."""
    return key == "data" and _literal_of(hints.get("media_type")) == "text/plain"


# --- the unions ------------------------------------------------------------------------------


def members_of(alias: Any) -> list[Any]:
    """The classes of a union, flattened through Annotated, Required and nested unions (the
    beta union ends with the response blocks' own annotated union)."""
    origin = get_origin(alias)
    if origin in (typing.Annotated, Required, NotRequired):
        return members_of(get_args(alias)[0])
    if origin in (Union, types.UnionType):
        return [m for arg in get_args(alias) for m in members_of(arg)]
    return [alias]


def field_type(cls: Any, key: str) -> Any:
    if isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
        return cls.model_fields[key].annotation
    return _hints(cls)[key]


def type_string(cls: Any, key: str = "type") -> str:
    found = _literal_of(field_type(cls, key))
    if found is None:
        raise AssertionError(f"{cls.__name__}.{key} is not a string Literal")
    return found


def parts_of(cls: Any, key: str) -> list[Any]:
    """The members of the element union of ``cls[key]``'s list member (a message's content
    parts, an output's parts); [] when it takes no list."""
    return [
        part
        for member in members_of(field_type(cls, key))
        if _is_sequence(get_origin(member))
        for part in members_of(get_args(member)[0])
    ]


@dataclass(frozen=True)
class Member:
    """One member of an SDK union: its family (which union), its type string, its class, and
    for a part or a nested block, the role or block type of what holds it."""

    family: str
    type: str
    cls: Any
    holder: str = ""
    alone: bool = True  # its type string is unique in its family (else its id names the class)

    @property
    def fmt(self) -> str:
        return FAMILIES[self.family]

    @property
    def id(self) -> str:
        where = f"{self.holder}/" if self.holder else ""
        which = "" if self.alone else f"({self.cls.__name__})"
        return f"{self.family}:{where}{self.type}{which}"


def _members(family: str, classes: list[Any], key: str = "type", holder: str = "") -> list[Member]:
    found = [Member(family, type_string(c, key), c, holder) for c in classes]
    count = collections.Counter((m.holder, m.type) for m in found)
    return [
        Member(m.family, m.type, m.cls, m.holder, alone=count[m.holder, m.type] == 1) for m in found
    ]


# Each family and the wire format its instances are sent in.
FAMILIES = {
    "anthropic": "anthropic",
    "anthropic-beta": "anthropic",
    "anthropic-nested": "anthropic",
    "anthropic-beta-nested": "anthropic",
    "chat-role": "openai",
    "chat-part": "openai",
    "chat-tool-call": "openai",
    "responses": "responses",
    "responses-part": "responses",
}
CHAT_MESSAGE_TYPES = members_of(chat_types.ChatCompletionMessageParam)


def anthropic_blocks() -> list[Member]:
    return _members("anthropic", members_of(anthropic_types.ContentBlockParam))


def anthropic_beta_blocks() -> list[Member]:
    return _members("anthropic-beta", members_of(beta_types.BetaContentBlockParam))


# Unions inside a block, by the block type and field that hold them (``[]``: a list of them):
# where images, documents and files sit, with their opaque payloads.
ANTHROPIC_NESTED = {
    "anthropic": {
        "tool_result.content[]": anthropic_types.ToolResultBlockParam,
        "image.source": anthropic_types.ImageBlockParam,
        "document.source": anthropic_types.DocumentBlockParam,
    },
    "anthropic-beta": {
        "tool_result.content[]": beta_types.BetaToolResultBlockParam,
        "image.source": beta_types.BetaImageBlockParam,
        "document.source": beta_types.BetaRequestDocumentBlockParam,
    },
}


def anthropic_nested() -> list[Member]:
    """The blocks a ``tool_result`` holds, and the sources of an image and a document."""
    found: list[Member] = []
    for family, holders in ANTHROPIC_NESTED.items():
        for holder, cls in holders.items():
            key = holder.split(".")[1].removesuffix("[]")
            classes = (
                parts_of(cls, key) if holder.endswith("[]") else members_of(field_type(cls, key))
            )
            found += _members(f"{family}-nested", classes, holder=holder)
    return found


def chat_roles() -> list[Member]:
    return _members("chat-role", CHAT_MESSAGE_TYPES, key="role")


def chat_parts() -> list[Member]:
    """Each role's content parts: the element union of its message's ``content``."""
    return [
        m
        for cls in CHAT_MESSAGE_TYPES
        for m in _members("chat-part", parts_of(cls, "content"), holder=type_string(cls, "role"))
    ]


def chat_tool_calls() -> list[Member]:
    return _members(
        "chat-tool-call", members_of(chat_types.ChatCompletionMessageToolCallUnionParam)
    )


def responses_items() -> list[Member]:
    return _members("responses", members_of(responses_types.ResponseInputItemParam))


# The Responses items whose content or output is a list of parts, by the item's type.
RESPONSES_PART_HOLDERS: dict[str, list[Any]] = {
    "message": [
        responses_types.EasyInputMessageParam,
        responses_types.ResponseOutputMessageParam,
    ],
    "function_call_output": [response_input_item_param.FunctionCallOutput],
    "custom_tool_call_output": [responses_types.ResponseCustomToolCallOutputParam],
}


def responses_parts() -> list[Member]:
    found: list[Member] = []
    for holder, classes in RESPONSES_PART_HOLDERS.items():
        key = "content" if holder == "message" else "output"
        parts = list(dict.fromkeys(p for c in classes for p in parts_of(c, key)))
        found += _members("responses-part", parts, holder=holder)
    return found


def every_member() -> list[Member]:
    return [
        *anthropic_blocks(),
        *anthropic_beta_blocks(),
        *anthropic_nested(),
        *chat_roles(),
        *chat_parts(),
        *chat_tool_calls(),
        *responses_items(),
        *responses_parts(),
    ]


def instance(cls: Any, markers: Markers) -> dict[str, Json]:
    """One instance of the TypedDict or model ``cls``, its opaque strings new markers."""
    built = Builder(markers).build(cls)
    assert isinstance(built, dict), cls
    return built


# --- fix-ups: where an instance sits ---------------------------------------------------------


@dataclass
class Unit:
    """The wire messages an instance sits in, with what it needs around it (its call or its
    result); ``boundary``: it is a provider-native compaction (nothing before it is read)."""

    messages: list[WireMessage]
    boundary: bool = False


# Anthropic blocks an agent sends in a user turn; every other block is one the model produced
# and the agent sends back in the assistant turn as it came.
ANTHROPIC_USER_BLOCKS = {
    "text",
    "image",
    "document",
    "search_result",
    "tool_result",
    "container_upload",
    "tool_addition",  # the client's directive to make a tool available from here on
    "tool_removal",
}
# A block that calls a tool, and the result block that answers it: a client tool's result
# comes in the next (user) turn, a server tool's in the same assistant turn. A block with a
# ``tool_use_id`` answers a ``server_tool_use`` unless listed here.
ANTHROPIC_RESULT_OF = {"tool_use": "tool_result", "mcp_tool_use": "mcp_tool_result"}
ANTHROPIC_USE_OF = {result: use for use, result in ANTHROPIC_RESULT_OF.items()}
ANTHROPIC_SERVER_RESULT = "web_search_tool_result"  # what a lone server_tool_use is answered by


def _anthropic_role(block: dict[str, Json]) -> str:
    return "user" if block["type"] in ANTHROPIC_USER_BLOCKS else "assistant"


def _anthropic_unit(member: Member, markers: Markers) -> Unit:
    if member.family.endswith("-nested"):
        family = member.family.removesuffix("-nested")
        kind, key = member.holder.split(".")
        holder = _anthropic_block(family, kind, markers)
        nested = instance(member.cls, markers)
        holder[key.removesuffix("[]")] = [nested] if key.endswith("[]") else nested
        return _anthropic_paired(family, holder, markers)
    block = instance(member.cls, markers)
    if block["type"] == "compaction" and isinstance(block.get("content"), str):
        return Unit([{"role": "assistant", "content": [block]}], boundary=True)
    return _anthropic_paired(member.family, block, markers)


def _anthropic_block(family: str, kind: str, markers: Markers) -> dict[str, Json]:
    """A fresh instance of the family's (first) block class of type ``kind``."""
    cls = next(m.cls for m in _family(family) if m.type == kind)
    return instance(cls, markers)


def _anthropic_paired(family: str, block: dict[str, Json], markers: Markers) -> Unit:
    """``block`` in its turn, with the block it pairs with: a use before its result, in the
    same message when both sit on the same side."""
    kind = block["type"]
    if "tool_use_id" in block:
        use = _anthropic_block(family, ANTHROPIC_USE_OF.get(kind, "server_tool_use"), markers)
        markers.pair(use, "id", block["tool_use_id"])
        pair = [use, block]
    elif kind in ANTHROPIC_RESULT_OF or kind == "server_tool_use":
        answer = ANTHROPIC_RESULT_OF.get(kind, ANTHROPIC_SERVER_RESULT)
        result = _anthropic_block(family, answer, markers)
        markers.pair(result, "tool_use_id", block["id"])
        pair = [block, result]
    else:
        return Unit([{"role": _anthropic_role(block), "content": [block]}])
    roles = [_anthropic_role(b) for b in pair]
    if roles[0] == roles[1]:
        return Unit([{"role": roles[0], "content": pair}])
    return Unit([{"role": r, "content": [b]} for r, b in zip(roles, pair, strict=True)])


def _chat_unit(member: Member, markers: Markers) -> Unit:
    """A role's message as generated; a part in a message of its role; a tool call in an
    assistant message."""
    if member.family == "chat-role":
        return _chat_around(instance(member.cls, markers), markers)
    if member.family == "chat-part":
        message: dict[str, Json] = {
            "role": member.holder,
            "content": [instance(member.cls, markers)],
        }
        if member.holder == "tool":
            message["tool_call_id"] = markers.new("tool", "tool_call_id")
        return _chat_around(message, markers)
    call = instance(member.cls, markers)
    return _chat_around(
        {"role": "assistant", "content": "Calling it.", "tool_calls": [call]}, markers
    )


def _chat_message(role: str, markers: Markers) -> dict[str, Json]:
    cls = next(c for c in CHAT_MESSAGE_TYPES if type_string(c, "role") == role)
    return instance(cls, markers)


def _chat_around(message: dict[str, Json], markers: Markers) -> Unit:
    """A chat message with what it needs: a tool result after each of its calls, the call a
    tool result answers before it, the function call a (deprecated) function result answers."""
    role = message["role"]
    if role == "tool":
        call = instance(chat_types.ChatCompletionMessageFunctionToolCallParam, markers)
        markers.pair(call, "id", message["tool_call_id"])
        return Unit([{"role": "assistant", "content": None, "tool_calls": [call]}, message])
    if role == "function":
        function_call = {"name": message["name"], "arguments": '{"query": "the next step"}'}
        return Unit(
            [{"role": "assistant", "content": None, "function_call": function_call}, message]
        )
    out = [message]
    for call in message.get("tool_calls") or []:
        result = _chat_message("tool", markers)
        markers.pair(result, "tool_call_id", call["id"])
        out.append(result)
    return Unit(out)


# A Responses call's type: (its output's type, the call's field, the output's field naming it).
RESPONSES_OUTPUT_OF = {
    "function_call": ("function_call_output", "call_id", "call_id"),
    "computer_call": ("computer_call_output", "call_id", "call_id"),
    "local_shell_call": ("local_shell_call_output", "call_id", "id"),
    "shell_call": ("shell_call_output", "call_id", "call_id"),
    "apply_patch_call": ("apply_patch_call_output", "call_id", "call_id"),
    "custom_tool_call": ("custom_tool_call_output", "call_id", "call_id"),
    "tool_search_call": ("tool_search_output", "call_id", "call_id"),
    "program": ("program_output", "call_id", "call_id"),
    "mcp_approval_request": ("mcp_approval_response", "id", "approval_request_id"),
}
# An item that names an earlier one: (the earlier item's type, its field, this item's field).
RESPONSES_ANSWERS = {
    output: (call, call_field, output_field)
    for call, (output, call_field, output_field) in RESPONSES_OUTPUT_OF.items()
} | {"mcp_call": ("mcp_approval_request", "id", "approval_request_id")}


def _responses_unit(member: Member, markers: Markers) -> Unit:
    if member.family == "responses-part":
        return _responses_part_unit(member, markers)
    item = instance(member.cls, markers)
    return _responses_around(item, markers)


def _responses_part_unit(member: Member, markers: Markers) -> Unit:
    """A part in a message of the side that sends it (an output part: the assistant's), or as
    the output of a call's output item."""
    part = instance(member.cls, markers)
    if member.holder == "message":
        output = member.type in ("output_text", "refusal")
        role = "assistant" if output else "user"
        return Unit([{"type": "message", "role": role, "content": [part]}])
    cls = next(m.cls for m in responses_items() if m.type == member.holder)
    holder = instance(cls, markers)
    holder["output"] = [part]
    return _responses_around(holder, markers)


def _responses_item(kind: str, markers: Markers) -> dict[str, Json]:
    cls = next(m.cls for m in responses_items() if m.type == kind)
    return instance(cls, markers)


def _responses_around(item: dict[str, Json], markers: Markers) -> Unit:
    """An item with what it needs: its output after a call, its call before an output, the
    reply a reasoning item produced after it; its own ``id`` names it (structural)."""
    kind = item.get("type")
    if kind == "compaction":
        return Unit(_named_items([item], markers), boundary=True)
    if kind in RESPONSES_OUTPUT_OF:
        answer, mine, theirs = RESPONSES_OUTPUT_OF[kind]
        output = _responses_item(answer, markers)
        markers.pair(output, theirs, item[mine])
        return Unit(_named_items([item, output], markers))
    if kind in RESPONSES_ANSWERS:
        earlier, theirs, mine = RESPONSES_ANSWERS[kind]
        call = _responses_item(earlier, markers)
        markers.pair(call, theirs, item[mine])
        return Unit(_named_items([call, item], markers))
    if kind == "reasoning":
        reply = instance(responses_types.ResponseOutputMessageParam, markers)
        return Unit(_named_items([item, reply], markers))
    return Unit(_named_items([item], markers))


def _named_items(items: list[WireMessage], markers: Markers) -> list[WireMessage]:
    for item in items:
        markers.link(item.get("id"))
    return items


@cache
def _family(family: str) -> tuple[Member, ...]:
    return tuple(m for m in every_member() if m.family == family)


UNITS: dict[str, Callable[[Member, Markers], Unit]] = {
    "anthropic": _anthropic_unit,
    "openai": _chat_unit,
    "responses": _responses_unit,
}


def unit(member: Member, markers: Markers) -> Unit:
    """A fresh instance of ``member`` (new markers) in the wire messages it needs."""
    return UNITS[member.fmt](member, markers)
