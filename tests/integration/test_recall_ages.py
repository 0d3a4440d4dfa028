"""Recall that ages well: a session of 30 compactions while retention keeps 10 transcripts
answers every recall (the original, or ``expired``), never raises, never names a path; the HTTP
API answers 410 ``expired``; and the scheduled prune never removes the transcript that undoing
a conversation's newest compaction needs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.service_support import StartedWorkers, started_workers

from worker.session import CompactingSession
from worker.transcripts import (
    StoredTranscript,
    TranscriptKey,
    doomed_by_retention,
    transcript_name,
)

pytestmark = pytest.mark.slow

SETTLE_S = 120.0  # generous: the machine is shared
KEPT = 10


@pytest.fixture(scope="module")
def cluster(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartedWorkers]:
    with started_workers(
        redis_server, tmp_path_factory.mktemp("ages"), f"max_persisted_transcripts = {KEPT}\n"
    ) as started:
        yield started


def turn(k: int) -> list[dict[str, Any]]:
    cid = f"call{k}"
    arguments = json.dumps({"command": f"cat src/pkg/mod_{k}.py"})
    call = {"id": cid, "type": "function", "function": {"name": "bash", "arguments": arguments}}
    words = " ".join(f"token{k}_{i}" for i in range(300))
    return [
        {"id": f"a{k}", "role": "assistant", "content": f"Step {k}.", "tool_calls": [call]},
        {"id": f"r{k}", "role": "tool", "tool_call_id": cid, "content": words},
    ]


def settle(session: CompactingSession) -> None:
    deadline = time.monotonic() + SETTLE_S
    while True:
        s = session.status
        if (
            s.pending_submits == 0
            and s.last_submitted_revision is not None
            and s.last_outcome_revision is not None
            and s.last_outcome_revision >= s.last_submitted_revision
        ):
            return
        assert time.monotonic() < deadline, s
        time.sleep(0.01)


def test_thirty_compactions_with_ten_transcripts_kept_recall_every_message(
    cluster: StartedWorkers,
) -> None:
    session = CompactingSession(
        "ages-1", client=cluster.client, model="gpt-4.1", context_window=4000
    )
    ids: list[str] = []
    try:
        session.extend([{"id": "u0", "role": "user", "content": "Fix src/pkg/core.py."}])
        k = 0
        while len(session.compactions) < 30:
            assert k < 400, session.status
            session.extend(turn(k))
            ids += [f"a{k}", f"r{k}"]
            settle(session)
            session.request_messages()  # the next model call: what arrived is applied
            k += 1
        kept = session.recallable_ids()  # never raises, whatever retention removed
        assert kept and not set(kept) >= set(ids), "retention removed some transcripts"
        tool = session.recall_tool()
        expired = recalled = 0
        for message_id in ids:
            answer = tool.handler({"id": message_id})
            assert "/" not in answer.split("{", 1)[0], answer  # no path, no store name
            if answer.startswith("expired"):
                expired += 1
                with pytest.raises(KeyError, match="expired"):
                    session.recall(message_id)
            elif answer.startswith("{"):
                recalled += 1
                assert json.loads(answer) == session.recall(message_id)
            else:  # never replaced yet: the newest turns
                assert message_id in {m.get("id") for m in session.messages}, answer
        assert expired and recalled, (expired, recalled)
    finally:
        session.close()


def _stored(conversation: str, created: float, n: int) -> StoredTranscript:
    key = TranscriptKey(conversation, transcript_name(n, f"{n:032x}"))
    return StoredTranscript(
        key=key, uri=f"file:///t/{conversation}/{n}", bytes=1000, created=created
    )


def test_the_prune_never_removes_what_undoing_the_newest_compaction_needs() -> None:
    now = 1_000_000.0
    items = [_stored("c", now - 50_000 + n, n) for n in range(5)]
    items += [_stored("old", now - 90_000, 1)]  # idle past the undo window: nothing needs it
    doomed = doomed_by_retention(
        items,
        keep_per_conversation=None,
        max_age_s=10,
        max_total_bytes=0,
        now=now,
        undo_window_s=60_000,
    )
    uris = {t.uri for t in doomed}
    assert items[4].uri not in uris  # the newest of "c", within the window
    assert {t.uri for t in items[:4]} <= uris and items[5].uri in uris
    assert Path(items[4].uri).name == "4"
