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

No section publishes a token that looks random (:func:`worker.core.redaction.looks_random`): a
key of no known kind, a password, a token's body look so, and a name list or a quoted output
would publish it whole. Each is replaced by a placeholder (a name list drops it), the words
around it kept.

The digest's jobs, a module each: :mod:`.base` (titles, bounds, a section, quoting),
:mod:`.earlier` (an earlier summary read back; the files), :mod:`.errors`, :mod:`.story` (code
names; the user's requests), :mod:`.state` (the task state, the latest state, the actions),
:mod:`.focus` (a requested focus; images and files) and :mod:`.fitting` (the bound).
"""

from __future__ import annotations

from dataclasses import replace

from worker.core.facts import extract_facts
from worker.core.redaction import without_random_tokens
from worker.summarize import SUMMARY_MARKER, SummaryRequest
from worker.summarize.digest.base import (
    ACTIONS,
    ARGUMENT_CHARS,
    CODE_NAMES,
    EARLIER,
    ERROR_DETAIL_LINES,
    ERROR_LINE_CHARS,
    ERRORS,
    FILES,
    FOCUS,
    IMAGES,
    KNOWN_TITLES,
    LATEST,
    LLM_CARRIED,
    LLM_ERRORS,
    LLM_FILES,
    LLM_NEXT,
    LLM_PROGRESS,
    MAX_ACTION_LINES,
    MAX_EARLIER_REQUESTS,
    MAX_ERRORS,
    MAX_OPEN,
    MAX_STEPS,
    NAMES_SHARE,
    OUTPUT_NAMES,
    REQUEST_CHARS,
    REQUESTS,
    STEP_CHARS,
    TASK_STATE,
    _Section,
)
from worker.summarize.digest.earlier import (
    _accumulated_files,
    _carried_llm_sections,
    _file_sources,
    _unmerged,
    earlier_sections,
    parse_files,
    render_files,
)
from worker.summarize.digest.errors import (
    ERROR_NAMES,
    MAX_ERROR_NAMES,
    RESOLVED,
    TRACEBACK,
    UNRESOLVED,
    _errors,
)
from worker.summarize.digest.fitting import _fit

# Reached by the names tests (tests/unit/test_identifiers.py) as digest._fitting_prefix.
from worker.summarize.digest.fitting import _fitting_prefix as _fitting_prefix
from worker.summarize.digest.focus import (
    FOCUS_LINE_CHARS,
    INSTRUCTIONS_NOTE,
    MAX_FOCUS_LINES,
    _attachments,
    _focus,
)
from worker.summarize.digest.state import (
    CHANGE_WORDS,
    CHANGES_SAID,
    MAX_STATE_CHARS,
    _actions,
    _latest_state,
    _task_state,
)
from worker.summarize.digest.story import _names, _names_section, _task, render_names
from worker.wire.events import Summary, SummarySection

__all__ = [
    "ACTIONS",
    "ARGUMENT_CHARS",
    "CHANGES_SAID",
    "CHANGE_WORDS",
    "CODE_NAMES",
    "EARLIER",
    "ERRORS",
    "ERROR_DETAIL_LINES",
    "ERROR_LINE_CHARS",
    "ERROR_NAMES",
    "FILES",
    "FOCUS",
    "FOCUS_LINE_CHARS",
    "IMAGES",
    "INSTRUCTIONS_NOTE",
    "KNOWN_TITLES",
    "LATEST",
    "LLM_CARRIED",
    "LLM_ERRORS",
    "LLM_FILES",
    "LLM_NEXT",
    "LLM_PROGRESS",
    "MAX_ACTION_LINES",
    "MAX_EARLIER_REQUESTS",
    "MAX_ERRORS",
    "MAX_ERROR_NAMES",
    "MAX_FOCUS_LINES",
    "MAX_OPEN",
    "MAX_STATE_CHARS",
    "MAX_STEPS",
    "NAMES_SHARE",
    "OUTPUT_NAMES",
    "REQUESTS",
    "REQUEST_CHARS",
    "RESOLVED",
    "STEP_CHARS",
    "TASK_STATE",
    "TRACEBACK",
    "UNRESOLVED",
    "DigestSummarizer",
    "earlier_sections",
    "parse_files",
    "render_files",
    "render_names",
]


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
        present = [s for s in map(_published, sections) if s.body]
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


def _published(section: _Section) -> _Section:
    """``section`` with no token that looks random: a names section without such names, any
    other with each replaced by a placeholder (the words around it kept)."""
    if section.items:
        items = [(label, n) for label, n in section.items if without_random_tokens(n) == n]
        if len(items) < len(section.items):
            section = replace(section, body=render_names(items), items=items, tokens=None)
        return section
    body = without_random_tokens(section.body)
    return section if body == section.body else replace(section, body=body, tokens=None)
