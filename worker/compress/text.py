"""Choosing the cheapest faithful plain-text form for a text, and expanding any form back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from worker.compress import (
    grep_text,
    long_text,
    ls_text,
    numbered_text,
    paths_text,
    rle_text,
    tree_text,
)
from worker.compress.limits import ExpansionBudget
from worker.compress.tally import Delta, TokenTally
from worker.compress.textform import VERBATIM_HEADER, TextForm

# Every plain-text form, in the order candidates are tried (ties go to the earlier one).
TEXT_FORMS: tuple[TextForm, ...] = (
    grep_text.FORM,
    paths_text.FORM,
    ls_text.FORM,
    ls_text.FORM_WITH_VERBATIM,
    tree_text.FORM,
    long_text.FORM,
    numbered_text.FORM,
    rle_text.FORM,
)
VERBATIM = "verbatim"
# Every header a raw text must not start with, for one C call (str.startswith takes a tuple).
_HEADERS = (VERBATIM_HEADER, *(form.header for form in TEXT_FORMS))
_LARGE_TEXT_CHARS = 256 * 1024
_SAMPLE_CHARS = 16 * 1024


@dataclass(frozen=True, slots=True)
class TextChoice:
    """The best form found for a text: what to emit, both sides as pieces, and the token delta."""

    form: str
    text: str
    original_pieces: Sequence[str]
    pieces: Sequence[str]
    delta: Delta


def is_framed(text: str) -> bool:
    """Whether ``text`` starts with a form's header (raw text like that must be escaped)."""
    return text.startswith(_HEADERS)


def expand(text: str, budget: ExpansionBudget | None = None) -> str | None:
    """The original of a framed text, or None when ``text`` carries no header."""
    if text.startswith(VERBATIM_HEADER):
        return text[len(VERBATIM_HEADER) :]
    for form in TEXT_FORMS:
        if text.startswith(form.header):
            return form.decode(text[len(form.header) :], budget)
    return None


def escape(text: str) -> str:
    """``text`` itself, or with the verbatim header when it would read as a compressed form."""
    return VERBATIM_HEADER + text if is_framed(text) else text


def best_form(text: str, tally: TokenTally, *, min_saving: float = 0.0) -> TextChoice | None:
    """The form that saves the most tokens on ``text``, if one saves any; judged exactly.

    Detection is cheap and usually leaves a single candidate. Only the pieces a candidate does not
    share with the text are tokenized (see :mod:`worker.compress.tally`). On a large text a form
    is first tried on its head and tail, and not at all unless it saves more than ``min_saving``
    on both: that keeps a megabyte that will not compress from costing a full encode and count.
    """
    best: TextChoice | None = None
    for form in TEXT_FORMS:
        if not form.applies(text) or not _promising(form, text, tally, min_saving):
            continue
        choice = _try(form, text, tally)
        # Comparing two candidates counts both exactly; a single one is judged by the gate alone.
        if choice is not None and (best is None or _saved(choice) > _saved(best)):
            best = choice
    return best


def _try(form: TextForm, text: str, tally: TokenTally) -> TextChoice | None:
    encoded = form.encode(text)
    if encoded is None:
        return None
    pieces = [form.header, *encoded.payload_pieces]
    delta = tally.delta(encoded.original_pieces, pieces)
    choice = TextChoice(
        form.name, form.header + encoded.payload, encoded.original_pieces, pieces, delta
    )
    return choice if tally.saves(delta) else None


def _saved(choice: TextChoice) -> int:
    return choice.delta.removed.exact() - choice.delta.added


def _promising(form: TextForm, text: str, tally: TokenTally, min_saving: float) -> bool:
    """On a large text, whether ``form`` saves more than ``min_saving`` on both its head and its
    tail: a cheap way to skip, never to accept, a form (the whole is then judged exactly)."""
    if len(text) <= _LARGE_TEXT_CHARS or min_saving <= 0:
        return True
    head = text[: text.rfind("\n", 0, _SAMPLE_CHARS) + 1]
    tail = text[text.find("\n", len(text) - _SAMPLE_CHARS) + 1 :]
    for sample in (head, tail):
        choice = _try(form, sample, tally) if sample else None
        if choice is None or not tally.passes(choice.delta, min_tokens=-1, min_saving=min_saving):
            return False
    return True
