"""What looks random: a token generated rather than written (a key, a password, a token's
body), told from names in code, paths, tags and hashes. The digest publishes none."""

from __future__ import annotations

import math
import re
from collections import Counter


def entropy(value: str) -> float:
    """Shannon entropy, in bits per character."""
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


# --- what looks random ------------------------------------------------------------------------

# Words of a name: a capitalized or lower-case word, an acronym, a number.
_FRAGMENTS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")
_CUT = re.compile(r"[^A-Za-z0-9]+")
_SEGMENT = re.compile(r"[^/=]+")
# A change of kind of character that words do not make: a digit after a letter or before one,
# a capital after a small letter or a digit (a capital starting a word is not one).
_SWITCHES = re.compile(r"(?<=[a-z])[A-Z0-9]|(?<=[A-Z])[0-9]|(?<=[0-9])[A-Za-z]")
_VOWELS = frozenset("aeiouAEIOU")
# A hash (hex digits in one case, 7+: a git commit abbreviated), a git describe's ``g<hash>``
# (``1.2.dev64+g6ed769d58d``) or a number: what it names is no secret, and a conversation
# cites it (a commit, a wheel's cache path, a UUID's parts, a line number).
_HASH = re.compile(r"g?[0-9a-f]{7,}|[0-9A-F]{7,}|[0-9]+")


def _unhashed(text: str) -> str:
    """The letters and digits of ``text`` but for its pieces that are hashes or numbers."""
    return "".join(p for p in _CUT.split(text) if not _HASH.fullmatch(p))


MIN_RANDOM_CHARS = 16


def looks_random(token: str) -> bool:
    """Whether ``token`` (a run of base64 characters: letters, digits, ``+ / = _ -``) looks
    generated rather than written: 16+ letters and digits that read as no words, or a span of
    its ``/``- or ``=``-separated segments as varied as detect-secrets' high-entropy rule says
    a secret is (more than 4.5 bits a character) that is not mostly words. Names in code
    (``ForeignKeyRawIdWidget``, ``django/contrib/auth/locale/zh_Hans``), version and platform
    tags (``cp39-manylinux_2_17_x86_64``: short pieces) and hashes (hex digits in one case: a
    git commit, a SHA-256, a UUID's parts; set aside before the rest is judged) are not."""
    core = token.strip("=/_-")
    if len(core) < MIN_RANDOM_CHARS:
        return False
    # A run cut often (a tag, a path) is judged piece by piece; one cut seldom (base64, whose
    # 64 characters hold 2 or 4 cuts) as one.
    pieces = _CUT.split(core) if len(_CUT.findall(core)) * 8 > len(core) else [core]
    for piece in pieces:
        letters = _unhashed(piece)
        if len(letters) >= MIN_RANDOM_CHARS and _randomness(letters) >= 2.0:
            return True
    if core.lower() == core or core.upper() == core:
        return False
    # Measured as detect-secrets measures, a ``-`` or ``_`` at either end included (base64url).
    spans = _spans(token.strip("=/"))
    return any(entropy(span) > 4.5 and not _mostly_words(span) for span in spans)


_MAX_SEGMENTS = 12


def _spans(core: str) -> list[str]:
    """Each run of consecutive ``/``- or ``=``-separated segments of ``core`` of 16+
    characters (a key in a path, a value after its name), at most 12 segments apart."""
    bounds = [m.span() for m in _SEGMENT.finditer(core)]
    return [
        core[bounds[i][0] : bounds[j][1]]
        for i in range(len(bounds))
        for j in range(i, min(i + _MAX_SEGMENTS, len(bounds)))
        if bounds[j][1] - bounds[i][0] >= MIN_RANDOM_CHARS
    ]


def _mostly_words(span: str) -> bool:
    """A path, an assignment or a title with half its letters or more in segments that read
    as words (numbers and hashes set aside: ``220617516_Polynomial_Algorithms_for_…``)."""
    total = worded = 0
    for segment in _SEGMENT.findall(span):
        letters = _unhashed(segment)
        total += len(letters)
        if letters and _reads_as_words(letters):
            worded += len(letters)
    return worded * 2 >= total


def _reads_as_words(letters: str) -> bool:
    """A segment of words: in one case (``site-packages``, ``LC_MESSAGES``), or long and not
    random (``ForeignKeyRawIdWidget``); a random one mixes cases in ones and twos."""
    if letters.islower() or letters.isupper():
        return True
    return len(letters) >= 8 and _randomness(letters) < 1.5


def _randomness(letters: str) -> float:
    """About 1 for names in code, 2 and more for random letters and digits: how varied the
    characters are (normalized entropy), how little of them reads as words or numbers, how
    often the kind of character changes, and how short its words are."""
    n = len(letters)
    fragments = _FRAGMENTS.findall(letters)
    spread = entropy(letters) / math.log2(n)
    unworded = 1 - _worded(fragments) / n
    switches = len(_SWITCHES.findall(letters)) / (n - 1)
    return spread + unworded + switches + len(fragments) / n


def _worded(fragments: list[str]) -> int:
    """Characters in words of 4+ letters with a vowel, or in numbers of 4+ digits (a date, a
    version: random text seldom holds one)."""
    return sum(len(f) for f in fragments if len(f) >= 4 and (f.isdigit() or _VOWELS & set(f)))


# --- what the digest publishes ------------------------------------------------------------------

RANDOM_PLACEHOLDER = "[random token]"
# A run of base64 characters, only where one starts (linear); ``.`` ends it, so a file's
# extension is never part of it.
_RUN = re.compile(rf"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/=_-]{{{MIN_RANDOM_CHARS},}}+")
_SEPARATED = re.compile(r"([/=]+)")


def without_random_tokens(text: str) -> str:
    """``text`` with each run of base64 characters that :func:`looks_random` replaced by
    :data:`RANDOM_PLACEHOLDER`, but for the segments at either end of it that read as words
    (``/tmp/`` and ``/report`` around a random directory, ``AccountKey=`` before a key)."""
    if len(text) < MIN_RANDOM_CHARS:
        return text
    return _RUN.sub(_masked, text)


def _masked(run: re.Match[str]) -> str:
    token = run.group(0)
    if not looks_random(token):
        return token
    parts = _SEPARATED.split(token)
    first, last = 0, len(parts) - 1
    while first <= last and _wording(parts[first]):
        first += 1
    while last >= first and _wording(parts[last]):
        last -= 1
    if first > last:  # random as a whole, no segment alone: all of it goes
        return RANDOM_PLACEHOLDER
    return "".join(parts[:first]) + RANDOM_PLACEHOLDER + "".join(parts[last + 1 :])


# Words in one case or capitalized (``tmp``, ``TOKEN_X``, ``AccountKey``), a number after them
# (``python3``): a random segment seldom is one (``kqfdslaz8i6x``, ``ZEVYPZSofgz`` are not).
_WORDING = re.compile(r"(?:[a-z]+|[A-Z]+|(?:[A-Z][a-z]+)+)[0-9]{0,3}")


def _wording(segment: str) -> bool:
    """A separator, or a segment that reads as words."""
    letters = _NOT_ALNUM.sub("", segment)
    return not letters or _WORDING.fullmatch(letters) is not None
