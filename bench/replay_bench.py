"""Replayed sessions: what repeated compactions keep of the story, as an agent session runs.

Each conversation of the shared corpus is replayed as its agent ran it: before each assistant
message (the moment the agent calls its model, every tool result of the turn before it in) and
once more at the end, the agent's *current* history (already compacted) with the new messages
appended is submitted to the real pipeline in process (``worker.pipeline.Pipeline``: parse,
evaluate, compact; offline digest, a file store in a temporary directory), and a completed
compaction is applied at once with ``worker.client.apply_compaction``; the replay goes on from
the applied history. Defaults everywhere except the threshold: ``--threshold-share`` (0.12) of
the conversation's own projected tokens, and no context window (the threshold in tokens
decides); ``--set KEY=VALUE`` overrides any other ``[compaction]`` setting.

**Gold facts**, right after each compaction: what the agent's later messages use
(``needed_gold``: paths and code names) that the compacted ranges held (the original messages
from the first compacted one up to the first the current history still holds verbatim), less
what the system prompt and first task or the messages still verbatim hold. **Error names**
apart (mostly builtins, which ``needed_gold`` never counts): exception and warning class names
(``ValueError``, ``ImproperlyConfigured``, the class a traceback's last line names) that the
compacted ranges held and the agent's later messages (text and calls) name. **Recall** = the
share present, as whole tokens, anywhere in the current history, grouped by how many
compactions the history has undergone; **early facts** are the gold facts first seen in the
first compaction's range.

    .venv/bin/python bench/replay_bench.py [--sample N] [--threshold-share 0.12]
        [--target-share S] [--min-gain-share S] [--set KEY=VALUE ...] [--json PATH]

Prints Markdown: recall by compactions undergone (all facts, early facts, error names), and
what it would be were every gold fact kept that the summarizer was given as a code name, or
that is shaped as one at all (what listing more names could win, and what no list can); the
summary's size and composition by section over successive compactions (the share of its
characters under each heading); how much of an earlier summary's errors, files and names the
next one states again; and how compactions were paced (on consecutive turns, the share of the
history each removed, where each ended against the target).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import conversations
from needed_gold import Fact, first_task, gold_facts, message_text, occurs
from needed_later import sample

from worker.client import apply_compaction
from worker.config import CompactionConfig, Settings
from worker.core.identifiers import CALLS, OUTPUT, TEXT, USER, code_names, names_in, shown_by
from worker.errors import CompactorError
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.tokens import count_tokens
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent
from worker.wire.formats import to_messages

Wire = dict[str, Any]
DEFAULT_THRESHOLD_SHARE = 0.12
# Compactions undergone, as the report groups them: (label, first, last).
BUCKETS = (
    ("1", 1, 1),
    ("2", 2, 2),
    ("3", 3, 3),
    ("4", 4, 4),
    ("5", 5, 5),
    ("6-7", 6, 7),
    ("8+", 8, 1 << 30),
)
COMPOSITION_UP_TO = 8  # the composition table's columns: the 1st to the 8th compaction

# An exception or warning class by the shape of its name (after a module's ``.``, too).
ERROR_NAME_RE = re.compile(
    r"(?<![\w])([A-Z][A-Za-z0-9]*"
    r"(?:Error|Exception|Warning|Exit|Interrupt|Failure|Fault|DoesNotExist|Configured))(?!\w)"
)
# A traceback's last line: the class (after an optional dotted module) and ": ".
TRACEBACK_LAST_RE = re.compile(r"^(?:[a-z_]\w*\.)*([A-Z]\w+): ", re.M)
TRACEBACK = "Traceback (most recent call last)"


# --- error names ------------------------------------------------------------------------------


def error_names(text: str) -> set[str]:
    """Exception and warning class names in ``text``: by shape (``ValueError``,
    ``ImproperlyConfigured``), and, in a text holding a traceback, the class a line names
    before ``: `` (``DoesNotExist: ...``)."""
    found = {m.group(1) for m in ERROR_NAME_RE.finditer(text)}
    if TRACEBACK in text:
        found.update(m.group(1) for m in TRACEBACK_LAST_RE.finditer(text))
    return found


def error_gold(messages: list[Wire], cut: int, start: int, end: int) -> list[Fact]:
    """The error names the agent's messages from ``cut`` on name that ``messages[start:end]``
    held, less those the prompt and first task or ``messages[end:cut]`` hold."""
    later = "\n".join(message_text(m) for m in messages[cut:] if m.get("role") == "assistant")
    in_range = "\n".join(message_text(m) for m in messages[start:end])
    prompt = "\n".join(message_text(m) for m in first_task(messages))
    tail = "\n".join(message_text(m) for m in messages[end:cut])
    facts = [Fact(name, "error") for name in error_names(later)]
    return sorted(
        f for f in facts if occurs(f, in_range) and not occurs(f, prompt) and not occurs(f, tail)
    )


# --- summaries --------------------------------------------------------------------------------

HEADING_RE = re.compile(r"^## (.+)$", re.M)
BACKTICKED_RE = re.compile(r"`([^`\n]+)`")
NAMES_LINE_RE = re.compile(r"^[A-Z][^:]*: (.+)$")


def section_sizes(summary: str) -> dict[str, int]:
    """Characters of ``summary`` under each ``## `` heading (the heading's line included); the
    text before the first heading under ""."""
    sizes: dict[str, int] = defaultdict(int)
    marks = [(m.start(), m.group(1).strip()) for m in HEADING_RE.finditer(summary)]
    bounds = [(0, ""), *marks, (len(summary), "")]
    for (at, title), (nxt, _) in pairwise(bounds):
        sizes[title] += nxt - at
    return dict(sizes)


def section_text(summary: str, title: str) -> str:
    marker = f"## {title}\n"
    if marker not in summary:
        return ""
    return summary.split(marker, 1)[1].split("\n## ", 1)[0]


def _error_items(body: str) -> list[str]:
    """The failed command of each listed error (its first backticked span)."""
    return [m.group(1) for line in body.splitlines() if (m := BACKTICKED_RE.search(line))]


def _file_items(body: str) -> list[str]:
    return [m.group(1) for line in body.splitlines() if (m := BACKTICKED_RE.search(line))]


def _name_items(body: str) -> list[str]:
    return [
        name
        for line in body.splitlines()
        if (m := NAMES_LINE_RE.match(line.strip()))
        for name in m.group(1).split()
        if name != "…"
    ]


# What "found again" reads of an earlier summary: (label, section, its items).
CARRIED: tuple[tuple[str, str, Callable[[str], list[str]]], ...] = (
    ("errors", "Errors seen", _error_items),
    ("files", "Files touched", _file_items),
    ("names", "Code names", _name_items),
)


def carried_over(before: str | None, after: str) -> dict[str, tuple[int, int]]:
    """For each of :data:`CARRIED`: (items of ``before``'s section that ``after`` states again,
    items of that section)."""
    if before is None:
        return {}
    out = {}
    for label, title, items_of in CARRIED:
        items = list(dict.fromkeys(items_of(section_text(before, title))))
        if items:
            out[label] = (sum(item in after for item in items), len(items))
    return out


# --- one replayed conversation ----------------------------------------------------------------


@dataclass
class Compacted:
    """One compaction of a replay, and what the history held right after it."""

    conversation: str
    number: int  # compactions undergone, this one included
    turn: int
    cut: int  # how many original messages had been submitted
    consecutive: bool  # the previous compaction came on the turn before
    threshold: int
    target: int  # the size a compaction aims at
    min_gain: int  # the fewest tokens it must remove
    tokens_before: int
    tokens_after: int
    summary: str
    gold: list[Fact]
    kept: list[Fact]
    early: list[Fact]  # the gold facts first seen in the first compaction's range
    errors: list[Fact]
    errors_kept: list[Fact]
    # The gold facts a code-name list could have kept: those this summarizer was given as code
    # names (in the range's messages, the earlier summary), and those with the shape of one
    # besides, whatever an earlier compaction gave up.
    given: list[Fact] = field(default_factory=list)
    shaped: list[Fact] = field(default_factory=list)
    carried_over: dict[str, tuple[int, int]] = field(default_factory=dict)
    # By where the range held a name (or only the earlier summary): (used again later, names).
    used_again: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def gain(self) -> float:
        """The share of the history's tokens the compaction removed."""
        return 1 - self.tokens_after / self.tokens_before if self.tokens_before else 0.0

    @property
    def sections(self) -> dict[str, int]:
        return section_sizes(self.summary)

    def to_json(self) -> dict[str, Any]:
        kept, errors_kept = set(self.kept), set(self.errors_kept)
        return {
            "conversation": self.conversation,
            "compaction": self.number,
            "turn": self.turn,
            "cut": self.cut,
            "consecutive": self.consecutive,
            "threshold": self.threshold,
            "target": self.target,
            "min_gain": self.min_gain,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "summary_tokens": count_tokens(self.summary),
            "summary": self.summary,
            "sections": self.sections,
            "gold": len(self.gold),
            "missed": [[f.text, f.kind] for f in self.gold if f not in kept],
            "early": len(self.early),
            "errors": len(self.errors),
            "errors_missed": [f.text for f in self.errors if f not in errors_kept],
            "given": len(self.given),
            "shaped": len(self.shaped),
            "carried_over": {k: list(v) for k, v in self.carried_over.items()},
            "used_again": {k: list(v) for k, v in self.used_again.items()},
        }


