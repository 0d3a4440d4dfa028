"""Redacting text, messages and JSON documents: each text through the patterns its needles
select, then each encoded run of it decoded and redacted again."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from worker.core.redaction.decoders import DECODERS, Decoder
from worker.core.redaction.patterns import PATTERNS, Pattern, placeholder, secret_span
from worker.wire.models import Message


@dataclass(frozen=True)
class Redaction:
    """The text with each secret replaced, and how many of each kind were replaced."""

    text: str
    counts: dict[str, int]


def _present(pattern: Pattern, text: str, lowered: str) -> bool:
    """The text may hold a match: one of the pattern's needles is in it (when it has any), and
    then its gate (when it has one)."""
    haystack = lowered if pattern.folded else text
    if pattern.needles and not any(n in haystack for n in pattern.needles):
        return False
    return pattern.gate is None or pattern.gate.search(haystack) is not None


def _substitute(pattern: Pattern, text: str, counts: Counter[str]) -> str:
    """``text`` with each of ``pattern``'s accepted matches' secret replaced. A refused match
    is skipped from the end of its name (its value may hold what a later match finds), else
    from its end as ``re.sub`` would."""
    parts: list[str] = []
    done = pos = 0
    resume = "name" in pattern.regex.groupindex
    while (match := pattern.regex.search(text, pos)) is not None:
        if pattern.accept is not None and not pattern.accept(match):
            pos = match.end("name") if resume else max(match.end(), pos + 1)
            continue
        counts[pattern.kind] += 1
        start, end = secret_span(match)
        parts += [text[done:start], placeholder(pattern.kind)]
        done = end
        pos = max(match.end(), pos + 1)
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


def _patterns_pass(
    text: str, counts: Counter[str], patterns: tuple[Pattern, ...] = PATTERNS
) -> str:
    """``text`` through each of ``patterns`` whose needles it holds (lower-cased once, again
    only after a pattern changed it)."""
    if not text:
        return text
    lowered = text.lower()
    for pattern in patterns:
        if _present(pattern, text, lowered):
            replaced = _substitute(pattern, text, counts)
            if replaced != text:
                text, lowered = replaced, replaced.lower()
    return text


# (most runs that decode at all: words, paths) is not redacted again.
_ANY_NEEDLE = re.compile(
    "|".join(
        sorted(
            {re.escape(n.lower()) for p in PATTERNS for n in p.needles}
            | {re.escape(d.needle) for d in DECODERS if d.needle}
        )
    )
)
_MIN_SECRET_CHARS = 8


def _may_hold_secret(decoded: str) -> bool:
    if len(decoded) < _MIN_SECRET_CHARS:
        return False
    return _ANY_NEEDLE.search(decoded.lower()) is not None or bool(DECODERS[-1].run.search(decoded))


# How deep encodings are decoded inside each other (JSON text in a JSON string, base64 of a
# percent-encoded query).
_MAX_DEPTH = 2


def _decoded_pass(text: str, counts: Counter[str], decoder: Decoder, depth: int) -> str:
    """``text`` with each run of ``decoder``'s encoding that holds a secret once decoded written
    back redacted (or replaced by the placeholders of what it held)."""
    if decoder.needle not in text or (decoder.gate and not decoder.gate.search(text)):
        return text
    parts: list[str] = []
    done = 0
    for run in decoder.runs(text):
        decoded = decoder.decode(run.group(0))
        if decoded is None or decoded == run.group(0) or not _may_hold_secret(decoded):
            continue
        found: Counter[str] = Counter()
        redacted = _redacted(decoded, found, depth=depth + 1)
        if not found:
            continue
        counts.update(found)
        encode = decoder.encode
        back = encode(redacted, run.group(0)) if encode else " ".join(map(placeholder, found))
        parts += [text[done : run.start()], back]
        done = run.end()
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


def _redacted(
    text: str,
    counts: Counter[str],
    patterns: tuple[Pattern, ...] = PATTERNS,
    *,
    depth: int = 0,
) -> str:
    """``text`` as written through ``patterns``, then each encoded run of it decoded through
    all of them (and through the decoders again, to :data:`_MAX_DEPTH`)."""
    if not text:
        return text
    if patterns:
        text = _patterns_pass(text, counts, patterns)
    if depth < _MAX_DEPTH:
        for decoder in DECODERS:
            text = _decoded_pass(text, counts, decoder, depth)
    return text


def redact(text: str, counts: Counter[str] | None = None) -> Redaction:
    """``text`` with every secret :data:`PATTERNS` finds, as written or encoded, replaced by
    its kind's placeholder; ``counts``, when given, is added to as well."""
    found: Counter[str] = Counter()
    text = _redacted(text, found)
    if counts is not None:
        counts.update(found)
    return Redaction(text=text, counts=dict(found))


