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
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.client import Client, RequestResult, project
from worker.config import CompactionConfig
from worker.errors import CompactorError, EventMismatch, PermanentError
from worker.reuse import Reuse
from worker.session.compact_tool import COMPACT_TOOL_NAME, CompactTool, compact_tool, tool_answer
from worker.wire import formats
from worker.wire.events import (
    OUTCOME_TYPES,
    CompactionEvent,
    CompletedEvent,
    FailedEvent,
    RejectedEvent,
    RevertedEvent,
    parse_event,
)
from worker.wire.history import apply_compaction, range_digest
from worker.wire.models import WireFormat
from worker.wire.snapshots import OPERATOR_ONLY

__all__ = [
    "COMPACT_TOOL_NAME",
    "RECALL_TOOL_NAME",
    "AsyncCompactingSession",
    "CompactTool",
    "CompactingSession",
    "RecallTool",
    "SessionStatus",
]

log = logging.getLogger(__name__)

STATE_VERSION = 1
RECALL_TOOL_NAME = "recall_message"
BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0
INBOX_SIZE = 10_000  # events read but not yet drained; the follower waits when it is full
TRANSCRIPTS_KEPT = 16  # transcripts held in memory for recall


@dataclass(frozen=True)
class SessionStatus:
    """What the background threads have done, as of now (a copy; cheap to take)."""

    conversation_id: str
    revision: int  # newest revision given to a snapshot (or learned from the service)
    last_submitted_revision: int | None  # newest revision the service accepted from us
    pending_submits: int  # turns (extend calls) not yet in an accepted snapshot
    retrying: bool  # the sender is backing off after a failed submit
    submit_failures: int  # failed submit attempts so far
    last_error: str | None  # the newest submit error, cleared by the next success
    snapshots_replaced: int  # unsent snapshots replaced by a newer one (only the newest is sent)
    events_received: int  # events the follower has read
    last_outcome_revision: int | None  # newest revision with an outcome event read
    events_applied: int  # compactions applied to the history
    compactions_skipped: int  # compactions that no longer described the history
    last_skip_reason: str | None
    compactions_undone: int
    follower_error: str | None  # the follower's newest read error, cleared when it reads again
    last_event_id: str  # the stream id of the newest event drained into the history
    compactions_failed: int  # compaction.failed events read (the next snapshot tries again)
    snapshots_rejected: int  # compaction.rejected events read: the history is not valid input
    last_rejection: str | None  # the newest rejection's reason ("FIELD: REASON")


@dataclass(frozen=True)
class RecallTool:
    """A tool that lets the model fetch a compacted message by id.

    ``openai``: a Chat Completions tool (``{"type": "function", "function": {...}}``);
    ``anthropic``: a Messages API tool (``{"name", "description", "input_schema"}``);
    ``handler(arguments)``: the tool's answer (text), where ``arguments`` is the call's
    arguments as JSON text (OpenAI) or a dict (Anthropic). An async session's handler is a
    coroutine function."""

    name: str
    openai: dict[str, Any]
    anthropic: dict[str, Any]
    handler: Callable[[str | Mapping[str, Any]], Any]


@dataclass
class _Applied:
    event: CompletedEvent
    index: int  # where the replacement starts in the history
    size: int  # len(replacement)


