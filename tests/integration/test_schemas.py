"""The checked-in JSON Schemas (docs/schemas) against the models, the examples and real events.

A test here fails when the files drift from the models (``python -m worker.wire.schemas`` rewrites
them), when an example snapshot or an event the CLI prints does not validate, or when a schema
accepts what the models refuse.
"""

from __future__ import annotations

import copy
import json
import shutil
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from worker.config import Settings
from worker.errors import InvalidSnapshot
from worker.wire import schemas
from worker.wire.events import EventType, rejected_event
from worker.wire.models import Snapshot
from worker.wire.snapshots import parse_snapshot

if TYPE_CHECKING:
    from conftest import CliRunner

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA_DIR = REPO_ROOT / "docs" / "schemas"
DEMO_CONFIG = REPO_ROOT / "examples" / "demo.toml"
SNAPSHOT_FILES = sorted(
    [*(REPO_ROOT / "examples").glob("*.json"), *(REPO_ROOT / "tests" / "fixtures").glob("*.json")]
)
EVENT_TYPES = sorted(get_args(EventType))


@cache
def validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
    return Draft202012Validator(schema)


def errors(name: str, value: Any) -> list[str]:
    return [e.message for e in validator(name).iter_errors(value)]


def event_schema(event_type: str) -> str:
    return f"{event_type}{schemas.SUFFIX}"


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# --- the files are the models' -----------------------------------------------------------------


def test_checked_in_schemas_are_what_the_models_generate() -> None:
    assert schemas.drift(SCHEMA_DIR) == [], "regenerate with: python -m worker.wire.schemas"
    assert schemas.main(["--check", "--dir", str(SCHEMA_DIR)]) == 0


def test_check_lists_every_drifted_file_and_write_repairs_them(tmp_path: Path) -> None:
    copy_dir = tmp_path / "schemas"
    shutil.copytree(SCHEMA_DIR, copy_dir)
    edited = copy_dir / "snapshot.schema.json"
    edited.write_text(edited.read_text().replace('"revision"', '"rev"'))
    (copy_dir / "compaction.failed.schema.json").unlink()
    (copy_dir / "old.schema.json").write_text("{}\n")
    assert schemas.main(["--check", "--dir", str(copy_dir)]) == 1
    assert sorted(schemas.drift(copy_dir)) == [
        f"{copy_dir / 'compaction.failed.schema.json'}: missing",
        f"{copy_dir / 'old.schema.json'}: no model makes this schema any more",
        f"{copy_dir / 'snapshot.schema.json'}: differs from the models",
    ]
    assert schemas.main(["--dir", str(copy_dir)]) == 0
    assert schemas.drift(copy_dir) == []
    assert sorted(p.name for p in copy_dir.iterdir()) == sorted(schemas.SCHEMAS)


def test_one_schema_per_event_type_and_each_is_a_valid_2020_12_schema() -> None:
    assert sorted(get_args(EventType)) == EVENT_TYPES
    for name in schemas.SCHEMAS:
        schema = load(SCHEMA_DIR / name)
        Draft202012Validator.check_schema(schema)
        assert schema["title"] == f"compaction-worker/{name.removesuffix(schemas.SUFFIX)}"
        assert schema["description"]


def test_output_is_deterministic() -> None:
    assert schemas.expected() == schemas.expected()
    text = (SCHEMA_DIR / "event.schema.json").read_text()
    assert text.endswith("}\n") and '\n  "$defs": {' in text


# --- every example validates ---------------------------------------------------------------


@pytest.mark.parametrize("path", SNAPSHOT_FILES, ids=lambda p: p.name)
def test_every_example_snapshot_validates(path: Path) -> None:
    value = load(path)
    Snapshot.model_validate(value)  # the models agree
    assert errors("snapshot.schema.json", value) == []


def _cli_events(run_cli: CliRunner, path: Path, config: Path) -> list[dict[str, Any]]:
    result = run_cli("compact", path, "--config", config)
    assert result.code in (0, 1), result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _assert_valid_event(event: dict[str, Any]) -> None:
    assert errors("event.schema.json", event) == []
    assert errors(event_schema(event["type"]), event) == []
    for other in EVENT_TYPES:
        if other != event["type"]:
            assert errors(event_schema(other), event), f"{other} accepted a {event['type']}"