@dataclass
class Replayed:
    conversation: str
    turns: int
    tokens: int  # the whole conversation's projected tokens
    threshold: int
    compactions: list[Compacted]


def turn_ends(messages: list[Wire]) -> list[int]:
    """Where each turn's submission ends: before every assistant message after the first
    message (its request held everything earlier), and at the end of the conversation."""
    ends = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
    return [*ends, len(messages)]


def leading_system(messages: list[Wire]) -> int:
    k = 0
    while k < len(messages) and messages[k].get("role") in ("system", "developer"):
        k += 1
    return k


@dataclass
class _Replay:
    """The agent's side of a replay: its current history and, for each message, its index in
    the original conversation (None: a message a compaction wrote)."""

    history: list[Wire] = field(default_factory=list)
    origin: list[int | None] = field(default_factory=list)

    def append(self, original: list[Wire], start: int, end: int) -> None:
        self.history.extend(original[start:end])
        self.origin.extend(range(start, end))

    def apply(self, event: CompletedEvent) -> int | None:
        """Apply ``event``; the original index of the first message after its replacement."""
        c = event.compaction
        self.history = apply_compaction(self.history, event)
        self.origin = [*self.origin[: c.start], *[None] * len(c.replacement), *self.origin[c.end :]]
        after = self.origin[c.start + len(c.replacement) :]
        return next((i for i in after if i is not None), None)