class _Core:
    """The state a session keeps, and every step that does not wait on a thread or a task."""

    def __init__(
        self,
        conversation_id: str,
        *,
        client: Client,
        format: WireFormat = "openai",
        model: str | None = None,
        context_window: int | None = None,
        config: Mapping[str, Any] | CompactionConfig | None = None,
        tools: Mapping[str, Any] | None = None,
        system: Any = None,
        messages: Iterable[dict[str, Any]] = (),
        follow_block_ms: int = 500,
    ) -> None:
        self.conversation_id = conversation_id
        self.client = client
        self.format: WireFormat = format
        self.model = model
        self.context_window = context_window
        self.system = system
        self.tools = dict(tools or {})
        self.overrides, self.projection_config = _resolve_config(client, config, self.tools)
        self.follow_block_ms = follow_block_ms
        self._reuse = Reuse(conversation_cache_bytes=0)
        self._lock = threading.RLock()
        # Notified when a submit is recorded or an outcome read (``wait_settled``).
        self._status_changed = threading.Condition(self._lock)
        self._history: list[dict[str, Any]] = [_own(m) for m in messages]
        self._version = 0  # bumped on every change of the history
        self._projected: tuple[int, list[dict[str, Any]]] | None = None
        # (the history last projected, its projection): the base of an incremental projection
        self._projection_base: tuple[list[Any], list[dict[str, Any]]] | None = None
        self._per_result = (
            self.projection_config.keep_recent_tool_results is None
            and self.projection_config.projected_tool_result_budget is None
        )
        self._revision = -1
        # The first revision the service accepted from this session (its line of history):
        # completed events of older revisions belong to an earlier use of the conversation id.
        self._floor: int | None = None
        self._held: list[tuple[str, CompactionEvent]] = []  # read before the floor was known
        self._applied: list[_Applied] = []
        self._seen: set[str] = set()
        self._last_event_id = "0"
        self._transcripts: OrderedDict[str, tuple[list[dict[str, Any]], dict[str, int]]] = (
            OrderedDict()
        )
        # sender bookkeeping
        self._turns = 0  # extend calls (and other changes) that need a snapshot
        self._submitted_turn = 0
        self._last_submitted: int | None = None
        self._retrying = False
        self._submit_failures = 0
        self._last_error: str | None = None
        self._replaced = 0
        # follower bookkeeping
        self._received = 0
        self._last_outcome: int | None = None
        self._follower_error: str | None = None
        self._failed = 0
        self._rejected = 0
        self._last_rejection: str | None = None
        # history bookkeeping
        self._skipped = 0
        self._last_skip: str | None = None
        self._undone = 0
        self._applied_count = 0

    # --- reading ------------------------------------------------------------------------------

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The current history (compactions applied), in the wire format. Treat the messages as
        read-only: the session shares them with the snapshots it sends."""
        with self._lock:
            return list(self._history)

    @property
    def compactions(self) -> list[CompletedEvent]:
        """The compactions applied so far, oldest first (an undone one is removed)."""
        with self._lock:
            return [a.event for a in self._applied]

    @property
    def status(self) -> SessionStatus:
        with self._lock:
            return SessionStatus(
                conversation_id=self.conversation_id,
                revision=self._revision,
                last_submitted_revision=self._last_submitted,
                pending_submits=self._turns - self._submitted_turn,
                retrying=self._retrying,
                submit_failures=self._submit_failures,
                last_error=self._last_error,
                snapshots_replaced=self._replaced,
                events_received=self._received,
                last_outcome_revision=self._last_outcome,
                events_applied=self._applied_count,
                compactions_skipped=self._skipped,
                last_skip_reason=self._last_skip,
                compactions_undone=self._undone,
                follower_error=self._follower_error,
                last_event_id=self._last_event_id,
                compactions_failed=self._failed,
                snapshots_rejected=self._rejected,
                last_rejection=self._last_rejection,
            )

    def _wait_settled(self, timeout_s: float) -> bool:
        """Until every turn is submitted (or refused) and the outcome event of the newest
        accepted snapshot has been read; False when ``timeout_s`` passes first."""

        def settled() -> bool:
            submitted, outcome = self._last_submitted, self._last_outcome
            return self._turns == self._submitted_turn and (
                submitted is None or (outcome is not None and outcome >= submitted)
            )

        with self._status_changed:
            return self._status_changed.wait_for(settled, timeout=timeout_s)

    # --- changing the history -----------------------------------------------------------------

    def _append(self, new_messages: Iterable[dict[str, Any]]) -> tuple[int, tuple[Any, ...]]:
        """Append copies of the messages; the (turn, messages) to snapshot."""
        copies = [_own(m) for m in new_messages]
        with self._lock:
            self._history.extend(copies)
            return self._changed()

    def _replace(self, messages: Iterable[dict[str, Any]]) -> tuple[int, tuple[Any, ...]]:
        copies = [_own(m) for m in messages]
        with self._lock:
            self._history = copies
            return self._changed()

    def _changed(self) -> tuple[int, tuple[Any, ...]]:
        self._version += 1
        self._turns += 1
        return self._turns, tuple(self._history)

    def _drain_one(self, entry_id: str, event: CompactionEvent) -> None:
        """Apply one event read from the stream (called in stream order)."""
        if isinstance(event, RevertedEvent):
            self._drain_revert(entry_id, event)
            return
        with self._lock:
            if self._floor is None:  # kept, in order, until the first submit is accepted
                self._held.append((entry_id, event))
                return
            self._last_event_id = entry_id
            self._revision = max(self._revision, event.revision)
            if not isinstance(event, CompletedEvent) or event.event_id in self._seen:
                return
            self._seen.add(event.event_id)
            if event.revision < self._floor:
                log.info(
                    "ignoring compaction %s of %s: revision %d predates this session (%d)",
                    event.event_id,
                    self.conversation_id,
                    event.revision,
                    self._floor,
                )
                return
            history = self._history
            try:
                compacted = apply_compaction(history, event, conversation_id=self.conversation_id)
            except EventMismatch as exc:
                self._skipped += 1
                self._last_skip = f"{event.event_id} (revision {event.revision}): {exc}"
                log.info(
                    "skipping compaction %s of %s (revision %d): %s; the next snapshot is "
                    "compacted instead",
                    event.event_id,
                    self.conversation_id,
                    event.revision,
                    exc,
                )
                return
            index = formats.source_ids(history).index(event.compaction.first_id)
            self._history = compacted
            self._version += 1
            self._applied.append(_Applied(event, index, len(event.compaction.replacement)))
            self._applied_count += 1
            log.info(
                "applied compaction %s of %s (revision %d): %d -> %d messages",
                event.event_id,
                self.conversation_id,
                event.revision,
                len(history),
                len(compacted),
            )

    def _drain_revert(self, entry_id: str, event: RevertedEvent) -> None:
        """A compaction restored on the service (``compaction.reverted``): undone here too
        when it is the newest applied, as :meth:`undo` does (its transcript read, unless
        cached); one not applied yet is never applied now."""
        with self._lock:
            if self._floor is None:
                self._held.append((entry_id, event))
                return
            self._last_event_id = entry_id
            self._seen.add(event.reverted_event_id)
            applied = self._revert_plan(event)
        if applied is None:
            return
        try:
            original, _ = self._transcript(applied.event)
            self._undo_apply(applied, original)
        except CompactorError as exc:
            with self._lock:
                self._skipped += 1
                self._last_skip = f"revert of {event.reverted_event_id}: {exc.message}"
            log.warning(
                "cannot undo compaction %s of %s, restored on the service: %s",
                event.reverted_event_id,
                self.conversation_id,
                exc.message,
            )

    def _revert_plan(self, event: RevertedEvent) -> _Applied | None:
        """The applied compaction ``event`` restores, when it is the newest applied."""
        with self._lock:
            if self._applied and self._applied[-1].event.event_id == event.reverted_event_id:
                return self._applied[-1]
            return None

    def _release_held(self) -> list[tuple[str, CompactionEvent]]:
        with self._lock:
            if self._floor is None:
                return []
            held, self._held = self._held, []
            return held

    def _project(self) -> list[dict[str, Any]]:
        """The projected request, computed for the new messages only when the history grew by
        appending and every tool result projects on its own (no keep-recent rule, no budget:
        then each result's body depends only on itself and its tool's name)."""
        with self._lock:
            cached = self._projected
            if cached is not None and cached[0] == self._version:
                return list(cached[1])
            version, history = self._version, list(self._history)
            base = self._projection_base
        request = None
        if base is not None and self._per_result:
            raw, projected = base
            same = zip(raw, history[: len(raw)], strict=True)
            if len(raw) <= len(history) and all(a is b for a, b in same):
                start = _slice_start(history, len(raw))
                if start is not None:
                    with contextlib.suppress(CompactorError):  # then the whole, which says why
                        request = projected[:start] + self._project_all(history[start:])
        if request is None:
            request = self._project_all(history)
        with self._lock:
            self._projected = (version, request)
            self._projection_base = (history, request)
        return list(request)

    def _project_all(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return project(
            messages,
            format=self.format,
            config=self.projection_config,
            model=self.model,
            system=self.system,
            compressed=self._reuse.compressed,
        )

    # --- undo and recall ----------------------------------------------------------------------

    def _undo_plan(self) -> _Applied:
        with self._lock:
            if not self._applied:
                raise EventMismatch("no compaction to undo")
            return self._applied[-1]

    def _undo_apply(self, applied: _Applied, original: list[dict[str, Any]]) -> None:
        compaction = applied.event.compaction
        replaced = original[compaction.start : compaction.end]
        if range_digest(replaced) != compaction.range_sha256:
            raise EventMismatch("the transcript's range does not match the compaction")
        with self._lock:
            if not self._applied or self._applied[-1] is not applied:
                raise EventMismatch("the history changed while undoing")
            i, size = applied.index, applied.size
            if self._history[i : i + size] != list(compaction.replacement):
                raise EventMismatch("the compaction's replacement is no longer in the history")
            self._history = [*self._history[:i], *replaced, *self._history[i + size :]]
            self._applied.pop()
            self._undone += 1
            self._version += 1
            log.info("undid compaction %s of %s", applied.event.event_id, self.conversation_id)

    def _transcript(self, event: CompletedEvent) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """The event's original messages (sha256-checked) and where each id is among them."""
        with self._lock:
            kept = self._transcripts.get(event.event_id)
            if kept is not None:
                self._transcripts.move_to_end(event.event_id)
                return kept
        original = self.client.restore(event)
        index: dict[str, int] = {}
        c = event.compaction
        for k, mid in enumerate(formats.source_ids(original)[c.start : c.end], start=c.start):
            index.setdefault(mid, k)
        for results in (True, False):  # a call id names its result first, else the call
            for k in range(c.start, c.end):
                for ref in _tool_refs(original[k], results=results):
                    index.setdefault(ref, k)
        with self._lock:
            self._transcripts[event.event_id] = (original, index)
            while len(self._transcripts) > TRANSCRIPTS_KEPT:
                self._transcripts.popitem(last=False)
        return original, index

    def _recall(self, message_id: str) -> dict[str, Any]:
        with self._lock:
            applied = [a.event for a in reversed(self._applied)]
        for event in applied:
            original, index = self._transcript(event)
            if message_id in index:
                return copy.deepcopy(original[index[message_id]])
        raise KeyError(message_id)

    def _recallable(self) -> list[str]:
        with self._lock:
            applied = [a.event for a in self._applied]
        ids: list[str] = []
        for event in applied:
            ids.extend(self._transcript(event)[1])
        return ids

    def _recall_text(self, arguments: str | Mapping[str, Any], recall: Callable[[str], Any]) -> Any:
        try:
            args = json.loads(arguments) if isinstance(arguments, str | bytes) else arguments
            message_id = args["id"]
        except (ValueError, TypeError, KeyError):
            return 'error: call with {"id": "<message id or tool call id>"}'
        return recall(str(message_id))

    def _tool(self, handler: Callable[[str | Mapping[str, Any]], Any]) -> RecallTool:
        description = (
            "Fetch the full original of a message that was compacted into a "
            "'[compaction-worker summary]': give its message id or a tool call id. Returns "
            "the message as JSON."
        )
        schema = {
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "A message id or a tool call id."}
            },
            "required": ["id"],
            "additionalProperties": False,
        }
        return RecallTool(
            name=RECALL_TOOL_NAME,
            openai={
                "type": "function",
                "function": {
                    "name": RECALL_TOOL_NAME,
                    "description": description,
                    "parameters": schema,
                },
            },
            anthropic={
                "name": RECALL_TOOL_NAME,
                "description": description,
                "input_schema": schema,
            },
            handler=handler,
        )

    def _recall_answer(self, message_id: str) -> str:
        try:
            return json.dumps(self._recall(message_id), ensure_ascii=False)
        except KeyError:
            some = self._recallable()[:50]
            return f"error: no compacted message has id {message_id!r}; some that do: {some}"
        except CompactorError as exc:
            return f"error: the transcript cannot be read: {exc.message}"

    # --- submitting ---------------------------------------------------------------------------

    def _snapshot(self, revision: int, messages: tuple[Any, ...]) -> dict[str, Any]:
        snap: dict[str, Any] = {
            "conversation_id": self.conversation_id,
            "revision": revision,
            "model": {"name": self.model or "", "context_window": self.context_window},
            "format": self.format,
            "messages": list(messages),
        }
        if self.system is not None:
            snap["system"] = self.system
        if self.overrides:
            snap["config"] = self.overrides
        if self.tools:
            snap["tools"] = self.tools
        return snap

    def _next_revision(self) -> int:
        with self._lock:
            self._revision += 1
            return self._revision

    def _submitted(self, turn: int, revision: int, status: str, known: int) -> bool:
        """Record a submit's result; False when it was superseded (to be sent again with a
        revision after ``known``, the service's newest)."""
        with self._lock:
            if status == "superseded":
                self._revision = max(self._revision, known)
                log.info(
                    "revision %d of %s is older than the service's %d; sending it as a newer one",
                    revision,
                    self.conversation_id,
                    known,
                )
                return False
            if self._retrying:
                log.warning(
                    "redis is back: submitted %s revision %d", self.conversation_id, revision
                )
            self._last_submitted = revision
            self._submitted_turn = max(self._submitted_turn, turn)
            self._retrying = False
            self._last_error = None
            if self._floor is None:
                self._floor = revision
            self._status_changed.notify_all()
            return True

    def _submit_failed(self, revision: int, exc: CompactorError, backoff_s: float) -> None:
        with self._lock:
            self._retrying = True
            self._submit_failures += 1
            self._last_error = f"{exc.code}: {exc.message}"
            pending = self._turns - self._submitted_turn
        log.warning(
            "cannot submit %s revision %d (%s); keeping the newest snapshot (%d turns pending), "
            "retrying in %.1fs",
            self.conversation_id,
            revision,
            exc.message,
            pending,
            backoff_s,
        )

    def _submit_refused(self, turn: int, revision: int, exc: CompactorError) -> None:
        with self._lock:
            self._last_error = f"{exc.code}: {exc.message}"
            self._submitted_turn = max(self._submitted_turn, turn)
            self._retrying = False
            self._status_changed.notify_all()
        log.error("the service refused %s revision %d: %s", self.conversation_id, revision, exc)

    def _received_event(self, event: CompactionEvent) -> None:
        with self._lock:
            self._received += 1
            self._follower_error = None
            if isinstance(event, FailedEvent):
                self._failed += 1
            elif isinstance(event, RejectedEvent):
                self._rejected += 1
                self._last_rejection = event.reason
                log.warning(
                    "%s revision %d was rejected: %s",
                    event.conversation_id,
                    event.revision,
                    event.reason,
                )
            if event.type in OUTCOME_TYPES:
                self._last_outcome = (
                    event.revision
                    if self._last_outcome is None
                    else max(self._last_outcome, event.revision)
                )
                self._status_changed.notify_all()

    def _follow_failed(self, exc: CompactorError, backoff_s: float) -> None:
        with self._lock:
            self._follower_error = f"{exc.code}: {exc.message}"
        log.warning(
            "cannot read events of %s (%s); retrying in %.1fs",
            self.conversation_id,
            exc.message,
            backoff_s,
        )

    # --- state --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """A JSON-able dict to carry the session into another process (``from_state``)."""
        with self._lock:
            return {
                "version": STATE_VERSION,
                "conversation_id": self.conversation_id,
                "format": self.format,
                "model": self.model,
                "context_window": self.context_window,
                "config": dict(self.overrides),
                "tools": dict(self.tools),
                "system": self.system,
                "messages": list(self._history),
                "revision": self._revision,
                "floor": self._floor,
                "last_event_id": self._last_event_id,
                "pending": self._turns > self._submitted_turn,
                "compactions": [
                    {"event": a.event.model_dump(mode="json"), "index": a.index, "size": a.size}
                    for a in self._applied
                ],
                "seen": sorted(self._seen),
            }

    @staticmethod
    def _arguments_of(state: Mapping[str, Any]) -> dict[str, Any]:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"not a session state of version {STATE_VERSION}")
        return {
            "format": state["format"],
            "model": state["model"],
            "context_window": state["context_window"],
            "config": state["config"],
            "tools": state["tools"],
            "system": state["system"],
            "messages": state["messages"],
        }

    def _restore_state(self, state: Mapping[str, Any]) -> bool:
        """Take over the counters of a saved session; True when it had unsent turns."""
        with self._lock:
            self._revision = int(state["revision"])
            self._floor = state["floor"]
            self._last_event_id = str(state["last_event_id"])
            for item in state["compactions"]:
                event = parse_event(item["event"])
                if not isinstance(event, CompletedEvent):
                    raise ValueError("a session state holds a compaction that is not completed")
                self._applied.append(_Applied(event, int(item["index"]), int(item["size"])))
                self._revision = max(self._revision, event.revision)
            self._seen = set(state.get("seen", ())) | {a.event.event_id for a in self._applied}
            return bool(state.get("pending"))


