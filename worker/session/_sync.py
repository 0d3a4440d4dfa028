""":class:`CompactingSession`: the session for threaded code (a sender and a follower thread)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from worker.client import Client, RequestResult
from worker.wire.events import CompactionEvent

from ._core import Mail, _LoopSteps
from ._history import arguments_of
from ._threads import INBOX_SIZE, Job
from ._tools import CompactTool, RecallTool, compact_tool, recall_tool, tool_answer


class CompactingSession(_LoopSteps):
    """One conversation, compacted in the background (threads). See :mod:`worker.session`.

    ``config``: the snapshot's ``config`` overrides (a dict, sent with every snapshot), or a
    :class:`CompactionConfig`; either way the projection uses the client's settings with them.
    ``messages``: an initial history (submitted with the first ``extend``)."""

    def __init__(self, conversation_id: str, *, client: Client, **options: Any) -> None:
        state = options.pop("_state", None)
        super().__init__(conversation_id, client=client, **options)
        self._inbox: queue.Queue[tuple[str, CompactionEvent]] = queue.Queue(maxsize=INBOX_SIZE)
        self._mail: Mail | None = None  # a mailbox of one: the newest unsent turn
        self._mail_ready = threading.Condition(threading.Lock())
        self._stop = threading.Event()
        if state is not None and self._restore_state(state):
            self._mail = self._changed()
        self._threads = (
            threading.Thread(
                target=self._send_loop, name=f"session-send-{conversation_id}", daemon=True
            ),
            threading.Thread(
                target=self._follow_loop, name=f"session-follow-{conversation_id}", daemon=True
            ),
        )
        for thread in self._threads:
            thread.start()

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], *, client: Client, **options: Any
    ) -> CompactingSession:
        """A session continuing a saved one: its history, revisions and applied compactions;
        events are read from after the last one it had drained."""
        arguments = arguments_of(state) | options
        return cls(state["conversation_id"], client=client, _state=state, **arguments)

    def extend(self, new_messages: Iterable[dict[str, Any]], *, pin: bool = False) -> None:
        """Append messages (copied) and submit a snapshot in the background; returns at once.
        ``pin``: carry these messages word for word through every compaction (``pin``)."""
        self._post(self._append(new_messages, pin))

    def pin(self, *messages: str | dict[str, Any]) -> None:
        """Pin messages of the history, given by id (their own or their derived id) or as
        they are: every compaction carries them word for word, and never summarizes them
        (docs/session.md, "Pins"). KeyError for an id no message of the history has."""
        self._pin(messages)

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
        original, _ = self._transcripts.of(applied.event)
        self._undo_apply(applied, original)
        return self.messages

    def recall(self, message_id: str) -> dict[str, Any]:
        """An original message a compaction replaced (by message id or tool call id), from the
        transcript of that compaction. KeyError when it cannot: its message says whether no
        applied compaction replaced it, or one did and its transcript has ``expired`` (removed
        by transcript retention)."""
        return self._recall(message_id)

    def recallable_ids(self) -> list[str]:
        return self._recallable()

    def recall_tool(self) -> RecallTool:
        return recall_tool(self._recall_text)

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
        while time.monotonic() < deadline and self._unsent():
            time.sleep(0.01)
        return self.client.compact_now(
            self.conversation_id, instructions, config=config, tools=tools
        )

    def compact_tool(self) -> CompactTool:
        """The ``compact_history`` tool the model calls to compact its own history
        (:mod:`worker.session._compact_tool`); calling it calls :meth:`compact`."""
        return compact_tool(lambda arguments: tool_answer(self.compact, arguments))

    def close(self, *, timeout_s: float = 2.0) -> None:
        """Stop the background threads, first giving an unsent snapshot up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._unsent():
            time.sleep(0.01)
        self._stop.set()
        with self._mail_ready:
            self._mail_ready.notify_all()
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()) + 0.1)

    def __enter__(self) -> CompactingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the background threads ---------------------------------------------------------------

    def _post(self, mail: Mail) -> None:
        with self._mail_ready:
            if self._mail is not None:
                self._count_replaced()
            self._mail = mail
            self._mail_ready.notify()

    def _take(self, job: Job | None) -> Job | None:
        """The job to send: the newest mail (waited for while there is none and no job to
        retry), else ``job``; None once the session is closed."""
        with self._mail_ready:
            while self._mail is None and job is None and not self._stop.is_set():
                self._mail_ready.wait()
            if self._stop.is_set():
                return None
            mail, self._mail = self._mail, None
        return job if mail is None else self._job(mail)

    def _send_loop(self) -> None:
        job: Job | None = None
        failures = 0  # in a row
        while (job := self._take(job)) is not None:
            try:
                result = self.client.submit(self._snapshot(job))
            except Exception as exc:  # refused, down or a bug: recorded; the thread goes on
                delay = self._submit_error(job, exc, failures + 1)
                if delay is None:
                    job = None
                else:
                    failures += 1
                    self._stop.wait(delay)
                continue
            failures = 0
            job = self._submitted(job, result)

    def _follow_loop(self) -> None:
        after = self._cursor.last_event_id
        failures = 0  # in a row
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
                    self._put(entry_id, event)
                    self._received_event(event)  # after: wait_settled's caller can drain it
                    failures = 0
            except Exception as exc:
                if self._stop.is_set():  # the client was closed under the follower's read
                    return
                failures += 1
                self._stop.wait(self._read_error(exc, failures))

    def _put(self, entry_id: str, event: CompactionEvent) -> None:
        """Queue the event for ``drain``, waiting while the inbox is full (until closed)."""
        while not self._stop.is_set():
            try:
                self._inbox.put((entry_id, event), timeout=0.5)
                return
            except queue.Full:
                continue
