"""The built-in context windows of well-known models, as data, and the lookup of a model's
window in them (docs/configuration.md, "Context windows" under ``[proxy]``, says where each
comes from and as of when). The proxy gives a request's snapshot the window of its ``model``,
so that ``auto_compact_threshold_percent`` applies per agent. Deployments override or extend
the table with ``[proxy.context_windows]``.

A window here is what a request may hold: the published context window, except where the
provider refuses input before it is full. GPT-5's 400,000-token window reserves 128,000 tokens
for output, and its API refuses more than 272,000 input tokens, so 272,000 is recorded: a
share of 400,000 could sit above what the model accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["BUILTIN_WINDOWS", "SOURCES", "WINDOWS_AS_OF", "ContextWindow", "window_for"]

WINDOWS_AS_OF = "2026-12-06"

SOURCES = {
    "openai": "https://platform.openai.com/docs/models",
    "anthropic": "https://platform.claude.com/docs/en/about-claude/models/overview",
    "google": "https://ai.google.dev/gemini-api/docs/models",
}

# GPT-5 and its 400,000-token successors: 400,000 less the 128,000 reserved for output.
_GPT5_INPUT = 272_000
# Google's "1M": every Gemini model below has this input token limit.
_GEMINI = 1_048_576

BUILTIN_WINDOWS: dict[str, int] = {
    # OpenAI
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    "gpt-5": _GPT5_INPUT,
    "gpt-5-mini": _GPT5_INPUT,
    "gpt-5-nano": _GPT5_INPUT,
    "gpt-5-chat": 128_000,
    "gpt-5.1": _GPT5_INPUT,
    "gpt-5.1-codex": _GPT5_INPUT,
    "gpt-5.1-chat": 128_000,
    "gpt-5.2": _GPT5_INPUT,
    "gpt-5.2-chat": 128_000,
    "gpt-5.4": 1_050_000,
    "gpt-5.4-mini": _GPT5_INPUT,
    "gpt-5.4-nano": _GPT5_INPUT,
    "gpt-5.5": 1_050_000,
    # Anthropic (200,000-token models take 1M with a beta header: give it per request)
    "claude-3-5-haiku": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-opus-4": 200_000,
    "claude-sonnet-4-5": 200_000,
    "claude-opus-4-5": 200_000,
    "claude-haiku-4-5": 200_000,
    "claude-sonnet-4-6": 1_000_000,
    "claude-opus-4-6": 1_000_000,
    "claude-opus-4-7": 1_000_000,
    "claude-opus-4-8": 1_000_000,
    "claude-sonnet-5": 1_000_000,
    "claude-opus-5": 1_000_000,
    "claude-haiku-5-5": 1_000_000,
    "claude-fable-5": 1_000_000,
    # Google
    "gemini-2.5-pro": _GEMINI,
    "gemini-2.5-flash": _GEMINI,
    "gemini-2.5-flash-lite": _GEMINI,
    "gemini-3-pro": _GEMINI,
    "gemini-3-flash": _GEMINI,
    "gemini-3.1-pro": _GEMINI,
    "gemini-3.1-flash-lite": _GEMINI,
    "gemini-3.5-flash": _GEMINI,
    "gemini-3.6-flash": _GEMINI,
}

# What may follow a table's name in a model name of its family: a dated or other variant
# ("gpt-4o-2024-08-06", "claude-sonnet-4-5@20250929"). A digit or a dot is another version
# ("gpt-5.1" is not "gpt-5"), a letter another model ("gpt-4o" is not "gpt-4").
_VARIANT_SEPARATORS = "-@:"


@dataclass(frozen=True)
class ContextWindow:
    """A model's context window in tokens and where it was found: ``header`` (the request
    said it), ``config`` (``[proxy.context_windows]``) or ``builtin``; ``name``: the table's
    name the model matched (``""`` for a header)."""

    tokens: int
    origin: str
    name: str = ""


def window_for(
    model: str, configured: Mapping[str, int], *, builtin: bool = True
) -> ContextWindow | None:
    """The window of ``model``: the longest name of the deployment's table (``configured``)
    and, with ``builtin``, the built-in one (a name in both: the deployment's) that the model
    is or starts with, followed by ``-``, ``@`` or ``:``. A routed name (``openai/gpt-4.1``,
    ``models/gemini-2.5-pro``) is also looked up without its routing. None: unknown."""
    names = {model, model.rpartition("/")[2]}
    tables = [("config", configured)]
    if builtin:
        tables.append(("builtin", BUILTIN_WINDOWS))
    found: ContextWindow | None = None
    for origin, table in tables:
        for entry, tokens in table.items():
            longer = found is None or len(entry) > len(found.name)
            if longer and any(_of_family(name, entry) for name in names):
                found = ContextWindow(tokens, origin, entry)
    return found


def _of_family(model: str, entry: str) -> bool:
    if not model.startswith(entry):
        return False
    rest = model[len(entry) :]
    return not rest or rest[0] in _VARIANT_SEPARATORS
