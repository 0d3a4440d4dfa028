"""A conversation kept compact in the background: what an agent holds instead of a message list.

:class:`CompactingSession` (threads) and :class:`AsyncCompactingSession` (asyncio) wrap a
:class:`worker.client.Client` for one conversation. ``extend`` appends a turn and hands a
snapshot to a background sender; ``request_messages`` applies the compactions that have arrived
(in stream order, each checked by :func:`worker.wire.history.apply_compaction`) and returns the
projected request. Neither waits for Redis or a worker:

- the **sender** keeps only the newest unsent snapshot (a queue of one: a newer turn replaces
  an unsent older snapshot, the service would coalesce them anyway), gives it the next
  revision and submits it; while Redis is down it retries with backoff and says so in the log
  and in :attr:`status`;
- the **follower** reads the conversation's event stream (``Client.events(follow=True)`` with a
  short block, or ``aevents`` in an asyncio task) into an in-memory queue, which
  ``request_messages`` drains without waiting.

A compaction that no longer describes the history (the agent edited a message or undid a
compaction meanwhile) is skipped and counted; messages appended after a snapshot always
survive. ``state()`` / ``from_state`` carry a session into another process. docs/session.md
is the reference.

The package's private modules, one job each, over ``_setup`` (what a session is, fixed at
construction; it imports none of the others): ``_sync`` and ``_async`` (the two faces and
their loops), ``_core`` (the parts, the steps that do not wait, what the loops record between
waits, ``status``), ``_history`` (messages, applied compactions, the stream cursor, and
``state()``/``from_state``), ``_projection`` (copies and tool call ids of wire messages, the
cached request), ``_threads`` (what the sender and follower did, the retry schedule both
share), ``_tools`` (transcripts and the recall tool, the model's ``compact_history`` tool).
"""

from __future__ import annotations

from ._async import AsyncCompactingSession
from ._core import SessionStatus
from ._sync import CompactingSession
from ._tools import (
    COMPACT_DESCRIPTION,
    COMPACT_TOOL_NAME,
    RECALL_TOOL_NAME,
    CompactTool,
    RecallTool,
)

__all__ = [
    "COMPACT_DESCRIPTION",
    "COMPACT_TOOL_NAME",
    "RECALL_TOOL_NAME",
    "AsyncCompactingSession",
    "CompactTool",
    "CompactingSession",
    "RecallTool",
    "SessionStatus",
]
