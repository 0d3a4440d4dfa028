"""What an agent imports: apply events, build the projected request, submit, read events.

``apply_compaction`` and ``project`` are pure: no Redis, no network, no clock.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker import formats
from worker.config import CompactionConfig, Settings
from worker.errors import CompactorError, InvalidSnapshot
from worker.models import (
    CONVERSATION_ID_PATTERN,
    MAX_REVISION,
    Compaction,
    CompactionEvent,
    WireFormat,
)
from worker.projection import ProjectionPolicy
from worker.projection import project as project_messages
from worker.snapshots import decode_json

if TYPE_CHECKING:
    from worker.redis_state import SubmitResult

_EVALUATE_QUEUE = "compactor.evaluate"  # worker.celery_app.EVALUATE_QUEUE, without importing Celery


class EventMismatch(CompactorError):
    """The event does not describe these messages (already applied, or another history)."""

    code = "event_mismatch"


def apply_compaction(
    messages: list[dict[str, Any]],
    event: CompactionEvent | Compaction | dict[str, Any],
    *,
    system: Any = None,
) -> list[dict[str, Any]]:
    """``messages[:start] + replacement + messages[end:]``, located by ``first_id``/``last_id``
    so that messages the agent appended after the snapshot survive. Returns a new list."""
    compaction = _compaction_of(event)
    del system  # ids of wire messages do not depend on Anthropic's top-level system
    if compaction.replacement and compaction.replacement[-1] in messages:
        raise EventMismatch("this compaction is already applied (its summary is present)")
    ids = formats.source_ids(messages)
    try:
        start = ids.index(compaction.first_id)
        last = ids.index(compaction.last_id, start)
    except ValueError:
        raise EventMismatch(
            f"messages {compaction.first_id!r}..{compaction.last_id!r} are not in this history"
        ) from None
    if last - start != compaction.end - 1 - compaction.start:
        raise EventMismatch("the compacted range has a different length in this history")
    return [*messages[:start], *compaction.replacement, *messages[last + 1 :]]


def _compaction_of(event: CompactionEvent | Compaction | dict[str, Any]) -> Compaction:
    if isinstance(event, Compaction):
        return event
    if isinstance(event, dict):
        event = CompactionEvent.model_validate(event)
    if event.type != "compaction.completed" or event.compaction is None:
        raise EventMismatch(f"a {event.type} event has nothing to apply")
    return event.compaction


def project(
    messages: list[dict[str, Any]],
    *,
    format: WireFormat = "openai",
    config: CompactionConfig | None = None,
    model: str | None = None,
    system: Any = None,
) -> list[dict[str, Any]]:
    """The messages to send: the same projection the worker measures, in the agent's format."""
    normalized = formats.to_messages(format, messages, system=system)
    policy = ProjectionPolicy.from_config(config or CompactionConfig(), model=model)
    projection = project_messages(normalized, policy)
    if not projection.bodies:
        return list(messages)
    return formats.replace_tool_results(format, messages, projection.bodies)


# --- talking to the service -------------------------------------------------------------------


