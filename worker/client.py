"""What an agent imports: apply events, build the projected request, submit, read events.

``apply_compaction`` and ``project`` are pure: no Redis, no network, no clock. :class:`Client`
talks to the service over Redis (and the broker) only; it imports no Celery.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from pydantic import ValidationError

from worker.backend import keys
from worker.backend.connection import connect, connect_async, state_url
from worker.backend.queues import (
    COMPACT_TASK,
    EVALUATE_QUEUE,
    EVALUATE_TASK,
    SUMMARIZE_QUEUE,
    TaskSender,
    broker_url,
)
from worker.backend.redis_state import RedisState, RequestResult, SubmitResult
from worker.backend.streams import anewest_id, await_entries, stream_entries
from worker.config import CompactionConfig, Settings, load_settings
from worker.core.projection import CompressionCache
from worker.core.projection import project as project_messages
from worker.core.projection_policy import ProjectionPolicy
from worker.core.review import edit_of, edited_summary
from worker.errors import (
    BrokerUnavailable,
    CompactorError,
    ConfigError,
    EventMismatch,
    InvalidRequest,
    InvalidSnapshot,
    NoSnapshot,
    RedisUnavailable,
    StorageError,
)
from worker.ops.telemetry import telemetry
from worker.ops.tracing import AttributeValue
from worker.transcripts import TranscriptKey, TranscriptStore, key_of_uri, open_store
from worker.wire import formats
from worker.wire.composed import HeldProposal
from worker.wire.events import (
    OUTCOME_TYPES,
    CompactionEvent,
    CompletedEvent,
    DeclinedEvent,
    Summary,
    parse_event,
)
from worker.wire.history import apply_compaction
from worker.wire.models import (
    CONVERSATION_ID_PATTERN,
    CONVERSATION_ID_RULE,
    MAX_REVISION,
    WireFormat,
)
from worker.wire.requests import compact_request
from worker.wire.snapshots import decode_json, encode_json, media_rules

__all__ = [
    "BrokerUnavailable",
    "Client",
    "CompactorError",
    "ConfigError",
    "EventMismatch",
    "InvalidRequest",
    "InvalidSnapshot",
    "NoSnapshot",
    "RedisUnavailable",
    "RequestResult",
    "StorageError",
    "SubmitResult",
    "apply_compaction",
    "parse_event",
    "project",
    "restore",
    "restore_conversation",
]

log = logging.getLogger(__name__)

_WAIT_BLOCK_MS = 5000  # the longest single blocking read of Client.wait_for


def project(
    messages: list[dict[str, Any]],
    *,
    format: WireFormat = "openai",
    config: CompactionConfig | None = None,
    model: str | None = None,
    system: Any = None,
    compressed: CompressionCache | None = None,
) -> list[dict[str, Any]]:
    """The messages to send: the same projection the worker measures, in the agent's format.

    ``compressed``: a cache of compressed tool results you keep between calls
    (``worker.reuse.Reuse().compressed``), so that each result is compressed once."""
    config = config or CompactionConfig()
    normalized = formats.to_messages(
        format, messages, system=system, media=media_rules(format, config)
    )
    policy = ProjectionPolicy.from_config(config, model=model)
    projection = project_messages(normalized, policy, compressed=compressed)
    if not projection.bodies:
        return list(messages)
    return formats.replace_tool_results(format, messages, projection.bodies)


# --- talking to the service -------------------------------------------------------------------


class Client:
    """Submit snapshots and read events. One per process; thread-safe.

    ``submit`` returns in milliseconds: the snapshot is stored in Redis under a key with a TTL
    (a claim check) and a small message naming the conversation goes to the broker, at most
    one queued per conversation at a time (later submissions coalesce into it).

    The asyncio variants never share a thread pool with each other or with your code: submits
    run on the client's own small pool, and followers read with Redis' asyncio client, so idle
    ``aevents`` followers hold no thread and cannot delay an ``asubmit``.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self._url = state_url(self.settings)
        self.state = RedisState(connect(self._url), self.settings.redis)
        self._sender = TaskSender(broker_url(self.settings))
        # [otel]: the submit span starts each snapshot's trace (nothing imported when unset).
        self.telemetry = telemetry(self.settings)
        self._submit_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._store: TranscriptStore | None = None

    def submit(self, snapshot: dict[str, Any] | bytes | str) -> SubmitResult:
        """Enqueue a snapshot (a dict, or its JSON). Only the id and revision are checked here;
        the worker validates the rest and answers a bad snapshot with ``compaction.rejected``.
        Raises :class:`BrokerUnavailable` when the broker cannot take the task message (no
        evaluation is left waiting for it: submit again once the broker is back)."""
        payload, conversation_id, revision = _claim(snapshot, self.settings)
        attributes: dict[str, AttributeValue | None] = {
            "gen_ai.conversation.id": conversation_id,
            "compactor.revision": revision,
        }
        with self.telemetry.stage("submit", kind="producer", attributes=attributes) as stage:
            submission = uuid.uuid4().hex
            result = self.state.store_snapshot(
                conversation_id, revision, payload, submission=submission
            )
            # queued: this submit's task carries the trace on; coalesced: the task already
            # queued evaluates this revision too, in the earlier submit's trace.
            stage.set({"compactor.submit.status": result.status})
            if result.status == "queued":
                self._send_evaluate(conversation_id, submission)
        return result

    def _send_evaluate(self, conversation_id: str, submission: str) -> None:
        try:
            self._sender.send(
                EVALUATE_TASK,
                [conversation_id, time.time()],
                queue=EVALUATE_QUEUE,
                trace=self.telemetry.carrier(),
            )
        except BaseException:
            # No flag without its task: else every later submission would coalesce into the
            # missing one until the reconciler ran (or the flag's TTL, without it). Should
            # Redis be gone too, the flag stays and the reconciler queues the conversation (it
            # is pending); the broker's error is the one to report.
            with contextlib.suppress(RedisUnavailable):
                self.state.unqueue(conversation_id, submission)
            raise

    def compact_now(
        self,
        conversation_id: str,
        instructions: str | None = None,
        *,
        config: dict[str, Any] | None = None,
        tools: dict[str, Any] | None = None,
    ) -> RequestResult:
        """Ask for a compaction of the conversation's newest snapshot now, whatever the
        threshold says; returns at once with the request's id and the revision it compacts.
        Its outcome event (``trigger.kind`` ``"requested"``, ``trigger.request_id`` this id)
        comes like any other: ``wait_for(conversation_id, request_id=...)``.

        ``instructions``: what the summary should focus on (at most 2,000 characters; they
        reach the summarizer, and only their SHA-256 the event). ``config`` / ``tools``:
        overrides of what to keep, as a snapshot's (docs/snapshot.md), over the snapshot's
        own. Raises :class:`InvalidRequest` (naming the field) for a bad argument,
        :class:`NoSnapshot` when the conversation has no snapshot (none, or it expired), and
        :class:`BrokerUnavailable` when the task cannot be sent (nothing is left asked)."""
        if not isinstance(conversation_id, str) or not re.fullmatch(
            CONVERSATION_ID_PATTERN, conversation_id
        ):
            raise InvalidRequest("conversation_id", CONVERSATION_ID_RULE)
        request = compact_request(
            self.settings, instructions=instructions, config=config, tools=tools
        )
        result = self.state.store_request(conversation_id, request)
        try:
            self._sender.send(
                COMPACT_TASK,
                [conversation_id],
                queue=SUMMARIZE_QUEUE,
                trace=self.telemetry.carrier(),
            )
        except BaseException:
            with contextlib.suppress(RedisUnavailable):
                self.state.done_request(conversation_id, request.request_id)
            raise
        return result

    async def acompact_now(
        self,
        conversation_id: str,
        instructions: str | None = None,
        *,
        config: dict[str, Any] | None = None,
        tools: dict[str, Any] | None = None,
    ) -> RequestResult:
        """``compact_now`` for asyncio code, on the client's own threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool(),
            lambda: self.compact_now(conversation_id, instructions, config=config, tools=tools),
        )

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._submit_pool is None:
            self._submit_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="compactor-submit"
            )
        return self._submit_pool

    async def asubmit(self, snapshot: dict[str, Any] | bytes | str) -> SubmitResult:
        """``submit`` for asyncio code, on the client's own threads."""
        loop = asyncio.get_running_loop()
        # In the caller's context, so that its current span (if any) is the submit's parent.
        context = contextvars.copy_context()
        return await loop.run_in_executor(self._pool(), context.run, self.submit, snapshot)

    def events(
        self,
        conversation_id: str,
        *,
        after: str = "0",
        follow: bool = False,
        block_ms: int = 5000,
        stop: threading.Event | None = None,
    ) -> Iterator[tuple[str, CompactionEvent]]:
        """(stream id, event) pairs after ``after``; with ``follow``, waits for new ones, up to
        ``block_ms`` per read (0: until one comes; ``after="$"``: the events from now on).
        Resume from the last id you saw to pick up exactly where you left off. ``stop``: a
        follower ends once this is set (looked at after each wait of up to ``block_ms``). An
        entry that is no event is skipped with a warning."""
        if follow and after == "$":
            after = self.state.newest_id(conversation_id)
        while stop is None or not stop.is_set():
            batch = self.state.read_events(
                conversation_id, after=after, block_ms=block_ms if follow else None
            )
            for entry_id, data in batch:
                after = entry_id
                event = _read_event(entry_id, data)
                if event is not None:
                    yield entry_id, event
            if not follow and not batch:
                return

    async def aevents(
        self,
        conversation_id: str,
        *,
        after: str = "0",
        follow: bool = False,
        block_ms: int = 5000,
    ) -> AsyncIterator[tuple[str, CompactionEvent]]:
        """Async ``events``, with Redis' asyncio client (no thread is held while waiting)."""
        client: Any = connect_async(self._url)
        stream = keys.events(conversation_id)

        async def read(block: int | None) -> Any:
            return await client.xread({stream: after}, count=100, block=block)

        try:
            while True:
                try:
                    if follow and after == "$":
                        after = await anewest_id(client, stream)
                    reply = await (await_entries(read, block_ms) if follow else read(None))
                except (
                    redis.exceptions.RedisError,
                    redis.exceptions.RedisClusterException,
                    OSError,
                ) as exc:
                    raise _async_redis_error(exc) from None
                entries = stream_entries(reply, stream)
                for entry_id, data in entries:
                    after = entry_id
                    event = _read_event(entry_id, data)
                    if event is not None:
                        yield entry_id, event
                if not follow and not entries:
                    return
        finally:
            await client.aclose()

    def wait_for(
        self,
        conversation_id: str,
        *,
        revision: int | None = None,
        after: str = "0",
        timeout_s: float = 60.0,
        request_id: str | None = None,
    ) -> CompactionEvent:
        """The first outcome event (``compaction.completed``, ``.skipped``, ``.failed``,
        ``.rejected``, or ``.proposed`` when compactions are held for review) after stream id
        ``after`` (of ``revision`` or a newer one, if given), waiting for it up to
        ``timeout_s``; ``TimeoutError`` when none arrives in time. An outcome published before
        the call counts: submit, then wait. ``request_id``: the outcome of that compaction
        request (``compact_now``) only, or a rejection of the snapshot it compacts."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                which = "" if revision is None else f" revision {revision} or later of"
                raise TimeoutError(
                    f"no outcome event for{which} {conversation_id} within {timeout_s:g} s"
                )
            # Bounded waits: a blocked read never outlasts the deadline by more than one.
            batch = self.state.read_events(
                conversation_id, after=after, block_ms=min(remaining_ms, _WAIT_BLOCK_MS)
            )
            for entry_id, data in batch:
                after = entry_id
                event = _read_event(entry_id, data)
                if (
                    event is not None
                    and event.type in OUTCOME_TYPES
                    and (revision is None or event.revision >= revision)
                    and (request_id is None or _answers(event, request_id))
                ):
                    return event

    def restore(
        self,
        conversation: str | CompactionEvent | dict[str, Any] | bytes,
        *,
        revision: int | None = None,
    ) -> list[dict[str, Any]]:
        """An original history from the transcripts: the one a completed event replaced
        (sha256-checked), or a conversation's newest transcript (at ``revision``, if given).

        The event may be an event, its dict or its JSON (a line of ``compactor events`` as
        printed). Its transcript is read from the configured store by the conversation and
        name at the end of the reference (so events from before a ``compactor transcripts
        migrate`` restore from the new store), else from the store the reference names (a
        worker's transcript directory, S3 bucket or PostgreSQL table that is not this
        client's)."""
        if isinstance(conversation, str) and not conversation.lstrip().startswith("{"):
            return restore_conversation(conversation, store=self.store, revision=revision)
        if revision is not None:
            raise TypeError("revision= goes with a conversation id, not with an event")
        return restore(conversation, store=self.store)

    # --- review before apply -----------------------------------------------------------------

    def approve(
        self, conversation_id: str, event_id: str, *, summary: str | None = None
    ) -> CompletedEvent:
        """Approve the compaction ``conversation_id`` holds for review (``compaction.proposed``
        ``event_id``): publish it as ``compaction.completed``, returned. ``summary``: an edited
        summary in place of the proposed one (the proposed text unchanged is no edit), bounded
        by ``summary_max_output_tokens`` and checked against the range's must-keep facts
        (missing ones repaired; the event says ``summary.edited`` and the fidelity after the
        edit). Raises :class:`EventMismatch` when
        no such compaction is held or it no longer applies (a restore since), ``InvalidInput``
        for an empty or too long edit."""
        held = self._held(conversation_id, event_id)
        edited = None
        text = edit_of(held.event.compaction, summary)
        if text is not None:
            edited = checked_edit(held, text, self.store, self.settings.compaction)
        status, event, _stream_id = self.state.approve(
            held, datetime.now(UTC), by="api", summary=edited
        )
        if status == "changed":
            raise EventMismatch(
                f"compaction {event_id} no longer applies: the conversation's compactions "
                "changed since it was proposed; reject it"
            )
        if event is None:
            raise EventMismatch(f"compaction {event_id} is no longer held: it was decided")
        return event

    def reject(
        self, conversation_id: str, event_id: str, *, reason: str | None = None
    ) -> DeclinedEvent:
        """Decline the compaction ``conversation_id`` holds for review: publish
        ``compaction.declined`` (with ``reason``), returned; the next snapshot over the
        threshold proposes again. :class:`EventMismatch` when no such compaction is held."""
        held = self._held(conversation_id, event_id)
        _status, event, _stream_id = self.state.decline(
            held, datetime.now(UTC), by="api", reason=reason
        )
        if event is None:
            raise EventMismatch(f"compaction {event_id} is no longer held: it was decided")
        return event

    def _held(self, conversation_id: str, event_id: str) -> HeldProposal:
        held = self.state.held_proposal(conversation_id)
        if held is None or held.event.event_id != event_id:
            raise EventMismatch(f"{conversation_id} holds no compaction {event_id} for review")
        return held

    @property
    def store(self) -> TranscriptStore:
        """The configured transcript store (``[transcripts] url``), opened on first use."""
        if self._store is None:
            self._store = open_store(self.settings)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
        self.state.client.close()
        self._sender.close()
        if self._submit_pool is not None:
            self._submit_pool.shutdown(wait=False)
        self.telemetry.shutdown()  # sends the spans still batched


def _answers(event: CompactionEvent, request_id: str) -> bool:
    """Whether ``event`` is the outcome of compaction request ``request_id`` (or a rejection,
    which answers any request of its snapshot)."""
    if event.type == "compaction.rejected":
        return True
    trigger = getattr(event, "trigger", None)
    return trigger is not None and getattr(trigger, "request_id", None) == request_id


def checked_edit(
    held: HeldProposal, text: str, store: TranscriptStore, config: CompactionConfig
) -> Summary:
    """A reviewer's edited summary of the held compaction, bounded and checked against the
    must-keep facts of its range, read from its transcript (sha256-checked): without the
    transcript no edit can be checked, and :class:`EventMismatch` says so."""
    compaction = held.event.compaction
    ref = compaction.transcript
    if ref is None:
        raise EventMismatch("an edit cannot be checked: this compaction keeps no transcript")
    try:
        data = store.read(ref.uri)
    except (StorageError, InvalidSnapshot):
        raise EventMismatch("an edit cannot be checked: its transcript is unavailable") from None
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise EventMismatch("an edit cannot be checked: its transcript does not match the event")
    return edited_summary(
        compaction,
        text,
        json.loads(data),
        delegation_tools=config.delegation_tools,
        max_output_tokens=config.summary_max_output_tokens,
    )


def _read_event(entry_id: str, data: dict[str, Any] | None) -> CompactionEvent | None:
    """A stream entry as an event; one that cannot be read at all is skipped with a warning,
    so that it never stops a reader (None: not even JSON, already warned about)."""
    if data is None:
        return None
    try:
        return parse_event(data)
    except ValidationError:
        log.warning("skipping unreadable event %s", entry_id, exc_info=True)
        return None


def _async_redis_error(exc: Exception) -> CompactorError:
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return ConfigError("redis.url", "Redis refused the credentials")
    return RedisUnavailable(f"redis unavailable while reading events: {type(exc).__name__}")


def restore(
    event: CompactionEvent | dict[str, Any] | str | bytes, *, store: TranscriptStore | str | Path
) -> list[dict[str, Any]]:
    """The original messages of a completed compaction, from its transcript (``store``: a
    store, a store URL, or a transcript directory; when it does not hold the transcript, the
    store the event's reference names). ``event``: an event, its dict or its JSON."""
    parsed = parse_event(event) if isinstance(event, dict | str | bytes) else event
    ref = parsed.compaction.transcript if isinstance(parsed, CompletedEvent) else None
    if ref is None:
        raise EventMismatch(f"the {parsed.type} event has no transcript")
    try:
        key = key_of_uri(ref.uri)
    except InvalidSnapshot:
        raise EventMismatch(f"the event's transcript reference is not one: {ref.uri!r}") from None
    attempts = _Attempts(key, ref.sha256)
    with _opened(store) as opened:
        data = attempts.read(opened)
        named = _store_named_by(ref.uri) if data is None else None
        if named is not None:
            try:
                with _opened(named) as other:
                    if other.display != opened.display:  # not the one just tried
                        data = attempts.read(other)
            except CompactorError as exc:  # e.g. that store's extra is not installed here
                attempts.failed(ref.uri, exc.message)
    if data is None:
        raise attempts.error()
    messages: list[dict[str, Any]] = json.loads(data)["messages"]
    return messages


class _Attempts:
    """Reads of one transcript from the stores that may hold it, and why each failed."""

    def __init__(self, key: TranscriptKey, sha256: str) -> None:
        self.key, self.sha256 = key, sha256
        self.why: list[str] = []
        self.mismatched = False

    def read(self, store: TranscriptStore) -> bytes | None:
        """The transcript's bytes if ``store`` has them and they hash to the event's sha256."""
        try:
            data = store.get(self.key)
        except StorageError as exc:
            self.failed(store.display, exc.message)
            return None
        if hashlib.sha256(data).hexdigest() != self.sha256:
            self.mismatched = True
            self.failed(store.display, "does not match the event's sha256")
            return None
        return data

    def failed(self, where: str, why: str) -> None:
        self.why.append(f"{where or 'the store'}: {why}")

    def error(self) -> CompactorError:
        """Another transcript under this name: the event does not describe it; none found:
        storage (retry later, or configure the store that has it)."""
        message = f"cannot restore transcript {self.key}: " + "; ".join(self.why)
        return EventMismatch(message) if self.mismatched else StorageError(message)


def _store_named_by(uri: str) -> str | None:
    """The store a transcript reference names, as a store URL: the directory two levels above
    a file's path, ``s3://bucket/prefix``, or a PostgreSQL database and table (credentials
    from the environment, as libpq reads them). None for a reference of no known form."""
    head, _, _ = uri.replace("\\", "/").rstrip("/").rpartition("/")
    root, _, _ = head.rpartition("/")
    if not root:
        return None
    scheme = root.split("://", 1)[0].lower() if "://" in root else ""
    if scheme in ("postgresql", "postgres"):
        database, _, table = root.rpartition("/")
        return f"{database}?table={table}" if "://" in database else None
    if scheme in ("", "file", "s3"):
        return root
    return None


def restore_conversation(
    conversation_id: str, *, store: TranscriptStore | str | Path, revision: int | None = None
) -> list[dict[str, Any]]:
    """The messages of a conversation's newest kept transcript, or of the one for ``revision``."""
    with _opened(store) as opened:
        kept = [
            t for t in opened.stored(conversation_id) if revision is None or t.revision == revision
        ]
        if not kept:
            which = "any revision" if revision is None else f"revision {revision}"
            raise EventMismatch(f"no transcript of {conversation_id} for {which} is kept")
        messages: list[dict[str, Any]] = json.loads(opened.get(kept[-1].key))["messages"]
    return messages


@contextlib.contextmanager
def _opened(store: TranscriptStore | str | Path) -> Iterator[TranscriptStore]:
    """``store`` itself, or the store a URL or directory names, closed after use."""
    if isinstance(store, TranscriptStore):
        yield store
        return
    opened = open_store(str(store))
    try:
        yield opened
    finally:
        opened.close()


def _claim(snapshot: dict[str, Any] | bytes | str, settings: Settings) -> tuple[bytes, str, int]:
    """The payload to store, and the two fields the keys are built from, validated."""
    limit = settings.compaction.max_snapshot_bytes
    if isinstance(snapshot, dict):
        payload = encode_json(snapshot)
        head: Any = snapshot
    elif isinstance(snapshot, bytes | str):
        try:
            payload = snapshot.encode("utf-8") if isinstance(snapshot, str) else snapshot
        except UnicodeEncodeError:
            raise InvalidSnapshot(
                "", "text contains a lone UTF-16 surrogate (not valid Unicode)"
            ) from None
        head = decode_json(payload, max_bytes=limit)
    else:
        raise InvalidSnapshot("", f"a snapshot is a dict or its JSON, not {type(snapshot)!r}")
    if len(payload) > limit:
        raise InvalidSnapshot("", f"snapshot is {len(payload)} bytes; the limit is {limit}")
    if not isinstance(head, dict):
        raise InvalidSnapshot("", "a snapshot must be a JSON object")
    conversation_id, revision = head.get("conversation_id"), head.get("revision")
    if not isinstance(conversation_id, str) or not re.fullmatch(
        CONVERSATION_ID_PATTERN, conversation_id
    ):
        raise InvalidSnapshot("conversation_id", CONVERSATION_ID_RULE)
    if isinstance(revision, bool) or not isinstance(revision, int):
        raise InvalidSnapshot("revision", "must be an integer")
    if not 0 <= revision <= MAX_REVISION:
        raise InvalidSnapshot("revision", f"must be an integer from 0 to {MAX_REVISION}")
    return payload, conversation_id, revision
