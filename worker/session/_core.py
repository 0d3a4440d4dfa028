"""``_Core``: the parts a session is made of, and every step that does not wait on a thread or
a task. One lock guards the parts; each part owns one job's state:

- :class:`Setup`: what the session is (fixed);
- :class:`History` and :class:`Cursor`: the messages with compactions applied, and where the
  session is in the event stream;
- :class:`Projection`: the cached projected request;
- :class:`Transcripts`: transcripts read for undo and recall;
- :class:`SenderState` and :class:`FollowerState`: what the background loops have done
  (their steps are in ``_loop_steps``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from worker.client import Client
from worker.errors import CompactorError, EventMismatch
from worker.wire import formats
from worker.wire.events import CompactionEvent, CompletedEvent, RevertedEvent

from . import _state
from ._follower import FollowerState
from ._history import Applied, Cursor, History, replaced_range
from ._messages import own, pinned_key
from ._projection import Projection
from ._recall import RECALL_USAGE, Transcripts, recall_id, recall_miss
from ._sender import SenderState
from ._setup import Setup, SetupView, log
from ._status import SessionStatus, status_of

Mail = tuple[int, tuple[Any, ...]]  # (the turn, the messages to snapshot)


class _Core(SetupView):
    """The state a session keeps, and every step that does not wait on a thread or a task."""

    def __init__(
        self,
        conversation_id: str,
        *,
        client: Client,
        messages: Iterable[dict[str, Any]] = (),
        **options: Any,
    ) -> None:
        self.setup = Setup.of(conversation_id, client=client, **options)
        self._lock = threading.RLock()
        # Notified when a submit is recorded or an outcome read (``wait_settled``).
        self._status_changed = threading.Condition(self._lock)
        self._history = History([own(m) for m in messages])
        self._cursor = Cursor()
        self._view = Projection(self.setup)
        self._transcripts = Transcripts(client)
        self._sender = SenderState()
        self._follower = FollowerState()
        self._pins: set[str] = set()  # what the pinned messages say (pinned_key), not their ids

    # --- reading ------------------------------------------------------------------------------

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The current history (compactions applied), in the wire format. Treat the messages as
        read-only: the session shares them with the snapshots it sends."""
        with self._lock:
            return list(self._history.messages)

    @property
    def compactions(self) -> list[CompletedEvent]:
        """The compactions applied so far, oldest first (an undone one is removed)."""
        return self._applied_events()

    @property
    def status(self) -> SessionStatus:
        with self._lock:
            return status_of(
                self.conversation_id, self._sender, self._follower, self._history, self._cursor
            )

    def _wait_settled(self, timeout_s: float) -> bool:
        """Until every turn is submitted (or refused) and the outcome event of the newest
        accepted snapshot has been read; False when ``timeout_s`` passes first."""
        with self._status_changed:
            return self._status_changed.wait_for(
                lambda: self._sender.settled(self._follower.last_outcome), timeout=timeout_s
            )

    def _project(self) -> list[dict[str, Any]]:
        """The projected request (see :meth:`Projection.compute`), projected off the lock."""
        with self._lock:
            version = self._history.version
            cached = self._view.cached(version)
            if cached is not None:
                return cached
            history, base = list(self._history.messages), self._view.base
        request = self._view.compute(history, base)
        with self._lock:
            self._view.store(version, history, request)
        return list(request)

    # --- changing the history -----------------------------------------------------------------

    def _append(self, new_messages: Iterable[dict[str, Any]], pin: bool = False) -> Mail:
        """Append copies of the messages (pinned too, with ``pin``); the (turn, messages) to
        snapshot."""
        copies = [own(m) for m in new_messages]
        with self._lock:
            self._history.extend(copies)
            if pin:
                self._pins.update(pinned_key(m) for m in copies)
            return self._changed()

    def _pin(self, messages: tuple[str | dict[str, Any], ...]) -> None:
        """Pin messages given by id (own or derived, in the current history) or as they are;
        KeyError for an id no message of the history has."""
        with self._lock:
            current = self._history.messages
            by_id = dict(zip(formats.source_ids(current), current, strict=True))
            for m in messages:
                if isinstance(m, str):
                    if m not in by_id:
                        raise KeyError(f"no message of the history has the id {m!r}")
                    m = by_id[m]
                self._pins.add(pinned_key(m))

    def _pinned_ids(self, messages: Iterable[dict[str, Any]]) -> list[str]:
        """The ids the pinned messages have among ``messages`` (a derived id changes as
        compactions move a message; what it says does not)."""
        with self._lock:
            pins = set(self._pins)
        if not pins:
            return []
        listed = list(messages)
        ids = formats.source_ids(listed)
        return [mid for mid, m in zip(ids, listed, strict=True) if pinned_key(m) in pins]

    def _replace(self, messages: Iterable[dict[str, Any]]) -> Mail:
        copies = [own(m) for m in messages]
        with self._lock:
            self._history.set(copies)
            return self._changed()

    def _changed(self) -> Mail:
        with self._lock:
            return self._sender.changed(), tuple(self._history.messages)

    def _drain_one(self, entry_id: str, event: CompactionEvent) -> None:
        """Apply one event read from the stream (called in stream order)."""
        if isinstance(event, RevertedEvent):
            self._drain_revert(entry_id, event)
            return
        with self._lock:
            if self._cursor.hold(entry_id, event):  # until the first submit is accepted
                return
            self._sender.learned(event.revision)
            if not isinstance(event, CompletedEvent) or event.event_id in self._cursor.seen:
                return
            self._cursor.seen.add(event.event_id)
            if not self._predates(event):
                self._history.apply(event, self.conversation_id)

    def _predates(self, event: CompletedEvent) -> bool:
        floor = self._cursor.floor
        if floor is None or event.revision >= floor:
            return False
        log.info(
            "ignoring compaction %s of %s: revision %d predates this session (%d)",
            event.event_id,
            self.conversation_id,
            event.revision,
            floor,
        )
        return True

    def _drain_revert(self, entry_id: str, event: RevertedEvent) -> None:
        """A compaction restored on the service (``compaction.reverted``): undone here too
        when it is the newest applied, as :meth:`undo` does (its transcript read, unless
        cached); one not applied yet is never applied now."""
        with self._lock:
            if self._cursor.hold(entry_id, event):
                return
            self._cursor.seen.add(event.reverted_event_id)
            applied = self._revert_plan(event)
        if applied is None:
            return
        try:
            original, _ = self._transcripts.of(applied.event)
            self._undo_apply(applied, original)
        except CompactorError as exc:
            with self._lock:
                self._history.skip(f"revert of {event.reverted_event_id}: {exc.message}")
            log.warning(
                "cannot undo compaction %s of %s, restored on the service: %s",
                event.reverted_event_id,
                self.conversation_id,
                exc.message,
            )

    def _revert_plan(self, event: RevertedEvent) -> Applied | None:
        """The applied compaction ``event`` restores, when it is the newest applied."""
        with self._lock:
            return self._history.newest(event.reverted_event_id)

    def _release_held(self) -> list[tuple[str, CompactionEvent]]:
        with self._lock:
            return self._cursor.release()

    # --- undo and recall ----------------------------------------------------------------------

    def _undo_plan(self) -> Applied:
        with self._lock:
            if not self._history.applied:
                raise EventMismatch("no compaction to undo")
            return self._history.applied[-1]

    def _undo_apply(self, applied: Applied, original: list[dict[str, Any]]) -> None:
        replaced = replaced_range(applied, original)
        with self._lock:
            self._history.undo(applied, replaced)
        log.info("undid compaction %s of %s", applied.event.event_id, self.conversation_id)

    def _applied_events(self) -> list[CompletedEvent]:
        with self._lock:
            return [a.event for a in self._history.applied]

    def _recall(self, message_id: str) -> dict[str, Any]:
        """The original, from the newest applied compaction whose transcript holds it. A
        KeyError says why not: never replaced, or replaced by a compaction whose transcript is
        gone (retention removed it: ``expired``)."""
        gone: list[CompletedEvent] = []
        for event in reversed(self._applied_events()):
            try:
                original, index = self._transcripts.of(event)
            except CompactorError:
                gone.append(event)
                continue
            if message_id in index:
                return copy.deepcopy(original[index[message_id]])
        raise KeyError(recall_miss(message_id, gone))

    def _recallable(self) -> list[str]:
        """The ids the kept transcripts hold (those retention removed are left out)."""
        ids: list[str] = []
        for event in self._applied_events():
            with contextlib.suppress(CompactorError):
                ids.extend(self._transcripts.of(event)[1])
        return ids

    def _recall_text(self, arguments: str | Mapping[str, Any]) -> str:
        """The recall tool's answer to a call's arguments: the message, or why not, in words
        for the model (never a path, a store or an error of ours)."""
        message_id = recall_id(arguments)
        if message_id is None:
            return RECALL_USAGE
        try:
            return json.dumps(self._recall(message_id), ensure_ascii=False)
        except KeyError as exc:
            why = str(exc.args[0]) if exc.args else f"no compacted message has id {message_id!r}"
            if why.startswith("expired"):
                return why
            some = self._recallable()[:50]
            return f"error: {why}; some that can be recalled: {some}"

    # --- state --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """A JSON-able dict to carry the session into another process (``from_state``)."""
        with self._lock:
            return _state.dump(self.setup, self._history, self._sender, self._cursor, self._pins)

    def _restore_state(self, state: Mapping[str, Any]) -> bool:
        """Take over the counters of a saved session; True when it had unsent turns."""
        with self._lock:
            return _state.load(state, self._history, self._sender, self._cursor, self._pins)
