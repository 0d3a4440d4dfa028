"""Provenance: the messages each section of a summary was drawn from, and what a compaction
dropped outright (docs/summaries.md, "Provenance").

Pure functions over the plan and the summary. The digest knows what each of its sections used
and says so; an LLM summary is *attributed* here (:func:`attribute`): its text is split at its
Markdown headings and each section gets the sources of the must-keep facts (and attachment
placeholders) it contains, which is our reading of the text, not the model's own claim. Both
speak in the ids of the normalized messages they were given; :func:`published_sections` keeps the
sections still in the final text, in its order, and turns their ids into wire message ids of
the range (each once, in conversation order, a long list capped). :func:`dropped` lists what the
replacement removes without summarizing or carrying it: names and sizes, never content.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from worker.core.fidelity import KEPT_FACTS_TITLE, Fact
from worker.core.planning import RangePlan, ToolPolicies, is_summary_message
from worker.wire.events import SUMMARY_MARKER, DroppedItem, DroppedKind, Summary, SummarySection
from worker.wire.media import placeholders
from worker.wire.models import Message

__all__ = [
    "MAX_SECTION_IDS",
    "Anchor",
    "anchors",
    "attribute",
    "dropped",
    "headings",
    "published_sections",
    "wire_locations",
]

# A section lists at most this many ids: the first HEAD_IDS and the newest rest (where the
# work ended matters most); ``omitted_ids`` counts the ones between.
MAX_SECTION_IDS = 64
HEAD_IDS = 16


@dataclass(frozen=True)
class Anchor:
    """Texts that, all present in a section (whitespace aside), tie it to ``sources``."""

    probes: tuple[str, ...]
    sources: tuple[str, ...]


def _flat(text: str) -> str:
    return " ".join(text.split())


def anchors(facts: Sequence[Fact], messages: Sequence[Message]) -> list[Anchor]:
    """What an LLM summary's sections are attributed by: the must-keep facts (each knows its
    messages) and the placeholder of each image or file of the summarized ``messages``."""
    out = [Anchor(tuple(_flat(p) for p in f.probes), f.sources) for f in facts if f.sources]
    for m in messages:
        out.extend(Anchor((name,), (m.id,)) for name in placeholders(m.id, m.attachments))
    return out


# A heading line (1-6 "#", a space or tab, a title, optional closing "#"s), or a code fence.
_HEADING_OR_FENCE = re.compile(
    r"^(?:[ \t]*(?:```|~~~).*|#{1,6}[ \t]+(.*?)(?:[ \t]+#+|#*)?[ \t]*)$", re.MULTILINE
)


def headings(text: str) -> list[tuple[str, int]]:
    """The Markdown (ATX) headings of ``text`` outside code fences: (title, offset of its line)."""
    found: list[tuple[str, int]] = []
    fenced = False
    for match in _HEADING_OR_FENCE.finditer(text):
        title = match.group(1)
        if title is None:
            fenced = not fenced
        elif not fenced and title.strip("# \t"):
            found.append((title.strip(), match.start()))
    return found


def attribute(summary: Summary, found: Sequence[Anchor]) -> Summary:
    """An LLM summary with its sections attributed: the text before the first heading (title
    ``""``, when it says more than the marker line) and each heading's section, with the
    sources of every anchor whose probes all appear in it. A ``Kept facts`` section the fidelity
    repair added keeps the repaired facts' own sources."""
    text = summary.text
    kept = [s for s in summary.sections if s.title == KEPT_FACTS_TITLE]
    marks = headings(text)
    if kept and marks and marks[-1][0] == KEPT_FACTS_TITLE:
        marks = marks[:-1]
        body_end = text.rfind("\n## " + KEPT_FACTS_TITLE)
        text = text[: body_end if body_end >= 0 else len(text)]
    else:
        kept = []
    starts = [("", 0), *marks]
    ends = [start for _, start in marks] + [len(text)]
    sections: list[SummarySection] = []
    for (title, start), end in zip(starts, ends, strict=True):
        part = text[start:end]
        if not title and not part.removeprefix(SUMMARY_MARKER).strip():
            continue  # nothing before the first heading but the marker line
        flat = _flat(part)
        sources = [i for a in found if all(p in flat for p in a.probes) for i in a.sources]
        sections.append(SummarySection(title=title, source_ids=sources))
    return summary.model_copy(update={"sections": [*sections, *kept]})


