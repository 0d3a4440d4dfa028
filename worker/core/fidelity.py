"""Must-keep facts of a range, checked against its summary and repaired (docs/summaries.md).

Before summarizing, :func:`extract_must_keep` takes from the range what the agent cannot lose:
the task as the user stated it and every later instruction or correction, the files changed
(created, edited, deleted) and, apart from them, the files only read, the commands that failed
(and whether they were fixed later), identifiers the agent used (commit hashes, URLs, UUIDs,
test names, branch names), the last state and the open next step, and delegated work with its
result. Each fact has *probes*: short verbatim texts that must all appear (whitespace aside) in
the summary or in the messages the compaction carries.

After summarizing, :func:`ensure` checks every fact. Missing ones are repaired: the summary
gets a ``## Kept facts`` section, one compact line a fact, most important first, within the
output bound; when the summary leaves no room, its end is cut (to at most half the bound) to
make some, and what still does not fit is dropped, least important first. The outcome is the
summary's ``fidelity`` (counts; dropped facts by kind, never their content). Rules:
docs/summaries.md.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from worker.core.facts import argument_strings, extract_facts, fix_of, sources_by_path
from worker.core.files import CHANGE_KINDS
from worker.tokens import count_joined, count_tokens, cut_to_tokens
from worker.wire.events import SUMMARY_MARKER, Fidelity, Summary, SummarySection
from worker.wire.models import Message

KEPT_FACTS_TITLE = "Kept facts"
KEPT_FACTS_HEADING = f"## {KEPT_FACTS_TITLE}"
# Most important first: repairs are added in this order and dropped in the reverse one.
KINDS = (
    "task",
    "instruction",
    "file_changed",
    "failed_command",
    "last_state",
    "next_step",
    "delegation",
    "identifier",
    "file_read",
)
PROBE_CHARS = 60
LINE_CHARS = 240
MAX_IDENTIFIERS = 40
MAX_FAILED = 30

_URL = re.compile(r"https?://[^\s'\"<>()\[\]`]+[^\s'\"<>()\[\]`.,;:]")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
# What every UUID holds, found by a literal-led search: many times faster than the UUID pattern,
# which tries each position of a text (most texts with dashes hold none).
_UUID_MIDDLE = re.compile(r"-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-")
_HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
_TEST_NODE = re.compile(r"[\w./\-]+\.py::[\w\[\]:.\-]+")
_TEST_K = re.compile(r"(?:^|\s)-k\s+['\"]?([\w\- ]+?)['\"]?(?:\s|$)")
_BRANCH = re.compile(
    r"\bgit\s+(?:checkout\s+-[bB]|switch\s+-[cC]|branch(?:\s+-[mMcC])?|push\s+(?:-u\s+)?\S+)"
    r"\s+([\w./\-]+)"
)
_INTENT = re.compile(
    r"^(?:now,?\s+|next,?\s+|first,?\s+|ok(?:ay)?,?\s+)?"
    r"(?:I'll|I will|I'm going to|I am going to|I need to|I should|I want to|let me|let's|"
    r"lets|I'd like to)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Fact:
    kind: str
    probes: tuple[str, ...]  # every one must appear, whitespace-normalized
    line: str  # the repair: how the kept-facts section states it
    sources: tuple[str, ...] = ()  # ids of the messages it was taken from, in order, each once

    @property
    def rank(self) -> int:
        return KINDS.index(self.kind)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, limit: int) -> str:
    flat = _flat(text)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _probe(text: str) -> str:
    """A verbatim prefix of ``text``, whitespace-normalized, cut at a word break."""
    flat = _flat(text)
    if len(flat) <= PROBE_CHARS:
        return flat
    cut = flat[:PROBE_CHARS]
    space = cut.rfind(" ", PROBE_CHARS // 2)
    return cut[:space] if space > 0 else cut


_THOUGHT = re.compile(r"^\s*THOUGHT:\s*", re.IGNORECASE)


def strip_thought(text: str) -> str:
    return _THOUGHT.sub("", text.strip()).strip()


def is_conclusion(text: str) -> bool:
    """A conclusion or a result, not only an announcement of the next look (the digest's
    "Latest state" uses the same rule)."""
    if len(text) < 40:
        return False
    return not (_INTENT.match(text) and len(text) < 400 and text.count(". ") < 2)


def extract_must_keep(
    messages: list[Message], delegation_tools: list[str], carried: Sequence[Message] = ()
) -> list[Fact]:
    """The must-keep facts of a range, most important kind first: ``messages`` are the ones
    summarized, ``carried`` the ones the replacement keeps (both oldest first)."""
    facts: list[Fact] = []
    # The same fact again (a user repeating "continue") only adds its sources: kept as an
    # ordered set per fact until the end, so that a fact said n times costs n, not n².
    seen: dict[tuple[str, tuple[str, ...]], dict[str, None]] = {}

    def add(kind: str, probes: list[str], line: str, sources: Sequence[str]) -> None:
        clean = tuple(p for p in probes if p)
        if not clean:
            return
        known = seen.get((kind, clean))
        if known is None:
            seen[(kind, clean)] = dict.fromkeys(sources)
            facts.append(Fact(kind, clean, line))
        else:
            known.update(dict.fromkeys(sources))

    summarized = messages
    messages = sorted([*messages, *carried], key=lambda m: m.source_index) if carried else messages
    users = [m for m in messages if m.role == "user" and m.content.strip()]
    for k, m in enumerate(users):
        text = m.content.strip()
        kind = "task" if k == 0 else "instruction"
        add(kind, [_probe(text)], f"{kind}: {_cut(text, LINE_CHARS)}", [m.id])

    extracted = extract_facts(summarized)  # the very list the digest saw: computed once
    records = list(extracted.files)
    actions = list(extracted.actions)
    if any(m.tool_calls for m in carried):  # tool exchanges a hint keeps
        more = extract_facts(list(carried))
        known = {r.path for r in records}
        records.extend(r for r in more.files if r.path not in known)
        actions.extend(more.actions)
    used_by = sources_by_path(actions)
    for record in records:
        changed = any(k in CHANGE_KINDS for k in record.kinds)
        add(
            "file_changed" if changed else "file_read",
            [record.path],
            f"`{record.path}` ({', '.join(record.kinds)})",
            used_by.get(record.path, ()),
        )

    failing = [a for a in actions if a.failed][-MAX_FAILED:]
    for action in failing:
        fix = fix_of(action, actions)
        error = f": {_cut(action.error_lines[0], 100)}" if action.error_lines else ""
        outcome = "fixed later" if fix is not None else "not fixed in range"
        command = _cut(action.key_argument, 100)
        add(
            "failed_command",
            [_probe(action.key_argument)],
            f"failed `{command}`{error} -> {outcome}",
            [*action.message_ids, *(fix.message_ids if fix is not None else ())],
        )

    texts = [
        (i, strip_thought(m.content))
        for i, m in enumerate(messages)
        if m.role == "assistant" and m.content.strip()
    ]
    texts = [(i, t) for i, t in texts if t]
    conclusion = next(((i, t) for i, t in reversed(texts) if is_conclusion(t)), None)
    if conclusion is None and texts:
        conclusion = texts[-1]
    if conclusion is not None:
        at, text = conclusion
        add("last_state", [_probe(text)], f"latest: {_cut(text, LINE_CHARS)}", [messages[at].id])
        if texts[-1][0] > at:
            k, nxt = texts[-1]
            add("next_step", [_probe(nxt)], f"next: {_cut(nxt, LINE_CHARS)}", [messages[k].id])

    results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    delegated = set(delegation_tools)
    for action in actions:
        if action.tool in delegated:
            result = results.get(action.call_id, "")
            probes = [_probe(action.key_argument), _probe(result)]
            line = f"delegated to {action.tool}: `{_cut(action.key_argument, 100)}`"
            line += f" -> {_cut(result, 140)}" if result.strip() else " -> no result yet"
            add("delegation", probes, line, action.message_ids)

    identifiers = _identifiers(messages)
    for identifier in list(identifiers)[-MAX_IDENTIFIERS:]:
        add("identifier", [identifier], f"id `{identifier}`", identifiers[identifier])

    facts = [replace(f, sources=tuple(seen[(f.kind, f.probes)])) for f in facts]
    facts.sort(key=lambda f: f.rank)  # stable: in order of the conversation within a kind
    return facts


def _identifiers(messages: list[Message]) -> dict[str, list[str]]:
    """Identifiers the agent used, in order of first use: in its text and its calls, each with
    the ids of the messages that used it."""
    found: dict[str, list[str]] = {}
    for m in messages:
        if m.role != "assistant":
            continue
        here: dict[str, None] = {}  # this message's, in order
        texts = [m.content, *(t for c in m.tool_calls for t in argument_strings(c.arguments))]
        for text in texts:
            if not text:
                continue
            # Each pattern only where its anchor occurs: the texts can be whole scripts.
            if "://" in text:
                for match in _URL.finditer(text):
                    here.setdefault(match.group(0), None)
            if _UUID_MIDDLE.search(text):
                for match in _UUID.finditer(text):
                    here.setdefault(match.group(0), None)
            git = "git " in text
            if git or "commit" in text:
                for match in _HEX.finditer(text):
                    word = match.group(0)
                    if any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
                        here.setdefault(word, None)
            if ".py::" in text:
                for match in _TEST_NODE.finditer(text):
                    here.setdefault(match.group(0), None)
            if "-k " in text:
                for match in _TEST_K.finditer(text):
                    for name in match.group(1).split():
                        if name.startswith("test"):
                            here.setdefault(name, None)
            if git:
                for match in _BRANCH.finditer(text):
                    here.setdefault(match.group(1), None)
        for identifier in here:
            found.setdefault(identifier, []).append(m.id)
    return found


def carried_text(messages: list[Message]) -> str:
    """What the carried messages say, as one text to look facts up in."""
    parts: list[str] = []
    for m in messages:
        parts.append(m.content)
        parts.extend(c.arguments for c in m.tool_calls)
    return "\n".join(parts)


def _present(fact: Fact, haystack: str) -> bool:
    return all(_flat(p) in haystack for p in fact.probes)


def missing_facts(facts: list[Fact], summary: str, carried: str) -> list[Fact]:
    haystack = _flat(summary) + "\n" + _flat(carried)
    return [f for f in facts if not _present(f, haystack)]


def score(facts: list[Fact], summary: str, carried: str) -> float:
    """The share of facts present (1.0 when there are none)."""
    if not facts:
        return 1.0
    return 1 - len(missing_facts(facts, summary, carried)) / len(facts)


def _with_facts(body: str, lines: list[str]) -> str:
    return f"{body}\n\n{KEPT_FACTS_HEADING}\n" + "\n".join(f"- {line}" for line in lines)


def _append_fitting(
    body: str, missing: list[Fact], limit: int, model: str | None, tokens: int | None = None
) -> tuple[str, list[Fact], int]:
    """``body`` with as many of ``missing`` (in order) as fit in ``limit`` tokens: each fact
    whose line, after the lines taken before it, keeps the whole text within the bound; with the
    count of the text. ``tokens``: the count of ``body``, when known.

    Counted a line at a time, not the whole text once per fact: every line starts with "- "
    right after a line break, a junction where tiktoken always splits
    (:func:`worker.compress.tally.is_split_point`), so the text's tokens are exactly those of
    the body with the heading plus those of each line (with its line break when another
    follows). The body itself is counted only when its count is not given (count_joined)."""
    if tokens is None:
        tokens = count_tokens(body, model)
    heading = _with_facts("", [])
    used = count_joined(body, tokens, heading, count_tokens(heading, model), model)
    lines: list[str] = []
    added: list[Fact] = []
    for fact in missing:
        item = f"- {fact.line}"
        last = count_tokens(item, model)
        if used + last <= limit:  # as the last line: no break after it
            lines.append(fact.line)
            added.append(fact)
            tokens = used + last
            used += count_tokens(item + "\n", model)
    return (_with_facts(body, lines) if lines else body), added, tokens


def _left_out(missing: list[Fact], added: list[Fact]) -> list[Fact]:
    """The facts of ``missing`` the repair did not add."""
    taken = set(added)
    return [f for f in missing if f not in taken]


def _standing(facts: list[Fact], lost: list[Fact]) -> tuple[int, ...]:
    """How many facts of each kind are present, most important kind first: an outcome with a
    greater tuple keeps more of what matters most."""
    present = Counter(f.kind for f in facts) - Counter(f.kind for f in lost)
    return tuple(present[kind] for kind in KINDS)


def ensure(
    summary: Summary,
    facts: list[Fact],
    carried: str,
    *,
    limit: int,
    model: str | None,
    tokens: int | None = None,
) -> Summary:
    """The summary checked against ``facts``, repaired within ``limit`` tokens, with its
    ``fidelity``. ``tokens``: the count of ``summary.text`` for ``model`` when the caller has it
    (a summarizer's own), so that it is not counted again."""
    text = summary.text
    missing = missing_facts(facts, text, carried)
    score = 1 - len(missing) / len(facts) if facts else 1.0
    kept = len(facts) - len(missing)
    truncated = summary.truncated
    added: list[Fact] = []
    if missing:
        text, added, tokens = _append_fitting(summary.text, missing, limit, model, tokens)
        if len(added) < len(missing):
            # Make room: cut the end of the summary, to no less than half the bound, and check
            # again (the cut may have removed facts that were there).
            wanted = _with_facts("", [f.line for f in missing])
            room = min(count_tokens(wanted, model) + 8, limit // 2)
            body, cut = cut_to_tokens(summary.text, max(limit - room, 0), model)
            if cut and body.startswith(SUMMARY_MARKER):
                body = body.rstrip() + "\n…"
                again = missing_facts(facts, body, carried)
                candidate, more, counted = _append_fitting(body, again, limit, model)
                before = _standing(facts, _left_out(missing, added))
                if _standing(facts, _left_out(again, more)) > before:
                    text, missing, added, truncated = candidate, again, more, True
                    kept, tokens = len(facts) - len(again), counted
    dropped = Counter(f.kind for f in _left_out(missing, added))
    fidelity = Fidelity(
        checked=len(facts),
        kept=kept,
        repaired=len(added),
        dropped=dict(sorted(dropped.items(), key=lambda kv: KINDS.index(kv[0]))),
        score=round(score, 4),
    )
    sections = list(summary.sections)
    if added:  # the repair is a section too, drawn from the repaired facts' messages
        sources = [i for f in added for i in f.sources]
        sections.append(SummarySection(title=KEPT_FACTS_TITLE, source_ids=sources))
    return summary.model_copy(
        update={
            "text": text,
            "tokens": count_tokens(text, model) if tokens is None else tokens,
            "truncated": truncated,
            "fidelity": fidelity,
            "sections": sections,
        }
    )
