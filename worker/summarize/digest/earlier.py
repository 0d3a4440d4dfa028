"""An earlier summary read back section by section, and the files touched."""

from __future__ import annotations

import re

from worker.core.facts import Facts, extract_paths, sources_by_path
from worker.core.fidelity import KEPT_FACTS_TITLE
from worker.core.files import CHANGE_KINDS
from worker.summarize import SUMMARY_MARKER
from worker.summarize.digest.base import (
    _FENCE_LINE,
    _HEADER_LINE,
    _MERGED,
    FILES,
    KNOWN_TITLES,
    LLM_CARRIED,
    LLM_FILES,
    _quoted,
    _Section,
)

# --- an earlier summary, section by section ---------------------------------------------------


def earlier_sections(previous: str | None) -> dict[str, str]:
    """The sections of the earlier summary (or summaries, joined) the range starts with, by
    title (a title seen twice: its bodies joined); text under no heading, our marker and header
    line aside, under "". A ``## `` line inside a code fence is text, unless it is one of the
    titles the digest or the LLM writes (an older digest could leave a fence open)."""
    bodies: dict[str, list[str]] = {}
    title = ""
    fenced = False
    for line in (previous or "").splitlines():
        heading = line[3:].strip() if line.startswith("## ") else None
        if heading and (not fenced or heading in KNOWN_TITLES):
            title, fenced = heading, False
            bodies.setdefault(title, [])
            continue
        if _FENCE_LINE.match(line):
            fenced = not fenced
        if not title and (line.strip() == SUMMARY_MARKER or _HEADER_LINE.match(line)):
            continue
        bodies.setdefault(title, []).append(line)
    joined = {t: "\n".join(lines).strip("\n") for t, lines in bodies.items()}
    return {t: body for t, body in joined.items() if body.strip()}


def _bullets(body: str) -> list[str]:
    """The items of a list (``- item`` lines), without their dashes."""
    return [line.strip()[2:].strip() for line in body.splitlines() if line.strip().startswith("- ")]


def _kept_facts(earlier: dict[str, str], prefix: str) -> list[str]:
    """The lines of the earlier summary's ``Kept facts`` repair that start with ``prefix``
    (``task: ``, ``latest: ``, ``id ``, ...), without it."""
    return [
        b[len(prefix) :]
        for b in _bullets(earlier.get(KEPT_FACTS_TITLE, ""))
        if b.startswith(prefix)
    ]


def _unmerged(earlier: dict[str, str]) -> str:
    """What of the earlier summary no section took: text under no heading or a heading we do
    not write (a forged summary, an older digest's quoted headings), each part under its title
    as a plain line; the ``delegated`` lines of a repair."""
    parts = [
        body if not title else f"{title}:\n{body}"
        for title, body in earlier.items()
        if title not in _MERGED
    ]
    delegated = [
        f"- {b}"
        for b in _bullets(earlier.get(KEPT_FACTS_TITLE, ""))
        if b.startswith("delegated to ")
    ]
    if delegated:
        parts.append("\n".join(delegated))
    return _quoted("\n\n".join(parts))


def _carried_llm_sections(earlier: dict[str, str], previous: list[str]) -> list[_Section]:
    """An earlier LLM summary's goal, decisions, constraints, delegated work and open questions,
    each under its own title (the digest has no sections of its own for them)."""
    return [
        _Section(title, _quoted(earlier[title]), list(previous), priority=4, share=0.05)
        for title in LLM_CARRIED
        if title in earlier
    ]


# --- files ------------------------------------------------------------------------------------


def _accumulated_files(facts: Facts, earlier: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(path, kinds), newest first: the range's files in first-use order, then those only
    earlier summaries listed (a path used again gets its new kinds after its earlier ones), so
    that a cut of the list drops the files least recently used."""
    known: dict[str, list[str]] = {}
    for path, kinds in _earlier_files(earlier):
        held = known.setdefault(path, [])
        held.extend(k for k in kinds if k not in held)
    ordered = [record.path for record in facts.files]
    for record in facts.files:
        held = known.setdefault(record.path, [])
        held.extend(k for k in record.kinds if k not in held)
    shown = set(ordered)
    ordered.extend(path for path in known if path not in shown)
    return [(path, known[path]) for path in ordered]


def _earlier_files(earlier: dict[str, str]) -> list[tuple[str, list[str]]]:
    """The files an earlier summary listed: a digest's ``Files touched``, an LLM's
    ``Artifacts and files touched``, and the file lines of a repair."""
    repaired = "\n".join(
        f"- {b}" for b in _bullets(earlier.get(KEPT_FACTS_TITLE, "")) if _FILE_LINE.match(f"- {b}")
    )
    return [
        *parse_files(earlier.get(FILES, "")),
        *parse_files(earlier.get(LLM_FILES, "")),
        *parse_files(repaired),
    ]


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