def redact_messages(messages: list[Message]) -> tuple[list[Message], dict[str, int]]:
    """Each message's text, reasoning, tool-call arguments and attachments' names (a file
    part's ``filename``) redacted (the same object when nothing was), and the counts by kind
    over all of them."""
    texts = [
        text
        for m in messages
        for text in (
            m.content,
            m.reasoning,
            *(c.arguments for c in m.tool_calls),
            *(a.label for a in m.attachments),
        )
    ]
    chosen = _patterns_by_text(texts)
    counts: Counter[str] = Counter()
    redacted = iter(
        _redacted(text, counts, patterns) for text, patterns in zip(texts, chosen, strict=True)
    )
    out = []
    for m in messages:
        content, reasoning = next(redacted), next(redacted)
        calls = tuple(
            c.model_copy(update={"arguments": a}) if a != c.arguments else c
            for c in m.tool_calls
            for a in [next(redacted)]
        )
        attachments = tuple(
            a.model_copy(update={"label": label}) if label != a.label else a
            for a in m.attachments
            for label in [next(redacted)]
        )
        changed = (content, reasoning, calls, attachments)
        if changed != (m.content, m.reasoning, m.tool_calls, m.attachments):
            m = m.model_copy(
                update={
                    "content": content,
                    "reasoning": reasoning,
                    "tool_calls": calls,
                    "attachments": attachments,
                }
            )
        out.append(m)
    return out, dict(counts)


def _patterns_by_text(texts: list[str]) -> list[tuple[Pattern, ...]]:
    """For each text, the patterns that may match it: at least those whose needles (and gate) it
    holds. Each pattern's needles, or its gate, are searched for once in all the texts joined,
    and each text is given the patterns found in it, so that a text none is found in (most
    texts) is not looked at again. (No needle spans the newline joining two texts; a gate match
    that does only adds a pattern to the text it starts in, which then finds nothing. A
    placeholder written by one pattern may hold another's needle, but it ends in "]" and so
    never completes that pattern's match.)"""
    whole = "\n".join(texts)
    lowered = whole.lower()
    chosen: list[list[Pattern]] = [[] for _ in texts]
    if len(lowered) != len(whole):  # lower() changed the length: positions would not agree
        present = [p for p in PATTERNS if _present(p, whole, lowered)]
        return [tuple(present) for _ in texts]
    starts = list(accumulate((len(text) + 1 for text in texts[:-1]), initial=0))
    for pattern in PATTERNS:
        haystack = lowered if pattern.folded else whole
        # A pattern with nothing to search for (no needles) may match any text.
        found = _holding(pattern, haystack, starts) if pattern.finders else range(len(texts))
        for index in sorted(found):
            chosen[index].append(pattern)
    return [tuple(patterns) for patterns in chosen]


def _holding(pattern: Pattern, haystack: str, starts: list[int]) -> set[int]:
    """The indexes of the texts (``haystack`` is them joined; ``starts``: where each starts) in
    which one of ``pattern``'s finders matches: once one does, the rest of that text is
    skipped, so a text full of needles costs one search, not one per needle."""
    holding = set()
    for finder in pattern.finders:
        found = finder.search(haystack)
        while found is not None:
            index = bisect_right(starts, found.start()) - 1
            holding.add(index)
            if index + 1 == len(starts):
                break
            found = finder.search(haystack, starts[index + 1])
    return holding


def redact_json(value: Any, counts: Counter[str] | None = None) -> Any:
    """A JSON document (wire messages, say) with every string in it redacted, keys included."""
    if isinstance(value, str):
        return redact(value, counts).text
    if isinstance(value, Mapping):
        return {redact_json(k, counts): redact_json(v, counts) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(v, counts) for v in value]
    return value
