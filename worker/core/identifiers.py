"""The code names a range taught the agent, ranked by how likely it is to use them again.

Agents go on to use the names they touched or learned: the classes and functions they edited,
called or found defined, the dotted names they imported, the constants they set, the paths a
search printed. A summary that paraphrases them ("the settings module") forces the agent to
search again, so the digest lists them verbatim. Each name is ranked by where the range held it
(the agent's own calls first, then its text, then what tools printed), then by how often, then
by how recently; the digest keeps the best ranked that fit its bound.

What counts as a code name (shape alone, no knowledge of any project): a path (a ``/`` between
name characters, or a name with a short extension); a dotted name (``a.b`` of identifiers, not
a file name); an identifier with an inner or leading ``_`` (``construct_instance``, ``_meta``),
in mixedCase (``getValue``), in CamelCase with two capitals (``QuerySet``) or in UPPER_CASE
with ``_`` (``INSTALLED_APPS``); and a plain name where code defines or calls it (``class
Meta``, ``def configure``, ``settings.configure(``). Python keywords, builtins, dunders and
names under three characters are never names worth a token.
"""

from __future__ import annotations

import bisect
import builtins
import json
import keyword
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from worker.wire.models import Message

# Where a name was seen, best first: the agent's own calls, its text, a user, a tool's output.
CALLS, TEXT, USER, OUTPUT = 0, 1, 2, 3
TIERS = (CALLS, TEXT, USER, OUTPUT)

# Possessive (``*+``): a name is never re-scanned shorter, which keeps every pattern linear.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*+"
_PATH = re.compile(
    # Each alternative starts only where a name starts (the lookbehind), so a long run of name
    # characters is scanned once, not once per position.
    r"(?<![\w/.~@+-])(?:(?:\.{0,2}/)?(?:[\w.@+-]++/)+[\w.@+-]*[\w/]"
    r"|[\w@+-]{2,}+\.[A-Za-z][A-Za-z0-9]{0,5}\b)"
)
_DOTTED = re.compile(rf"(?<![\w.]){_NAME}(?:\.{_NAME})+(?![\w(]*/)")
_WORD = re.compile(_NAME)
_DEFINED = re.compile(rf"\b(?:def|class|function|fn|func|interface|struct|type)\s+({_NAME})")
_CALLED = re.compile(rf"(?<![\w])({_NAME})\(")
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,5}$")
# Extensions that name a file; a dotted name ending in one is a path, not an attribute chain.
_FILE_EXTENSIONS = frozenset(
    extension
    for line in (
        "py pyi pyx ipynb js jsx mjs cjs ts tsx rs go java kt rb php c h cc cpp hpp cs swift m",
        "sh bash zsh toml yaml yml json jsonl ini cfg conf txt md rst csv tsv xml html htm css",
        "scss sql lock log patch diff proto graphql vue svelte gradle properties env mk cmake",
    )
    for extension in line.split()
)
# Keywords, builtins and the methods of built-in types (``append``, ``strip``) name nothing of
# the project the agent works on.
_NEVER = frozenset(
    [*keyword.kwlist, *keyword.softkwlist, *dir(builtins)]
    + [a for t in (str, bytes, list, dict, set, tuple, int, float) for a in dir(t)]
)
# A dotted name headed by these is an attribute chain on an object, not a name to look up.
_NOT_HEADS = frozenset(["self", "cls", "this"])
MIN_NAME = 3
MAX_NAME_CHARS = 120
MAX_ARGUMENT_DEPTH = 20


@dataclass
class CodeName:
    """One name, its best tier, how often and how late the range held it."""

    text: str
    tier: int
    count: int = 0
    last: int = 0  # the position of its newest occurrence (a running counter)
    message_ids: list[str] = field(default_factory=list)  # the messages that held it

    def rank(self) -> tuple[int, int, int]:
        return (self.tier, -min(self.count, 8), -self.last)


def code_names(messages: Iterable[Message]) -> list[CodeName]:
    """Every code name of ``messages``, best ranked first (see the module's docstring)."""
    found: dict[str, CodeName] = {}
    position = 0
    for message_id, tier, text in _texts(messages):
        for name in names_in(text):
            position += 1
            seen = found.get(name)
            if seen is None:
                seen = found[name] = CodeName(name, tier)
            seen.tier = min(seen.tier, tier)
            seen.count += 1
            seen.last = position
            if not seen.message_ids or seen.message_ids[-1] != message_id:
                seen.message_ids.append(message_id)
    return sorted(found.values(), key=CodeName.rank)


