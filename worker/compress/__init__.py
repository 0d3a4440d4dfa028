"""Lossless tool-output compression (the forms are described in docs/compression.md).

``compress_tool_result(tool, output)`` returns a token-cheaper form of a tool result that a model
can read as it is, or ``output`` itself; ``decompress_tool_result(tool, compressed)`` gives back
exactly the original: the same bytes for strings, the same value (key order and types included)
for JSON. Strings go out as strings and JSON values as JSON values (an array of objects may go
out as the object of its ``csv`` form).

Forms, each self-describing (a one-line header for text, a ``_fmt`` key for JSON):

- plain text, chosen per output by exact token count: ``grep-by-file`` (grep lines under a
  ``## PATH`` heading), ``paths-by-dir`` (``DIR/ a b``), ``listing-packed`` (``ls`` entries
  separated by spaces), ``listing-tree`` (``ls -R`` packed, subdirectory headings indented by
  name), ``long-listing`` (``ls -l`` single-spaced, the common owner and date said once),
  ``numbered-lines`` (``nl -ba``/``cat -n`` without number padding),
  ``repeated-lines`` (``line [xN]``). Shell wrappers such as ``<returncode>..<output>`` stay
  byte for byte around the compressed body.
- JSON: ``grep-v1``, ``glob-v1``, ``csv``, ``rle-lines``, ``read_file-v1`` (field
  drops), applied recursively through any JSON value (``delegate_task``), plus ``json-text`` for
  JSON text inside a string; JSON text is only treated as JSON when it can be rewritten byte for
  byte (:mod:`worker.compress.jsontext`), otherwise it is text.

The gate: a result is compressed only when it has more than ``min_tokens`` tokens and the
compressed form saves more than ``min_saving`` of them, both counted exactly with the model's
tokenizer; every compressed form is expanded again and compared before it is returned. MCP
results, ``ask_user``, ``write_file`` and ``edit_file`` are left alone, and so are results marked
``truncated: true`` (bash, web_fetch: a bounded preview; read_file's flag only means a partial
view, so those still lose their derivable fields). The only output ever larger than its input is
a raw result that already looks like a compressed form: it is escaped (``codec`` ``"verbatim"``
or ``"literal"``) so that decompressing can never misread it. Decompressing is bounded
(:mod:`worker.compress.limits`), so a crafted form cannot expand without limit.

The same input always yields the same output, so a projected request keeps its prompt-cache
prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.compress import output as codec
from worker.compress import policy, structured
from worker.compress.node import same_json
from worker.compress.tally import TokenTally
from worker.errors import CompressionError
from worker.tokens import count_tokens

__all__ = [
    "CODECS_VERSION",
    "CompressionOutcome",
    "compress_tool_result",
    "compress_with_stats",
    "decompress_tool_result",
]

# Bumped whenever any codec's output changes for some input: a worker caches compressed bodies
# under this version, and a conversation's memo written by workers of another version (a rolling
# deploy) is not taken. tests/unit/test_compress_version.py fails when outputs change without a
# bump.
CODECS_VERSION = 1


@dataclass(frozen=True, slots=True)
class CompressionOutcome:
    """What :func:`compress_with_stats` did.

    ``compressed`` is true when ``output`` differs from the input; ``codec`` then names the forms
    used, '+'-joined. Token counts are of the text a result costs: a string itself, a JSON value
    serialized compactly.
    """

    output: Any
    codec: str | None
    tokens_before: int
    tokens_after: int
    compressed: bool


def compress_tool_result(
    tool_name: str,
    output: Any,
    *,
    min_tokens: int = 200,
    min_saving: float = 0.15,
    model: str | None = None,
) -> Any:
    """``output`` in a cheaper lossless form, or ``output`` itself when that does not pay."""
    outcome = _compress(
        tool_name, output, min_tokens=min_tokens, min_saving=min_saving, model=model, stats=False
    )
    return outcome.output


def compress_with_stats(
    tool_name: str,
    output: Any,
    *,
    min_tokens: int = 200,
    min_saving: float = 0.15,
    model: str | None = None,
) -> CompressionOutcome:
    """Like :func:`compress_tool_result`, with exact token counts before and after."""
    return _compress(
        tool_name, output, min_tokens=min_tokens, min_saving=min_saving, model=model, stats=True
    )


def decompress_tool_result(tool_name: str, compressed: Any) -> Any:
    """The exact original of anything :func:`compress_tool_result` returned for ``tool_name``.

    Raises :class:`~worker.errors.CompressionError` for a malformed or unknown compressed form.
    """
    if policy.leaves_alone(tool_name):
        return compressed
    try:
        return codec.decode(compressed)
    except RecursionError as exc:
        raise CompressionError("compressed form nested too deeply to expand") from exc


def _compress(
    tool_name: str,
    output: Any,
    *,
    min_tokens: int,
    min_saving: float,
    model: str | None,
    stats: bool,
) -> CompressionOutcome:
    if policy.leaves_alone(tool_name):
        return _unchanged(output, model, stats=stats)
    if not _surely_within(output, min_tokens):
        tally = TokenTally(model)
        try:
            candidate = codec.encode(tool_name, output, tally, min_saving=min_saving)
        except (RecursionError, ValueError):  # a value JSON cannot write: too deep, huge ints
            candidate = None
        if candidate is not None:
            outcome = _gate(candidate, tally, min_tokens, min_saving, stats=stats)
            if outcome is not None and _expands_to(candidate.output, output):
                return outcome
    raw = codec.raw_form(output)
    if raw is output:
        return _unchanged(output, model, stats=stats)
    name = structured.LITERAL if isinstance(raw, dict) else "verbatim"
    before, after = (_tokens(output, model), _tokens(raw, model)) if stats else (0, 0)
    return CompressionOutcome(raw, name, before, after, True)


def _gate(
    candidate: codec.Candidate,
    tally: TokenTally,
    min_tokens: int,
    min_saving: float,
    *,
    stats: bool,
) -> CompressionOutcome | None:
    """The outcome if ``candidate`` passes the gate (exact token counts), else None.

    Without stats, the unchanged bulk is only counted as far as it takes to settle the gate (the
    outcome's counts are then left at 0: only its output is used); with stats it is counted
    once, for both sides.
    """
    delta = candidate.delta
    if not stats:
        passed = tally.passes(delta, min_tokens=min_tokens, min_saving=min_saving)
        return CompressionOutcome(candidate.output, candidate.codec, 0, 0, True) if passed else None
    before, after = tally.counts(delta)
    if before > min_tokens and before - after > min_saving * before:
        return CompressionOutcome(candidate.output, candidate.codec, before, after, True)
    return None


def _surely_within(output: Any, min_tokens: int) -> bool:
    """True when a string cannot have more than ``min_tokens`` tokens (each token is >= 1 byte),
    so the common case of a short result costs no tokenization at all."""
    if not isinstance(output, str) or len(output) > min_tokens:
        return False
    return (
        len(output) * 4 <= min_tokens or len(output.encode("utf-8", "surrogatepass")) <= min_tokens
    )


def _expands_to(compressed: Any, original: Any) -> bool:
    """The safety net: a form is only returned after expanding it gave the original back."""
    try:
        expanded = codec.decode(compressed)
        if isinstance(original, str):
            return isinstance(expanded, str) and expanded == original
        return same_json(expanded, original)
    except (CompressionError, RecursionError):
        return False


def _unchanged(output: Any, model: str | None, *, stats: bool) -> CompressionOutcome:
    tokens = _tokens(output, model) if stats else 0
    return CompressionOutcome(output, None, tokens, tokens, False)


def _tokens(output: Any, model: str | None) -> int:
    if not isinstance(output, (str, dict, list)):
        return 0
    try:
        return count_tokens(codec.serialized(output), model)
    except (RecursionError, ValueError):  # not JSON-writable, so it costs nothing we can count
        return 0
