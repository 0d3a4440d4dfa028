"""Images and files (issue 14 §4): sizes from real image headers, the providers' token rules,
the count of a snapshot with an image, carried images, and no image bytes to a summarizer."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from worker.config import LLMConfig, Settings
from worker.pipeline import Adapters, Pipeline, SnapshotContext
from worker.pipeline.evaluate import evaluate
from worker.summarize import SummaryRequest
from worker.summarize.digest import DigestSummarizer
from worker.summarize.llm import LLMSummarizer
from worker.summarize.prompt import render_message, without_bytes
from worker.testing.standin_llm import StandinLLM
from worker.tokens import tokenizer_for
from worker.transcripts.filesystem import FileStore
from worker.wire import formats
from worker.wire.events import CompletedEvent, Summary
from worker.wire.media import (
    MediaRules,
    anthropic_image_tokens,
    base64_image_size,
    image_size,
    openai_image_tokens,
)
from worker.wire.snapshots import parse_snapshot

# --- real image bytes -------------------------------------------------------------------------


def png(width: int, height: int) -> bytes:
    """A complete, valid PNG (8-bit grey), written with zlib and struct."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = b"".join(b"\x00" + bytes(width) for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def jpeg(width: int, height: int, *, exif: int = 0) -> bytes:
    """SOI, APP0 (JFIF), an optional large APP1, DQT, then a baseline SOF0 frame header."""

    def segment(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body

    app0 = segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    app1 = segment(0xE1, b"Exif\x00\x00" + bytes(exif)) if exif else b""
    dqt = segment(0xDB, b"\x00" + bytes(64))
    sof = segment(0xC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    return b"\xff\xd8" + app0 + app1 + dqt + sof + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00" + b";"


def webp_vp8(width: int, height: int) -> bytes:
    frame = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height) + bytes(10)
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(frame))
        + b"WEBP"
        + b"VP8 "
        + struct.pack("<I", len(frame))
        + frame
    )


def webp_vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    body = b"\x2f" + bits.to_bytes(4, "little") + bytes(8)
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(body))
        + b"WEBP"
        + b"VP8L"
        + struct.pack("<I", len(body))
        + body
    )


def webp_vp8x(width: int, height: int) -> bytes:
    body = (
        b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    )
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(body))
        + b"WEBP"
        + b"VP8X"
        + struct.pack("<I", len(body))
        + body
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (png(1024, 1024), (1024, 1024)),
        (png(3, 7), (3, 7)),
        (jpeg(640, 480), (640, 480)),
        (jpeg(4032, 3024, exif=60_000), (4032, 3024)),  # SOF after the first 48 KiB
        (gif(300, 200), (300, 200)),
        (webp_vp8(800, 600), (800, 600)),
        (webp_vp8l(1000, 16000), (1000, 16000)),
        (webp_vp8x(5000, 3), (5000, 3)),
    ],
)
def test_sizes_are_read_from_real_headers(data: bytes, size: tuple[int, int]) -> None:
    assert image_size(data) == size
    assert base64_image_size(b64(data)) == size


def test_what_is_not_an_image_has_no_size() -> None:
    for data in (
        b"",
        b"hello",
        b"\x89PNG\r\n\x1a\n",
        b"\xff\xd8\xff\xda\x00\x02",
        b"RIFF0000WEBPXXXX",
    ):
        assert image_size(data) is None
    assert base64_image_size("!!! not base64 !!!") is None


def test_openai_tile_rule() -> None:
    assert openai_image_tokens(1024, 1024, "high") == 765  # 768x768: 4 tiles
    assert openai_image_tokens(1024, 1024, "auto") == 765  # auto counts as high
    assert openai_image_tokens(1024, 1024, "low") == 85
    assert openai_image_tokens(512, 512, "high") == 255  # 1 tile
    assert openai_image_tokens(2048, 4096, "high") == 1105  # 1024x2048 -> 768x1536: 6 tiles
    assert openai_image_tokens(100, 100, "high") == 255  # never scaled up


def test_anthropic_pixel_rule() -> None:
    assert anthropic_image_tokens(1024, 1024) == 1399  # ceil(1048576 / 750)
    assert anthropic_image_tokens(200, 200) == 54
    assert anthropic_image_tokens(3136, 784) == 820  # fit 1568: 1568x392
    assert anthropic_image_tokens(1568, 300) == 628
    assert anthropic_image_tokens(6000, 4000) == 1600


# --- in snapshots -----------------------------------------------------------------------------

SCREENSHOT = b64(png(1024, 1024))


def _openai_history(image_part: dict[str, Any] | None) -> list[dict[str, Any]]:
    user: dict[str, Any] = {
        "id": "u2",
        "role": "user",
        "content": "What is wrong in this screenshot?",
    }
    if image_part is not None:
        user["content"] = [{"type": "text", "text": user["content"]}, image_part]
    messages: list[dict[str, Any]] = [
        {"id": "s", "role": "system", "content": "You are a coding agent."},
        {"id": "u1", "role": "user", "content": "Fix the layout bug in src/app.py."},
    ]
    for k in range(6):
        messages.append(
            {
                "id": f"a{k}",
                "role": "assistant",
                "content": f"step {k}",
                "tool_calls": [
                    {
                        "id": f"c{k}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat f{k}"})},
                    }
                ],
            }
        )
        messages.append(
            {"id": f"r{k}", "role": "tool", "tool_call_id": f"c{k}", "content": "data " * 300}
        )
    messages.append(user)
    messages.append({"id": "a9", "role": "assistant", "content": "Looking at it."})
    messages.append({"id": "u3", "role": "user", "content": "Any progress?"})
    messages.append({"id": "last", "role": "assistant", "content": "Almost."})
    return messages