class CompactingSession(_Core):
    """One conversation, compacted in the background (threads). See the module docstring.

    ``config``: the snapshot's ``config`` overrides (a dict, sent with every snapshot), or a
    :class:`CompactionConfig`; either way the projection uses the client's settings with them.
    ``messages``: an initial history (submitted with the first ``extend``)."""

    def __init__(self, conversation_id: str, *, client: Client, **options: Any) -> None:
        state = options.pop("_state", None)
        super().__init__(conversation_id, client=client, **options)
        self._inbox: queue.Queue[tuple[str, CompactionEvent]] = queue.Queue(maxsize=INBOX_SIZE)
        self._mail: tuple[int, tuple[Any, ...]] | None = None
        self._mail_ready = threading.Condition(threading.Lock())
        self._stop = threading.Event()
        if state is not None and self._restore_state(state):
            self._mail = self._changed()
        self._sender = threading.Thread(
            target=self._send_loop, name=f"session-send-{conversation_id}", daemon=True
        )
        self._follower = threading.Thread(
            target=self._follow_loop, name=f"session-follow-{conversation_id}", daemon=True
        )
        self._sender.start()
        self._follower.start()

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], *, client: Client, **options: Any
    ) -> CompactingSession:
        """A session continuing a saved one: its history, revisions and applied compactions;
        events are read from after the last one it had drained."""
        arguments = cls._arguments_of(state) | options
        return cls(state["conversation_id"], client=client, _state=state, **arguments)

    def extend(self, new_messages: Iterable[dict[str, Any]]) -> None:
        """Append messages (copied) and submit a snapshot in the background; returns at once."""
        self._post(self._append(new_messages))

    def replace_messages(self, messages: Iterable[dict[str, Any]]) -> None:
        """Replace the whole history (an edit of the agent's own) and submit it. Compactions
        that no longer describe it are skipped when they arrive."""
        self._post(self._replace(messages))

    def request_messages(self) -> list[dict[str, Any]]:
        """Apply every compaction that has arrived, in order, and return the messages to send
        (projected as the worker measures them). Never waits for the service."""
        self.drain()
        return self._project()

    def drain(self) -> None:
        """Apply the events that have arrived (``request_messages`` does this first)."""
        for item in self._release_held():
            self._drain_one(*item)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._drain_one(*item)
        for item in self._release_held():
            self._drain_one(*item)

    def wait_settled(self, timeout_s: float = 60.0) -> bool:
        """Wait until the service has answered the newest turn: every turn submitted and the
        outcome event (completed, skipped, failed or rejected) of the newest accepted snapshot
        read. True then; False when ``timeout_s`` passes first. For scripts, tests and
        shutdown; an agent never needs to wait (``request_messages`` applies what arrived)."""
        return self._wait_settled(timeout_s)

    def undo(self) -> list[dict[str, Any]]:
        """Put back the history the newest applied compaction replaced (from its transcript,
        sha256-checked), keeping every message added after it. Nothing is submitted: the next
        ``extend`` sends the restored history."""
        applied = self._undo_plan()
        original, _ = self._transcript(applied.event)
        self._undo_apply(applied, original)
        return self.messages

    def recall(self, message_id: str) -> dict[str, Any]:
        """An original message a compaction replaced (by message id or tool call id), from the
        transcript of that compaction. KeyError when no applied compaction replaced it."""
        return self._recall(message_id)

    def recallable_ids(self) -> list[str]:
        return self._recallable()

    def recall_tool(self) -> RecallTool:
        return self._tool(lambda arguments: self._recall_text(arguments, self._recall_answer))

    def compact(
        self,
        instructions: str | None = None,
        *,
        config: dict[str, Any] | None = None,
        tools: dict[str, Any] | None = None,
        timeout_s: float = 10.0,
    ) -> RequestResult:
        """Ask the service to compact the conversation now, whatever the threshold says
        (``Client.compact_now``): first waits up to ``timeout_s`` for the turns not yet
        submitted, so that the newest snapshot holds them. The compaction arrives like any
        other and ``request_messages`` applies it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.status.pending_submits and not self._retrying:
            time.sleep(0.01)
        return self.client.compact_now(
            self.conversation_id, instructions, config=config, tools=tools
        )

    def compact_tool(self) -> CompactTool:
        """The ``compact_history`` tool the model calls to compact its own history
        (:mod:`worker.session.compact_tool`); calling it calls :meth:`compact`."""
        return compact_tool(lambda arguments: tool_answer(self.compact, arguments))

    def close(self, *, timeout_s: float = 2.0) -> None:
        """Stop the background threads, first giving an unsent snapshot up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.status.pending_submits and not self._retrying:
            time.sleep(0.01)
        self._stop.set()
        with self._mail_ready:
            self._mail_ready.notify_all()
        for thread in (self._sender, self._follower):
            thread.join(timeout=max(0.0, deadline - time.monotonic()) + 0.1)

    def __enter__(self) -> CompactingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the background threads ---------------------------------------------------------------

    def _post(self, mail: tuple[int, tuple[Any, ...]]) -> None:
        with self._mail_ready:
            if self._mail is not None:
                with self._lock:
                    self._replaced += 1
            self._mail = mail
            self._mail_ready.notify()

    def _send_loop(self) -> None:
        job: tuple[int, int, tuple[Any, ...]] | None = None  # (turn, revision, messages)
        backoff = 0.0
        while not self._stop.is_set():
            with self._mail_ready:
                while self._mail is None and job is None and not self._stop.is_set():
                    self._mail_ready.wait()
                if self._stop.is_set():
                    return
                if self._mail is not None:
                    turn, messages = self._mail
                    self._mail = None
                    job = (turn, self._next_revision(), messages)
            assert job is not None
            turn, revision, messages = job
            try:
                result = self.client.submit(self._snapshot(revision, messages))
            except PermanentError as exc:
                self._submit_refused(turn, revision, exc)
                job = None
                continue
            except CompactorError as exc:
                backoff = min(max(BACKOFF_START_S, backoff * 2), BACKOFF_MAX_S)
                self._submit_failed(revision, exc, backoff)
                self._stop.wait(backoff)
                continue
            except Exception:  # a bug must not end the thread silently
                log.exception("submitting %s revision %d failed", self.conversation_id, revision)
                backoff = min(max(BACKOFF_START_S, backoff * 2), BACKOFF_MAX_S)
                self._stop.wait(backoff)
                continue
            backoff = 0.0
            if self._submitted(turn, revision, result.status, result.revision):
                job = None
            else:
                job = (turn, self._next_revision(), messages)

    def _follow_loop(self) -> None:
        after = self._last_event_id
        backoff = 0.0
        while not self._stop.is_set():
            try:
                for entry_id, event in self.client.events(
                    self.conversation_id,
                    after=after,
                    follow=True,
                    block_ms=self.follow_block_ms,
                    stop=self._stop,
                ):
                    after = entry_id
                    while not self._stop.is_set():
                        try:
                            self._inbox.put((entry_id, event), timeout=0.5)
                            break
                        except queue.Full:
                            continue
                    self._received_event(event)  # after: wait_settled's caller can drain it
                    backoff = 0.0
            except CompactorError as exc:
                if self._stop.is_set():
                    return
                backoff = min(max(BACKOFF_START_S, backoff * 2), BACKOFF_MAX_S)
                self._follow_failed(exc, backoff)
                self._stop.wait(backoff)
            except Exception:
                if self._stop.is_set():  # the client was closed under the follower's read
                    return
                log.exception("reading events of %s failed", self.conversation_id)
                self._stop.wait(BACKOFF_MAX_S)