def test_events_the_cli_prints_validate(run_cli: CliRunner) -> None:
    seen: set[str] = set()
    for path in SNAPSHOT_FILES:
        for event in _cli_events(run_cli, path, DEMO_CONFIG):
            _assert_valid_event(event)
            seen.add(event["type"])
    # Elision: the demo settings with every old tool result turned into a marker.
    eliding = run_cli.cwd / "eliding.toml"
    eliding.write_text(
        DEMO_CONFIG.read_text().replace(
            "[compaction]", "[compaction]\nkeep_recent_tool_results = 0"
        )
    )
    for event in _cli_events(run_cli, REPO_ROOT / "examples" / "coding-session.json", eliding):
        _assert_valid_event(event)
        seen.add(event["type"])
    # Failure: the transcript directory is a regular file.
    blocker = run_cli.cwd / "blocker"
    blocker.write_text("not a directory")
    failing = run_cli.cwd / "failing.toml"
    failing.write_text(f'[compaction]\ntranscript_dir = "{blocker}"\n')
    for event in _cli_events(
        run_cli, REPO_ROOT / "tests" / "fixtures" / "snapshot_openai.json", failing
    ):
        _assert_valid_event(event)
        seen.add(event["type"])
    # (compaction.reverted: only a restore publishes it; test_inspector.py validates it;
    # compaction.proposed and .declined: only the service holding compactions for review
    # publishes them, and tests/integration/test_review.py validates them)
    assert seen == set(EVENT_TYPES) - {
        "compaction.rejected",
        "compaction.reverted",
        "compaction.proposed",
        "compaction.declined",
    }


def test_a_rejected_event_validates() -> None:
    """The CLI answers bad input with exit code 2; the service publishes this event instead."""
    bad = load(REPO_ROOT / "examples" / "short-session.json") | {"format": "gemini"}
    with pytest.raises(InvalidSnapshot) as caught:
        parse_snapshot(json.dumps(bad), Settings())
    error = caught.value
    event = rejected_event(
        bad["conversation_id"],
        2,
        datetime.now(UTC),
        code=error.code,
        field=error.field,
        reason=error.reason,
        message=error.message,
    )
    _assert_valid_event(json.loads(event.to_json()))


# --- wrong documents fail --------------------------------------------------------------------


def _short() -> dict[str, Any]:
    value: dict[str, Any] = load(REPO_ROOT / "examples" / "short-session.json")
    return value


WRONG_SNAPSHOTS = {
    "no messages": {k: v for k, v in _short().items() if k != "messages"},
    "id starting with a dot": _short() | {"conversation_id": ".hidden"},
    "id with a slash": _short() | {"conversation_id": "a/b"},
    "revision as a string": _short() | {"revision": "2"},
    "negative revision": _short() | {"revision": -1},
    "revision past 2**53-1": _short() | {"revision": 2**53},
    "unknown format": _short() | {"format": "gemini"},
    "unknown field": _short() | {"conversations": []},
    "zero context window": _short() | {"model": {"name": "gpt-4o", "context_window": 0}},
    "messages not objects": _short() | {"messages": ["hello"]},
}


@pytest.mark.parametrize("name", WRONG_SNAPSHOTS)
def test_a_wrong_snapshot_fails_the_schema_and_the_model(name: str) -> None:
    value = WRONG_SNAPSHOTS[name]
    assert errors("snapshot.schema.json", value)
    with pytest.raises(ValidationError):
        Snapshot.model_validate(value)


def test_wrong_events_fail(run_cli: CliRunner) -> None:
    [completed] = _cli_events(
        run_cli, REPO_ROOT / "tests" / "fixtures" / "snapshot_openai.json", DEMO_CONFIG
    )
    assert completed["type"] == "compaction.completed"
    wrong = {
        "unknown type": completed | {"type": "compaction.started"},
        "no event_id": {k: v for k, v in completed.items() if k != "event_id"},
        "revision as a string": completed | {"revision": "7"},
        "start as a string": completed | {"compaction": completed["compaction"] | {"start": "1"}},
        "unknown summary source": completed
        | {
            "compaction": completed["compaction"]
            | {"summary": completed["compaction"]["summary"] | {"source": "oracle"}}
        },
        "no transcript field": completed
        | {"compaction": {k: v for k, v in completed["compaction"].items() if k != "transcript"}},
    }
    for name, event in wrong.items():
        assert errors("event.schema.json", event), name
        assert errors("compaction.completed.schema.json", event), name
    relabelled = copy.deepcopy(completed) | {"type": "compaction.skipped"}
    assert errors("compaction.completed.schema.json", relabelled)  # not a completed one ...
    assert errors("event.schema.json", relabelled)  # ... nor a skipped one (it has no reason)
    relabelled |= {"reason": "below the threshold", "why": "below", "floor": None}
    assert errors("event.schema.json", relabelled) == []  # readers ignore unknown fields
