"""The errors seen: each failed call and how it ended, and the error names."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from worker.core.facts import Facts, ToolAction, argument_strings, fix_of
from worker.summarize.digest.base import (
    ERROR_DETAIL_LINES,
    ERROR_LINE_CHARS,
    ERRORS,
    LLM_ERRORS,
    MAX_ERRORS,
    _one_line,
)
from worker.summarize.digest.earlier import _kept_facts
from worker.summarize.prompt import without_bytes
from worker.wire.models import Message

# --- errors -----------------------------------------------------------------------------------

RESOLVED = "resolved later"
UNRESOLVED = "not resolved in range"
_ERROR_ENTRY = re.compile(r"^- `(.+)`: (.*) -> (resolved later|not resolved in range)$")
_REPAIRED_ERROR = re.compile(r"^failed `(.+)`(?:: (.*))? -> (fixed later|not fixed in range)$")
_OLDER_ERRORS = re.compile(r"^- earlier: (\d+) more failed calls?$")
ERROR_NAMES = "Error names seen: "
# An exception or warning class, by the shape of its name (after a module's ``.``, too). Tried
# only where a word starts, and without a dotted prefix to backtrack over: linear in the text.
_ERROR_CLASS = re.compile(
    r"(?<!\w)([A-Z]\w*(?:Error|Exception|Warning|Exit|Interrupt|Failure|Fault|DoesNotExist"
    r"|Configured))\b"
)
TRACEBACK = "Traceback (most recent call last):"
# A traceback's last line: the class raised (after its module) alone or before ": message".
_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Z]\w*)(?::[^\n]*)?$", re.MULTILINE)
MAX_ERROR_NAMES = 16


@dataclass
class _Error:
    command: str  # one line, as listed
    detail: str
    resolved: bool
    sources: list[str]

    def line(self) -> str:
        return f"- `{self.command}`: {self.detail} -> {RESOLVED if self.resolved else UNRESOLVED}"


@dataclass
class _Errors:
    body: str
    sources: list[str]
    entries: list[_Error] = field(default_factory=list)  # the ones listed, oldest first


def _errors(
    messages: list[Message], facts: Facts, earlier: dict[str, str], previous: list[str]
) -> _Errors:
    """The error names seen (exception and warning classes, wherever the range or an earlier
    summary held them; the newest :data:`MAX_ERROR_NAMES`), then every failed call and how it
    ended, oldest first: the earlier summaries' (one they left unresolved is resolved when a
    call of this range on the same first two words succeeded), then the range's (with the
    class a traceback raised); the same call with the same error once, where it last failed.
    Past :data:`MAX_ERRORS`, the oldest are only counted. Drawn from the failed calls, their
    results and the calls that resolved them, the messages that named the errors, and the
    earlier summary when it listed errors."""
    entries, kept_lines, older, names = _earlier_errors(earlier, previous)
    succeeded = {_head(a.key_argument) for a in facts.actions if not a.failed}
    for entry in entries:
        entry.resolved = entry.resolved or _head(entry.command) in succeeded
    outputs = {m.id: m.content for m in messages if m.role == "tool"}
    for a in facts.failing:
        fix = fix_of(a, facts.actions)
        fixed = fix.message_ids if fix is not None else ()
        detail = _error_detail(a, outputs)
        entries.append(
            _Error(
                _one_line(a.key_argument, 100), detail, fix is not None, [*a.message_ids, *fixed]
            )
        )
    merged: dict[tuple[str, str], _Error] = {}
    for entry in entries:  # the same failure again: listed once, where it last happened
        seen = merged.pop((entry.command, entry.detail), None)
        if seen is not None:
            entry.sources = [*seen.sources, *entry.sources]
        merged[(entry.command, entry.detail)] = entry
    listed = list(merged.values())
    folded, listed = listed[: max(len(listed) - MAX_ERRORS, 0)], listed[-MAX_ERRORS:]
    older += len(folded)
    named, naming = _range_error_names(messages)
    names = list(dict.fromkeys(reversed([*names, *named])))[:MAX_ERROR_NAMES][::-1]
    lines = [ERROR_NAMES + " ".join(f"`{n}`" for n in names)] if names else []
    lines += [f"- earlier: {older} more failed call{'s' if older != 1 else ''}"] if older else []
    lines += [*kept_lines, *(e.line() for e in listed)]
    sources = [*naming, *(i for e in [*folded, *listed] for i in e.sources)]
    if kept_lines or older or not set(names) <= set(named):
        sources.extend(previous)
    return _Errors("\n".join(lines), sources, listed)


def _range_error_names(messages: list[Message]) -> tuple[list[str], list[str]]:
    """The error names of the range in order of appearance (texts, call arguments, tool
    outputs, the class each traceback raised), and the messages that held them."""
    names: list[str] = []
    sources: list[str] = []
    for m in messages:
        texts = [
            without_bytes(m.content),
            *(a for c in m.tool_calls for a in argument_strings(c.arguments)),
        ]
        found = [n for text in texts for n in _error_names(text)]
        if m.role == "tool" and TRACEBACK in m.content:
            raised = _RAISED.match(_raised(m.content[m.content.rfind(TRACEBACK) :]) or "")
            found.extend([raised.group(1)] if raised else [])
        names.extend(found)
        if found:
            sources.append(m.id)
    return names, sources


def _earlier_errors(
    earlier: dict[str, str], previous: list[str]
) -> tuple[list[_Error], list[str], int, list[str]]:
    """An earlier summary's errors: its entries, lines of another shape (an LLM's), how many
    older ones it counted, and the error names it listed."""
    entries: list[_Error] = []
    others: list[str] = []
    older = 0
    names: list[str] = []
    for line in (earlier.get(ERRORS, "") + "\n" + earlier.get(LLM_ERRORS, "")).splitlines():
        line = line.strip()
        entry = _ERROR_ENTRY.match(line)
        counted = _OLDER_ERRORS.match(line)
        if entry:
            resolved = entry.group(3) == RESOLVED
            entries.append(_Error(entry.group(1), entry.group(2), resolved, list(previous)))
        elif counted:
            older += int(counted.group(1))
        elif line.startswith(ERROR_NAMES):
            names.extend(n.strip("`") for n in line[len(ERROR_NAMES) :].split())
        elif line and line != "…":
            others.append(line)
    for repaired in _kept_facts(earlier, ""):
        found = _REPAIRED_ERROR.match(repaired)
        if found:
            detail = found.group(2) or "non-zero exit"
            entries.append(
                _Error(found.group(1), detail, found.group(3) == "fixed later", list(previous))
            )
    return entries, others, older, [n for n in names if n]


def _head(command: str) -> tuple[str, ...]:
    return tuple(command.split(maxsplit=2)[:2])


def _error_detail(action: ToolAction, outputs: dict[str, str]) -> str:
    """What a failed call said: the class its traceback raised (its last line) first, then its
    first error lines, without the bare ``Traceback ...:`` line that names nothing."""
    lines = [line for line in action.error_lines if line != TRACEBACK]
    output = outputs.get(action.result_id or "", "")
    at = output.rfind(TRACEBACK)
    raised = _raised(output[at:]) if at >= 0 else None
    if raised is not None and not any(raised in line for line in lines):
        lines.insert(0, raised)
    shown = [_one_line(line, ERROR_LINE_CHARS) for line in lines[:ERROR_DETAIL_LINES]]
    return "; ".join(shown) or "non-zero exit"


def _raised(traceback: str) -> str | None:
    """The last line of a traceback that names a class (``KeyError: 'x'``, ``pkg.Error``)."""
    found = None
    for match in _RAISED.finditer(traceback):
        name = match.group(1)
        if len(name) >= 4 and name != "Traceback" and any(c.islower() for c in name):
            found = match.group(0)
    return found


def _error_names(text: str) -> list[str]:
    return [m.group(1) for m in _ERROR_CLASS.finditer(text)]
