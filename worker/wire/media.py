"""Images and files in messages: their size, read from the image header, and what they cost.

Pure functions. Providers bill an image by its pixel size, not by the bytes that carry it, so a
base64 image is counted from the width and height in its header (PNG, JPEG, GIF, WebP), and an
image given by URL (or an upload id) from a configured default size. The rules
(docs/configuration.md, "Images and files"):

- OpenAI (``openai`` and ``responses`` formats), by ``detail``: ``low`` costs 85 tokens; ``high``
  (and ``auto``, counted as high: the most it can cost) scales the image to fit 2048×2048, then
  so that its shortest side is at most 768, and costs 170 per 512-pixel tile plus 85.
- Anthropic (``anthropic`` format): the image is scaled to fit 1568 pixels on its long edge and
  costs ceil(width × height / 750) tokens, at most 1600.
- A document or file part (a PDF, a text file) costs a fixed estimate per part.

Only sizes leave this module: image bytes are never kept, logged or sent to a summarizer.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

Provider = Literal["openai", "anthropic"]
# ``opaque``: a payload the service cannot read (encrypted, or of a type the format does not
# know), counted by an estimate from its size (:func:`opaque`).
Kind = Literal["image", "file", "opaque"]

OPENAI_LOW_TOKENS = 85
OPENAI_BASE_TOKENS = 85
OPENAI_TILE_TOKENS = 170
OPENAI_FIT = 2048
OPENAI_SHORT_SIDE = 768
OPENAI_TILE = 512
ANTHROPIC_LONG_EDGE = 1568
ANTHROPIC_PIXELS_PER_TOKEN = 750
ANTHROPIC_MAX_TOKENS = 1600  # larger images are scaled down to about 1.15 megapixels first
# Base64 characters decoded to find the size: enough for every PNG, GIF and WebP header and for
# JPEGs whose frame header comes early; a JPEG whose EXIF pushes it later is decoded whole.
HEADER_CHARS = 64 * 1024


class Attachment(BaseModel):
    """An image, file or opaque payload of a message: its kind, what it costs, and how it is
    named to a summarizer (``label``: media type and size, or the payload's type; never its
    bytes, URL or content)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Kind
    tokens: int
    label: str
    width: int | None = None
    height: int | None = None


@dataclass(frozen=True)
class MediaRules:
    """How attachments are counted: the provider's image rule, the size assumed for an image
    whose bytes are not in the snapshot, and the estimate for a document or file part."""

    provider: Provider = "openai"
    default_width: int = 1024
    default_height: int = 1024
    file_tokens: int = 1500


