"""Adapters for agent frameworks (optional extras): docs/integrations.md.

Each module imports its framework at import time, so import the one you use:
``worker.integrations.langchain`` needs the ``langchain`` extra.
"""
