"""Adapters for agent frameworks (optional extras; each module imports its framework, so
import the one you use). The four read alike (docs/integrations.md, "Names"): a
``Compacting<extension point>`` class, ``to_wire`` / ``from_wire`` and ``EXTRA_KEY``.

- :mod:`worker.integrations.langchain`: LangChain's ``create_agent`` middleware and LangGraph's
  ``pre_model_hook`` (``pip install 'compaction-worker[langchain]'``);
- :mod:`worker.integrations.openai_agents`: a session for the OpenAI Agents SDK
  (``pip install 'compaction-worker[openai-agents]'``);
- :mod:`worker.integrations.agent_framework`: a context provider for Microsoft Agent Framework
  (``pip install 'compaction-worker[agent-framework]'``);
- :mod:`worker.integrations.google_adk`: an events summarizer for Google ADK's events
  compaction (``pip install 'compaction-worker[google-adk]'``).

docs/integrations.md shows the few lines each takes.
"""

__all__: list[str] = []  # nothing here: import the module of your framework