@dataclass(frozen=True)
class Pace:
    """What the pacing is measured against: the threshold as a share of each conversation's
    tokens; the target and the minimum gain as shares of the threshold and of the history
    (None: what ``[compaction]`` sets, where this tree's settings have them; else the
    threshold, and no minimum)."""

    threshold_share: float = DEFAULT_THRESHOLD_SHARE
    target_share: float | None = None
    min_gain_share: float | None = None

    def target(self, config: CompactionConfig, threshold: int) -> int:
        if self.target_share is not None:
            return int(self.target_share * threshold)
        aimed = getattr(config, "target_tokens", None)
        return int(aimed(threshold)) if callable(aimed) else threshold

    def min_gain(self, config: CompactionConfig, tokens_before: int) -> int:
        if self.min_gain_share is not None:
            return math.ceil(self.min_gain_share * tokens_before)
        least = getattr(config, "min_gain_tokens", None)
        return int(least(tokens_before)) if callable(least) else 0


def replay(
    name: str,
    snapshot: Wire,
    *,
    pace: Pace,
    overrides: dict[str, Any],
    store_dir: Path,
    reuse: Reuse,
) -> Replayed:
    """Replay one conversation turn by turn, compacting as the pipeline decides."""
    original: list[Wire] = snapshot["messages"]
    model = {"name": (snapshot.get("model") or {}).get("name", "")}
    store = FileStore(store_dir)
    probe = Pipeline(Settings(), Adapters(store=store), reuse)
    whole = probe.parse({**snapshot, "model": model})
    total = probe.evaluate(whole).evaluation.projected_tokens
    threshold = max(int(total * pace.threshold_share), 1)
    config = CompactionConfig(auto_compact_threshold_tokens=threshold, **overrides)
    pipeline = Pipeline(Settings(compaction=config), Adapters(store=store), reuse)
    agent = _Replay()
    out = Replayed(name, 0, total, threshold, [])
    start = leading_system(original)  # the first compaction's range starts after the system
    spans: list[int] = []  # where each compaction's range ended, in the original messages
    last_turn = -2
    taken = 0
    for turn, cut in enumerate(turn_ends(original)):
        agent.append(original, taken, cut)
        taken = cut
        out.turns = turn + 1
        wire = {
            "conversation_id": snapshot["conversation_id"],
            "revision": turn + 1,
            "model": model,
            "messages": agent.history,
        }
        context = pipeline.context(pipeline.parse(json.dumps(wire).encode()))
        verdict = pipeline.evaluate(context)
        if verdict.skipped is not None or not verdict.over_threshold:
            continue
        event = pipeline.compact(context, verdict.evaluation)
        if not isinstance(event, CompletedEvent):
            continue
        end = agent.apply(event)
        end = cut if end is None else end
        spans.append(end)
        out.compactions.append(
            _measured(
                out.conversation,
                original,
                agent.history,
                event,
                spans=(start, *spans),
                at=(turn, cut, turn == last_turn + 1),
                paced=(
                    threshold,
                    pace.target(config, threshold),
                    pace.min_gain(config, event.compaction.tokens_before),
                ),
                previous=out.compactions[-1] if out.compactions else None,
            )
        )
        last_turn = turn
    return out


