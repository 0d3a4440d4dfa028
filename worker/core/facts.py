"""Facts taken deterministically from a range of messages: files, commands, errors.

Both summarizers use them: the digest prints them, and the LLM prompt passes them as must-keep
items and checks the answer for them. Files come from :mod:`worker.core.files` (what the tool calls
used as files, by position). :func:`extract_paths` is the older, looser regex over free text (a
"path" has a directory separator or a file extension), kept for reading earlier summaries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from worker.core.files import (
    LINE_BREAKS,
    FileKind,
    FileRecord,
    file_uses,
    lines_holding,
    parse_arguments,
)
from worker.core.last_answer import LastAnswer
from worker.wire.models import Message

_PATH = re.compile(
    r"(?<![\w/.\-~])"
    r"(?:~?/|\.{1,2}/)?"  # absolute, home or relative prefix
    r"(?:[\w@+\-.]+/)*"  # directories
    r"[\w@+\-]+(?:\.[\w@+\-]+)*"  # file name
    r"/?"
)
_EXTENSION = re.compile(r"[\w@+\-]{2,}\.[A-Za-z][A-Za-z0-9]{0,7}$")
_ERROR_LINE = re.compile(
    r"(Traceback \(most recent call last\)|^\w*(Error|Exception)\b|\bError:|error:|^E\s{2,}|"
    r"FAILED\b|^FAIL:|fatal:|No such file or directory|command not found|Permission denied)"
)
# Every line _ERROR_LINE finds holds a match of this looser pattern (the pytest "E  " only at a
# line start), so one search of the whole output skips the other lines at C speed. Each branch
# begins with a letter, which lets the search jump over text that cannot start a match.
_ERROR_HINT = re.compile(
    r"Traceback \(most recent call last\)|Error\b|Exception\b|error:|FAILED\b|FAIL:|fatal:|"
    r"No such file or directory|command not found|Permission denied|"
    f"E(?<![^{LINE_BREAKS}]E)\\s\\s"
)
_EMAIL = re.compile(r"@[\w\-]+\.[A-Za-z]")
_RETURN_CODE = re.compile(r"<returncode>(-?\d+)</returncode>")
MAX_ERROR_LINE_CHARS = 240


@dataclass
class ToolAction:
    index: int  # message index of the call
    tool: str
    call_id: str
    key_argument: str  # the command, path or query that identifies the call
    failed: bool = False
    error_lines: list[str] = field(default_factory=list)
    files: list[tuple[str, FileKind]] = field(default_factory=list)  # normalized, with the use
    message_id: str = ""  # the id of the call's message
    result_id: str | None = None  # the id of its result's message, when the range holds it

    @property
    def changes(self) -> list[tuple[str, FileKind]]:
        return [(p, k) for p, k in self.files if k in ("created", "edited", "deleted")]

    @property
    def message_ids(self) -> tuple[str, ...]:
        """The messages of the call and of its result: where the call's facts come from."""
        return (self.message_id,) if self.result_id is None else (self.message_id, self.result_id)


@dataclass
class Facts:
    files: list[FileRecord] = field(default_factory=list)  # in first-use order, one a path
    actions: list[ToolAction] = field(default_factory=list)

    @property
    def paths(self) -> list[str]:
        """The files used, normalized, in first-use order."""
        return [r.path for r in self.files]

    @property
    def failing(self) -> list[ToolAction]:
        return [a for a in self.actions if a.failed]


def fix_of(failed: ToolAction, actions: list[ToolAction]) -> ToolAction | None:
    """The first later call of the same tool, on the same first two words of its key argument,
    that succeeded: the heuristic for "fixed later" (not a proof)."""
    head = failed.key_argument.split(maxsplit=2)[:2]
    return next(
        (
            a
            for a in actions
            if a.index > failed.index
            and a.tool == failed.tool
            and not a.failed
            and a.key_argument.split(maxsplit=2)[:2] == head
        ),
        None,
    )


def sources_by_path(actions: list[ToolAction]) -> dict[str, list[str]]:
    """Each path the calls used -> the messages of the calls that used it and of their results."""
    out: dict[str, list[str]] = {}
    for action in actions:
        for path, _ in action.files:
            out.setdefault(path, []).extend(action.message_ids)
    return out


