"""What a requested compaction points at, and the images and files the range held."""

from __future__ import annotations

import re

from worker.summarize import SummaryRequest
from worker.summarize.digest.base import FOCUS, IMAGES, _one_line
from worker.summarize.prompt import without_bytes
from worker.wire.media import placeholders
from worker.wire.models import Message

# --- what a requested compaction points at; images; the latest state; actions -----------


# Words of a request's instructions that say nothing about what to look for.
_FOCUS_STOPWORDS = frozenset(
    [
        "about",
        "above",
        "after",
        "also",
        "been",
        "before",
        "below",
        "being",
        "both",
        "compact",
        "compaction",
        "could",
        "does",
        "each",
        "every",
        "focus",
        "from",
        "have",
        "into",
        "just",
        "keep",
        "kept",
        "make",
        "more",
        "most",
        "must",
        "only",
        "other",
        "over",
        "please",
        "should",
        "some",
        "such",
        "sure",
        "than",
        "that",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "very",
        "want",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "will",
        "with",
        "would",
        "your",
        "summary",
        "summarize",
    ]
)
_FOCUS_WORD = re.compile(r"[\w./:-]{4,}")
MAX_FOCUS_LINES = 12
FOCUS_LINE_CHARS = 200


# What the digest does with a requested compaction's instructions: it cannot follow them as an
# LLM would, and says so in the event (Summary.instructions_note).
INSTRUCTIONS_NOTE = (
    "the offline digest cannot follow instructions: it wrote its usual sections, and under "
    f"'{FOCUS}' the lines of the range that hold the instructions' words; configure an LLM "
    "(mode prefer_remote or remote_only) to have them followed"
)


def _focus(request: SummaryRequest) -> tuple[str, list[str]]:
    """What a requested compaction's instructions point at: the lines of the range (texts and
    tool-call arguments) that hold one of their words, newest kept when there are many. The
    instructions themselves are user text and are not repeated (the summary is published)."""
    if not request.instructions:
        return "", []
    words = {
        w.strip(".:/-").lower() for w in _FOCUS_WORD.findall(request.instructions)
    } - _FOCUS_STOPWORDS
    words.discard("")
    found: dict[str, str] = {}  # line -> message id
    for m in request.messages if words else []:
        texts = [without_bytes(m.content), *(c.arguments for c in m.tool_calls)]
        for line in (ln for t in texts for ln in t.splitlines()):
            flat = _one_line(line, FOCUS_LINE_CHARS)
            if flat and any(w in flat.lower() for w in words):
                found.setdefault(flat, m.id)
    if not found:
        return "Requested focus: nothing in the summarized messages matches it.", []
    kept = list(found.items())[-MAX_FOCUS_LINES:]
    lines = ["Requested focus: the summarized lines that match it, oldest first."]
    lines.extend(f"- {line}" for line, _ in kept)
    return "\n".join(lines), list(dict.fromkeys(mid for _, mid in kept))


def _attachments(
    messages: list[Message], earlier: dict[str, str], previous: list[str]
) -> tuple[str, list[str]]:
    """Each image and file an earlier summary named, then the range's, by placeholder and
    label (never its bytes)."""
    lines = [line.strip() for line in earlier.get(IMAGES, "").splitlines() if line.strip()]
    sources: list[str] = list(previous) if lines else []
    for m in messages:
        for name, a in zip(placeholders(m.id, m.attachments), m.attachments, strict=True):
            lines.append(f"- {name}: {a.label} (from the {m.role})")
            sources.append(m.id)
    return "\n".join(dict.fromkeys(lines)), sources