def _snap(messages: list[dict[str, Any]], fmt: str = "openai", **config: Any) -> dict[str, Any]:
    return {
        "conversation_id": "img-1",
        "revision": 1,
        "model": {"name": "gpt-4.1"},
        "format": fmt,
        "messages": messages,
        "config": {"auto_compact_threshold_tokens": 50_000, **config},
    }


def _tokens(snap: dict[str, Any]) -> int:
    parsed = parse_snapshot(snap, Settings())
    return evaluate(SnapshotContext.of(parsed, tokenizer_for("gpt-4.1"))).projected_tokens


def _data_url_part(detail: str = "high") -> dict[str, Any]:
    return {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{SCREENSHOT}", "detail": detail},
    }


def test_a_png_raises_the_projected_count_by_what_openai_bills() -> None:
    text_only = _openai_history(None)
    text_only[-4]["content"] = [{"type": "text", "text": "What is wrong in this screenshot?"}]
    with_image = _openai_history(_data_url_part("high"))
    assert _tokens(_snap(with_image)) - _tokens(_snap(text_only)) == 765
    assert _tokens(_snap(_openai_history(_data_url_part("low")))) - _tokens(_snap(text_only)) == 85


def test_an_image_by_url_counts_at_the_configured_default_size() -> None:
    by_url = {"type": "image_url", "image_url": {"url": "https://example.com/shot.png"}}
    base = _tokens(_snap(_openai_history(None)))
    assert _tokens(_snap(_openai_history(by_url))) - base == 765  # 1024x1024 by default
    small = _snap(_openai_history(by_url), image_default_width=512, image_default_height=512)
    assert _tokens(small) - base == 255


def test_files_count_the_documented_estimate() -> None:
    part = {"type": "file", "file": {"filename": "spec.pdf", "file_data": "data:x;base64,AAAA"}}
    base = _tokens(_snap(_openai_history(None)))
    assert _tokens(_snap(_openai_history(part))) - base == 1500
    assert _tokens(_snap(_openai_history(part), file_part_tokens=10)) - base == 10


def test_anthropic_images_count_by_pixels_in_turns_and_tool_results() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": SCREENSHOT},
    }
    plain = [{"role": "user", "content": [{"type": "text", "text": "look"}]}]
    with_image = [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}]
    rules = MediaRules(provider="anthropic")
    (m,) = formats.to_messages("anthropic", with_image, media=rules)
    assert m.attachment_tokens == 1399 and m.attachments[0].width == 1024
    assert formats.to_messages("anthropic", plain)[0].attachments == ()
    result = [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image]}],
        },
    ]
    tool = formats.to_messages("anthropic", result)[-1]
    assert tool.role == "tool" and tool.attachment_tokens == 1399


def test_responses_input_image_and_screenshot_are_counted() -> None:
    url = f"data:image/png;base64,{SCREENSHOT}"
    items = [
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "see"},
            {"type": "input_image", "image_url": url, "detail": "low"},
        ]},
        {"type": "computer_call", "call_id": "k1", "action": {"type": "screenshot"}},
        {"type": "computer_call_output", "call_id": "k1",
         "output": {"type": "computer_screenshot", "image_url": url}},
    ]  # fmt: skip
    user, _, shot = formats.to_messages("responses", items)
    assert user.attachment_tokens == 85
    assert shot.attachment_tokens == 765


class Recording:
    """A summarizer standing in for the LLM: keeps each request and the text an LLM would get."""

    def __init__(self) -> None:
        self.requests: list[SummaryRequest] = []
        self.sent: list[str] = []

    def summarize(self, request: SummaryRequest) -> Summary:
        self.requests.append(request)
        self.sent.append("\n\n".join(render_message(m) for m in request.messages))
        return DigestSummarizer().summarize(request)


def _compact(snap: dict[str, Any], tmp_path: Path, llm: Recording) -> CompletedEvent:
    parsed = parse_snapshot(snap, Settings())
    adapters = Adapters(store=FileStore(tmp_path), llm=llm)
    events = Pipeline(parsed.settings, adapters).run(parsed)
    assert isinstance(events[-1], CompletedEvent), events[-1]
    return events[-1]


