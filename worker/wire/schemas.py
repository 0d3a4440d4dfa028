"""JSON Schemas of the snapshot and of every event, generated from the pydantic models.

The files under ``docs/schemas/`` are made by this module and checked in; a test runs
``--check`` so that they cannot drift from the models::

    python -m worker.wire.schemas                 # (re)write docs/schemas/*.schema.json
    python -m worker.wire.schemas --check         # exit 1, listing every file that differs

:data:`SCHEMAS` is the whole recipe: one row per file, naming the model (or a ``TypeAdapter``)
it is built from and the mode. Snapshots are input, so their schema is of what validation
accepts; events are output, so theirs is of what serialization writes (every field of the
type present, nulls included). Events are read tolerantly: a reader ignores fields it does not
know, so these schemas describe what this version writes, not what a reader must refuse.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode
from pydantic_core import core_schema

from worker.wire.events import (
    CompletedEvent,
    DeclinedEvent,
    ElidedEvent,
    FailedEvent,
    ProposedEvent,
    PublishedEvent,
    RejectedEvent,
    RevertedEvent,
    SkippedEvent,
)
from worker.wire.models import Snapshot

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
DEFAULT_DIR = Path("docs/schemas")
SUFFIX = ".schema.json"


class Source(NamedTuple):
    """What one schema file is built from."""

    model: type[BaseModel] | TypeAdapter[Any]
    mode: JsonSchemaMode
    description: str | None = None  # None: the model's docstring


_EVENT = (
    "An event as published on a conversation's stream, of any type; ``type`` says which. "
    "Readers must ignore fields they do not know."
)

SCHEMAS: dict[str, Source] = {
    "snapshot.schema.json": Source(Snapshot, "validation"),
    "event.schema.json": Source(TypeAdapter(PublishedEvent), "serialization", _EVENT),
    "compaction.completed.schema.json": Source(CompletedEvent, "serialization"),
    "compaction.skipped.schema.json": Source(SkippedEvent, "serialization"),
    "compaction.failed.schema.json": Source(FailedEvent, "serialization"),
    "compaction.rejected.schema.json": Source(RejectedEvent, "serialization"),
    "tool_results.elided.schema.json": Source(ElidedEvent, "serialization"),
    "compaction.reverted.schema.json": Source(RevertedEvent, "serialization"),
    "compaction.proposed.schema.json": Source(ProposedEvent, "serialization"),
    "compaction.declined.schema.json": Source(DeclinedEvent, "serialization"),
}


class _Published(GenerateJsonSchema):
    """In serialization mode every field is required: an event is written with every field,
    defaults and nulls included (``model_dump_json`` without exclusions)."""

    def field_is_required(
        self,
        field: core_schema.ModelField | core_schema.DataclassField | core_schema.TypedDictField,
        total: bool,
    ) -> bool:
        if self.mode == "serialization" and field["type"] != "typed-dict-field":
            return field.get("serialization_exclude_if") is None
        return super().field_is_required(field, total)


def build(name: str, source: Source) -> dict[str, Any]:
    """The schema of file ``name``, as a JSON value."""
    if isinstance(source.model, TypeAdapter):
        schema = source.model.json_schema(mode=source.mode, schema_generator=_Published)
        docstring = None
    else:
        schema = source.model.model_json_schema(mode=source.mode, schema_generator=_Published)
        docstring = source.model.__doc__
    schema = copy.deepcopy(schema)
    stem = name.removesuffix(SUFFIX)
    description = source.description or (inspect.cleandoc(docstring) if docstring else None)
    head: dict[str, Any] = {
        "$schema": SCHEMA_DIALECT,
        "$id": f"urn:compaction-worker:schema:{stem}",
        "title": f"compaction-worker/{stem}",
    }
    if description:
        head["description"] = description
    return schema | head


def render(schema: dict[str, Any]) -> str:
    """Deterministic text: sorted keys, two-space indent, UTF-8 kept, a trailing newline."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def expected() -> dict[str, str]:
    """File name -> the text it must have."""
    return {name: render(build(name, source)) for name, source in SCHEMAS.items()}


def drift(directory: Path) -> list[str]:
    """What differs between ``directory`` and the models, one line per file (empty: none)."""
    wanted = expected()
    problems = []
    for name, text in wanted.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: differs from the models")
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        if path.name not in wanted:
            problems.append(f"{path}: no model makes this schema any more")
    return problems


def write(directory: Path) -> list[str]:
    """Write every schema into ``directory`` and remove stale ones; returns what changed."""
    directory.mkdir(parents=True, exist_ok=True)
    wanted = expected()
    changed = []
    for name, text in wanted.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(f"{path}: written")
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        if path.name not in wanted:
            path.unlink()
            changed.append(f"{path}: removed")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.wire.schemas",
        description="Write (or check) the JSON Schemas of the snapshot and the events.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare instead of writing; exit 1 listing every file that differs",
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"default: {DEFAULT_DIR}")
    args = parser.parse_args(argv)
    if args.check:
        problems = drift(args.dir)
        for line in problems:
            sys.stderr.write(line + "\n")
        if problems:
            sys.stderr.write("regenerate with: python -m worker.wire.schemas\n")
            return 1
        return 0
    for line in write(args.dir):
        sys.stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
