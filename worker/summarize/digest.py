"""The offline digest (``mode = local_only``): deterministic, bounded, no network.

It states the task as the user gave it, what was done (tool calls by name with their key
arguments), every file touched (verbatim paths), the errors seen and how they ended, and the
latest state. When the text is over ``max_output_tokens``, sections give way in reverse order
of importance: paths and errors are the last to be cut.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from worker.events import Summary
from worker.facts import Facts, ToolAction, extract_facts, extract_paths
from worker.media import placeholders
from worker.models import Message
from worker.summarize import SUMMARY_MARKER, SummaryRequest
from worker.summarize.llm_prompt import without_bytes
from worker.tokens import count_tokens, cut_to_tokens

MAX_ACTION_LINES = 40
MAX_ERRORS = 12
ARGUMENT_CHARS = 160


@dataclass
class _Section:
    title: str
    body: str
    priority: int  # lower is cut first


class DigestSummarizer:
    """Deterministic summaries from the messages alone."""

    def summarize(self, request: SummaryRequest) -> Summary:
        facts = extract_facts(request.messages)
        paths = _accumulated_paths(facts, request.previous_summary)
        header = (
            f"{SUMMARY_MARKER}\nOffline digest of {len(request.messages)} earlier messages "
            f"({len(facts.actions)} tool calls), revision {request.revision}."
        )
        sections = [
            _Section("Files touched", "\n".join(paths), 6),
            _Section("Errors seen", _errors(facts), 5),
            _Section("Images and files", _attachments(request.messages), 5),
            _Section("Earlier user requests", _task(request.messages), 4),
            _Section("Latest state", _latest_state(request.messages), 3),
            _Section("Actions", _actions(facts), 2),
            _Section("Earlier summary", _strip_marker(request.previous_summary or ""), 1),
        ]
        text, truncated = _fit(header, [s for s in sections if s.body], request)
        return Summary(
            text=text,
            tokens=count_tokens(text, request.model),
            source="digest",
            truncated=truncated,
        )


def _accumulated_paths(facts: Facts, previous: str | None) -> list[str]:
    """Files from earlier summaries stay listed: facts accumulate across compactions."""
    earlier = extract_paths(_section_of(previous or "", "Files touched"))
    return list(dict.fromkeys([*earlier, *facts.paths]))


def _section_of(text: str, title: str) -> str:
    marker = f"## {title}\n"
    if marker not in text:
        return ""
    return text.split(marker, 1)[1].split("\n## ", 1)[0]


def _strip_marker(text: str) -> str:
    return text.removeprefix(SUMMARY_MARKER).strip()


def _task(messages: list[Message]) -> str:
    users = [without_bytes(m.content) for m in messages if m.role == "user" and m.content.strip()]
    if not users:
        return ""
    first = users[0].strip()
    latest = users[-1].strip()
    return first if latest == first else f"{first}\n\nLatest user message:\n{latest}"


def _attachments(messages: list[Message]) -> str:
    """Each image and file of the range, by placeholder and label (never its bytes)."""
    lines = []
    for m in messages:
        for name, a in zip(placeholders(m.id, m.attachments), m.attachments, strict=True):
            lines.append(f"- {name}: {a.label} (from the {m.role})")
    return "\n".join(lines)


def _latest_state(messages: list[Message]) -> str:
    for m in reversed(messages):
        if m.role == "assistant" and m.content.strip():
            return without_bytes(m.content).strip()
    return ""


def _one_line(text: str, limit: int = ARGUMENT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _actions(facts: Facts) -> str:
    counts = Counter(a.tool for a in facts.actions)
    lines = [", ".join(f"{tool} ×{n}" for tool, n in counts.most_common())]
    shown = facts.actions
    if len(shown) > MAX_ACTION_LINES:  # first few for context, most for the recent work
        head = MAX_ACTION_LINES // 4
        shown = [*shown[:head], *shown[-(MAX_ACTION_LINES - head) :]]
    for a in shown:
        status = " (failed)" if a.failed else ""
        lines.append(f"- {a.tool}: `{_one_line(a.key_argument)}`{status}")
    return "\n".join(lines)


def _errors(facts: Facts) -> str:
    lines = []
    for a in facts.failing[-MAX_ERRORS:]:
        outcome = "resolved later" if _resolved_later(a, facts.actions) else "not resolved in range"
        detail = "; ".join(a.error_lines) or "non-zero exit"
        lines.append(f"- `{_one_line(a.key_argument, 100)}`: {detail} -> {outcome}")
    return "\n".join(lines)


def _resolved_later(failed: ToolAction, actions: list[ToolAction]) -> bool:
    """A later call of the same tool on the same first word of its argument succeeded."""
    head = failed.key_argument.split(maxsplit=2)[:2]
    return any(
        a.index > failed.index
        and a.tool == failed.tool
        and not a.failed
        and a.key_argument.split(maxsplit=2)[:2] == head
        for a in actions
    )


def _render(header: str, sections: list[_Section]) -> str:
    parts = [header] + [f"## {s.title}\n{s.body}" for s in sections if s.body]
    return "\n\n".join(parts)


def _fit(header: str, sections: list[_Section], request: SummaryRequest) -> tuple[str, bool]:
    """Shrink the least important sections until the digest fits the output bound."""
    limit = request.max_output_tokens
    text = _render(header, sections)
    total = count_tokens(text, request.model)
    truncated = False
    for section in sorted(sections, key=lambda s: s.priority):
        if total <= limit:
            break
        own = count_tokens(section.body, request.model)
        keep = max(own - (total - limit) - 8, 0)
        section.body = _head_tail(section.body, keep, request.model) if keep >= 24 else ""
        truncated = True
        text = _render(header, sections)
        total = count_tokens(text, request.model)
    if total > limit:
        text, _ = cut_to_tokens(text, limit, request.model)
        truncated = True
    return text, truncated


def _head_tail(text: str, max_tokens: int, model: str | None) -> str:
    """Keep the start and the end: the newest part of a section matters as much as the first."""
    head, _ = cut_to_tokens(text, max_tokens // 2, model)
    rest = text[len(head) :]
    tail_budget = max_tokens - max_tokens // 2 - 4
    tail = rest[-(tail_budget * 3) :] if tail_budget > 0 else ""
    while tail and count_tokens(tail, model) > tail_budget:
        tail = tail[len(tail) // 10 + 1 :]
    return f"{head}\n…\n{tail}" if tail else head
