"""Secrets of well-known shapes found in text and replaced by a placeholder naming their kind.

What a compaction summarizes is redacted before any summarizer sees it (the LLM and the offline
digest alike), and the completed event counts what was redacted, by kind, never the content.
Each :data:`PATTERNS` entry is one kind: API keys and tokens with a known prefix, JWTs, PEM
private keys (the whole block), the password of a ``scheme://user:password@host`` URL,
``Authorization`` header values and ``api_key = ...``-style assignments of high-entropy values.
Only the secret itself is replaced (``[redacted: aws_access_key_id]``); what names it stays, so
a summary still says which key or URL was used.

Bounded cost: every pattern is linear in the text. Each starts with a literal or where a run of
its characters starts (a lookbehind), and its variable parts are possessive, so a failed match
is never retried inside the same run (Python >= 3.11). The patterns run one after the other, the
most specific first, so a key assigned to ``api_key`` is counted as that key's kind.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from worker.wire.models import Message

__all__ = [
    "PATTERNS",
    "Pattern",
    "Redaction",
    "placeholder",
    "redact",
    "redact_json",
    "redact_messages",
]

# Characters of a token: a match starts only where a run of them starts, so a long run is
# scanned once, not once per character.
_TOKEN_RUN = r"(?<![A-Za-z0-9_-])"


def _run_starts_before(prefix: int) -> str:
    """:data:`_TOKEN_RUN` for a match whose ``prefix`` literal characters come first: written
    after the literal, so that the regex engine still searches for the literal (fast)."""
    return rf"(?<![A-Za-z0-9_-][\s\S]{{{prefix}}})"


_END = r"(?![A-Za-z0-9_-])"
# An optional quote, escaped or not: a secret in JSON inside a JSON string (tool arguments).
_QUOTE = r"(?:\\?[\"'])?"


@dataclass(frozen=True)
class Pattern:
    """One kind of secret. ``regex``'s group ``secret`` is what is replaced (the whole match when
    it has none); ``accept`` vets a candidate (its full match) and ``needles`` skip the regex when
    none of them is in the text."""

    kind: str
    regex: re.Pattern[str]
    description: str
    accept: Callable[[re.Match[str]], bool] | None = None
    needles: tuple[str, ...] = ()
    folded: bool = False  # the needles are lower case, looked for in the lower-cased text
    gate: re.Pattern[str] | None = None  # then searched for where the needles were
    # What a range is searched for: the needles (one regex), or the gate's alternatives (one
    # regex each, starting with its needle: a literal start lets ``re`` skip ahead fast).
    finders: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True)
class Redaction:
    """The text with each secret replaced, and how many of each kind were replaced."""

    text: str
    counts: dict[str, int]


def placeholder(kind: str) -> str:
    return f"[redacted: {kind}]"


_PLACEHOLDER_PREFIXES = ("[redacted", "$", "<", "{", "%", "*", "…", "...", "xxx", "XXX")


def _placeholder_value(value: str) -> bool:
    """A value that stands for a secret rather than being one (``$TOKEN``, ``<key>``, ``***``)."""
    return value.startswith(_PLACEHOLDER_PREFIXES) or value.lower() in {
        "none",
        "null",
        "true",
        "false",
        "password",
        "changeme",
        "redacted",
    }


def _entropy(value: str) -> float:
    """Shannon entropy, in bits per character."""
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


# An expression rather than a literal: a call, an index, an attribute of a name.
_CODE = re.compile(r"[()\[\]]|^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")


def _random_looking(value: str, *, min_length: int) -> bool:
    """Letters and digits mixed, long enough and varied enough to be a generated secret (an
    identifier such as ``max_tokens`` or ``getApiKey`` has no digits; ``token_v2`` is short)."""
    if len(value) < min_length or _placeholder_value(value):
        return False
    has_digit = any(c.isdigit() for c in value)
    has_alpha = any(c.isalpha() for c in value)
    return has_digit and has_alpha and not _CODE.search(value) and _entropy(value) >= 3.0


def _secret(match: re.Match[str]) -> str:
    return match.group("secret") if "secret" in match.re.groupindex else match.group(0)


def _with_digit(match: re.Match[str]) -> bool:
    return any(c.isdigit() for c in _secret(match))


# Key names an assignment's value is a secret for: `api_key`, `OPENAI_API_KEY`, `x-auth-token`,
# `client_secret`, `db_password`; not `max_tokens` or `token_count` (the word must end the name).
_SECRET_NAME = re.compile(
    r"(?:api[_-]?key|apikey|access[_-]?key|secret[_-]?key|private[_-]?key|secret|token"
    r"|password|passwd|pwd|credentials?)$",
    re.IGNORECASE,
)


def _assignment(match: re.Match[str]) -> bool:
    if not _SECRET_NAME.search(match.group("name")):
        return False
    return _random_looking(match.group("secret"), min_length=10)


# Passwords of examples and tests (`http://user:pass@host`, `:pass%40word@`): not secrets, and
# a conversation about URL parsing needs them to stay.
_STAND_IN_PASSWORDS = {"p", "pw", "pwd", "pass", "passwd", "password", "secret", "x", "xxx"}
_ESCAPES = re.compile(r"%[0-9A-Fa-f]{2}|:")


def _url_password(match: re.Match[str]) -> bool:
    value = match.group("secret")
    if _ESCAPES.sub("", value).lower() in _STAND_IN_PASSWORDS:
        return False
    return not _placeholder_value(value)


def _authorization(match: re.Match[str]) -> bool:
    value = match.group("secret")
    return len(value) >= 6 and not _placeholder_value(value)


def _p(
    kind: str,
    pattern: str,
    description: str,
    *,
    accept: Callable[[re.Match[str]], bool] | None = None,
    needles: tuple[str, ...] = (),
    folded: bool = False,
    gate: Mapping[str, str] | None = None,
) -> Pattern:
    """``gate``: for each needle, what must follow it (a regex) for the full pattern to be tried."""
    after = dict.fromkeys(needles, "") if gate is None else gate
    if set(after) != set(needles):
        raise ValueError(f"{kind}: the gate must give what follows each needle, and only those")
    alternatives = [f"{re.escape(needle)}(?:{rest})" for needle, rest in after.items()]
    either = "|".join(alternatives)
    if gate is None:  # needles alone are found together as fast as apart
        compiled_gate, finders = None, [either] if needles else []
    else:
        # A gate's alternatives are searched for apart: together, their first letters (common
        # ones) would each be tried as the start of every alternative.
        compiled_gate, finders = re.compile(either), alternatives
    compiled = tuple(map(re.compile, finders))
    return Pattern(
        kind, re.compile(pattern), description, accept, needles, folded, compiled_gate, compiled
    )


PATTERNS: tuple[Pattern, ...] = (
    _p(
        "private_key",
        # The body stops at the next "-----" (its END line, or the next BEGIN of a truncated
        # key), so a block is scanned once; a key cut off before its END line is redacted to
        # the end of its base64.
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[A-Za-z0-9+/=\s,:\\]|-(?!----))*+"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)?",
        "a PEM private key (RSA, EC, OpenSSH, PKCS#8, PGP), the whole block",
        needles=("PRIVATE KEY",),
    ),
    _p(
        "anthropic_api_key",
        r"sk-ant-" + _run_starts_before(7) + r"[A-Za-z0-9_-]{20,}+",
        "`sk-ant-…`",
        needles=("sk-ant-",),
    ),
    _p(
        "openai_api_key",
        r"sk-" + _run_starts_before(3) + r"(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}+",
        "`sk-…`, `sk-proj-…`, `sk-svcacct-…` (with a digit in it)",
        accept=_with_digit,
        needles=("sk-",),
    ),
    _p(
        "stripe_secret_key",
        _TOKEN_RUN + r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}+" + _END,
        "`sk_live_…`, `sk_test_…`, `rk_live_…` (secret and restricted keys)",
        needles=("_live_", "_test_"),
    ),
    _p(
        "aws_access_key_id",
        r"A(?:KIA|SIA|BIA|CCA)(?<![A-Za-z0-9][\s\S]{4})[A-Z0-9]{16}(?![A-Za-z0-9])",
        "`AKIA…`, `ASIA…` (20 characters)",
        needles=("AKIA", "ASIA", "ABIA", "ACCA"),
    ),
    _p(
        "aws_secret_access_key",
        r"(?i:aws_?secret_?access_?key|aws_?secret_?key|secret_?access_?key)" + _QUOTE + r"\s{0,8}+"
        r"[:=]\s{0,8}+" + _QUOTE + r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
        "40 characters assigned to `aws_secret_access_key` (any case, `=` or `:`)",
        needles=("secret",),
        folded=True,
    ),
    _p(
        "github_token",
        r"(?:gh[pousr]_"
        + _run_starts_before(4)
        + r"[A-Za-z0-9]{30,}+|github_pat_"
        + _run_starts_before(11)
        + r"[A-Za-z0-9_]{22,}+)"
        + _END,
        "`ghp_…`, `gho_…`, `ghs_…`, `ghu_…`, `ghr_…`, `github_pat_…`",
        needles=("ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_"),
    ),
    _p(
        "slack_token",
        r"xox" + _run_starts_before(3) + r"[a-z]-[A-Za-z0-9-]{10,}+",
        "`xoxb-…`, `xoxp-…`, `xoxa-…` and the other `xox?-` tokens",
        needles=("xox",),
    ),
    _p(
        "google_api_key",
        r"AIza" + _run_starts_before(4) + r"[A-Za-z0-9_-]{35}" + _END,
        "`AIza…` (39 characters)",
        needles=("AIza",),
    ),
    _p(
        "authorization_header",
        r"(?i:(?:proxy-)?authorization)"
        + _QUOTE
        + r"\s{0,8}+[:=]\s{0,8}+"
        + _QUOTE
        + r"(?i:bearer|basic|token|digest|apikey)\s{1,8}+(?P<secret>[^\s\"',;`\\]++)",
        "the credentials of an `Authorization:` (or `Proxy-Authorization:`) header with a "
        "`Bearer`, `Basic`, `Token`, `Digest` or `ApiKey` scheme; the scheme stays",
        accept=_authorization,
        needles=("authorization",),
        folded=True,
    ),
    _p(
        "jwt",
        r"eyJ"
        + _run_starts_before(3)
        + r"[A-Za-z0-9_-]{8,}+\.eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+",
        "a JSON Web Token (`eyJ….eyJ….…`)",
        needles=("eyJ",),
    ),
    _p(
        "url_password",
        r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,30}+://[^\s:/?#@\"'<>\\]*+:"
        r"(?P<secret>[^\s/?#@\"'<>\\]++)@",
        "the password of `scheme://user:password@host` (the user and host stay)",
        accept=_url_password,
        needles=("://",),
    ),
    _p(
        "secret_assignment",
        r"(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z0-9_.-]{1,64}+)"
        + _QUOTE
        + r"\s{0,8}+[:=]\s{0,8}+"
        + _QUOTE
        + r"(?P<secret>[^\s\"'`,;:=\\]{10,}+={0,2})",
        "a value of 10+ characters mixing letters and digits (3+ bits of entropy a "
        "character) assigned with `=` or `:` to a name ending in `api_key`, `access_key`, "
        "`secret_key`, `private_key`, `secret`, `token`, `password`, `passwd`, `pwd` or "
        "`credentials`",
        accept=_assignment,
        needles=("key", "secret", "token", "pass", "pwd", "credential"),
        folded=True,
        # A secret name's last word right before the `=` or `:` (the full pattern tries every
        # run of name characters: three times slower over ordinary code).
        gate={
            needle: rest + _QUOTE + r"\s{0,8}+[:=]"
            for needle, rest in [
                ("key", ""),
                ("secret", ""),
                ("token", ""),
                ("pass", "w(?:or)?d"),
                ("pwd", ""),
                ("credential", "s?"),
            ]
        },
    ),
)


def _present(pattern: Pattern, text: str, lowered: str) -> bool:
    """The text may hold a match: one of the pattern's needles is in it (when it has any), and
    then its gate (when it has one)."""
    haystack = lowered if pattern.folded else text
    if pattern.needles and not any(n in haystack for n in pattern.needles):
        return False
    return pattern.gate is None or pattern.gate.search(haystack) is not None


def _substitute(pattern: Pattern, text: str, counts: Counter[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if pattern.accept is not None and not pattern.accept(match):
            return match.group(0)
        counts[pattern.kind] += 1
        if "secret" not in match.re.groupindex:
            return placeholder(pattern.kind)
        start, end = match.span("secret")
        whole = match.group(0)
        base = match.start()
        return whole[: start - base] + placeholder(pattern.kind) + whole[end - base :]

    return pattern.regex.sub(replace, text)


def _redacted(text: str, counts: Counter[str], patterns: tuple[Pattern, ...] = PATTERNS) -> str:
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


def redact(text: str, counts: Counter[str] | None = None) -> Redaction:
    """``text`` with every secret :data:`PATTERNS` finds replaced by its kind's placeholder;
    ``counts``, when given, is added to as well."""
    found: Counter[str] = Counter()
    text = _redacted(text, found)
    if counts is not None:
        counts.update(found)
    return Redaction(text=text, counts=dict(found))


def redact_messages(messages: list[Message]) -> tuple[list[Message], dict[str, int]]:
    """Each message's text, reasoning and tool-call arguments redacted (the same object when
    nothing was), and the counts by kind over all of them."""
    texts = [
        text
        for m in messages
        for text in (m.content, m.reasoning, *(c.arguments for c in m.tool_calls))
    ]
    chosen = _patterns_by_text(texts)
    if not any(chosen):
        return list(messages), {}
    counts: Counter[str] = Counter()
    redacted = iter(
        _redacted(text, counts, patterns) if patterns else text
        for text, patterns in zip(texts, chosen, strict=True)
    )
    out = []
    for m in messages:
        content, reasoning = next(redacted), next(redacted)
        calls = tuple(
            c.model_copy(update={"arguments": a}) if a != c.arguments else c
            for c in m.tool_calls
            for a in [next(redacted)]
        )
        if content != m.content or reasoning != m.reasoning or calls != m.tool_calls:
            m = m.model_copy(
                update={"content": content, "reasoning": reasoning, "tool_calls": calls}
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