# --- reading sizes -------------------------------------------------------------------------------


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of a PNG, JPEG, GIF or WebP image; None otherwise."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return _positive(*struct.unpack(">II", data[16:24])) if len(data) >= 24 else None
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return _positive(*struct.unpack("<HH", data[6:10]))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _positive(width: int, height: int) -> tuple[int, int] | None:
    return (width, height) if width > 0 and height > 0 else None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", data[26:30])
        return _positive(w & 0x3FFF, h & 0x3FFF)
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return _positive((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(data) >= 30:
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return _positive(w, h)
    return None


# Start-of-frame markers (baseline, extended, progressive, lossless, ...): not DHT, JPG, DAC.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in _SOF:
            if at + 9 > len(data):
                return None
            h, w = struct.unpack(">HH", data[at + 5 : at + 9])
            return _positive(w, h)
        if marker == 0xDA or length < 2:  # scan data: no frame header before it
            return None
        at += 2 + length
    return None


def base64_image_size(text: str) -> tuple[int, int] | None:
    """The size of a base64-encoded image, decoding only its start where that is enough."""
    head = _b64decode(text[:HEADER_CHARS])
    size = image_size(head) if head is not None else None
    if size is None and head is not None and head[:2] == b"\xff\xd8" and len(text) > HEADER_CHARS:
        whole = _b64decode(text)
        size = image_size(whole) if whole is not None else None
    return size


def _b64decode(text: str) -> bytes | None:
    cut = text.strip()
    cut = cut[: len(cut) - len(cut) % 4]
    try:
        return base64.b64decode(cut, validate=False)
    except (binascii.Error, ValueError):
        return None


def data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 payload) of a ``data:...;base64,`` URL; None for other URLs."""
    if not url.startswith("data:"):
        return None
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    return head[5:].split(";", 1)[0] or "image", payload


# --- what they cost ------------------------------------------------------------------------------


def openai_image_tokens(width: int, height: int, detail: str = "auto") -> int:
    """OpenAI's rule: ``low`` is 85; ``high`` and ``auto`` fit 2048×2048, then a shortest side
    of at most 768, then 170 per 512-pixel tile plus 85."""
    if detail == "low":
        return OPENAI_LOW_TOKENS
    w, h = float(width), float(height)
    if max(w, h) > OPENAI_FIT:
        scale = OPENAI_FIT / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > OPENAI_SHORT_SIDE:
        scale = OPENAI_SHORT_SIDE / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(round(w, 6) / OPENAI_TILE) * math.ceil(round(h, 6) / OPENAI_TILE)
    return OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * tiles


def anthropic_image_tokens(width: int, height: int) -> int:
    """Anthropic's rule: fit 1568 pixels on the long edge, then ceil(width × height / 750),
    at most 1600 (Anthropic scales a larger image down to about 1.15 megapixels)."""
    w, h = float(width), float(height)
    if max(w, h) > ANTHROPIC_LONG_EDGE:
        scale = ANTHROPIC_LONG_EDGE / max(w, h)
        w, h = math.floor(w * scale), math.floor(h * scale)
    return min(max(1, math.ceil(w * h / ANTHROPIC_PIXELS_PER_TOKEN)), ANTHROPIC_MAX_TOKENS)


def image(
    rules: MediaRules, *, data: str | None, media_type: str, detail: str = "auto"
) -> Attachment:
    """An image part: ``data`` its base64 bytes when inline (None: a URL or an upload id)."""
    size = base64_image_size(data) if data is not None else None
    known = size is not None
    width, height = size if size is not None else (rules.default_width, rules.default_height)
    if rules.provider == "anthropic":
        tokens = anthropic_image_tokens(width, height)
    else:
        tokens = openai_image_tokens(width, height, detail)
    where = f"{width}×{height}" if known else "size unknown"
    kind = "image by reference" if data is None else media_type or "image"
    label = f"{kind}, {where}"
    return Attachment(
        kind="image",
        tokens=tokens,
        label=label,
        width=width if known else None,
        height=height if known else None,
    )


def url_image(rules: MediaRules, url: str, detail: str = "auto") -> Attachment:
    """An image given as a URL: a data URL is read, any other counts at the default size."""
    inline = data_url(url)
    if inline is None:
        return image(rules, data=None, media_type="", detail=detail)
    media_type, payload = inline
    return image(rules, data=payload, media_type=media_type, detail=detail)


def file(rules: MediaRules, name: str) -> Attachment:
    """A document or file part: the fixed estimate (its pages are not read)."""
    return Attachment(kind="file", tokens=rules.file_tokens, label=name or "file")


# An opaque payload is counted as one token per OPAQUE_CHARS_PER_TOKEN characters of its JSON
# text: more than any tokenizer's average for text (about 3.8 characters a token on the corpus),
# so a payload whose real cost is unknown is never counted short.
OPAQUE_CHARS_PER_TOKEN = 3


def opaque(label: str, chars: int) -> Attachment:
    """A payload of ``chars`` characters that the service cannot read, named by ``label`` (its
    type, never its content), at the conservative estimate."""
    return Attachment(
        kind="opaque", tokens=-(-max(chars, 0) // OPAQUE_CHARS_PER_TOKEN), label=label
    )


def placeholder(n: int, message_id: str, attachment: Attachment) -> str:
    """How an attachment is named to a summarizer: ``[image 1 in message m3]``."""
    return f"[{attachment.kind} {n} in message {message_id}]"


def placeholders(message_id: str, attachments: tuple[Attachment, ...]) -> list[str]:
    return [placeholder(n, message_id, a) for n, a in enumerate(attachments, 1)]
