"""compaction-worker: conversation compaction for LLM agents, off the agent's critical path."""

__version__ = "0.1.0"