def _measured(
    name: str,
    original: list[Wire],
    history: list[Wire],
    event: CompletedEvent,
    *,
    spans: tuple[int, ...],
    at: tuple[int, int, bool],
    paced: tuple[int, int, int],
    previous: Compacted | None,
) -> Compacted:
    """What the history held right after a compaction: ``spans`` are where the compacted
    ranges start (the first) and end (each compaction's, this one last), in ``original``;
    ``at``: the turn, the original messages submitted so far and whether the previous
    compaction came on the turn before; ``paced``: the threshold, the target, the least gain."""
    start, first_end, end = spans[0], spans[1], spans[-1]
    turn, cut, consecutive = at
    threshold, target, min_gain = paced
    text = "\n".join(message_text(m) for m in history)
    later = cut < len(original)
    gold = gold_facts(original, cut, start, end) if later else []
    errors = error_gold(original, cut, start, end) if later else []
    early = "\n".join(message_text(m) for m in original[start:first_end])
    summary = event.compaction.summary.text
    said_later = "\n".join(message_text(m) for m in original[cut:] if m.get("role") == "assistant")
    kept = [f for f in gold if occurs(f, text)]
    given = listable_names(
        "\n".join(message_text(m) for m in original[spans[-2] : end])
        + "\n"
        + (previous.summary if previous else "")
    )
    c = event.compaction
    return Compacted(
        conversation=name,
        number=previous.number + 1 if previous else 1,
        turn=turn,
        cut=cut,
        consecutive=consecutive,
        threshold=threshold,
        target=target,
        min_gain=min_gain,
        tokens_before=c.tokens_before,
        tokens_after=c.tokens_after,
        summary=summary,
        gold=gold,
        kept=kept,
        given=[f for f in gold if f in kept or f.text in given],
        shaped=[f for f in gold if f in kept or f.text in given or is_code_name(f.text)],
        early=[f for f in gold if occurs(f, early)],
        errors=errors,
        errors_kept=[f for f in errors if occurs(f, text)],
        carried_over=carried_over(previous.summary if previous else None, summary),
        used_again=names_used_again(
            original[spans[-2] : end], previous.summary if previous else None, said_later
        ),
    )


def listable_names(text: str) -> set[str]:
    """The code names a text holds (``worker.core.identifiers``), and every shorter name each
    shows whole: what a summary listing names could have kept of it."""
    found = set(names_in(text))
    for name in list(found):
        found.update(shown_by(name))
    return found


def is_code_name(word: str) -> bool:
    """Whether ``word`` is a code name by its shape alone (no call or definition needed)."""
    return word in listable_names(f" {word} ")


# --- which names the agent uses again ---------------------------------------------------------

