"""The digest's section titles, bounds and shared pieces: a section, quoting text into one."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from worker.core.fidelity import KEPT_FACTS_TITLE

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
NAMES_SHARE = 0.35

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


_HEADER_LINE = re.compile(r"Offline digest of \d+ earlier messages")
_FENCE_LINE = re.compile(r"^[ \t]*(?:```|~~~)", re.MULTILINE)


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


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str, limit: int = ARGUMENT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