def test_the_carried_turn_keeps_its_image_and_no_bytes_reach_the_summarizer(
    tmp_path: Path,
) -> None:
    messages = _openai_history(_data_url_part("high"))
    # The image turn is compacted (too big to carry); a second screenshot in a carried turn.
    messages[-2]["content"] = [{"type": "text", "text": "Any progress?"}, _data_url_part("auto")]
    snap = _snap(
        messages, mode="prefer_remote", auto_compact_threshold_tokens=2500,
        preserve_recent_user_tokens=900, summary_max_output_tokens=300,
    )  # fmt: skip
    llm = Recording()
    event = _compact(snap, tmp_path, llm)
    replacement = event.compaction.replacement
    carried = [m for m in replacement if m.get("id") == "u3"]
    assert carried == [messages[-2]]  # unchanged: copied, image and all
    (sent,) = llm.sent
    assert SCREENSHOT[:200] not in sent and "base64" not in sent
    assert "[image 1 in message u2]" in sent
    assert "[image 1 in message u2]" in llm.requests[0].must_keep
    summary = event.compaction.summary.text
    assert "[image 1 in message u2]" in summary and "image/png, 1024×1024" in summary
    assert SCREENSHOT[:200] not in summary


def test_a_shortened_carried_turn_keeps_its_image(tmp_path: Path) -> None:
    messages = _openai_history(None)
    long_turn = "Please look at this. " + "details " * 3000
    messages[-2]["content"] = [{"type": "text", "text": long_turn}, _data_url_part("high")]
    snap = _snap(
        messages, auto_compact_threshold_tokens=3000, summary_max_output_tokens=300,
    )  # fmt: skip
    llm = Recording()
    event = _compact(snap, tmp_path, llm)
    (carried,) = [m for m in event.compaction.replacement if m.get("id") == "u3"]
    text, image = carried["content"]
    assert "shortened by compaction" in text["text"]
    assert image == _data_url_part("high")


def test_anthropic_carried_turns_and_results_keep_their_images(tmp_path: Path) -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": SCREENSHOT},
    }
    messages: list[dict[str, Any]] = [{"id": "u0", "role": "user", "content": "Start."}]
    for k in range(5):
        messages.append(
            {
                "id": f"a{k}",
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": f"t{k}", "name": "bash", "input": {"cmd": f"ls {k}"}}
                ],
            }
        )
        messages.append(
            {
                "id": f"r{k}",
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{k}", "content": "x " * 400}],
            }
        )
    turn = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "This one?"}, image]}
    messages += [turn, {"id": "a9", "role": "assistant", "content": "Yes."},
                 {"id": "u2", "role": "user", "content": "Go on."},
                 {"id": "last", "role": "assistant", "content": "Done."}]  # fmt: skip
    # The whole threshold as the target: what is carried here is the point, not how much.
    snap = _snap(messages, fmt="anthropic", auto_compact_threshold_tokens=3000,
                 summary_max_output_tokens=300, auto_compact_target_percent=100)  # fmt: skip
    event = _compact(snap, tmp_path, Recording())
    assert turn in event.compaction.replacement


def test_an_image_only_turn_is_carried_like_any_user_turn(tmp_path: Path) -> None:
    messages = _openai_history(None)
    messages[-2]["content"] = [_data_url_part("high")]  # the newest user turn: a screenshot
    snap = _snap(messages, auto_compact_threshold_tokens=2500, summary_max_output_tokens=300)
    event = _compact(snap, tmp_path, Recording())
    assert messages[-2] in event.compaction.replacement


def test_the_llm_requests_hold_no_image_bytes(tmp_path: Path, sockets: None) -> None:
    """Through the real LLM client to the stand-in provider: every request body it received."""
    messages = _openai_history(_data_url_part("high"))
    # Bytes in text too: a tool printed a data URL, a user pasted raw base64.
    messages[3]["content"] = f"wrote data:image/png;base64,{SCREENSHOT} to out.png"
    messages[-2]["content"] = [{"type": "text", "text": "Any progress?"}, _data_url_part("auto")]
    snap = _snap(
        messages, mode="remote_only", auto_compact_threshold_tokens=2500,
        preserve_recent_user_tokens=900, summary_max_output_tokens=300,
    )  # fmt: skip
    parsed = parse_snapshot(snap, Settings())
    with StandinLLM(expected_key="k") as server:
        config = LLMConfig(base_url=server.openai_base_url, api_key_env="IMG_KEY", max_retries=0)
        with LLMSummarizer(config, environ={"IMG_KEY": "k"}) as llm:
            adapters = Adapters(store=FileStore(tmp_path), llm=llm)
            event = Pipeline(parsed.settings, adapters).run(parsed)[-1]
        bodies = [json.dumps(r.body) for r in server.requests]
    assert isinstance(event, CompletedEvent), event
    assert bodies
    for body in bodies:
        assert SCREENSHOT[:100] not in body and "base64," not in body
    assert any("[image 1 in message u2]" in body for body in bodies)
    assert "[image 1 in message u2]" in event.compaction.summary.text  # a must-keep item
    assert [m for m in event.compaction.replacement if m.get("id") == "u3"] == [messages[-2]]


def test_without_bytes_leaves_ordinary_text_alone() -> None:
    text = "pytest -q tests/test_app.py\n" + "ok " * 500 + "a" * 999
    assert without_bytes(text) == text
    raw = b64(png(64, 64) * 20)
    assert without_bytes(f"x {raw} y") == f"x [{len(raw)} characters of base64 omitted] y"