class AsyncCompactingSession(_Core):
    """:class:`CompactingSession` for asyncio code: ``extend``, ``request_messages``, ``undo``
    and ``recall`` are coroutines; the sender and the follower are tasks on the running loop
    (started by the first call), submitting with ``Client.asubmit`` and reading with
    ``Client.aevents``."""

    def __init__(self, conversation_id: str, *, client: Client, **options: Any) -> None:
        state = options.pop("_state", None)
        super().__init__(conversation_id, client=client, **options)
        self._inbox: asyncio.Queue[tuple[str, CompactionEvent]] | None = None
        self._mail: tuple[int, tuple[Any, ...]] | None = None
        self._mail_ready: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        if state is not None and self._restore_state(state):
            self._mail = self._changed()

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], *, client: Client, **options: Any
    ) -> AsyncCompactingSession:
        arguments = cls._arguments_of(state) | options
        return cls(state["conversation_id"], client=client, _state=state, **arguments)

    def _start(self) -> None:
        if self._tasks:
            return
        self._inbox = asyncio.Queue(maxsize=INBOX_SIZE)
        self._mail_ready = asyncio.Event()
        if self._mail is not None:
            self._mail_ready.set()
        self._tasks = [
            asyncio.create_task(self._send_loop(), name=f"session-send-{self.conversation_id}"),
            asyncio.create_task(self._follow_loop(), name=f"session-follow-{self.conversation_id}"),
        ]

    async def start(self) -> None:
        """Start the background tasks now (the first call of any coroutine does it too)."""
        self._start()

    async def extend(self, new_messages: Iterable[dict[str, Any]]) -> None:
        self._post(self._append(new_messages))

    async def replace_messages(self, messages: Iterable[dict[str, Any]]) -> None:
        self._post(self._replace(messages))

    async def request_messages(self) -> list[dict[str, Any]]:
        await self.drain()
        return self._project()

    async def drain(self) -> None:
        self._start()
        assert self._inbox is not None
        for item in self._release_held():
            self._drain_one(*item)
        while not self._inbox.empty():
            entry_id, event = self._inbox.get_nowait()
            if isinstance(event, RevertedEvent) and (plan := self._revert_plan(event)):
                # the transcript of an undo is read off the loop (then cached)
                with contextlib.suppress(CompactorError):
                    await asyncio.to_thread(self._transcript, plan.event)
            self._drain_one(entry_id, event)
        for item in self._release_held():
            self._drain_one(*item)

    async def wait_settled(self, timeout_s: float = 60.0) -> bool:
        """:meth:`CompactingSession.wait_settled`, waiting on a thread (the loop runs on)."""
        self._start()
        return await asyncio.to_thread(self._wait_settled, timeout_s)

    async def undo(self) -> list[dict[str, Any]]:
        applied = self._undo_plan()
        original, _ = await asyncio.to_thread(self._transcript, applied.event)
        self._undo_apply(applied, original)
        return self.messages

    async def recall(self, message_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self._recall, message_id)

    async def recallable_ids(self) -> list[str]:
        return await asyncio.to_thread(self._recallable)

    def recall_tool(self) -> RecallTool:
        async def handler(arguments: str | Mapping[str, Any]) -> str:
            answer: str = await asyncio.to_thread(self._recall_text, arguments, self._recall_answer)
            return answer

        return self._tool(handler)

    async def compact(
        self,
        instructions: str | None = None,
        *,
        config: dict[str, Any] | None = None,
        tools: dict[str, Any] | None = None,
        timeout_s: float = 10.0,
    ) -> RequestResult:
        """:meth:`CompactingSession.compact` for asyncio code."""
        await self._flush(timeout_s)
        return await self.client.acompact_now(
            self.conversation_id, instructions, config=config, tools=tools
        )

    def compact_tool(self) -> CompactTool:
        """:meth:`CompactingSession.compact_tool`; its handler is a coroutine function."""

        async def handler(arguments: str | Mapping[str, Any]) -> str:
            def run(instructions: str | None) -> RequestResult:
                return self.client.compact_now(self.conversation_id, instructions)

            await self._flush(10.0)
            answer: str = await asyncio.to_thread(tool_answer, run, arguments)
            return answer

        return compact_tool(handler)

    async def _flush(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the turns not yet submitted (unless Redis is down)."""
        self._start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.status.pending_submits and not self._retrying:
            await asyncio.sleep(0.01)

    async def close(self, *, timeout_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self._tasks and time.monotonic() < deadline:
            if not self.status.pending_submits or self._retrying:
                break
            await asyncio.sleep(0.01)
        for task in self._tasks:
            task.cancel()
        pending = set(self._tasks)
        while pending:
            # A cancellation that lands while redis-py's read is inside its own asyncio.timeout
            # can be lost (seen on Python 3.11 under load: the follower went on reading): ask
            # again until the tasks are done.
            _done, pending = await asyncio.wait(pending, timeout=1.0)
            for task in pending:
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def __aenter__(self) -> AsyncCompactingSession:
        self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _post(self, mail: tuple[int, tuple[Any, ...]]) -> None:
        self._start()
        assert self._mail_ready is not None
        if self._mail is not None:
            with self._lock:
                self._replaced += 1
        self._mail = mail
        self._mail_ready.set()

    async def _send_loop(self) -> None:
        assert self._mail_ready is not None
        job: tuple[int, int, tuple[Any, ...]] | None = None
        backoff = 0.0
        while True:
            if job is None:
                await self._mail_ready.wait()
            if self._mail is not None:
                turn, messages = self._mail
                self._mail = None
                self._mail_ready.clear()
                job = (turn, self._next_revision(), messages)
            if job is None:
                self._mail_ready.clear()
                continue
            turn, revision, messages = job
            try:
                result = await self.client.asubmit(self._snapshot(revision, messages))
            except PermanentError as exc:
                self._submit_refused(turn, revision, exc)
                job = None
                continue
            except CompactorError as exc:
                backoff = min(max(BACKOFF_START_S, backoff * 2), BACKOFF_MAX_S)
                self._submit_failed(revision, exc, backoff)
                await asyncio.sleep(backoff)
                continue
            except Exception:  # a bug must not end the task silently
                log.exception("submitting %s revision %d failed", self.conversation_id, revision)
                backoff = min(max(BACKOFF_START_S, backoff * 2), BACKOFF_MAX_S)
                await asyncio.sleep(backoff)
                continue
            backoff = 0.0
            if self._submitted(turn, revision, result.status, result.revision):
                job = None
            else:
                job = (turn, self._next_revision(), messages)

    async def _follow_loop(self) -> None:
        assert self._inbox is not None
        after = self._last_event_id
        backoff = 0.0
        while True:
            try:
                async for entry_id, event in self.client.aevents(
                    self.conversation_id, after=after, follow=True, block_ms=self.follow_block_ms
                ):
                    after = entry_id
                    await self._inbox.put((entry_id, event))
                    self._received_event(event)  # after: wait_settled's caller can drain it
                    backoff = 0.0
            except CompactorError as exc:
                backoff = min(max(BACKOFF_START_S, backoff * 2), BACKOFF_MAX_S)
                self._follow_failed(exc, backoff)
                await asyncio.sleep(backoff)
            except Exception:
                log.exception("reading events of %s failed", self.conversation_id)
                await asyncio.sleep(BACKOFF_MAX_S)


def _own(message: dict[str, Any]) -> dict[str, Any]:
    """A copy the caller cannot change under the session (messages are JSON)."""
    if not isinstance(message, dict):
        raise TypeError(f"a message is a dict, not {type(message).__name__}")
    return copy.deepcopy(message)


def _tool_refs(message: dict[str, Any], *, results: bool) -> list[str]:
    """The tool call ids a wire message answers (``results``) or makes (a call)."""
    refs: list[str] = []
    content = message.get("content")
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    if results:
        if isinstance(message.get("tool_call_id"), str):  # openai
            refs.append(message["tool_call_id"])
        refs += [str(b.get("tool_use_id")) for b in blocks if b.get("type") == "tool_result"]
    else:
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                refs.append(call["id"])
        refs += [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
    return refs


def _slice_start(history: list[dict[str, Any]], known: int) -> int | None:
    """Where to start projecting ``history[known:]`` on its own: back to the calls its tool
    results answer (None: some call is not in the history at all)."""
    need: set[str] = set()
    for m in history[known:]:
        need.update(_tool_refs(m, results=True))
    for m in history[known:]:
        need.difference_update(_tool_refs(m, results=False))
    start = known
    while need:
        if start == 0:
            return None
        start -= 1
        need.update(_tool_refs(history[start], results=True))
        need.difference_update(_tool_refs(history[start], results=False))
    return start


def _resolve_config(
    client: Client,
    config: Mapping[str, Any] | CompactionConfig | None,
    tools: Mapping[str, Any],
) -> tuple[dict[str, Any], CompactionConfig]:
    """(the snapshot's ``config`` overrides, the configuration the projection uses)."""
    settings = client.settings
    if isinstance(config, CompactionConfig):
        base = settings.compaction.model_dump(mode="json")
        mine = config.model_dump(mode="json")
        overrides = {k: v for k, v in mine.items() if k not in OPERATOR_ONLY and base.get(k) != v}
        return overrides, config
    overrides = dict(config or {})
    return overrides, settings.with_overrides(overrides, tools).compaction
