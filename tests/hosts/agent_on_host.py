"""The agent side, run on one test "host": a CompactingSession whose compactions are made by
workers on another host, then recall, undo and a plain Client.restore from here.

Reads a JSON job on stdin ({"conversation_id", "turns"}), prints one JSON result on stdout.
"""

from __future__ import annotations

import json
import sys
import time

sys.path.insert(0, sys.argv[1])  # the tests directory, for service_support

from support.service_support import conversation

from worker.client import Client
from worker.session import CompactingSession


def main() -> None:
    job = json.load(sys.stdin)
    cid = job["conversation_id"]
    history = conversation(cid, job["turns"], window=6000)["messages"]
    client = Client()
    with CompactingSession(cid, client=client, model="gpt-4.1", context_window=6000) as session:
        session.extend(history)
        deadline = time.monotonic() + 120
        while not session.compactions and time.monotonic() < deadline:
            session.request_messages()
            time.sleep(0.2)
        if not session.compactions:
            print(json.dumps({"error": "no compaction arrived", "status": str(session.status)}))
            return
        event = session.compactions[-1]
        ref = event.compaction.transcript
        recalled = session.recall("r0")
        restored = client.restore(event)
        undone = session.undo()
    print(
        json.dumps(
            {
                "event_id": event.event_id,
                "transcript_uri": ref.uri if ref else None,
                "recalled": recalled,
                "restored_ids": [m.get("id") for m in restored],
                "undone_ids": [m.get("id") for m in undone],
                "history_ids": [m["id"] for m in history],
            }
        )
    )


if __name__ == "__main__":
    main()