def names_in(text: str) -> Iterator[str]:
    """The code names of one text, repeats included: paths and dotted names first, then the
    words outside them (a longer name already shows the words inside it)."""
    taken: list[tuple[int, int]] = []
    for match in _PATH.finditer(text):
        path = match.group(0).rstrip("./")
        if _is_path(path):
            taken.append(match.span())
            yield path
    for match in _DOTTED.finditer(text):
        if _is_dotted(match.group(0)) and not _inside(match.start(), taken):
            taken.append(match.span())
            yield match.group(0)
    taken.sort()
    plain = {
        m.group(1) for p in (_DEFINED, _CALLED) for m in p.finditer(text) if _plain(m.group(1))
    }
    for match in _WORD.finditer(text):
        word = match.group(0)
        if (word in plain or _is_name(word)) and not _inside(match.start(), taken):
            yield word


def _inside(position: int, spans: list[tuple[int, int]]) -> bool:
    """Whether ``position`` falls in one of the sorted, disjoint-enough ``spans``."""
    at = bisect.bisect_right(spans, (position, 1 << 62)) - 1
    return at >= 0 and spans[at][0] <= position < spans[at][1]


def _texts(messages: Iterable[Message]) -> Iterator[tuple[str, int, str]]:
    for m in messages:
        if m.role == "assistant":
            yield m.id, TEXT, m.content
            for call in m.tool_calls:
                yield from ((m.id, CALLS, s) for s in _argument_strings(call.arguments))
        elif m.role == "tool":
            yield m.id, OUTPUT, m.content
        elif m.role == "user":
            yield m.id, USER, m.content


def _argument_strings(arguments: str) -> list[str]:
    """The string values of a call's JSON arguments (the raw text when it is not JSON)."""
    try:
        value: Any = json.loads(arguments) if arguments else {}
    except (ValueError, RecursionError):
        return [arguments]
    out: list[str] = []
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif depth < MAX_ARGUMENT_DEPTH and isinstance(item, dict):
            stack.extend((v, depth + 1) for v in reversed(item.values()))
        elif depth < MAX_ARGUMENT_DEPTH and isinstance(item, list):
            stack.extend((v, depth + 1) for v in reversed(item))
    return out


def _is_path(text: str) -> bool:
    if not MIN_NAME <= len(text) <= MAX_NAME_CHARS or "//" in text or text.startswith("@"):
        return False
    if "/" in text.strip("/"):
        # A one-letter segment is a sed script or prose (``s/old/new``, ``and/or``).
        segments = [s for s in text.split("/") if s not in ("", ".", "..", "~")]
        return all(len(s) >= 2 for s in segments) and any(c.isalpha() for c in text)
    extension = _EXTENSION.search(text)
    return extension is not None and extension.group(0)[1:].lower() in _FILE_EXTENSIONS


def _is_dotted(text: str) -> bool:
    parts = text.split(".")
    if len(text) > MAX_NAME_CHARS or parts[-1].lower() in _FILE_EXTENSIONS:
        return False
    if parts[0] in _NOT_HEADS or parts[0] in sys.stdlib_module_names or len(parts[0]) < 2:
        return False
    # Three parts, or a part shaped like code or a class (``models.Model``, ``Database.connect``).
    return len(parts) >= 3 or any(_is_name(p) or p[:1].isupper() for p in parts)


def _is_name(word: str) -> bool:
    """An identifier whose shape says it is code, not prose."""
    if len(word) < MIN_NAME or len(word) > MAX_NAME_CHARS or word in _NEVER:
        return False
    if word.startswith("__") and word.endswith("__"):
        return False
    if not any(c.isalpha() for c in word):
        return False
    if "_" in word.strip("_") or word.startswith("_"):
        return True
    body = word[1:]
    if word[0].islower() and any(c.isupper() for c in body):  # mixedCase
        return True
    return word[0].isupper() and any(c.isupper() for c in body) and not word.isupper()


def _plain(word: str) -> bool:
    """A plain name that code defines or calls (``configure``, ``Meta``)."""
    return len(word) >= MIN_NAME and word not in _NEVER and not word.startswith("__")


def shown_by(name: str) -> set[str]:
    """The shorter names that ``name`` already shows whole (``a.b.Model`` shows ``b.Model``
    and ``Model``; ``x/y/z.py`` shows ``y/z.py`` and ``z.py``): listing them again would
    spend tokens for nothing."""
    segments = name.split("/")
    shown = {
        "/".join(segments[i:j])
        for i in range(len(segments))
        for j in range(i + 1, len(segments) + 1)
    }
    for segment in segments:
        parts = segment.split(".")
        shown.update(
            ".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)
        )
    shown.discard(name)
    shown.discard("")
    return shown
