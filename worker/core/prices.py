"""The built-in list prices of well-known models, as data (docs/cost.md says where each comes
from and as of when). US dollars per million tokens. Deployments override or extend them with
``[cost.models."NAME"]``; a model matches the longest name here that it starts with, so dated
names (``gpt-4o-2024-08-06``, ``claude-sonnet-4-20250514``) find their family.

Prices change: these are the published list prices as known on :data:`PRICES_AS_OF`, without
batch, priority or regional surcharges, and for Gemini 2.5 Pro the tier of prompts up to
200,000 tokens.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BUILTIN_PRICES", "PRICES_AS_OF", "SOURCES"]

PRICES_AS_OF = "2025-08-15"

SOURCES = {
    "openai": "https://openai.com/api/pricing/",
    "anthropic": "https://docs.anthropic.com/en/docs/about-claude/pricing",
    "google": "https://ai.google.dev/gemini-api/docs/pricing",
}


def _openai(input_: float, cached: float, output: float) -> dict[str, Any]:
    # Automatic prompt caching: no write surcharge, prefixes of 1,024 tokens or more, kept
    # 5-10 minutes of inactivity (the lower bound is used).
    return {
        "input": input_,
        "cached_input": cached,
        "output": output,
        "cache_ttl": "5m",
        "min_cacheable_tokens": 1024,
        "source": f"{SOURCES['openai']} (as of {PRICES_AS_OF})",
    }


def _anthropic(input_: float, output: float, *, min_tokens: int = 1024) -> dict[str, Any]:
    # Cache writes cost 1.25x input for the 5-minute TTL (the default) and 2x for 1 hour;
    # reads 0.1x input.
    return {
        "input": input_,
        "cached_input": round(input_ * 0.1, 6),
        "output": output,
        "cache_write": {"5m": round(input_ * 1.25, 6), "1h": round(input_ * 2, 6)},
        "cache_ttl": "5m",
        "min_cacheable_tokens": min_tokens,
        "source": f"{SOURCES['anthropic']} (as of {PRICES_AS_OF})",
    }


def _google(input_: float, cached: float, output: float, *, min_tokens: int) -> dict[str, Any]:
    # Implicit caching: no write charge, cached reads at 25 % of input; Google documents no
    # lifetime for implicit caches, so 5 minutes is assumed (explicit caches default to 1 h).
    return {
        "input": input_,
        "cached_input": cached,
        "output": output,
        "cache_ttl": "5m",
        "min_cacheable_tokens": min_tokens,
        "source": f"{SOURCES['google']} (as of {PRICES_AS_OF})",
    }


BUILTIN_PRICES: dict[str, dict[str, Any]] = {
    # OpenAI
    "gpt-5": _openai(1.25, 0.125, 10.00),
    "gpt-5-mini": _openai(0.25, 0.025, 2.00),
    "gpt-5-nano": _openai(0.05, 0.005, 0.40),
    "gpt-4.1": _openai(2.00, 0.50, 8.00),
    "gpt-4.1-mini": _openai(0.40, 0.10, 1.60),
    "gpt-4.1-nano": _openai(0.10, 0.025, 0.40),
    "gpt-4o": _openai(2.50, 1.25, 10.00),
    "gpt-4o-mini": _openai(0.15, 0.075, 0.60),
    "o3": _openai(2.00, 0.50, 8.00),
    "o4-mini": _openai(1.10, 0.275, 4.40),
    # Anthropic
    "claude-opus-4": _anthropic(15.00, 75.00),
    "claude-sonnet-4": _anthropic(3.00, 15.00),
    "claude-3-7-sonnet": _anthropic(3.00, 15.00),
    "claude-3-5-sonnet": _anthropic(3.00, 15.00),
    "claude-3-5-haiku": _anthropic(0.80, 4.00, min_tokens=2048),
    # Google
    "gemini-2.5-pro": _google(1.25, 0.31, 10.00, min_tokens=2048),
    "gemini-2.5-flash": _google(0.30, 0.075, 2.50, min_tokens=1024),
    "gemini-2.5-flash-lite": _google(0.10, 0.025, 0.40, min_tokens=1024),
}
