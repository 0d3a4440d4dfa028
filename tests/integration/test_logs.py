"""The workers' logs: a rejected snapshot is the user's input problem, logged at WARNING with
where (``field``) and why (``reason``), never with the snapshot's content. A real worker process
on a real Redis; the log is read as the JSON lines it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.fault_support import wait_until
from support.service_support import Workers, client_for, conversation, wait_for_outcome

pytestmark = pytest.mark.slow

SECRET_CONTENT = "orphan-result-text-that-must-not-be-logged"


class JsonLogWorkers(Workers):
    """Workers logging JSON lines (the default; the test configuration says text)."""

    def env(self) -> dict[str, str]:
        return super().env() | {"COMPACTOR_WORKER_LOG_FORMAT": "json"}


def json_records(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line being written
    return records


def test_a_rejected_snapshot_is_logged_at_warning_with_its_field_and_reason(
    service_env: Any,
) -> None:
    _, make = service_env
    plain = make()
    workers = JsonLogWorkers(plain.url, plain.config, plain.logs)
    try:
        workers.start("w-log")
        client = client_for(workers)
        bad = conversation("c-rejected", 2)
        bad["messages"].append({"role": "tool", "tool_call_id": "nope", "content": SECRET_CONTENT})
        client.submit(bad)
        rejected = wait_for_outcome(client, "c-rejected", timeout_s=60)[-1]
        assert rejected.type == "compaction.rejected"

        def logged() -> list[dict[str, Any]]:
            return [
                r
                for r in json_records(plain.logs / "w-log.log")
                if r.get("conversation_id") == "c-rejected" and r.get("field")
            ]

        (record,) = wait_until(logged, timeout_s=60, what="the rejection in the worker's log")
    finally:
        workers.stop_all()
    assert record["level"] == "warning", record
    assert record["field"] == rejected.error.field
    assert record["reason"] == rejected.error.message  # the reason alone; the event says both
    assert record["revision"] == rejected.revision
    assert rejected.error.field in record["message"] and "nope" in record["message"]
    assert SECRET_CONTENT not in (plain.logs / "w-log.log").read_text(errors="replace")