def extract_paths(text: str) -> list[str]:
    """File paths in ``text``, verbatim, in order of first appearance, without URLs."""
    found: dict[str, None] = {}
    for match in _PATH.finditer(text):
        candidate = match.group(0).rstrip(".")
        start = match.start()
        if text[max(start - 3, 0) : start].endswith("://") or "//" in candidate:
            continue
        if _EMAIL.search(candidate):
            continue
        if _looks_like_path(candidate):
            found.setdefault(candidate, None)
    return list(found)


def _looks_like_path(candidate: str) -> bool:
    name = candidate.rstrip("/").rsplit("/", 1)[-1]
    if "/" in candidate.strip("/") or candidate.startswith(("/", "./", "../", "~/")):
        return len(candidate.strip("/.~")) >= 2 and any(c.isalpha() for c in candidate)
    # Only the end can match (two name characters, the dot, at most 8 of extension), and
    # searching a whole enormous name for it would take quadratic time.
    return bool(_EXTENSION.search(name[-11:])) and not name[0].isdigit()


def key_argument(arguments: str) -> str:
    """The argument that identifies a call: a command, a path, a query, or the raw text."""
    return _key_of(arguments, parse_arguments(arguments))


def _key_of(arguments: str, value: Any) -> str:
    """:func:`key_argument` of arguments already parsed (``value``: None if not JSON)."""
    if isinstance(value, dict):
        for key in (
            "command",
            "cmd",
            "path",
            "file_path",
            "file",
            "pattern",
            "query",
            "url",
            "prompt",
            "task",
            "description",
        ):
            if isinstance(value.get(key), str):
                return str(value[key])
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return arguments


def argument_strings(arguments: str) -> list[str]:
    """Every string inside a call's JSON arguments (the raw text if it is not JSON)."""
    try:
        value: Any = json.loads(arguments) if arguments else {}
    except (ValueError, RecursionError):
        return [arguments]
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return out


def error_lines(output: str, *, limit: int = 3) -> list[str]:
    """The first few error-looking lines of a tool result, verbatim (long lines cut)."""
    lines: list[str] = []
    for line in _error_lines(output):
        text = line.strip()
        if len(text) > MAX_ERROR_LINE_CHARS:
            text = text[: MAX_ERROR_LINE_CHARS - 1] + "…"
        if text and text not in lines:
            lines.append(text)
        if len(lines) >= limit:
            break
    return lines


def _error_lines(output: str) -> Iterator[str]:
    """The lines of ``output`` (as str.splitlines() cuts them) that _ERROR_LINE finds, in order:
    only the few lines holding an _ERROR_HINT match are cut out and searched."""
    return (line for line in lines_holding(output, _ERROR_HINT) if _ERROR_LINE.search(line))


def _failed(output: str, errors: list[str]) -> bool:
    code = _RETURN_CODE.search(output[:200])
    if code is not None:
        return code.group(1) != "0"
    return bool(errors)


def extract_facts(messages: list[Message]) -> Facts:
    """The files the tool calls used (see :mod:`worker.core.files`), and each call with its outcome.

    One compaction asks for the facts of the same messages several times (the must-keep items,
    the digest, the fidelity check): the last answer of this thread is reused when the messages
    are the very same objects. Callers must not modify the result."""
    return _LAST_FACTS(messages)


def _extract_facts(messages: list[Message]) -> Facts:
    facts = Facts()
    records: dict[str, FileRecord] = {}
    results = {m.tool_call_id: m for m in messages if m.role == "tool"}
    for index, m in enumerate(messages):
        for call in m.tool_calls:
            result = results.get(call.id)
            output = result.content if result is not None else ""
            errors = error_lines(output)
            value = parse_arguments(call.arguments)  # once for the files and the key argument
            used = file_uses(call.name, call.arguments, value, output)
            for path, kind in used:
                record = records.get(path)
                if record is None:
                    record = records[path] = FileRecord(path=path, first_index=index)
                if kind not in record.kinds:
                    record.kinds.append(kind)
                if kind in ("created", "edited", "deleted"):
                    record.last_change = index
            facts.actions.append(
                ToolAction(
                    index=index,
                    tool=call.name,
                    call_id=call.id,
                    key_argument=_key_of(call.arguments, value),
                    failed=result is not None and _failed(output, errors),
                    error_lines=errors,
                    files=used,
                    message_id=m.id,
                    result_id=result.id if result is not None else None,
                )
            )
    facts.files = list(records.values())
    return facts


# After the function it reuses the answers of.
_LAST_FACTS = LastAnswer(_extract_facts)
