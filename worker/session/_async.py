""":class:`AsyncCompactingSession`: the session for asyncio code (a sender and a follower task)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import Any

from worker.client import Client, RequestResult
from worker.errors import CompactorError
from worker.wire.events import CompactionEvent, RevertedEvent

from ._core import Mail, _LoopSteps
from ._history import arguments_of
from ._threads import INBOX_SIZE, Job
from ._tools import CompactTool, RecallTool, compact_tool, recall_tool, tool_answer


class AsyncCompactingSession(_LoopSteps):
    """:class:`CompactingSession` for asyncio code: ``extend``, ``request_messages``, ``undo``
    and ``recall`` are coroutines; the sender and the follower are tasks on the running loop
    (started by the first call), submitting with ``Client.asubmit`` and reading with
    ``Client.aevents``."""

    def __init__(self, conversation_id: str, *, client: Client, **options: Any) -> None:
        state = options.pop("_state", None)
        super().__init__(conversation_id, client=client, **options)
        self._inbox: asyncio.Queue[tuple[str, CompactionEvent]] | None = None
        self._mail: Mail | None = None  # a mailbox of one: the newest unsent turn
        self._mail_ready: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        if state is not None and self._restore_state(state):
            self._mail = self._changed()

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], *, client: Client, **options: Any
    ) -> AsyncCompactingSession:
        arguments = arguments_of(state) | options
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

    async def extend(self, new_messages: Iterable[dict[str, Any]], *, pin: bool = False) -> None:
        self._post(self._append(new_messages, pin))

    def pin(self, *messages: str | dict[str, Any]) -> None:
        self._pin(messages)

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
                    await asyncio.to_thread(self._transcripts.of, plan.event)
            self._drain_one(entry_id, event)
        for item in self._release_held():
            self._drain_one(*item)

    async def wait_settled(self, timeout_s: float = 60.0) -> bool:
        """:meth:`CompactingSession.wait_settled`, waiting on a thread (the loop runs on)."""
        self._start()
        return await asyncio.to_thread(self._wait_settled, timeout_s)

    async def undo(self) -> list[dict[str, Any]]:
        applied = self._undo_plan()
        original, _ = await asyncio.to_thread(self._transcripts.of, applied.event)
        self._undo_apply(applied, original)
        return self.messages

    async def recall(self, message_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self._recall, message_id)

    async def recallable_ids(self) -> list[str]:
        return await asyncio.to_thread(self._recallable)

    def recall_tool(self) -> RecallTool:
        async def handler(arguments: str | Mapping[str, Any]) -> str:
            return await asyncio.to_thread(self._recall_text, arguments)

        return recall_tool(handler)

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
        while time.monotonic() < deadline and self._unsent():
            await asyncio.sleep(0.01)

    async def close(self, *, timeout_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self._tasks and time.monotonic() < deadline and self._unsent():
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

    # --- the background tasks -----------------------------------------------------------------

    def _post(self, mail: Mail) -> None:
        self._start()
        assert self._mail_ready is not None
        if self._mail is not None:
            self._count_replaced()
        self._mail = mail
        self._mail_ready.set()

    async def _take(self, job: Job | None) -> Job:
        """The job to send: the newest mail (waited for while there is none and no job to
        retry), else ``job``."""
        assert self._mail_ready is not None
        while self._mail is None and job is None:
            self._mail_ready.clear()
            await self._mail_ready.wait()
        mail, self._mail = self._mail, None
        self._mail_ready.clear()
        if mail is not None:
            return self._job(mail)
        assert job is not None  # the loop above ends with a mail or a job
        return job

    async def _send_loop(self) -> None:
        job: Job | None = None
        failures = 0  # in a row
        while True:
            job = await self._take(job)
            try:
                result = await self.client.asubmit(self._snapshot(job))
            except Exception as exc:  # refused, down or a bug: recorded; the task goes on
                delay = self._submit_error(job, exc, failures + 1)
                if delay is None:
                    job = None
                else:
                    failures += 1
                    await asyncio.sleep(delay)
                continue
            failures = 0
            job = self._submitted(job, result)

    async def _follow_loop(self) -> None:
        assert self._inbox is not None
        after = self._cursor.last_event_id
        failures = 0  # in a row
        while True:
            try:
                async for entry_id, event in self.client.aevents(
                    self.conversation_id, after=after, follow=True, block_ms=self.follow_block_ms
                ):
                    after = entry_id
                    await self._inbox.put((entry_id, event))
                    self._received_event(event)  # after: wait_settled's caller can drain it
                    failures = 0
            except Exception as exc:
                failures += 1
                await asyncio.sleep(self._read_error(exc, failures))