HELD_BY = {
    CALLS: "the agent's calls",
    TEXT: "its text",
    USER: "user messages",
    OUTPUT: "tool outputs only",
}
PASSED_ON = "only the earlier summary (passed on)"
WORDS_RE = re.compile(r"[A-Za-z0-9_~][\w.\-/~]*")
MAX_PARTS = 12


def later_words(text: str) -> set[str]:
    """Every word of ``text`` that a name could be (runs of name, ``.``, ``/`` and ``-``
    characters), with each run of its ``.``- or ``/``-separated parts: ``a.b.C`` holds ``b.C``
    and ``C``, as the gold's whole-token rule would find them."""
    words: set[str] = set()
    for word in WORDS_RE.findall(text):
        word = word.rstrip(".-/")
        parts = re.split(r"([./])", word)[: 2 * MAX_PARTS]
        for i in range(0, len(parts), 2):
            for j in range(i + 1, len(parts) + 1, 2):
                words.add("".join(parts[i:j]))
    return words


def names_used_again(
    span: list[Wire], earlier_summary: str | None, said_later: str
) -> dict[str, tuple[int, int]]:
    """For the code names of a compacted range (``worker.core.identifiers``, by the best place
    the range held them) and those only the earlier summary listed: how many of them the
    agent's later messages name, of how many."""
    words = later_words(said_later)
    try:
        names = code_names(to_messages("openai", span)) if span else []
    except CompactorError:
        names = []
    counts: dict[str, tuple[int, int]] = {}

    def count(label: str, name: str) -> None:
        used, total = counts.get(label, (0, 0))
        counts[label] = (used + (name in words), total + 1)

    for found in names:
        count(HELD_BY[found.tier], found.text)
    ranged = {found.text for found in names}
    listed = [
        n
        for title in ("Code names", "Names printed by tools")
        for n in _name_items(section_text(earlier_summary or "", title))
    ]
    for name in dict.fromkeys(listed):
        if name not in ranged:
            count(PASSED_ON, name)
    return counts


# --- report -----------------------------------------------------------------------------------


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def in_bucket(c: Compacted, low: int, high: int) -> bool:
    return low <= c.number <= high


def ratio(kept: int, total: int) -> str:
    return f"{kept / total:.3f}" if total else "—"


