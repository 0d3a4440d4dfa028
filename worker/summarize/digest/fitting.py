"""Fitting the digest to its bound: each section gives way to its share, by value per token."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from itertools import pairwise
from typing import NamedTuple

from worker.summarize import SummaryRequest
from worker.summarize.digest.base import ACTIONS, EARLIER, NAMES_SHARE, _quoted, _Section
from worker.summarize.digest.errors import ERROR_NAMES
from worker.summarize.digest.state import _DONE, _LAST_CALL, _NEXT_STEP, _OPEN
from worker.summarize.digest.story import _EARLIER_LABEL, render_names
from worker.tokens import count_joined, count_prefix, count_tokens, cut_to_tokens

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
