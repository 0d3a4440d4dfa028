"""What the format modules share: the preamble of the two OpenAI shapes (their roles, the
Anthropic blocks they refuse, no top-level system), reading a string field of a wire message
(or block, part or item), and, when rendering, finding the wire message a normalized message
came from and whether it is still exactly what that message normalizes to.

Kept apart from the package's ``__init__`` (which imports every format module) so that each
format module imports it without a circle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worker.errors import InvalidSnapshot
from worker.wire import media
from worker.wire.media import Attachment, MediaRules
from worker.wire.models import Message, Role, canonical_json

# A format's reader of one wire message into one internal message:
# (index, raw, message id, tool names by call id, media rules) -> message.
Normalizer = Callable[[int, dict[str, Any], str, dict[str, str], MediaRules], Message]


# The roles of a message in both OpenAI shapes (a Chat Completions message, a Responses message
# item) and the internal role each is read as: ``developer`` is the newer name of ``system``.
# Chat Completions adds its own ``tool`` and ``function`` roles.
MESSAGE_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}
# Anthropic's tool blocks in an OpenAI-shaped message say the snapshot's format is wrong:
# carried unread, a call and its result would lose their pairing, and a compaction could
# separate them.
FOREIGN_PARTS = frozenset({"tool_use", "tool_result"})


def foreign_part(kind: str, at: str) -> InvalidSnapshot:
    """The error for a content part of one of :data:`FOREIGN_PARTS` at ``at``."""
    return InvalidSnapshot(
        f"{at}.type", f"unexpected content part type {kind!r} (is this an anthropic snapshot?)"
    )


def no_system_field(system: Any) -> list[Message]:
    """``system_messages`` of the OpenAI shapes: their system prompt is a message of the
    history, so a snapshot's top-level ``system`` (Anthropic's) is refused."""
    if system is not None:
        raise InvalidSnapshot(
            "system", "only the anthropic format has a top-level system (put it in messages)"
        )
    return []


def string_field(raw: dict[str, Any], key: str, where: str, *, nonempty: bool = False) -> str:
    """``raw[key]``, which must be a string (non-empty with ``nonempty``); ``where`` names
    ``raw`` in the snapshot for the error (``messages[3].content[0]``)."""
    value = raw.get(key)
    if not isinstance(value, str) or (nonempty and not value):
        raise InvalidSnapshot(
            f"{where}.{key}", "must be a non-empty string" if nonempty else "must be a string"
        )
    return value


def source_of(m: Message, source: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The wire message ``m`` was normalized from (``source[m.source_index]``), if any."""
    if source is None or not 0 <= m.source_index < len(source):
        return None
    src = source[m.source_index]
    return src if isinstance(src, dict) else None


def normalizes_to(m: Message, src: dict[str, Any], normalize: Normalizer) -> bool:
    """Whether ``m`` is exactly what ``src`` normalizes to, its attachments aside (a renderer
    copies them from ``src`` itself): then ``src`` can be carried as it was."""
    names = {m.tool_call_id: m.tool_name} if m.tool_call_id and m.tool_name else {}
    try:
        fresh = normalize(m.source_index, src, m.id, names, MediaRules())
    except InvalidSnapshot:
        return False
    return fresh.model_copy(update={"attachments": m.attachments}) == m


# Fields whose values the service never reads: encrypted state, signatures, inline binary
# payloads, and the ids of objects that live on the provider's side (``id`` and every
# ``*_id``). They never reach a message's text (so never a summary, a name list, an event or a
# log) and are carried byte for byte wherever their block or item is carried.
OPAQUE_FIELDS = frozenset(
    {
        "encrypted_content",
        "signature",
        "data",
        "file_data",
        "encrypted_index",
        "image_url",
        # credentials an item may carry (an MCP server's headers) and device fingerprints
        "authorization",
        "headers",
        "fingerprint",
    }
)
# A string that is a data URL (an inline image or file) is opaque wherever it sits.
_DATA_URL = "data:"


def is_opaque_field(key: str) -> bool:
    return key in OPAQUE_FIELDS or key == "id" or key.endswith("_id")


def is_data_url(value: Any) -> bool:
    """Whether ``value`` is a data URL (an inline image or file): opaque wherever it sits."""
    return isinstance(value, str) and value.startswith(_DATA_URL)


def readable(value: Any) -> Any:
    """``value`` (a block, an item, a part of one) without its opaque fields, at any depth:
    what of it a summarizer may read."""
    if isinstance(value, dict):
        return {
            k: readable(v)
            for k, v in value.items()
            if not is_opaque_field(k) and not is_data_url(v)
        }
    if isinstance(value, list):
        return [readable(v) for v in value if not is_data_url(v)]
    return value


def readable_json(value: Any) -> str:
    """The canonical JSON of :func:`readable` ``(value)``."""
    return canonical_json(readable(value))


def unknown_payload(kind: str, raw: dict[str, Any]) -> Attachment:
    """A block or item of a type the format does not know: carried as it came, never read,
    counted by the conservative estimate of its JSON's size (named by its type alone)."""
    return media.opaque(f"{kind} (unknown type, not read)", len(canonical_json(raw)))
