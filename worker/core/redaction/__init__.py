"""Secrets of well-known shapes found in text and replaced by a placeholder naming their kind.

What a compaction summarizes is redacted before any summarizer sees it (the LLM and the offline
digest alike), and the completed event counts what was redacted, by kind, never the content.
Each :data:`PATTERNS` entry is one kind (:mod:`.patterns`): API keys and tokens with a known
prefix, JWTs, PEM private keys (the whole block), the password of a
``scheme://user:password@host`` URL, ``Authorization`` and API-key header values, passwords on
command lines, connection strings' account keys and ``api_key = ...``-style assignments. Only
the secret itself is replaced (``[redacted: aws_access_key_id]``); what names it stays, so a
summary still says which key or URL was used.

A secret is found as written and as encoded (:data:`DECODERS`, :mod:`.decoders`): a run of JSON
string escapes (``\\u0073\\u006b-proj-…`` in a tool call's arguments), of percent-encoding (a
URL's query) or of base64 of a plausible length is decoded and redacted too; a run that held a
secret is written back encoded around its placeholders (JSON and percent-encoding), or replaced
whole (base64).

Bounded cost: every pattern is linear in the text. The patterns run one after the other, the
most specific first, so a key assigned to ``api_key`` is counted as that key's kind. A
candidate the pattern's check refuses (an assignment to ``max_tokens``) is skipped from the end
of its name, not of its value, so that a secret inside that value is still found (a URL's first
query parameter after its scheme's ``:``).

What looks random (:mod:`.randomness`) is no secret of a known kind, but the digest publishes
none of it: :func:`without_random_tokens`.
"""

from worker.core.redaction.decoders import DECODERS, Decoder
from worker.core.redaction.patterns import PATTERNS, Pattern, placeholder
from worker.core.redaction.randomness import (
    MIN_RANDOM_CHARS,
    RANDOM_PLACEHOLDER,
    looks_random,
    without_random_tokens,
)
from worker.core.redaction.scan import Redaction, redact, redact_json, redact_messages

__all__ = [
    "DECODERS",
    "MIN_RANDOM_CHARS",
    "PATTERNS",
    "RANDOM_PLACEHOLDER",
    "Decoder",
    "Pattern",
    "Redaction",
    "looks_random",
    "placeholder",
    "redact",
    "redact_json",
    "redact_messages",
    "without_random_tokens",
]
