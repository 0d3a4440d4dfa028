"""The task state (what was done, what is open), the latest state and the action log."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from worker.core.facts import Facts, ToolAction
from worker.core.fidelity import is_conclusion, strip_thought
from worker.summarize.digest.base import (
    LATEST,
    LLM_NEXT,
    LLM_PROGRESS,
    MAX_ACTION_LINES,
    MAX_OPEN,
    MAX_STEPS,
    STEP_CHARS,
    TASK_STATE,
    _cut,
    _one_line,
    _quoted,
)
from worker.summarize.digest.earlier import _bullets, _kept_facts
from worker.summarize.digest.errors import _error_names, _Errors
from worker.summarize.prompt import without_bytes
from worker.wire.models import Message

_DONE = "Done so far, oldest first:"
_OPEN = "Still open:"
_LAST_CALL = "Last call: "
_NEXT_STEP = "Next step: "


def _task_state(
    messages: list[Message],
    facts: Facts,
    earlier: dict[str, str],
    latest: _Latest,
    errors: _Errors,
    previous: list[str],
) -> tuple[str, list[str]]:
    """What the agent has done and what is still open. Done, oldest first: the steps earlier
    summaries listed; the conclusion an earlier summary's latest state stated (when this range
    has a newer one); the range's newest changes that the agent said something about, with
    what it said. Open: the calls still failing, newest first, and what an LLM summary listed
    as next. Drawn from the earlier summary, those changes and the failed calls listed."""
    steps, waiting = _earlier_task_state(earlier)
    if latest.concluded:
        conclusion = _conclusion_of(earlier.get(LATEST, ""))
        steps.extend([conclusion] if conclusion else _kept_facts(earlier, "latest: "))
    changes = _changes_said(messages, facts)
    steps.extend(step for step, _ in changes)
    steps = list(dict.fromkeys(_opening(s, STEP_CHARS) for s in steps if s.strip()))
    if len(steps) > MAX_STEPS:
        steps = [*steps[:2], *steps[-(MAX_STEPS - 2) :]]
    failing = [e for e in reversed(errors.entries) if not e.resolved][:MAX_OPEN]
    still = [f"`{_one_line(e.command, 60)}` still failing{_named(e.detail)}" for e in failing]
    still.extend(waiting[-(MAX_OPEN - len(still)) :] if len(still) < MAX_OPEN else [])
    lines = []
    if steps:
        lines += [_DONE, *(f"- {s}" for s in steps)]
    if still:
        lines += [_OPEN, *(f"- {s}" for s in still)]
    sources = [i for _, action in changes for i in action.message_ids]
    sources += [i for e in failing for i in e.sources]
    if len(steps) > len(changes) or waiting:
        sources.extend(previous)
    return "\n".join(lines), sources


CHANGES_SAID = 3  # a range's changes listed as steps done, newest kept
CHANGE_WORDS = 160


def _changes_said(messages: list[Message], facts: Facts) -> list[tuple[str, ToolAction]]:
    """The range's newest changes (one a file: its last) whose call came with text, as steps
    (``edited `path`: what the agent said``), oldest first: what it did, and why."""
    latest: dict[str, tuple[str, ToolAction]] = {}
    for action in facts.actions:
        said = _APOLOGY.sub("", strip_thought(without_bytes(messages[action.index].content)))
        for path, kind in action.changes if said else ():
            latest.pop(path, None)
            latest[path] = (f"{kind} `{path}`: {_opening(said, CHANGE_WORDS)}", action)
    return list(latest.values())[-CHANGES_SAID:]


_SENTENCE_END = re.compile(r"[.!?](?=\s)")
# Sentences an agent opens with after a format error: they say nothing about the change.
_APOLOGY = re.compile(
    r"^(?:(?:I apologi[sz]e|My apologies|Apologies|Sorry)\b[^.!?\n]*[.!?]\s*)+", re.I
)


def _opening(text: str, limit: int) -> str:
    """The first sentences of ``text`` on one line, within ``limit`` characters where a
    sentence ends in time."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    ends = [m.end() for m in _SENTENCE_END.finditer(flat, 0, limit)]
    return flat[: ends[-1]] if ends and ends[-1] >= limit // 3 else flat[: limit - 1] + "…"


