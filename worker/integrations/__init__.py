"""Adapters for agent frameworks (optional extras; each module imports its framework).

- :mod:`worker.integrations.openai_agents`: a session for the OpenAI Agents SDK
  (``pip install 'compaction-worker[openai-agents]'``);
- :mod:`worker.integrations.agent_framework`: a context provider for Microsoft Agent Framework
  (``pip install 'compaction-worker[agent-framework]'``).

docs/integrations.md shows the few lines each takes.
"""