class Client:
    """Submit snapshots and read events. One per process; thread-safe.

    ``submit`` returns in milliseconds: the snapshot is stored in Redis under a key with a TTL
    (a claim check) and a small message naming the conversation goes to the broker, at most
    one queued per conversation at a time (later submissions coalesce into it).
    """

    def __init__(self, settings: Settings | None = None) -> None:
        from worker.celery_app import broker_url
        from worker.config import load_settings
        from worker.redis_state import RedisState, connect

        self.settings = settings or load_settings()
        self._url = broker_url(self.settings)
        self.state = RedisState(connect(self._url), self.settings.redis)
        self._celery: Any = None

    def _app(self) -> Any:
        if self._celery is None:
            from worker.celery_app import make_app

            self._celery = make_app(self.settings)
        return self._celery

    def submit(self, snapshot: dict[str, Any] | bytes | str) -> SubmitResult:
        """Enqueue a snapshot (a dict, or its JSON). Only the id and revision are checked here;
        the worker validates the rest and answers a bad snapshot with ``compaction.rejected``."""
        payload, conversation_id, revision = _claim(snapshot, self.settings)
        result = self.state.store_snapshot(conversation_id, revision, payload)
        if result.status == "queued":
            self._app().send_task(
                "compactor.evaluate", args=[conversation_id, time.time()], queue=_EVALUATE_QUEUE
            )
        return result

    async def asubmit(self, snapshot: dict[str, Any] | bytes | str) -> SubmitResult:
        """``submit`` for asyncio code: the blocking parts run in a worker thread."""
        return await asyncio.to_thread(self.submit, snapshot)

    def events(
        self,
        conversation_id: str,
        *,
        after: str = "0",
        follow: bool = False,
        block_ms: int = 5000,
    ) -> Iterator[tuple[str, CompactionEvent]]:
        """(stream id, event) pairs after ``after``; with ``follow``, waits for new ones.
        Resume from the last id you saw to pick up exactly where you left off."""
        while True:
            batch = self.state.read_events(
                conversation_id, after=after, block_ms=block_ms if follow else None
            )
            for entry_id, data in batch:
                after = entry_id
                yield entry_id, CompactionEvent.model_validate(data)
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
        """Async ``events``: each blocking read runs in a worker thread."""
        while True:
            batch = await asyncio.to_thread(
                self.state.read_events,
                conversation_id,
                after=after,
                block_ms=block_ms if follow else None,
            )
            for entry_id, data in batch:
                after = entry_id
                yield entry_id, CompactionEvent.model_validate(data)
            if not follow and not batch:
                return

    def restore(
        self, conversation: str | CompactionEvent, *, revision: int | None = None
    ) -> list[dict[str, Any]]:
        """An original history from the transcripts: the one a completed event replaced
        (sha256-checked), or a conversation's newest transcript (at ``revision``, if given)."""
        transcript_dir = self.settings.compaction.transcript_dir
        if isinstance(conversation, CompactionEvent):
            return restore(conversation, transcript_dir=transcript_dir)
        return restore_conversation(conversation, transcript_dir=transcript_dir, revision=revision)

    def close(self) -> None:
        self.state.client.close()


def restore(event: CompactionEvent, *, transcript_dir: str | Path) -> list[dict[str, Any]]:
    """The original messages of a completed compaction, from its transcript."""
    from worker.transcripts import TranscriptStore

    if event.compaction is None or event.compaction.transcript is None:
        raise EventMismatch(f"a {event.type} event has no transcript")
    ref = event.compaction.transcript
    data = TranscriptStore(Path(transcript_dir)).read(ref.uri)
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise EventMismatch(f"transcript {ref.uri} does not match the event's sha256")
    messages: list[dict[str, Any]] = json.loads(data)["messages"]
    return messages


def restore_conversation(
    conversation_id: str, *, transcript_dir: str | Path, revision: int | None = None
) -> list[dict[str, Any]]:
    """The messages of a conversation's newest kept transcript, or of the one for ``revision``."""
    from worker.transcripts import TranscriptStore

    store = TranscriptStore(Path(transcript_dir))
    kept = [t for t in store.stored(conversation_id) if revision is None or t.revision == revision]
    if not kept:
        which = "any revision" if revision is None else f"revision {revision}"
        raise EventMismatch(f"no transcript of {conversation_id} for {which} is kept")
    messages: list[dict[str, Any]] = json.loads(store.read(str(kept[-1].path)))["messages"]
    return messages


def _claim(snapshot: dict[str, Any] | bytes | str, settings: Settings) -> tuple[bytes, str, int]:
    """The payload to store, and the two fields the keys are built from, validated."""
    if isinstance(snapshot, dict):
        payload = json.dumps(snapshot, ensure_ascii=False).encode("utf-8")
        head = snapshot
    else:
        payload = snapshot.encode("utf-8") if isinstance(snapshot, str) else snapshot
        head = decode_json(payload, max_bytes=settings.compaction.max_snapshot_bytes)
    if len(payload) > settings.compaction.max_snapshot_bytes:
        raise InvalidSnapshot(
            "",
            f"snapshot is {len(payload)} bytes; the limit is "
            f"{settings.compaction.max_snapshot_bytes}",
        )
    if not isinstance(head, dict):
        raise InvalidSnapshot("", "a snapshot must be a JSON object")
    conversation_id, revision = head.get("conversation_id"), head.get("revision")
    if not isinstance(conversation_id, str) or not re.fullmatch(
        CONVERSATION_ID_PATTERN, conversation_id
    ):
        raise InvalidSnapshot(
            "conversation_id",
            "must be 1-128 characters of A-Z a-z 0-9 . _ : - and not start with '.'",
        )
    if isinstance(revision, bool) or not isinstance(revision, int):
        raise InvalidSnapshot("revision", "must be an integer")
    if not 0 <= revision <= MAX_REVISION:
        raise InvalidSnapshot("revision", f"must be an integer from 0 to {MAX_REVISION}")
    return payload, conversation_id, revision
