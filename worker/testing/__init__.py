"""Test support that ships with the package, supported like the rest of its public names
(docs/testing.md).

- :class:`StandinLLM` (:mod:`worker.testing.standin_llm`): a stand-in LLM provider, a real
  HTTP server on loopback speaking the OpenAI Chat Completions and Anthropic Messages formats,
  with deterministic answers, fault injection (:class:`Fault`) and a record of every request
  (:class:`RecordedRequest`); also runnable as ``python -m worker.testing.standin_llm``.
- :func:`openai_chat_errors` and :func:`anthropic_messages_errors`
  (:mod:`worker.testing.llm_schema`): what is wrong with a request body, per provider.

The names are resolved on first use, so that importing this package imports neither module
(and ``python -m worker.testing.standin_llm`` runs that module once).
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:
    from worker.testing.llm_schema import anthropic_messages_errors, openai_chat_errors
    from worker.testing.standin_llm import Fault, RecordedRequest, StandinLLM, standin_summary

__all__ = [
    "Fault",
    "RecordedRequest",
    "StandinLLM",
    "anthropic_messages_errors",
    "openai_chat_errors",
    "standin_summary",
]

_HOMES = {
    "Fault": "worker.testing.standin_llm",
    "RecordedRequest": "worker.testing.standin_llm",
    "StandinLLM": "worker.testing.standin_llm",
    "standin_summary": "worker.testing.standin_llm",
    "anthropic_messages_errors": "worker.testing.llm_schema",
    "openai_chat_errors": "worker.testing.llm_schema",
}


def __getattr__(name: str) -> typing.Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
