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

The package's private modules, one job each: ``_sync`` and ``_async`` (the two faces and their
loops), ``_loop_steps`` (what the loops record between waits), ``_core`` (the parts, and
the steps that do not wait), ``_setup`` (what a session is), ``_history``
(messages, applied compactions, the stream cursor), ``_projection`` (the cached request),
``_recall`` (transcripts, the recall tool), ``_sender`` and ``_follower`` (what the loops did),
``_status``, ``_state`` (``state()``/``from_state``), ``_backoff`` (the retry schedule both
loops share), ``_messages`` (copies, tool call ids), ``_compact_tool`` (the model's
``compact_history`` tool).
"""

from __future__ import annotations

from ._async import AsyncCompactingSession
from ._compact_tool import COMPACT_DESCRIPTION, COMPACT_TOOL_NAME, CompactTool
from ._recall import RECALL_TOOL_NAME, RecallTool
from ._status import SessionStatus
from ._sync import CompactingSession

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