def recall_table(points: list[Compacted]) -> list[str]:
    """Recall by compactions undergone: mean of each compaction's share (those with gold),
    and over all facts pooled; early facts; error names."""
    rows = [
        "| compactions undergone | compactions | conversations | gold facts | mean recall "
        "| pooled recall | early facts | early recall | error names | error recall |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, low, high in [*BUCKETS, ("all", 1, 1 << 30)]:
        at = [c for c in points if in_bucket(c, low, high)]
        if not at:
            continue
        scored = [c for c in at if c.gold]
        gold = sum(len(c.gold) for c in at)
        kept = sum(len(c.kept) for c in at)
        kept_sets = [set(c.kept) for c in at]
        early = sum(len(c.early) for c in at)
        early_kept = sum(sum(f in k for f in c.early) for c, k in zip(at, kept_sets, strict=True))
        errors = sum(len(c.errors) for c in at)
        errors_kept = sum(len(c.errors_kept) for c in at)
        score = mean([len(c.kept) / len(c.gold) for c in scored])
        rows.append(
            f"| {label} | {len(at)} | {len({c.conversation for c in at})} | {gold} | "
            f"{score:.3f} | {ratio(kept, gold)} | {early} | {ratio(early_kept, early)} | "
            f"{errors} | {ratio(errors_kept, errors)} |"
        )
    return rows


def ceiling_table(points: list[Compacted]) -> list[str]:
    """Mean recall by compactions undergone, and what it would be were every gold fact kept
    that this compaction's summarizer was given as a code name (the range's and the earlier
    summary's), or that is shaped as one at all (whatever an earlier compaction gave up): what
    listing more names could win, and what no list of names can (plain words)."""
    rows = [
        "| compactions undergone | mean recall | every name given kept | every shaped name kept |",
        "|---|---|---|---|",
    ]
    for label, low, high in [*BUCKETS, ("all", 1, 1 << 30)]:
        scored = [c for c in points if in_bucket(c, low, high) and c.gold]
        if not scored:
            continue
        shares = [
            mean([len(facts(c)) / len(c.gold) for c in scored])
            for facts in (
                lambda c: c.kept,
                lambda c: c.given,
                lambda c: c.shaped,
            )
        ]
        rows.append(f"| {label} | " + " | ".join(f"{v:.3f}" for v in shares) + " |")
    return rows


# The digest's sections, in its order; any other heading is reported as "other headings".
KNOWN_SECTIONS = (
    "",
    "Requested focus",
    "Task state",
    "Files touched",
    "Errors seen",
    "Images and files",
    "Code names",
    "Earlier user requests",
    "Latest state",
    "Names printed by tools",
    "Actions",
    "Earlier summary",
    "Kept facts",
)
OTHER = "other headings"


def composition_table(points: list[Compacted]) -> list[str]:
    """For the n-th compaction of each conversation: the summary's mean tokens and
    characters, and the share of all those summaries' characters under each heading."""
    numbers = list(range(1, COMPOSITION_UP_TO + 1))
    by_number = {n: [c for c in points if c.number == n] for n in numbers}
    numbers = [n for n in numbers if by_number[n]]
    head = " | ".join(f"{n}" for n in numbers)
    rows = [f"| compaction | {head} |", "|---" * (len(numbers) + 1) + "|"]

    def row(label: str, cells: list[str]) -> None:
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    row("summaries", [str(len(by_number[n])) for n in numbers])
    row(
        "summary tokens (mean)",
        [f"{mean([count_tokens(c.summary) for c in by_number[n]]):.0f}" for n in numbers],
    )
    row(
        "summary characters (mean)",
        [f"{mean([len(c.summary) for c in by_number[n]]):.0f}" for n in numbers],
    )
    shares: dict[int, Counter[str]] = {}
    for n in numbers:
        counter: Counter[str] = Counter()
        for c in by_number[n]:
            for title, size in c.sections.items():
                counter[title if title in KNOWN_SECTIONS else OTHER] += size
        shares[n] = counter
    titles = [t for t in (*KNOWN_SECTIONS, OTHER) if any(shares[n][t] for n in numbers)]
    for title in titles:
        label = "(header)" if title == "" else title
        cells = []
        for n in numbers:
            total = sum(shares[n].values())
            cells.append(f"{shares[n][title] / total:.0%}" if total else "—")
        row(label, cells)
    return rows


def reuse_table(points: list[Compacted]) -> list[str]:
    rows = [
        "| held in the compacted range by | names | named again by the agent later | share |",
        "|---|---|---|---|",
    ]
    for label in [*HELD_BY.values(), PASSED_ON]:
        used = sum(c.used_again.get(label, (0, 0))[0] for c in points)
        total = sum(c.used_again.get(label, (0, 0))[1] for c in points)
        if total:
            rows.append(f"| {label} | {total} | {used} | {ratio(used, total)} |")
    return rows


def carried_table(points: list[Compacted]) -> list[str]:
    rows = [
        "| earlier summary's | items | stated again by the next summary |",
        "|---|---|---|",
    ]
    for label, title, _ in CARRIED:
        found = sum(c.carried_over.get(label, (0, 0))[0] for c in points)
        total = sum(c.carried_over.get(label, (0, 0))[1] for c in points)
        rows.append(f"| {title} ({label}) | {total} | {ratio(found, total)} |")
    return rows


def pacing(points: list[Compacted], replays: list[Replayed]) -> list[str]:
    consecutive = sum(c.consecutive for c in points)
    under_gain = [c for c in points if c.tokens_before - c.tokens_after < c.min_gain]
    at_target = [c for c in points if c.tokens_after <= c.target]
    over_threshold = [c for c in points if c.tokens_after > c.threshold]
    gains = sorted(c.gain for c in points)
    after = sorted(c.tokens_after / c.threshold for c in points)
    targets = sorted(c.target / c.threshold for c in points)
    per = [len(r.compactions) for r in replays]

    def q(values: list[float], share: float) -> float:
        return values[min(int(share * len(values)), len(values) - 1)] if values else float("nan")

    return [
        "| measure | value |",
        "|---|---|",
        f"| compactions | {len(points)} in {len(replays)} conversations (per conversation: "
        f"median {statistics.median(per) if per else 0:.0f}, max {max(per, default=0)}) |",
        f"| on consecutive turns | {consecutive} ({ratio(consecutive, len(points))}) |",
        f"| removed fewer tokens than the minimum gain | {len(under_gain)} |",
        f"| share of the history removed: min / p10 / median | {q(gains, 0):.3f} / "
        f"{q(gains, 0.1):.3f} / {q(gains, 0.5):.3f} |",
        f"| ended at or under the target (median target {q(targets, 0.5):.2f} x threshold) | "
        f"{len(at_target)} ({ratio(len(at_target), len(points))}) |",
        f"| ended over the threshold | {len(over_threshold)} |",
        f"| tokens after / threshold: median / p90 / max | {q(after, 0.5):.3f} / "
        f"{q(after, 0.9):.3f} / {q(after, 1.0):.3f} |",
    ]


def most_missed(points: list[Compacted], top: int = 12) -> list[str]:
    missed: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for c in points:
        kept = set(c.kept)
        missed.update(f"{f.text} ({f.kind})" for f in c.gold if f not in kept)
        errors.update(f.text for f in c.errors if f not in set(c.errors_kept))
    return [
        "- facts: " + ", ".join(f"`{t}` {n}" for t, n in missed.most_common(top)),
        "- error names: " + ", ".join(f"`{t}` {n}" for t, n in errors.most_common(top)),
    ]


def report(replays: list[Replayed], args: argparse.Namespace, seconds: float) -> str:
    points = [c for r in replays for c in r.compactions]
    settings = ", ".join(f"{k} = {v}" for k, v in args.overrides.items()) or "defaults"
    return "\n".join(
        [
            f"conversations: {len(replays)}; turns: {sum(r.turns for r in replays)}; "
            f"threshold {args.pace.threshold_share:.0%} of each conversation's tokens (median "
            f"{statistics.median([r.threshold for r in replays]) if replays else 0:.0f}); "
            f"[compaction]: {settings}; run time {seconds:.0f} s",
            "",
            "### Recall by compactions undergone",
            "",
            *recall_table(points),
            "",
            "### What more names could win (recall were every such gold fact kept)",
            "",
            *ceiling_table(points),
            "",
            "### The summary over successive compactions (share of its characters)",
            "",
            *composition_table(points),
            "",
            "### What the next summary states again of an earlier one",
            "",
            *carried_table(points),
            "",
            "### Which names the agent names again",
            "",
            *reuse_table(points),
            "",
            "### Pacing",
            "",
            *pacing(points, replays),
            "",
            "### Missed most (times, over all compactions)",
            "",
            *most_missed(points),
        ]
    )


def setting(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, help="this many conversations, spread evenly")
    parser.add_argument(
        "--threshold-share",
        type=float,
        default=DEFAULT_THRESHOLD_SHARE,
        help="the threshold, as a share of each conversation's projected tokens",
    )
    parser.add_argument(
        "--target-share",
        type=float,
        help="the target, as a share of the threshold (default: [compaction]'s own, if any)",
    )
    parser.add_argument(
        "--min-gain-share",
        type=float,
        help="the minimum gain, as a share of the history (default: [compaction]'s own, if any)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        type=setting,
        action="append",
        default=[],
        help="a [compaction] setting, KEY=VALUE (VALUE read as JSON when it is)",
    )
    parser.add_argument("--json", type=Path, help="write every compaction's figures here")
    args = parser.parse_args()
    args.overrides = dict(args.overrides)
    args.pace = Pace(args.threshold_share, args.target_share, args.min_gain_share)
    wanted = set(sample([name for name, _ in conversations()], args.sample))
    reuse = Reuse()
    replays: list[Replayed] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, snapshot in conversations():
            if name in wanted:
                replays.append(
                    replay(
                        name,
                        snapshot,
                        pace=args.pace,
                        overrides=args.overrides,
                        store_dir=Path(tmp),
                        reuse=reuse,
                    )
                )
    print(report(replays, args, time.perf_counter() - t0))
    if args.json:
        points = [c.to_json() for r in replays for c in r.compactions]
        args.json.write_text(json.dumps(points, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
