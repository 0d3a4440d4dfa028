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

A token that looks random is no name: a secret's shape (a base64-wrapped key, an account key,
a token's body, a password) or a hash in a path. Each run of base64 characters is judged by
:func:`worker.core.redaction.looks_random` whole (a run across ``+`` and ``=``, which cut
tokens, too: a key is judged whole, not piece by piece), and no name of a random run is listed.
"""

from __future__ import annotations

import builtins
import keyword
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from worker.core.facts import argument_strings
from worker.core.last_answer import LastAnswer
from worker.core.redaction import MIN_RANDOM_CHARS, looks_random
from worker.wire.models import Message

# Where a name was seen, best first: the agent's own calls, its text, a user, a tool's output.
CALLS, TEXT, USER, OUTPUT = 0, 1, 2, 3

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED_IDENTIFIERS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_LETTER = re.compile(r"[A-Za-z]")
_DEFINING = ("def ", "class ", "function ", "func ", "interface ", "struct ")
_DEFINED_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)")
# Every byte that cannot be part of an ASCII name, a path or a call becomes a space, so that
# ``bytes.translate`` and ``bytes.split`` (both in C, far faster than ``re`` or
# ``str.translate``) cut a text into tokens; only the distinct tokens are looked at in Python.
_TOKEN_CHARS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./~-("
_SEPARATE = bytes(c if c in _TOKEN_CHARS else 32 for c in range(256))
# A string literal's escapes, as a script passed in a command holds them: they end a token.
_ESCAPES = ("\\n", "\\t", "\\r")
_ESCAPE_BYTES = tuple(escape.encode() for escape in _ESCAPES)
# A token that holds no name: after a flag's dashes, a slash or a parenthesis, a number, a word
# (digits allowed), an acronym or a capitalized word, then a sentence's full stops.
_PLAIN_SHAPE = (
    rb"[-/(]*+(?:[0-9]++|(?=[0-9]*[a-z])[a-z0-9]++|(?=[0-9]*[A-Z])[A-Z0-9]++"
    rb"|[A-Za-z0-9](?=[0-9]*[a-z])[a-z0-9]++)\.*+"
)
_PLAIN = re.compile(_PLAIN_SHAPE)
_NOT_PLAIN = re.compile(rb"^(?!" + _PLAIN_SHAPE + rb"$).+$", re.MULTILINE)
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,5}$")
# Runs of base64 characters long enough to be judged random: inside a token, and (``+`` and
# ``=`` cut tokens) across tokens, only where a run starts and only those holding a cut.
_BASE64_RUNS = re.compile(rf"[A-Za-z0-9/_-]{{{MIN_RANDOM_CHARS},}}")
_RUNS_ACROSS_CUTS = re.compile(
    rb"(?<![A-Za-z0-9+/=_-])(?=[A-Za-z0-9+/=_-]{%d})[A-Za-z0-9/_-]*+[+=][A-Za-z0-9+/=_-]*+"
    % MIN_RANDOM_CHARS
)
_CUTS = re.compile(rb"[+=]+")
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


@dataclass
class CodeName:
    """One name, its best tier, how often and how late the range held it."""

    text: str
    tier: int
    count: int = 0
    last: int = 0  # how late its tier's texts held it last (an order, within a tier only)

    def rank(self) -> tuple[int, int, int, str]:
        return (self.tier, -min(self.count, 8), -self.last, self.text)


def code_names(messages: list[Message]) -> list[CodeName]:
    """Every code name of ``messages``, best ranked first (see the module's docstring).

    One compaction asks twice for the same messages (the LLM's checklist, the digest): the last
    answer of this thread is reused when the messages are the very same objects. Callers must
    not modify the result."""
    return _LAST_NAMES(messages)


def _code_names(messages: list[Message]) -> list[CodeName]:
    found: dict[str, CodeName] = {}
    # Each distinct token's names, over all tiers: none for the pieces of random runs.
    known: dict[bytes, tuple[str, ...]] = dict.fromkeys(_random_pieces(_texts(messages)), ())
    # One pass per tier over its texts joined: the C-level tokenizing and counting then carry
    # the work, and Python only looks into the few distinct tokens shaped like code.
    by_tier: dict[int, list[str]] = {}
    for tier, text in _texts(messages):
        by_tier.setdefault(tier, []).append(text)
    for tier, texts in sorted(by_tier.items()):
        text = "\n".join(texts)
        # Counted from the end, so that the tokens come in the order in which the text holds
        # them last: a token's recency is where it comes in that order (no position list).
        counts = Counter(reversed(_tokens(text)))
        new = counts.keys() - known.keys()
        known.update(dict.fromkeys(new, ()))
        known.update((token, _token_names(token.decode("ascii"))) for token in _shaped(new))
        latest = len(counts)  # later than every token: where the definitions count as seen
        for order, token in enumerate(counts):
            for name in known[token]:
                _seen(found, name, tier, counts[token], latest - 1 - order)
        for name in _defined(text):
            _seen(found, name, tier, 1, latest)
    return sorted(found.values(), key=CodeName.rank)


def _random_pieces(texts: Iterable[tuple[int, str]]) -> set[bytes]:
    """The tokens of the runs of base64 characters that cross a ``+`` or ``=`` (tokens end
    there) and look random: a key is judged whole, and none of its pieces is a name."""
    runs = {
        run
        for _tier, text in texts
        if "+" in text or "=" in text
        for run in _RUNS_ACROSS_CUTS.findall(text.encode("utf-8", "replace"))
    }
    return {
        piece
        for run in runs
        if looks_random(run.decode("ascii"))
        for piece in _CUTS.split(run)
        if piece
    }


def _shaped(tokens: Iterable[bytes]) -> list[bytes]:
    """The tokens that may hold a name: all but words, numbers, capitalized words and acronyms
    (most tokens), told apart by one regex over them all rather than a call each."""
    return _NOT_PLAIN.findall(b"\n".join(tokens))


def _seen(found: dict[str, CodeName], name: str, tier: int, count: int, position: int) -> None:
    seen = found.get(name)
    if seen is None:
        found[name] = CodeName(name, tier, count, position)
    elif tier == seen.tier:
        seen.count += count
        seen.last = max(seen.last, position)
    # A name already seen in a better tier keeps that tier's count and recency (tiers are
    # visited best first).


def names_in(text: str) -> list[str]:
    """The code names of one text, in order, repeats included (the names a class or function
    definition gives, last)."""
    random = _random_pieces([(TEXT, text)])
    names = [n for token in _tokens(text) if token not in random for n in _names_of_token(token)]
    return names + _defined(text)


def _tokens(text: str) -> list[bytes]:
    data = text.encode("utf-8", "replace")
    if b"\\" in data:
        # A string literal's escape ends a token: ``print("\nFAILED: x")`` shows ``FAILED``,
        # not a name ``nFAILED``.
        for escape in _ESCAPE_BYTES:
            data = data.replace(escape, b"  ")
    return data.translate(_SEPARATE).split()


def _starts_word(text: str, at: int) -> bool:
    """Whether a word starts at ``at``: after no name character, or after an escape (``\\n``
    in a script passed as a string)."""
    before = text[at - 1] if at else " "
    return not (before.isalnum() or before == "_") or text[at - 2 : at] in _ESCAPES


def _defined(text: str) -> list[str]:
    """Plain names that ``def``, ``class`` and the like define (shaped names are found anyway).
    Found with ``str.find``: the keywords are rare, and a regex over the whole text is not."""
    names = []
    for defining in _DEFINING:
        at = text.find(defining)
        while at != -1:
            match = _DEFINED_NAME.match(text, at + len(defining))
            if match and _starts_word(text, at):
                name = match.group(1)
                if _plain(name) and not _is_name(name):
                    names.append(name)
            at = text.find(defining, at + len(defining))
    return names


def _names_of_token(token: bytes) -> tuple[str, ...]:
    """The names one token holds: each piece before a ``(`` is a call."""
    if _PLAIN.fullmatch(token):
        return ()  # most tokens: a word, a number, a capitalized word, an acronym
    return _token_names(token.decode("ascii"))


def _token_names(token: str) -> tuple[str, ...]:
    if len(token) >= MIN_RANDOM_CHARS and any(map(looks_random, _BASE64_RUNS.findall(token))):
        return ()  # a run in it looks random: a secret's shape or a hash, no name
    if "(" not in token:
        return _piece_names(token, called=False)
    pieces = token.split("(")
    return tuple(
        name
        for k, piece in enumerate(pieces)
        for name in _piece_names(piece, called=k < len(pieces) - 1)
    )


def _piece_names(piece: str, *, called: bool) -> tuple[str, ...]:
    """A path, a dotted name, or the shaped names of its parts (and a called plain name)."""
    piece = piece.lstrip("-").rstrip(".")
    if len(piece) < MIN_NAME or len(piece) > MAX_NAME_CHARS:
        return ()
    if "/" in piece:
        path = piece.rstrip("/")
        if is_path(path):
            return (path,)
        return tuple(n for part in piece.split("/") for n in _piece_names(part, called=False))
    if "." in piece:
        extension = piece.rpartition(".")[2]
        if extension.lower() in _FILE_EXTENSIONS and is_path(piece):
            return (piece,)
        parts = piece.strip(".").split(".")
        dotted = ".".join(parts)
        if _DOTTED_IDENTIFIERS.fullmatch(dotted) and _is_dotted(dotted):
            return (dotted,)
        names = [p for p in parts if _is_name(p)]
        if called and parts and _plain(parts[-1]) and parts[-1] not in names:
            names.append(parts[-1])
        return tuple(names)
    if "-" in piece or "~" in piece:
        return tuple(
            n
            for part in piece.replace("~", "-").split("-")
            for n in _piece_names(part, called=False)
        )
    if not _IDENTIFIER.fullmatch(piece):
        return ()
    return (piece,) if _is_name(piece) or (called and _plain(piece)) else ()


def _texts(messages: Iterable[Message]) -> Iterator[tuple[int, str]]:
    for m in messages:
        if m.role == "assistant":
            yield TEXT, m.content
            for call in m.tool_calls:
                yield from ((CALLS, s) for s in argument_strings(call.arguments))
        elif m.role == "tool":
            yield OUTPUT, m.content
        elif m.role == "user":
            yield USER, m.content


def is_path(text: str) -> bool:
    """Whether ``text`` is shaped as a path or a file name (``a/b``, ``setup.cfg``)."""
    if not MIN_NAME <= len(text) <= MAX_NAME_CHARS or "//" in text or text.startswith("@"):
        return False
    if "/" in text.strip("/"):
        # A one-letter segment is a sed script or prose (``s/old/new``, ``and/or``).
        segments = [s for s in text.split("/") if s not in ("", ".", "..", "~")]
        return all(len(s) >= 2 for s in segments) and _LETTER.search(text) is not None
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
    """An identifier whose shape says it is code, not prose. (Every text here is ASCII: a text
    differs from its lower-cased self where it has a capital.)"""
    if len(word) < MIN_NAME or len(word) > MAX_NAME_CHARS or word in _NEVER:
        return False
    if word.startswith("__") and word.endswith("__"):
        return False
    if _LETTER.search(word) is None:
        return False
    if "_" in word.strip("_") or word.startswith("_"):
        return True
    body = word[1:]
    if word[0].islower():
        return body != body.lower()  # mixedCase
    return word[0].isupper() and body != body.lower() and not word.isupper()


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
        shown.update(_dotted_runs(segment))
    shown.discard(name)
    shown.discard("")
    return shown


def names_shown(messages: Iterable[Message]) -> set[str]:
    """Every code name the messages' text and calls show whole: the names they hold, and in
    each the shorter names a reader sees whole in it (every run of a dotted name's parts, the
    tails of a path: ``a/b/c.py`` shows ``b/c.py``, not the directory ``a/b``). A summary that
    sits beside these messages need not list them. Tool outputs are not read: an older one may
    be elided later, and a name only it showed would be gone."""
    shown: set[str] = set()
    for tier, text in _texts(messages):
        if tier == OUTPUT:
            continue
        for name in names_in(text):
            shown.add(name)
            shown.update(_seen_whole_in(name))
    return shown


def _seen_whole_in(name: str) -> Iterator[str]:
    if is_path(name):
        segments = name.strip("/").split("/")
        yield from ("/".join(segments[i:]) for i in range(1, len(segments)))
    elif "." in name:
        yield from _dotted_runs(name)


def _dotted_runs(text: str) -> Iterator[str]:
    """Every run of ``text``'s dotted parts (``a.b.c``: ``a``, ``a.b``, ``b.c``, ...)."""
    parts = text.split(".")
    for i in range(len(parts)):
        for j in range(i + 1, len(parts) + 1):
            yield ".".join(parts[i:j])


# After the function it reuses the answers of.
_LAST_NAMES = LastAnswer(_code_names)
