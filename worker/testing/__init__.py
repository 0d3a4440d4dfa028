"""Test support that ships with the package.

- :mod:`worker.testing.standin_llm`: a stand-in LLM provider (a real HTTP server on loopback,
  OpenAI and Anthropic wire formats, fault injection), also runnable with ``python -m``.
- :mod:`worker.testing.llm_schema`: checks of request bodies against each provider's schema.

Nothing is imported here, so that ``python -m worker.testing.standin_llm`` runs the module once.
"""