def wire_locations(
    ranged: Iterable[Message], source_ids: Sequence[str]
) -> dict[str, tuple[int, str]]:
    """Normalized id -> (wire index, wire id), for the messages of the compacted range."""
    return {m.id: (m.source_index, source_ids[m.source_index]) for m in ranged}


def _capped(ids: Iterable[str], where: Mapping[str, tuple[int, str]]) -> tuple[list[str], int]:
    located = sorted({where[i] for i in ids if i in where})
    wire = list(dict.fromkeys(w for _, w in located))
    if len(wire) <= MAX_SECTION_IDS:
        return wire, 0
    tail = MAX_SECTION_IDS - HEAD_IDS
    return [*wire[:HEAD_IDS], *wire[-tail:]], len(wire) - MAX_SECTION_IDS


def published_sections(
    text: str, sections: Sequence[SummarySection], where: Mapping[str, tuple[int, str]]
) -> list[SummarySection]:
    """The ``sections`` still in ``text`` (a cut to the output bound may have removed the last
    ones), matched to its headings in order, with wire ids: each once, in conversation order,
    capped at :data:`MAX_SECTION_IDS`."""
    marks = headings(text)
    out: list[SummarySection] = []
    k = 0
    for section in sections:
        if section.title:
            j = next((j for j in range(k, len(marks)) if marks[j][0] == section.title), None)
            if j is None:
                continue
            k = j + 1
        ids, omitted = _capped(section.source_ids, where)
        out.append(SummarySection(title=section.title, source_ids=ids, omitted_ids=omitted))
    return out


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def dropped(
    ranged: Sequence[Message],
    plan: RangePlan,
    policies: ToolPolicies,
    where: Mapping[str, tuple[int, str]],
) -> list[DroppedItem]:
    """What the replacement of the range drops outright, in conversation order: each call an
    ``omit`` policy removes (with its result), each body a ``strip`` policy replaces by a
    marker, each carried user turn shortened to fit, and each image or file of a message that
    is summarized (or whose tool output was stripped): the replacement does not carry it."""
    carried = {m.id: m for m in plan.carried}
    hinted = policies.default is not None or bool(policies.overrides)
    if not hinted:  # no call is omitted or stripped: only turns and attachments can be
        ranged = [m for m in ranged if m.attachments or (m.role == "user" and m.id in carried)]
    names = {c.id: c.name for m in ranged for c in m.tool_calls} if hinted else {}
    outputs = {m.tool_call_id: m.content for m in ranged if m.role == "tool"} if hinted else {}
    carry = set(plan.delegation_calls)
    out: list[DroppedItem] = []

    def add(
        m: Message,
        kind: DroppedKind,
        *,
        call_id: str | None = None,
        tool: str | None = None,
        size: int | None = None,
        attachment: str | None = None,
    ) -> None:
        wire_id = where[m.id][1]
        out.append(DroppedItem(message_id=wire_id, kind=kind, call_id=call_id, tool=tool,
                               bytes=size, attachment=attachment))  # fmt: skip

    for m in ranged:
        if m.id not in where or is_summary_message(m):
            continue
        for c in m.tool_calls:
            policy = None if c.id in carry else policies.for_tool(c.name)
            if policy is None:
                continue
            if policy.policy == "omit":
                size = _size(c.arguments) + _size(outputs.get(c.id, ""))
                add(m, "tool_call_omitted", call_id=c.id, tool=c.name, size=size)
            elif policy.request:
                size = _size(c.arguments)
                add(m, "tool_arguments_stripped", call_id=c.id, tool=c.name, size=size)
        kept = carried.get(m.id)
        if m.role == "tool" and m.tool_call_id not in carry:
            tool = names.get(m.tool_call_id or "", m.tool_name or "")
            policy = policies.for_tool(tool)
            if policy is not None and policy.policy == "strip" and policy.response:
                size = _size(m.content)
                add(m, "tool_output_stripped", call_id=m.tool_call_id, tool=tool, size=size)
        elif m.role == "user" and kept is not None and kept.content != m.content:
            add(m, "user_message_shortened", size=_size(m.content) - _size(kept.content))
        media_kept = kept is not None and (m.role != "tool" or kept.content == m.content)
        if m.attachments and not media_kept:
            for name in placeholders(m.id, m.attachments):
                add(m, "attachment_dropped", attachment=name)
    return out
