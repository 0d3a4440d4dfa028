"""The offline digest (``mode = local_only``): deterministic, bounded, no network.

It states the task as the user gave it, what was done (tool calls by name with their key
arguments), every file touched (verbatim paths), the code names the agent used or learned
(:mod:`worker.core.identifiers`), the errors seen and how they ended, and the latest state
(its conclusion or hypothesis, the last call and the open next step). When the text is over
``max_output_tokens``, sections give way by value per token: the earlier summary's prose (its
files and names are carried into the new sections), then the action log, then names only a
tool printed, each ranked list losing its least valuable items first; paths, errors and the
names the agent used are the last to be cut.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

from worker.core.facts import (
    Facts,
    ToolAction,
    extract_facts,
    extract_paths,
    fix_of,
    sources_by_path,
)
from worker.core.fidelity import is_conclusion, strip_thought
from worker.core.files import CHANGE_KINDS
from worker.core.identifiers import CALLS, OUTPUT, TEXT, USER, code_names, shown_by
from worker.summarize import SUMMARY_MARKER, SummaryRequest
from worker.summarize.prompt import without_bytes
from worker.tokens import count_joined, count_prefix, count_tokens, cut_to_tokens
from worker.wire.events import Summary, SummarySection
from worker.wire.media import placeholders
from worker.wire.models import Message

MAX_ACTION_LINES = 40
MAX_ERRORS = 12
ARGUMENT_CHARS = 160


@dataclass
class _Section:
    title: str
    body: str
    sources: list[str]  # ids of the messages it was drawn from (a cut keeps them all)
    priority: int  # lower is cut first
    ranked: bool = False  # lines of items, best first: a cut drops the last items
    tokens: int | None = None  # the count of ``body`` once counted (reset with a new body)


class DigestSummarizer:
    """Deterministic summaries from the messages alone."""

    def summarize(self, request: SummaryRequest) -> Summary:
        facts = extract_facts(request.messages)
        files = _accumulated_files(facts, request.previous_summary)
        header = (
            f"{SUMMARY_MARKER}\nOffline digest of {len(request.messages)} earlier messages "
            f"({len(facts.actions)} tool calls), revision {request.revision}."
        )
        previous = request.previous_summary_ids
        calls = [i for a in facts.actions for i in a.message_ids]
        used = _file_sources(facts, files, previous)
        earlier = _strip_marker(request.previous_summary or "")
        used_names, printed_names = _names(request, files)
        sections = [
            _Section("Requested focus", *_focus(request), priority=9),
            _Section("Files touched", render_files(files), used, priority=8),
            _Section("Errors seen", *_errors(facts), priority=7),
            _Section("Images and files", *_attachments(request.messages), priority=7),
            _Section(CODE_NAMES, *used_names, priority=6, ranked=True),
            _Section("Earlier user requests", *_task(request.messages), priority=5),
            _Section("Latest state", *_latest_state(request.messages, facts), priority=4),
            _Section(OUTPUT_NAMES, *printed_names, priority=3, ranked=True),
            _Section("Actions", _actions(facts), calls, priority=2),
            _Section("Earlier summary", earlier, previous, priority=1),
        ]
        present = [s for s in sections if s.body]
        text, tokens, truncated = _fit(header, present, request)
        return Summary(
            text=text,
            tokens=tokens,
            source="digest",
            truncated=truncated,
            # In the request's ids; the sections a cut removed are left out when published.
            sections=[
                SummarySection(title=s.title, source_ids=s.sources) for s in present if s.body
            ],
        )


CODE_NAMES = "Code names"
OUTPUT_NAMES = "Names printed by tools"
_TIER_LABELS = {
    CALLS: "In the agent's commands and edits",
    TEXT: "In its notes",
    USER: "In user messages",
}
_EARLIER_LABEL = "From earlier summaries"
_PRINTED_LABEL = "Seen in outputs"
_NAMES_LINE = re.compile(r"^([A-Z][^:]*): (.+)$")


def _names(
    request: SummaryRequest, files: list[tuple[str, list[str]]]
) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
    """The code names the range held, best ranked first, less what the files list shows: the
    ones the agent used (its calls, its text, a user's message, then those an earlier summary
    listed), and apart, those only a tool printed (more of them, and each less likely needed).
    Their sources are the messages of the roles they are drawn from."""
    shown = {path for path, _ in files} | {n for path, _ in files for n in shown_by(path)}
    used: list[tuple[str, str]] = []
    printed: list[tuple[str, str]] = []
    for name in code_names(request.messages):
        if name.text in shown:
            continue
        shown.add(name.text)
        if "." in name.text or "/" in name.text:  # a plain identifier shows nothing shorter
            shown.update(shown_by(name.text))
        if name.tier == OUTPUT:
            printed.append((_PRINTED_LABEL, name.text))
        else:
            used.append((_TIER_LABELS[name.tier], name.text))
    for earlier in _earlier_names(request.previous_summary or ""):
        if earlier not in shown:
            shown.add(earlier)
            used.append((_EARLIER_LABEL, earlier))
    said = [m.id for m in request.messages if m.role in ("assistant", "user")] if used else []
    if any(label == _EARLIER_LABEL for label, _ in used):
        said.extend(request.previous_summary_ids)
    outputs = [m.id for m in request.messages if m.role == "tool"] if printed else []
    return (render_names(used), said), (render_names(printed), outputs)


def render_names(items: list[tuple[str, str]]) -> str:
    """One line per label, its names in rank order, separated by spaces (each name is whole)."""
    lines: dict[str, list[str]] = {}
    for label, name in items:
        lines.setdefault(label, []).append(name)
    return "\n".join(f"{label}: {' '.join(names)}" for label, names in lines.items())


def _earlier_names(previous: str) -> list[str]:
    """The names an earlier digest listed (both of its name sections)."""
    names: list[str] = []
    for title in (CODE_NAMES, OUTPUT_NAMES):
        for line in _section_of(previous, title).splitlines():
            match = _NAMES_LINE.match(line.strip())
            if match:
                names.extend(n for n in match.group(2).split() if n != "…")
    return names


def _accumulated_files(facts: Facts, previous: str | None) -> list[tuple[str, list[str]]]:
    """(path, kinds): files from earlier summaries stay listed, facts accumulate across
    compactions; a path used again adds its new kinds."""
    files: dict[str, list[str]] = {}
    for path, kinds in parse_files(_section_of(previous or "", "Files touched")):
        files.setdefault(path, []).extend(k for k in kinds if k not in files.get(path, []))
    for record in facts.files:
        known = files.setdefault(record.path, [])
        known.extend(k for k in record.kinds if k not in known)
    return list(files.items())


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


def _section_of(text: str, title: str) -> str:
    marker = f"## {title}\n"
    if marker not in text:
        return ""
    return text.split(marker, 1)[1].split("\n## ", 1)[0]


def _strip_marker(text: str) -> str:
    return text.removeprefix(SUMMARY_MARKER).strip()


def _task(messages: list[Message]) -> tuple[str, list[str]]:
    """The task as the user first stated it, every later instruction or correction (each once,
    shortened), and the latest user message whole; drawn from every user message with text."""
    said = [(without_bytes(m.content).strip(), m.id) for m in messages if m.role == "user"]
    said = [(text, mid) for text, mid in said if text]
    users = list(dict.fromkeys(text for text, _ in said))
    sources = [mid for _, mid in said]
    if not users:
        return "", []
    first, later = users[0], users[1:]
    if not later:
        return first, sources
    lines = [first]
    if len(later) > 1:
        lines.append("\nLater user messages:")
        lines.extend(f"- {_cut(_one_line(u, 10**6), 300)}" for u in later[:-1])
    lines.append(f"\nLatest user message:\n{later[-1]}")
    return "\n".join(lines), sources


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


def _attachments(messages: list[Message]) -> tuple[str, list[str]]:
    """Each image and file of the range, by placeholder and label (never its bytes)."""
    lines = []
    sources: list[str] = []
    for m in messages:
        for name, a in zip(placeholders(m.id, m.attachments), m.attachments, strict=True):
            lines.append(f"- {name}: {a.label} (from the {m.role})")
            sources.append(m.id)
    return "\n".join(lines), sources


MAX_STATE_CHARS = 1200


def _latest_state(messages: list[Message], facts: Facts) -> tuple[str, list[str]]:
    """The agent's last substantive conclusion (not a mere "let me look at X"), the result of
    the last call, and the open next step when the agent said one after its conclusion; drawn
    from those messages."""
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
        lines.append(_cut(conclusion[1], MAX_STATE_CHARS))
        sources.append(messages[conclusion[0]].id)
    if facts.actions:
        last = facts.actions[-1]
        outcome = "failed" if last.failed else "ok"
        detail = f": {last.error_lines[0]}" if last.failed and last.error_lines else ""
        lines.append(
            f"Last call: {last.tool} `{_one_line(last.key_argument, 120)}` -> {outcome}{detail}"
        )
        sources.extend(last.message_ids)
    if newest is not None and conclusion is not None and newest[0] > conclusion[0]:
        lines.append(f"Next step: {_one_line(newest[1], 300)}")
        sources.append(messages[newest[0]].id)
    return "\n".join(lines), sources


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


def _errors(facts: Facts) -> tuple[str, list[str]]:
    """Each failed call and how it ended; drawn from the failed calls, their results and the
    calls that resolved them."""
    lines = []
    sources: list[str] = []
    for a in facts.failing[-MAX_ERRORS:]:
        fix = fix_of(a, facts.actions)
        outcome = "resolved later" if fix is not None else "not resolved in range"
        detail = "; ".join(a.error_lines) or "non-zero exit"
        lines.append(f"- `{_one_line(a.key_argument, 100)}`: {detail} -> {outcome}")
        sources.extend(a.message_ids)
        if fix is not None:
            sources.extend(fix.message_ids)
    return "\n".join(lines), sources


def _render(header: str, sections: list[_Section]) -> str:
    parts = [header] + [f"## {s.title}\n{s.body}" for s in sections if s.body]
    return "\n\n".join(parts)


def _fit(header: str, sections: list[_Section], request: SummaryRequest) -> tuple[str, int, bool]:
    """Shrink the least important sections until the digest fits the output bound: the text,
    its token count and whether anything was cut."""
    limit, model = request.max_output_tokens, request.model
    total = _rendered_tokens(header, sections, model)
    exact = True  # whether ``total`` is the count of the sections as they now are
    truncated = False
    for section in sorted(sections, key=lambda s: s.priority):
        if total <= limit:
            break
        own = _tokens(section, model)
        keep = max(own - (total - limit) - 8, 0)
        if section.ranked:
            section.body, section.tokens = _best_names(section.body, own, keep, model)
        else:
            section.body = _head_tail(section.body, keep, model) if keep >= 24 else ""
            section.tokens = None
        truncated = True
        # The sections' own counts add up to the whole's within a few tokens at the joins; the
        # whole's exact count is taken once they say it may fit (only the joins are tokenized).
        total += _tokens(section, model) - own
        exact = total <= limit
        if exact:
            total = _rendered_tokens(header, sections, model)
    text = _render(header, sections)
    if exact and total <= limit:
        return text, total, truncated  # ``total`` is this text's count: no need to count it again
    total = count_tokens(text, model)
    if total > limit:
        text, _ = cut_to_tokens(text, limit, model)
        total = count_tokens(text, model)
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


def _best_names(body: str, body_tokens: int, max_tokens: int, model: str | None) -> tuple[str, int]:
    """The best ranked names of a names section that fit ``max_tokens``, with their count (they
    come in rank order, so the ones dropped are the least likely to be needed). ``body_tokens``:
    the count of ``body``."""
    items = [
        (match.group(1), name)
        for line in body.splitlines()
        if (match := _NAMES_LINE.match(line))
        for name in match.group(2).split()
    ]
    return _fitting_prefix(items, (body, body_tokens), max_tokens, model)


class _Prefix(NamedTuple):
    """The rendering of the first ``size`` names and its count."""

    size: int
    text: str
    tokens: int


def _fitting_prefix(
    items: list[tuple[str, str]], counted: tuple[str, int], max_tokens: int, model: str | None
) -> tuple[str, int]:
    """``render_names(items[:m])`` for the largest ``m`` whose count is within ``max_tokens``
    (``m`` = 0 when none is), with that count; ``counted``: a text and its count, used when it
    is the rendering of all the items.

    Counts grow with ``m``, so the largest fitting ``m`` lies between a prefix known to fit and
    one known not to; each probe is where the count reaches the bound by linear interpolation in
    characters between the two, and is counted from the nearer of them (only the names between
    are tokenized), so a search takes about one count of the text kept instead of one per
    halving."""
    full = render_names(items)
    tokens = counted[1] if full == counted[0] else count_tokens(full, model)
    if tokens <= max_tokens:
        return full, tokens
    lengths = _rendered_lengths(items)
    labels = [label for label, _ in items]
    # When each label's names come together (as parsed from a section, a line each), a prefix of
    # the items renders as a prefix of the whole: cut, not rendered again.
    together = len({*labels}) == 1 + sum(a != b for a, b in pairwise(labels))
    low, high = _Prefix(0, "", 0), _Prefix(len(items), full, tokens)
    while high.size - low.size > 1:
        middle = _interpolated(low, high, lengths, max_tokens)
        text = full[: lengths[middle]] if together else render_names(items[:middle])
        probe = _counted_prefix(text, middle, low, high, model)
        if probe.tokens <= max_tokens:
            low = probe
        else:
            high = probe
    return low.text, low.tokens


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
    renderings that it extends or starts (one does when each label's names come together),
    else counted whole."""
    if len(text) - len(low.text) <= len(high.text) - len(text) and text.startswith(low.text):
        added = text[len(low.text) :]
        tokens = count_joined(low.text, low.tokens, added, count_tokens(added, model), model)
    elif high.text.startswith(text):
        tokens = count_prefix(high.text, high.tokens, len(text), model)
    else:
        tokens = count_tokens(text, model)
    return _Prefix(size, text, tokens)


def _head_tail(text: str, max_tokens: int, model: str | None) -> str:
    """Keep the start and the end: the newest part of a section matters as much as the first."""
    head, _ = cut_to_tokens(text, max_tokens // 2, model)
    rest = text[len(head) :]
    tail_budget = max_tokens - max_tokens // 2 - 4
    tail = rest[-(tail_budget * 3) :] if tail_budget > 0 else ""
    while tail and count_tokens(tail, model) > tail_budget:
        tail = tail[len(tail) // 10 + 1 :]
    return f"{head}\n…\n{tail}" if tail else head