def _earlier_task_state(earlier: dict[str, str]) -> tuple[list[str], list[str]]:
    """An earlier summary's steps done (a digest's, or an LLM's progress) and what it listed
    as open that is not a failing call (an LLM's next steps)."""
    steps: list[str] = []
    waiting: list[str] = []
    into = steps
    for line in earlier.get(TASK_STATE, "").splitlines():
        line = line.strip()
        if line in (_DONE, _OPEN):
            into = steps if line == _DONE else waiting
        elif (
            line.startswith("- ")
            and line != "- …"
            and not (into is waiting and line.startswith("- `"))
        ):
            into.append(line[2:])
    steps.extend(_bullets(earlier.get(LLM_PROGRESS, "")))
    waiting.extend(_bullets(earlier.get(LLM_NEXT, "")))
    return steps, waiting


def _conclusion_of(state: str) -> str:
    """The conclusion an earlier latest state stated: its lines before the last call and the
    next step (or before where a cut shortened it)."""
    lines = []
    for line in state.splitlines():
        if line.startswith((_LAST_CALL, _NEXT_STEP)) or line == "…":
            break
        lines.append(line)
    return "\n".join(lines).strip()


def _named(detail: str) -> str:
    names = list(dict.fromkeys(_error_names(detail)))
    return f" ({', '.join(names)})" if names else ""


MAX_STATE_CHARS = 1200


@dataclass
class _Latest:
    body: str
    sources: list[str]
    concluded: bool  # whether the range said something (else the earlier conclusion holds)


def _latest_state(
    messages: list[Message], facts: Facts, earlier: dict[str, str], previous: list[str]
) -> _Latest:
    """The agent's last substantive conclusion (not a mere "let me look at X"), or, when the
    range has none, the one an earlier summary stated; the result of the last call; and the
    open next step when the agent said one after its conclusion. Drawn from those messages
    (the earlier summary, for its conclusion)."""
    newest = conclusion = None
    for said in _assistant_texts_newest_first(messages):
        newest = newest or said
        if is_conclusion(said[1]):
            conclusion = said
            break
    conclusion = conclusion or newest
    lines = []
    sources: list[str] = []
    if conclusion is not None:
        lines.append(_quoted(_cut(conclusion[1], MAX_STATE_CHARS)))
        sources.append(messages[conclusion[0]].id)
    elif _conclusion_of(earlier.get(LATEST, "")):
        lines.append(_conclusion_of(earlier[LATEST]))
        sources.extend(previous)
    if facts.actions:
        last = facts.actions[-1]
        outcome = "failed" if last.failed else "ok"
        detail = f": {last.error_lines[0]}" if last.failed and last.error_lines else ""
        lines.append(
            f"{_LAST_CALL}{last.tool} `{_one_line(last.key_argument, 120)}` -> {outcome}{detail}"
        )
        sources.extend(last.message_ids)
    elif conclusion is None and earlier.get(LATEST):  # nothing new at all: it holds whole
        return _Latest(earlier[LATEST], list(previous), concluded=False)
    if newest is not None and conclusion is not None and newest[0] > conclusion[0]:
        lines.append(f"{_NEXT_STEP}{_one_line(newest[1], 300)}")
        sources.append(messages[newest[0]].id)
    return _Latest("\n".join(lines), sources, concluded=conclusion is not None)


def _assistant_texts_newest_first(messages: list[Message]) -> Iterator[tuple[int, str]]:
    """(position, text) of each assistant message that says something, newest first: made
    only as far back as the latest state looks (its conclusion is usually a few turns back)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "assistant" and m.content.strip():
            text = strip_thought(without_bytes(m.content))
            if text:
                yield i, text


def _actions(facts: Facts) -> str:
    """What changed (each change with its files) before what was only looked at or run."""
    counts = Counter(a.tool for a in facts.actions)
    lines = [", ".join(f"{tool} ×{n}" for tool, n in counts.most_common())]
    changes = [a for a in facts.actions if a.changes]
    others = [a for a in facts.actions if not a.changes]
    if changes:
        lines.append("Changes:")
        for a in _capped(changes, MAX_ACTION_LINES // 2):
            what = ", ".join(f"{k} `{p}`" for p, k in a.changes)
            status = " (failed)" if a.failed else ""
            lines.append(f"- {what}: {a.tool} `{_one_line(a.key_argument, 100)}`{status}")
    if others:
        lines.append("Looked at or ran:")
        for a in _capped(others, MAX_ACTION_LINES - min(len(changes), MAX_ACTION_LINES // 2)):
            status = " (failed)" if a.failed else ""
            lines.append(f"- {a.tool}: `{_one_line(a.key_argument)}`{status}")
    return "\n".join(lines)


def _capped(actions: list[ToolAction], limit: int) -> list[ToolAction]:
    """The first few for context, most of the room for the recent work."""
    if len(actions) <= limit:
        return actions
    head = limit // 4
    return [*actions[:head], *actions[-(limit - head) :]]
