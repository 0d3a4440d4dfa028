"""The code names the agent used or learned, and the user's requests."""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

from worker.core.facts import Facts, argument_strings
from worker.core.files import only_lists
from worker.core.identifiers import CALLS, TEXT, USER, code_names, is_path, names_in, shown_by
from worker.summarize import SummaryRequest
from worker.summarize.digest.base import (
    CODE_NAMES,
    MAX_EARLIER_REQUESTS,
    OUTPUT_NAMES,
    REQUEST_CHARS,
    REQUESTS,
    _one_line,
    _quoted,
    _Section,
)
from worker.summarize.digest.earlier import _bullets, _kept_facts
from worker.summarize.prompt import without_bytes
from worker.wire.models import Message

# --- names ------------------------------------------------------------------------------------

_TIER_LABELS = {
    CALLS: "In the agent's commands and edits",
    TEXT: "In its notes",
}
_USER_LABEL = "In user messages"
_EARLIER_LABEL = "From earlier summaries"
_PRINTED_LABEL = "Seen in outputs"
_LISTED_LABEL = "In directory listings"
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
    those only a tool printed (more of them, and each less likely needed; this range's before
    the earlier summary's): the order of how often the agent names them again later
    (BENCHMARKS.md, "Replayed sessions"). Their sources
    are the messages of the roles they are drawn from, and the earlier summary."""
    shown = {path for path, _ in files} | {n for path, _ in files for n in shown_by(path)}
    shown |= request.shown_beside  # the messages kept verbatim show these already
    coded, was_printed, was_listed = _earlier_names(earlier)
    before = [n for n in coded if n not in shown]
    before_printed = [n for n in was_printed if n not in shown]
    listed = set(before)
    used: list[tuple[str, str]] = []
    users: list[tuple[str, str]] = []
    printed: list[tuple[str, str]] = []
    listings = _listing_results(request.messages)
    for name in code_names([m for m in request.messages if m.id not in listings]):
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
    # Only printed before, they stay among the printed, after this range's own: an earlier
    # range's output is the least likely to be named again (BENCHMARKS.md, "Replayed sessions").
    passed = [n for n in before_printed if n not in shown]
    shown.update(passed)
    # Only a directory listing printed them: names of files, which the agent names again
    # least of all (and lists again when it needs them); this range's first, those beside
    # what the range works on before the others.
    new_files = [n for m in request.messages if m.id in listings for n in names_in(m.content)]
    listed_here = [n for n in dict.fromkeys(new_files) if n not in shown and n not in listed]
    if listed_here:
        listed_here = _related_first(listed_here, _range_words(request.messages, files))
    shown.update(listed_here)
    passed_files = [n for n in was_listed if n not in shown]
    said = (
        [m.id for m in request.messages if m.role in ("assistant", "user")] if used or users else []
    )
    if carried:
        said.extend(request.previous_summary_ids)
    outputs = [m.id for m in request.messages if m.role == "tool"] if printed or listed_here else []
    if passed or passed_files:
        outputs.extend(request.previous_summary_ids)
    printed += [(_PRINTED_LABEL, n) for n in passed]
    printed += [(_LISTED_LABEL, n) for n in [*listed_here, *passed_files]]
    listed_names, printed = _longest_first([*used, *carried, *users], printed)
    return _Names(listed_names, said), _Names(printed, outputs)


# A word of a name or a text, as a listing entry and the range are compared (lower-cased).
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]{2,}")
# A word more than this share of a listing's entries hold relates nothing (``tests``, ``py``).
_COMMON_WORD_SHARE = 0.05
_MIN_COMMON_WORD = 3  # entries a word may be in and still relate (small listings)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def _range_words(messages: list[Message], files: list[tuple[str, list[str]]]) -> set[str]:
    """The words of what the range is about: the files it touched, the agent's text and
    calls, the user's messages (not the tools' outputs, which the listings are among)."""
    words = {w for path, _ in files for w in _words(path)}
    for m in messages:
        if m.role in ("assistant", "user"):
            words |= _words(m.content)
            for call in m.tool_calls:
                words.update(w for s in argument_strings(call.arguments) for w in _words(s))
    return words


def _related_first(entries: list[str], context: set[str]) -> list[str]:
    """A directory listing's entries, those that share more words with the range first
    (``test_sampled.py`` when the agent read ``sampled.py``; ``tests/utils_tests`` when it
    talked of utils), else in the listing's order: of the hundreds of names an ``ls -R``
    prints, those the agent goes on to open are mostly beside what it works on. A word most
    entries hold relates nothing."""
    entry_words = [_words(e) for e in entries]
    held = Counter(w for words in entry_words for w in words)
    most = max(_MIN_COMMON_WORD, int(len(entries) * _COMMON_WORD_SHARE))
    related = {w for w, n in held.items() if n <= most} & context
    shared = {e: len(words & related) for e, words in zip(entries, entry_words, strict=True)}
    return sorted(entries, key=lambda e: -shared[e])


def _listing_results(messages: list[Message]) -> set[str]:
    """The ids of the results of the calls that only list directories."""
    calls = {
        call.id
        for m in messages
        if m.role == "assistant"
        for call in m.tool_calls
        if only_lists(call.name, call.arguments)
    }
    if not calls:
        return set()
    return {m.id for m in messages if m.role == "tool" and m.tool_call_id in calls}


def _longest_first(
    listed: list[tuple[str, str]], printed: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Both lists with a name that a later, longer dotted name shows whole (``b.C`` in
    ``a.b.C``) replaced by that longer name where the shorter ranked, and the longer not listed
    again: one entry instead of two, at the better rank of the two. Paths are left as they
    are (``setup`` is no part of ``setup.cfg``)."""
    entries: list[tuple[str, str, int]] = []  # (label, name, which list)
    entry_of: dict[str, int] = {}  # each name an entry lists
    shown: set[str] = set()  # and every name those show
    for which, items in enumerate((listed, printed)):
        for label, name in items:
            if name in entry_of or name in shown:
                continue
            parts = shown_by(name) if "." in name and not is_path(name) else set()
            entry = min((entry_of[n] for n in parts if n in entry_of), default=None)
            if entry is None:
                entry = len(entries)
                entries.append((label, name, which))
            else:
                entries[entry] = (entries[entry][0], name, entries[entry][2])
            entry_of[name] = entry
            shown.update(parts)
    return (
        [(label, name) for label, name, which in entries if which == 0],
        [(label, name) for label, name, which in entries if which == 1],
    )


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


def _earlier_names(earlier: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """The names an earlier summary listed, in their order: under its code names (with the
    identifiers its repair kept), those only under the names tools printed, and of those the
    ones only a directory listing printed."""
    coded = [*_listed_names(earlier, CODE_NAMES)]
    coded.extend(n.strip("`") for n in _kept_facts(earlier, "id "))
    coded = list(dict.fromkeys(coded))
    known = set(coded)
    printed = _listed_names(earlier, OUTPUT_NAMES, but=_LISTED_LABEL)
    printed = [n for n in dict.fromkeys(printed) if n not in known]
    known.update(printed)
    listings = _listed_names(earlier, OUTPUT_NAMES, only=_LISTED_LABEL)
    return coded, printed, [n for n in dict.fromkeys(listings) if n not in known]


def _listed_names(
    earlier: dict[str, str], title: str, *, only: str | None = None, but: str | None = None
) -> list[str]:
    """The names of a names section's lines (those of the ``only`` label, or all ``but``)."""
    names: list[str] = []
    for line in earlier.get(title, "").splitlines():
        match = _NAMES_LINE.match(line.strip())
        if match and match.group(1) != but and only in (None, match.group(1)):
            names.extend(n for n in match.group(2).split() if n != "…")
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
