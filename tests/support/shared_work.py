"""Expensive work done once per test session, whichever pytest-xdist processes need it.

A module-scoped fixture is built again in every xdist process that runs one of the module's
tests; for a batch of hundreds of CLI runs that is minutes of CPU repeated up to ``-n`` times.
:func:`once_per_session` runs the batch in the first process that asks, under a file lock in the
directory all the session's processes share (``tmp_path_factory.getbasetemp().parent``, as
pytest-xdist's documentation shows), and hands every process the same JSON record of it.
"""

from __future__ import annotations

import fcntl
import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def session_dir(factory: pytest.TempPathFactory) -> Path:
    """A directory of this test session seen by all its processes: the parent of this process's
    base temp under pytest-xdist (``pytest-N/popen-gwK``), else the base temp itself (whose
    parent holds earlier sessions' directories too)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_session(
    factory: pytest.TempPathFactory, name: str, compute: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """``(root, record)``: ``compute(root)`` run once in the session, in a fresh directory
    ``root``, its JSON record kept beside it. A process that asks while another computes waits
    for it. A failed computation is recorded too, so every process fails with its traceback
    instead of running it again."""
    shared = session_dir(factory)
    root, record = shared / name, shared / f"{name}.json"
    with (shared / f"{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not record.exists():
                root.mkdir()
                try:
                    value: dict[str, Any] = {"ok": compute(root)}
                except BaseException:
                    value = {"failed": traceback.format_exc()}
                partial = record.with_suffix(".partial")
                partial.write_text(json.dumps(value))
                partial.replace(record)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    done: dict[str, Any] = json.loads(record.read_text())
    if "failed" in done:
        pytest.fail(f"{name} failed (once for the session):\n{done['failed']}", pytrace=False)
    result: dict[str, Any] = done["ok"]
    return root, result
