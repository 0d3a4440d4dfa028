"""The offline digest (``mode = local_only``): deterministic, bounded, no network.

It states the task as the user gave it, what the agent has done and what is still open, every
file touched (verbatim paths), the errors seen and how they ended, the code names the agent used
or learned (:mod:`worker.core.identifiers`), and the latest state (its conclusion or hypothesis,
the last call and the open next step).

An earlier summary the range starts with is merged into these sections, section by section: its
files, errors, names, user requests and images join the new ones (an error it left open is
marked resolved when the range fixed it), its latest state becomes a step done, and an LLM
summary's sections are read the same way; only what fits no section is kept apart, under
``Earlier summary``, and given up first. So the story carries across any number of compactions
instead of shrinking to the names each one passes on.

When the text is over ``max_output_tokens``, each section first gives way down to its share of
the bound, the names first (so that they never crowd out the story), then the others by value
per token: what could not be merged, the action log, names only a tool printed, the latest
state, the user's requests and the task state, the names the agent used, errors, files. A ranked
list (names, files) loses its least valuable items first. Text quoted from the conversation
never opens a section of its own: a heading line in it is indented and a code fence left open
is closed.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

from worker.core.facts import (
    Facts,
    ToolAction,
    argument_strings,
    extract_facts,
    extract_paths,
    fix_of,
    sources_by_path,
)
from worker.core.fidelity import KEPT_FACTS_TITLE, is_conclusion, strip_thought
from worker.core.files import CHANGE_KINDS
from worker.core.identifiers import CALLS, TEXT, USER, code_names, shown_by
from worker.summarize import SUMMARY_MARKER, SummaryRequest
from worker.summarize.prompt import without_bytes
from worker.tokens import count_joined, count_prefix, count_tokens, cut_to_tokens
from worker.wire.events import Summary, SummarySection
from worker.wire.media import placeholders
from worker.wire.models import Message

MAX_ACTION_LINES = 40
MAX_ERRORS = 12  # listed one a line; older ones are counted on one line, with their error names
ERROR_DETAIL_LINES = 2
ERROR_LINE_CHARS = 160
ARGUMENT_CHARS = 160
MAX_STEPS = 16  # steps done, listed: the first two and the newest
STEP_CHARS = 200
MAX_OPEN = 6
MAX_EARLIER_REQUESTS = 12  # an earlier summary's later user messages, newest kept
REQUEST_CHARS = 300
# The most both names sections may keep of the output bound when the digest must shrink: names
# are one section among others, so that the story (requests, task state, latest state) survives.
NAMES_SHARE = 0.3

FOCUS = "Requested focus"
FILES = "Files touched"
ERRORS = "Errors seen"
IMAGES = "Images and files"
CODE_NAMES = "Code names"
REQUESTS = "Earlier user requests"
TASK_STATE = "Task state"
LATEST = "Latest state"
OUTPUT_NAMES = "Names printed by tools"
ACTIONS = "Actions"
EARLIER = "Earlier summary"
# An LLM summary's sections (worker.summarize.prompt.SECTIONS) with no digest section of their
# own: carried under their titles when the digest continues from such a summary.
LLM_CARRIED = ("Goal", "Decisions", "Constraints", "Delegated work", "Open questions")
LLM_PROGRESS = "Progress"
LLM_NEXT = "Next steps"
LLM_FILES = "Artifacts and files touched"
LLM_ERRORS = "Errors and outcomes"
# Sections whose heading always starts a section when an earlier summary is read, even after a
# code fence an older digest left open.
KNOWN_TITLES = frozenset(
    [
        *(FOCUS, FILES, ERRORS, IMAGES, CODE_NAMES, REQUESTS, TASK_STATE, LATEST, OUTPUT_NAMES),
        *(ACTIONS, EARLIER, KEPT_FACTS_TITLE, LLM_PROGRESS, LLM_NEXT, LLM_FILES, LLM_ERRORS),
        *LLM_CARRIED,
    ]
)
# Read from an earlier summary into the new sections (the rest is kept apart, under EARLIER);
# an earlier request's focus and action log are dropped: they described that range only.
_MERGED = KNOWN_TITLES - {EARLIER}


@dataclass
class _Section:
    title: str
    body: str
    sources: list[str]  # ids of the messages it was drawn from (a cut keeps them all)
    priority: int  # lower is cut first
    # What a cut drops: "text" keeps the start and the end; "names" and "lines" are ranked
    # lists, best first, that lose their last items; "steps" (the task state) keeps what is
    # open and the newest steps; "state" (the latest state) its opening and the next step;
    # "errors" the error names and the newest failed calls.
    cut: str = "text"
    share: float = 0.0  # of the output bound, what it keeps before the others give way
    tokens: int | None = None  # the count of ``body`` once counted (reset with a new body)
    # A names section's (label, name), best first: ``body`` renders them a line per label, so
    # a cut takes the best ranked from here, not the first lines of the body.
    items: list[tuple[str, str]] = field(default_factory=list)


class DigestSummarizer:
    """Deterministic summaries from the messages alone."""

    def summarize(self, request: SummaryRequest) -> Summary:
        messages = request.messages
        facts = extract_facts(messages)
        earlier = earlier_sections(request.previous_summary)
        previous = request.previous_summary_ids
        files = _accumulated_files(facts, earlier)
        errors = _errors(messages, facts, earlier, previous)
        latest = _latest_state(messages, facts, earlier, previous)
        used_names, printed_names = _names(request, facts, files, earlier)
        header = (
            f"{SUMMARY_MARKER}\nOffline digest of {len(messages)} earlier messages "
            f"({len(facts.actions)} tool calls), revision {request.revision}."
        )
        calls = [i for a in facts.actions for i in a.message_ids]
        sections = [
            _Section(FOCUS, *_focus(request), priority=9, share=0.15),
            _Section(
                FILES,
                render_files(files),
                _file_sources(facts, files, previous),
                priority=8,
                cut="lines",
                share=0.2,
            ),
            _Section(ERRORS, errors.body, errors.sources, priority=7, cut="errors", share=0.1),
            _Section(IMAGES, *_attachments(messages, earlier, previous), priority=7, share=0.05),
            _names_section(CODE_NAMES, used_names, priority=6),
            _Section(REQUESTS, *_task(messages, earlier, previous), priority=5, share=0.08),
            _Section(
                TASK_STATE,
                *_task_state(messages, facts, earlier, latest, errors, previous),
                priority=5,
                cut="steps",
                share=0.12,
            ),
            _Section(LATEST, latest.body, latest.sources, priority=4, cut="state", share=0.12),
            *_carried_llm_sections(earlier, previous),
            _names_section(OUTPUT_NAMES, printed_names, priority=3),
            _Section(ACTIONS, _actions(facts), calls, priority=2),
            _Section(EARLIER, _unmerged(earlier), list(previous), priority=1),
        ]
        present = [s for s in sections if s.body]
        text, tokens, truncated = _fit(header, present, request)
        return Summary(
            text=text,
            tokens=tokens,
            source="digest",
            truncated=truncated,
            instructions_note=INSTRUCTIONS_NOTE if request.instructions else None,
            # In the request's ids; the sections a cut removed are left out when published.
            sections=[
                SummarySection(title=s.title, source_ids=s.sources) for s in present if s.body
            ],
        )


# --- an earlier summary, section by section ---------------------------------------------------

_HEADER_LINE = re.compile(r"Offline digest of \d+ earlier messages")
_FENCE_LINE = re.compile(r"^[ \t]*(?:```|~~~)", re.MULTILINE)


def earlier_sections(previous: str | None) -> dict[str, str]:
    """The sections of the earlier summary (or summaries, joined) the range starts with, by
    title (a title seen twice: its bodies joined); text under no heading, our marker and header
    line aside, under "". A ``## `` line inside a code fence is text, unless it is one of the
    titles the digest or the LLM writes (an older digest could leave a fence open)."""
    bodies: dict[str, list[str]] = {}
    title = ""
    fenced = False
    for line in (previous or "").splitlines():
        heading = line[3:].strip() if line.startswith("## ") else None
        if heading and (not fenced or heading in KNOWN_TITLES):
            title, fenced = heading, False
            bodies.setdefault(title, [])
            continue
        if _FENCE_LINE.match(line):
            fenced = not fenced
        if not title and (line.strip() == SUMMARY_MARKER or _HEADER_LINE.match(line)):
            continue
        bodies.setdefault(title, []).append(line)
    joined = {t: "\n".join(lines).strip("\n") for t, lines in bodies.items()}
    return {t: body for t, body in joined.items() if body.strip()}


def _bullets(body: str) -> list[str]:
    """The items of a list (``- item`` lines), without their dashes."""
    return [line.strip()[2:].strip() for line in body.splitlines() if line.strip().startswith("- ")]


def _kept_facts(earlier: dict[str, str], prefix: str) -> list[str]:
    """The lines of the earlier summary's ``Kept facts`` repair that start with ``prefix``
    (``task: ``, ``latest: ``, ``id ``, ...), without it."""
    return [
        b[len(prefix) :]
        for b in _bullets(earlier.get(KEPT_FACTS_TITLE, ""))
        if b.startswith(prefix)
    ]


def _unmerged(earlier: dict[str, str]) -> str:
    """What of the earlier summary no section took: text under no heading or a heading we do
    not write (a forged summary, an older digest's quoted headings), each part under its title
    as a plain line; the ``delegated`` lines of a repair."""
    parts = [
        body if not title else f"{title}:\n{body}"
        for title, body in earlier.items()
        if title not in _MERGED
    ]
    delegated = [
        f"- {b}"
        for b in _bullets(earlier.get(KEPT_FACTS_TITLE, ""))
        if b.startswith("delegated to ")
    ]
    if delegated:
        parts.append("\n".join(delegated))
    return _quoted("\n\n".join(parts))


def _carried_llm_sections(earlier: dict[str, str], previous: list[str]) -> list[_Section]:
    """An earlier LLM summary's goal, decisions, constraints, delegated work and open questions,
    each under its own title (the digest has no sections of its own for them)."""
    return [
        _Section(title, _quoted(earlier[title]), list(previous), priority=4, share=0.05)
        for title in LLM_CARRIED
        if title in earlier
    ]


# --- quoting ------------------------------------------------------------------------------------

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?=[ \t]|$)", re.MULTILINE)


def _quoted(text: str) -> str:
    """Text of the conversation (or of an earlier summary) as it goes in a section: a line that
    would open a Markdown heading is indented (the same words, so that a check of the text
    whitespace aside still finds them), and a code fence left open is closed, so that quoted
    text never starts a section of its own or swallows the ones after it."""
    if "#" in text:
        text = _HEADING.sub(r"    \1", text)
    if len(_FENCE_LINE.findall(text)) % 2:
        text += "\n```"
    return text


# --- files ------------------------------------------------------------------------------------


def _accumulated_files(facts: Facts, earlier: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(path, kinds), newest first: the range's files in first-use order, then those only
    earlier summaries listed (a path used again gets its new kinds after its earlier ones), so
    that a cut of the list drops the files least recently used."""
    known: dict[str, list[str]] = {}
    for path, kinds in _earlier_files(earlier):
        held = known.setdefault(path, [])
        held.extend(k for k in kinds if k not in held)
    ordered = [record.path for record in facts.files]
    for record in facts.files:
        held = known.setdefault(record.path, [])
        held.extend(k for k in record.kinds if k not in held)
    shown = set(ordered)
    ordered.extend(path for path in known if path not in shown)
    return [(path, known[path]) for path in ordered]


def _earlier_files(earlier: dict[str, str]) -> list[tuple[str, list[str]]]:
    """The files an earlier summary listed: a digest's ``Files touched``, an LLM's
    ``Artifacts and files touched``, and the file lines of a repair."""
    repaired = "\n".join(
        f"- {b}" for b in _bullets(earlier.get(KEPT_FACTS_TITLE, "")) if _FILE_LINE.match(f"- {b}")
    )
    return [
        *parse_files(earlier.get(FILES, "")),
        *parse_files(earlier.get(LLM_FILES, "")),
        *parse_files(repaired),
    ]


def _file_sources(
    facts: Facts, files: list[tuple[str, list[str]]], previous: list[str]
) -> list[str]:
    """The calls (and results) that used each listed file, and the earlier summary when it
    listed files (they are carried over)."""
    used_by = sources_by_path(facts.actions)
    sources = [i for path, _ in files for i in used_by.get(path, ())]
    if len(files) > len(facts.files):  # some come from the earlier summary only
        sources.extend(previous)
    return sources


def render_files(files: list[tuple[str, list[str]]]) -> str:
    """Changed files first (with how), then the ones only read, listed or run."""
    changed = [(p, k) for p, k in files if any(x in CHANGE_KINDS for x in k)]
    looked = [(p, k) for p, k in files if not any(x in CHANGE_KINDS for x in k)]
    lines = []
    if changed:
        lines.append("Changed:")
        lines.extend(f"- `{p}` ({', '.join(k)})" for p, k in changed)
    if looked:
        lines.append("Read, listed or run:")
        lines.extend(f"- `{p}` ({', '.join(k)})" if k else f"- `{p}`" for p, k in looked)
    return "\n".join(lines)


_FILE_LINE = re.compile(r"^- `([^`]+)`(?: \(([a-z, ]+)\))?$")


def parse_files(section: str) -> list[tuple[str, list[str]]]:
    """The (path, kinds) of a "Files touched" section; a line of an older digest is a bare path."""
    out: list[tuple[str, list[str]]] = []
    for line in section.splitlines():
        line = line.strip()
        match = _FILE_LINE.match(line)
        if match:
            kinds = [k.strip() for k in (match.group(2) or "").split(",") if k.strip()]
            out.append((match.group(1), kinds))
        elif line and not line.endswith(":") and line != "…":
            out.extend((p, []) for p in extract_paths(line))
    return out


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


# --- names ------------------------------------------------------------------------------------

_TIER_LABELS = {
    CALLS: "In the agent's commands and edits",
    TEXT: "In its notes",
}
_USER_LABEL = "In user messages"
_EARLIER_LABEL = "From earlier summaries"
_PRINTED_LABEL = "Seen in outputs"
_NAMES_LINE = re.compile(r"^([A-Z][^:]*): (.+)$")


def _names(
    request: SummaryRequest,
    facts: Facts,
    files: list[tuple[str, list[str]]],
    earlier: dict[str, str],
) -> tuple[_Names, _Names]:
    """The code names to list, best first, less what the files list shows: the ones the agent
    used (its calls, then its text), then those earlier summaries listed (in their order, which
    is by recency: a name a summary passes on moves down with each compaction and gives way
    first), then those only user messages held (the requests beside quote them); and apart,
    those only a tool printed (more of them, and each less likely needed): the order of how
    often the agent names them again later (BENCHMARKS.md, "Replayed sessions"). Their sources
    are the messages of the roles they are drawn from, and the earlier summary."""
    shown = {path for path, _ in files} | {n for path, _ in files for n in shown_by(path)}
    before = [n for n in dict.fromkeys(_earlier_names(earlier)) if n not in shown]
    listed = set(before)
    used: list[tuple[str, str]] = []
    users: list[tuple[str, str]] = []
    printed: list[tuple[str, str]] = []
    for name in code_names(request.messages):
        if name.text in shown:
            continue
        shown.add(name.text)
        if "." in name.text or "/" in name.text:  # a plain identifier shows nothing shorter
            shown.update(shown_by(name.text))
        if name.tier in _TIER_LABELS:
            used.append((_TIER_LABELS[name.tier], name.text))
        elif name.text in listed:  # printed or quoted again: it stays where it was listed
            shown.discard(name.text)
        elif name.tier == USER:
            users.append((_USER_LABEL, name.text))
        else:
            printed.append((_PRINTED_LABEL, name.text))
    carried = [(_EARLIER_LABEL, n) for n in before if n not in shown]
    said = (
        [m.id for m in request.messages if m.role in ("assistant", "user")] if used or users else []
    )
    if carried:
        said.extend(request.previous_summary_ids)
    outputs = [m.id for m in request.messages if m.role == "tool"] if printed else []
    return _Names([*used, *carried, *users], said), _Names(printed, outputs)


class _Names(NamedTuple):
    items: list[tuple[str, str]]  # (label, name), best first
    sources: list[str]


def _names_section(title: str, names: _Names, priority: int) -> _Section:
    return _Section(
        title, render_names(names.items), names.sources, priority, cut="names", items=names.items
    )


def render_names(items: list[tuple[str, str]]) -> str:
    """One line per label, its names in rank order, separated by spaces (each name is whole)."""
    lines: dict[str, list[str]] = {}
    for label, name in items:
        lines.setdefault(label, []).append(name)
    return "\n".join(f"{label}: {' '.join(names)}" for label, names in lines.items())


def _earlier_names(earlier: dict[str, str]) -> list[str]:
    """The names an earlier summary listed (both of a digest's name sections, in their order),
    and the identifiers its repair kept."""
    names: list[str] = []
    for title in (CODE_NAMES, OUTPUT_NAMES):
        for line in earlier.get(title, "").splitlines():
            match = _NAMES_LINE.match(line.strip())
            if match:
                names.extend(n for n in match.group(2).split() if n != "…")
    names.extend(n.strip("`") for n in _kept_facts(earlier, "id "))
    return names


# --- the user's requests, the task state, the latest state -----------------------------------

_LATER = "\nLater user messages:\n"
_LATEST_REQUEST = "\nLatest user message:\n"


def _task(
    messages: list[Message], earlier: dict[str, str], previous: list[str]
) -> tuple[str, list[str]]:
    """The task as the user first stated it, every later instruction or correction (each once,
    shortened), and the latest user message whole; an earlier summary's come first (the task
    it stated stays the first). Drawn from every user message with text, and the earlier
    summary when it held requests."""
    said = [(without_bytes(m.content).strip(), m.id) for m in messages if m.role == "user"]
    said = [(text, mid) for text, mid in said if text]
    first, before = _earlier_requests(earlier)
    users = list(dict.fromkeys(text for text, _ in said))
    sources = [mid for _, mid in said]
    if first or before:
        sources.extend(previous)
    if not first:
        if not users:
            return "", []
        first, users = users[0], users[1:]
    later = [u for u in dict.fromkeys([*before[-MAX_EARLIER_REQUESTS:], *users]) if u != first]
    lines = [_quoted(first)]
    if len(later) > 1:
        lines.append(_LATER.rstrip("\n"))
        lines.extend(f"- {_one_line(u, REQUEST_CHARS)}" for u in later[:-1])
    if later:
        lines.append(_LATEST_REQUEST.rstrip("\n") + f"\n{_quoted(later[-1])}")
    return "\n".join(lines), sources


def _earlier_requests(earlier: dict[str, str]) -> tuple[str, list[str]]:
    """An earlier summary's user requests: the first as it stated it, and the later ones
    (its latest among them), oldest first."""
    body = earlier.get(REQUESTS, "")
    first, _, latest = body.partition(_LATEST_REQUEST)
    first, _, listed = first.partition(_LATER)
    later = [*_bullets(listed), *([latest.strip()] if latest.strip() else [])]
    first = first.strip()
    if not first:
        tasks = _kept_facts(earlier, "task: ")
        first = tasks[0] if tasks else ""
    later.extend(_kept_facts(earlier, "instruction: "))
    return first, later


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


# --- what a requested compaction points at; images; the latest state; actions -----------


# Words of a request's instructions that say nothing about what to look for.
_FOCUS_STOPWORDS = frozenset(
    [
        "about",
        "above",
        "after",
        "also",
        "been",
        "before",
        "below",
        "being",
        "both",
        "compact",
        "compaction",
        "could",
        "does",
        "each",
        "every",
        "focus",
        "from",
        "have",
        "into",
        "just",
        "keep",
        "kept",
        "make",
        "more",
        "most",
        "must",
        "only",
        "other",
        "over",
        "please",
        "should",
        "some",
        "such",
        "sure",
        "than",
        "that",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "very",
        "want",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "will",
        "with",
        "would",
        "your",
        "summary",
        "summarize",
    ]
)
_FOCUS_WORD = re.compile(r"[\w./:-]{4,}")
MAX_FOCUS_LINES = 12
FOCUS_LINE_CHARS = 200


# What the digest does with a requested compaction's instructions: it cannot follow them as an
# LLM would, and says so in the event (Summary.instructions_note).
INSTRUCTIONS_NOTE = (
    "the offline digest cannot follow instructions: it wrote its usual sections, and under "
    f"'{FOCUS}' the lines of the range that hold the instructions' words; configure an LLM "
    "(mode prefer_remote or remote_only) to have them followed"
)


def _focus(request: SummaryRequest) -> tuple[str, list[str]]:
    """What a requested compaction's instructions point at: the lines of the range (texts and
    tool-call arguments) that hold one of their words, newest kept when there are many. The
    instructions themselves are user text and are not repeated (the summary is published)."""
    if not request.instructions:
        return "", []
    words = {
        w.strip(".:/-").lower() for w in _FOCUS_WORD.findall(request.instructions)
    } - _FOCUS_STOPWORDS
    words.discard("")
    found: dict[str, str] = {}  # line -> message id
    for m in request.messages if words else []:
        texts = [without_bytes(m.content), *(c.arguments for c in m.tool_calls)]
        for line in (ln for t in texts for ln in t.splitlines()):
            flat = _one_line(line, FOCUS_LINE_CHARS)
            if flat and any(w in flat.lower() for w in words):
                found.setdefault(flat, m.id)
    if not found:
        return "Requested focus: nothing in the summarized messages matches it.", []
    kept = list(found.items())[-MAX_FOCUS_LINES:]
    lines = ["Requested focus: the summarized lines that match it, oldest first."]
    lines.extend(f"- {line}" for line, _ in kept)
    return "\n".join(lines), list(dict.fromkeys(mid for _, mid in kept))


def _attachments(
    messages: list[Message], earlier: dict[str, str], previous: list[str]
) -> tuple[str, list[str]]:
    """Each image and file an earlier summary named, then the range's, by placeholder and
    label (never its bytes)."""
    lines = [line.strip() for line in earlier.get(IMAGES, "").splitlines() if line.strip()]
    sources: list[str] = list(previous) if lines else []
    for m in messages:
        for name, a in zip(placeholders(m.id, m.attachments), m.attachments, strict=True):
            lines.append(f"- {name}: {a.label} (from the {m.role})")
            sources.append(m.id)
    return "\n".join(dict.fromkeys(lines)), sources


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


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str, limit: int = ARGUMENT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


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


# --- fitting the bound ------------------------------------------------------------------------


def _render(header: str, sections: list[_Section]) -> str:
    parts = [header] + [f"## {s.title}\n{s.body}" for s in sections if s.body]
    return "\n\n".join(parts)


def _fit(header: str, sections: list[_Section], request: SummaryRequest) -> tuple[str, int, bool]:
    """Shrink sections until the digest fits the output bound: first each down to its share of
    the bound (the names first), then by value per token; the text, its token count and whether
    anything was cut."""
    fitting = _Fitting(header, sections, request.max_output_tokens, request.model)
    names = [s for s in sections if s.cut == "names"]
    if any(label == _EARLIER_LABEL for s in names for label, _ in s.items):
        # Names passed on from summary to summary would grow with every compaction: when the
        # digest carries some, both names sections keep their share even if all would fit.
        for section in sorted(names, key=lambda s: s.priority):
            fitting.limit_to(section, _share_of(section, sections, fitting))
    for section in sorted(sections, key=_share_order):
        if fitting.fits():
            break
        fitting.shrink(section, _share_of(section, sections, fitting))
    for section in sorted(sections, key=lambda s: s.priority):
        if fitting.fits():
            break
        fitting.shrink(section, 0)
    return fitting.result()


def _share_order(section: _Section) -> tuple[int, int]:
    """Down to their shares: what could not be merged and the action log, then the names (so
    that they give way before any of the story does), then the others by value per token."""
    first = section.title in (EARLIER, ACTIONS)
    names = section.cut == "names"
    return (0 if first else 1 if names else 2, section.priority)


def _share_of(section: _Section, sections: list[_Section], fitting: _Fitting) -> int:
    """The tokens a section keeps before the others give way: its share of the bound; for a
    names section, what :data:`NAMES_SHARE` of it leaves beside the other names section."""
    if section.cut != "names":
        return int(section.share * fitting.limit)
    others = sum(fitting.tokens(s) for s in sections if s.cut == "names" and s is not section)
    return max(int(NAMES_SHARE * fitting.limit) - others, 0)


class _Fitting:
    """The digest's count while sections shrink: each section's own count is kept, and the
    whole's exact count is taken once those say it may fit (only the joins are tokenized)."""

    def __init__(self, header: str, sections: list[_Section], limit: int, model: str | None):
        self.header = header
        self.sections = sections
        self.limit = limit
        self.model = model
        self.total = _rendered_tokens(header, sections, model)
        self.exact = True  # whether ``total`` is the count of the sections as they now are
        self.truncated = False

    def tokens(self, section: _Section) -> int:
        return _tokens(section, self.model)

    def fits(self) -> bool:
        return self.total <= self.limit

    def shrink(self, section: _Section, floor: int) -> None:
        """Cut ``section`` by what the whole is over, down to no less than ``floor`` tokens."""
        own = self.tokens(section)
        if own > floor:
            self._cut(section, own, max(own - (self.total - self.limit) - 8, floor))

    def limit_to(self, section: _Section, most: int) -> None:
        """Cut ``section`` to at most ``most`` tokens, whether or not the whole is over."""
        own = self.tokens(section)
        if own > most:
            self._cut(section, own, most)

    def _cut(self, section: _Section, own: int, keep: int) -> None:
        if section.cut in _TEXT_CUTS:
            cut = _TEXT_CUTS[section.cut]
            section.body = cut(section.body, keep, self.model) if keep >= 24 else ""
            section.tokens = None
        elif section.cut == "names":
            section.items = _best_names(section.items, (section.body, own), keep, self.model)
            section.body, section.tokens = render_names(section.items), None
        else:
            section.body, section.tokens = _best_lines(section.body, own, keep, self.model)
        self.truncated = True
        # The sections' own counts add up to the whole's within a few tokens at the joins.
        self.total += self.tokens(section) - own
        self.exact = self.total <= self.limit
        if self.exact:
            self.total = _rendered_tokens(self.header, self.sections, self.model)

    def result(self) -> tuple[str, int, bool]:
        text = _render(self.header, self.sections)
        if self.exact and self.total <= self.limit:
            return text, self.total, self.truncated  # the count of this very text
        total = count_tokens(text, self.model)
        truncated = self.truncated
        if total > self.limit:
            text, _ = cut_to_tokens(text, self.limit, self.model)
            total = count_tokens(text, self.model)
            truncated = True
        return text, total, truncated


def _tokens(section: _Section, model: str | None) -> int:
    if section.tokens is None:
        section.tokens = count_tokens(section.body, model)
    return section.tokens


def _rendered_tokens(header: str, sections: list[_Section], model: str | None) -> int:
    """``count_tokens(_render(header, sections), model)``, each body tokenized once however often
    the whole is counted: every section starts a line with "## ", where tiktoken always splits,
    so the whole is the sum of its parts (each with the blank line after it), and a part is its
    body's count plus what its heading and that blank line add where they meet it."""
    shown = [s for s in sections if s.body]
    total = count_tokens(f"{header}\n\n" if shown else header, model)
    blank = count_tokens("\n\n", model)
    for k, section in enumerate(shown):
        heading = f"## {section.title}\n"
        tokens = count_tokens(heading, model)
        part = count_joined(heading, tokens, section.body, _tokens(section, model), model)
        if k < len(shown) - 1:
            part = count_joined(heading + section.body, part, "\n\n", blank, model)
        total += part
    return total


def _best_names(
    items: list[tuple[str, str]], counted: tuple[str, int], max_tokens: int, model: str | None
) -> list[tuple[str, str]]:
    """The best ranked names of a names section whose rendering fits ``max_tokens`` (they come
    in rank order, so the ones dropped are the least likely to be needed). ``counted``: the
    rendering of all of them and its count."""
    return items[: _fitting_prefix_size(items, counted, max_tokens, model)]


def _best_lines(body: str, body_tokens: int, max_tokens: int, model: str | None) -> tuple[str, int]:
    """The first lines of a ranked list that fit ``max_tokens``, with their count; a line that
    ends with ``:`` (a group's label) goes with the line after it, never alone at the end."""
    items: list[str] = []
    pending = ""
    for line in body.splitlines():
        if line.endswith(":"):
            pending += line + "\n"
        else:
            items.append(pending + line)
            pending = ""
    if pending:
        items.append(pending.rstrip("\n"))
    lengths = [0]
    for item in items:
        lengths.append(lengths[-1] + (1 if len(lengths) > 1 else 0) + len(item))
    full = "\n".join(items)
    tokens = body_tokens if full == body else count_tokens(full, model)
    if tokens <= max_tokens:
        return full, tokens

    def render(size: int) -> str:
        return full[: lengths[size]]

    found = _longest_prefix(_Prefix(len(items), full, tokens), lengths, render, max_tokens, model)
    return found.text, found.tokens


class _Prefix(NamedTuple):
    """The rendering of the first ``size`` items and its count."""

    size: int
    text: str
    tokens: int


def _fitting_prefix(
    items: list[tuple[str, str]], counted: tuple[str, int], max_tokens: int, model: str | None
) -> tuple[str, int]:
    """``render_names(items[:m])`` for the largest ``m`` whose count is within ``max_tokens``
    (``m`` = 0 when none is), with that count; ``counted``: a text and its count, used when it
    is the rendering of all the items."""
    found = _longest_names_prefix(items, counted, max_tokens, model)
    return found.text, found.tokens


def _fitting_prefix_size(
    items: list[tuple[str, str]], counted: tuple[str, int], max_tokens: int, model: str | None
) -> int:
    """The ``m`` of :func:`_fitting_prefix`."""
    return _longest_names_prefix(items, counted, max_tokens, model).size


def _longest_names_prefix(
    items: list[tuple[str, str]], counted: tuple[str, int], max_tokens: int, model: str | None
) -> _Prefix:
    full = render_names(items)
    tokens = counted[1] if full == counted[0] else count_tokens(full, model)
    if tokens <= max_tokens:
        return _Prefix(len(items), full, tokens)
    lengths = _rendered_lengths(items)
    labels = [label for label, _ in items]
    # When each label's names come together (as parsed from a section, a line each), a prefix of
    # the items renders as a prefix of the whole: cut, not rendered again.
    together = len({*labels}) == 1 + sum(a != b for a, b in pairwise(labels))

    def render(size: int) -> str:
        return full[: lengths[size]] if together else render_names(items[:size])

    return _longest_prefix(_Prefix(len(items), full, tokens), lengths, render, max_tokens, model)


def _longest_prefix(
    whole: _Prefix,
    lengths: list[int],
    render: Callable[[int], str],
    max_tokens: int,
    model: str | None,
) -> _Prefix:
    """The rendering of the most items whose count is within ``max_tokens`` (none: ""), with
    that count; ``whole``: all of them, counted and over; ``lengths[m]``: the characters of the
    first ``m`` rendered; ``render(m)``: their rendering.

    Counts grow with ``m``, so the largest fitting ``m`` lies between a prefix known to fit and
    one known not to; each probe is where the count reaches the bound by linear interpolation in
    characters between the two, and is counted from the nearer of them (only the items between
    are tokenized), so a search takes about one count of the text kept instead of one per
    halving."""
    low, high = _Prefix(0, "", 0), whole
    while high.size - low.size > 1:
        middle = _interpolated(low, high, lengths, max_tokens)
        probe = _counted_prefix(render(middle), middle, low, high, model)
        if probe.tokens <= max_tokens:
            low = probe
        else:
            high = probe
    return low


def _rendered_lengths(items: list[tuple[str, str]]) -> list[int]:
    """``len(render_names(items[:m]))`` for every ``m``: a name adds itself and a space, or, the
    first of its label, a line of its own."""
    lengths, labels = [0], set[str]()
    for label, name in items:
        if label in labels:
            lengths.append(lengths[-1] + 1 + len(name))
        else:
            line_break = 1 if labels else 0
            lengths.append(lengths[-1] + line_break + len(label) + 2 + len(name))
            labels.add(label)
    return lengths


def _interpolated(low: _Prefix, high: _Prefix, lengths: list[int], max_tokens: int) -> int:
    """The number of items at which the count reaches ``max_tokens``, estimated linearly in
    characters between two counted prefixes; strictly between them."""
    share = (max_tokens - low.tokens) / (high.tokens - low.tokens)
    chars = lengths[low.size] + share * (lengths[high.size] - lengths[low.size])
    return min(max(bisect_right(lengths, chars) - 1, low.size + 1), high.size - 1)


def _counted_prefix(
    text: str, size: int, low: _Prefix, high: _Prefix, model: str | None
) -> _Prefix:
    """``text``, the rendering of ``size`` items, with its count: from the nearer of the counted
    renderings that it extends or starts (one does when the items render as prefixes), else
    counted whole."""
    if len(text) - len(low.text) <= len(high.text) - len(text) and text.startswith(low.text):
        added = text[len(low.text) :]
        tokens = count_joined(low.text, low.tokens, added, count_tokens(added, model), model)
    elif high.text.startswith(text):
        tokens = count_prefix(high.text, high.tokens, len(text), model)
    else:
        tokens = count_tokens(text, model)
    return _Prefix(size, text, tokens)


def _steps_cut(body: str, max_tokens: int, model: str | None) -> str:
    """A task state within about ``max_tokens``, whole lines: what is still open first, then
    the newest step done, the first one (how it started) and the newer ones before the older,
    in their order, a ``- …`` line where steps were left out."""
    lines = body.splitlines()
    split = lines.index(_OPEN) if _OPEN in lines else len(lines)
    steps = lines[1:split] if lines[:1] == [_DONE] else []
    budget = max_tokens - _line_tokens(_DONE, model) - _line_tokens("- …", model)
    still: list[str] = []
    for line in lines[split:]:
        if _line_tokens(line, model) > budget:
            break
        still.append(line)
        budget -= _line_tokens(line, model)
    kept: set[int] = set()
    for k in dict.fromkeys([len(steps) - 1, 0, *range(len(steps) - 2, 0, -1)][: len(steps)]):
        if _line_tokens(steps[k], model) > budget:
            break
        kept.add(k)
        budget -= _line_tokens(steps[k], model)
    shown = [steps[0]] if 0 in kept else []
    if len(kept) < len(steps):
        shown.append("- …")
    shown += [steps[k] for k in sorted(kept) if k]
    done = [_DONE, *shown] if kept else []
    return "\n".join([*done, *(still if len(still) > 1 else [])])


def _errors_cut(body: str, max_tokens: int, model: str | None) -> str:
    """Errors seen within about ``max_tokens``, whole lines: the error names (the oldest left
    out first when even they do not fit), then the newest failed calls, in their order, a
    ``- …`` line where older ones were left out."""
    lines = body.splitlines()
    named = [line for line in lines if line.startswith(ERROR_NAMES)]
    calls = [line for line in lines if not line.startswith(ERROR_NAMES)]
    budget = max_tokens - _line_tokens("- …", model)
    names = named[0][len(ERROR_NAMES) :].split() if named else []
    while names and _line_tokens(ERROR_NAMES + " ".join(names), model) > budget:
        names = names[1:]
    shown = [ERROR_NAMES + " ".join(names)] if names else []
    budget -= _line_tokens(shown[0], model) if shown else 0
    kept: list[str] = []
    for line in reversed(calls):
        if _line_tokens(line, model) > budget:
            break
        kept.insert(0, line)
        budget -= _line_tokens(line, model)
    left_out = ["- …"] if len(kept) < len(calls) else []
    return "\n".join([*shown, *left_out, *kept])


def _state_cut(body: str, max_tokens: int, model: str | None) -> str:
    """A latest state within about ``max_tokens``: the opening of its conclusion and the next
    step (the two a fidelity check looks for), the last call while there is room."""
    lines = body.splitlines()
    last = [line for line in lines if line.startswith(_LAST_CALL)]
    following = [line for line in lines if line.startswith(_NEXT_STEP)]
    said = "\n".join(line for line in lines if not line.startswith((_LAST_CALL, _NEXT_STEP)))
    for tail in ([*last, *following], following, []):
        room = max_tokens - sum(_line_tokens(line, model) for line in tail)
        if room >= 24 or not said:
            break
    head, cut = cut_to_tokens(said, max(room - 2, 0), model)
    opening = _quoted(head + "…" if cut else head)
    return "\n".join(part for part in [opening, *tail] if part)


def _line_tokens(line: str, model: str | None) -> int:
    return count_tokens(line, model) + 1  # and its line break


def _text_cut(text: str, max_tokens: int, model: str | None) -> str:
    """:func:`_head_tail`, quoted again: a line the cut started in the middle of may now look
    like a heading, and a code fence may be left open."""
    return _quoted(_head_tail(text, max_tokens, model))


# How each section that is not a ranked list is cut (``_Section.cut``).
_TEXT_CUTS: dict[str, Callable[[str, int, str | None], str]] = {
    "text": _text_cut,
    "steps": _steps_cut,
    "state": _state_cut,
    "errors": _errors_cut,
}


def _head_tail(text: str, max_tokens: int, model: str | None) -> str:
    """Keep the start and the end: the newest part of a section matters as much as the first."""
    head, _ = cut_to_tokens(text, max_tokens // 2, model)
    rest = text[len(head) :]
    tail_budget = max_tokens - max_tokens // 2 - 4
    tail = rest[-(tail_budget * 3) :] if tail_budget > 0 else ""
    while tail and count_tokens(tail, model) > tail_budget:
        tail = tail[len(tail) // 10 + 1 :]
    return f"{head}\n…\n{tail}" if tail else head
