"""A whole tool result, as a conversation carries it: a string (plain or JSON text) or a JSON value.

Strings that are byte-exact JSON text (see :mod:`jsontext`) go through the JSON codecs and are
written back in their own style. Other strings are split into shell wrapper and bodies
(:mod:`envelope`); each body takes its cheapest plain-text form, or stays as it is. JSON values
go through :mod:`structured`. ``decode`` is the inverse of ``encode`` and leaves every raw result
that :func:`raw_form` lets through exactly as it is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from worker.compress import envelope, jsontext, policy, structured, text
from worker.compress.limits import ExpansionBudget
from worker.compress.node import FMT, Json
from worker.compress.tally import Delta, Pending, TokenTally, is_split_point
from worker.compress.textform import VERBATIM_HEADER


@dataclass(frozen=True, slots=True)
class Candidate:
    """A compressed result, the forms it used ('+'-joined), and its exact token delta."""

    output: Json
    codec: str
    delta: Delta


@dataclass(frozen=True, slots=True)
class _Body:
    """One body of a shell result as it will go out, with both sides as pieces.

    ``delta`` is None for a body no form compressed (left as it is or escaped): most bodies are,
    and their delta only matters when another body of the result compresses (:func:`_delta_of`).
    """

    output: str
    forms: frozenset[str]
    original_pieces: Sequence[str]
    pieces: Sequence[str]
    delta: Delta | None


def serialized(output: Json) -> str:
    """The text whose tokens a result costs: a string itself, a JSON value compact."""
    return output if isinstance(output, str) else structured.dumps(output)


def encode(
    tool_name: str, output: Json, tally: TokenTally, *, min_saving: float = 0.0
) -> Candidate | None:
    if isinstance(output, str):
        if text.is_framed(output):
            return None  # it can only go out escaped whole
        parsed = jsontext.parse(output)
        if parsed is not None:
            return _encode_json_text(tool_name, output, parsed, tally)
        return _encode_text(output, tally, min_saving)
    if isinstance(output, (dict, list)):
        if policy.is_truncated_preview(tool_name, output):
            return None
        encoder = structured.TreeEncoder(tally)
        tree = encoder.top(tool_name, output)
        codec = _codec_name(encoder.forms)
        if codec is None:
            return None
        return Candidate(tree, codec, tally.delta([serialized(output)], [serialized(tree)]))
    return None


def _codec_name(forms: Iterable[str]) -> str | None:
    """'+'-joined form names, or None when the only forms used were escapes."""
    names = set(forms)
    if not names - {structured.LITERAL, text.VERBATIM}:
        return None
    return "+".join(sorted(names))


def _encode_json_text(
    tool_name: str, raw: str, parsed: tuple[Json, jsontext.JsonStyle], tally: TokenTally
) -> Candidate | None:
    value, style = parsed
    if policy.is_truncated_preview(tool_name, value):
        return None
    encoder = structured.TreeEncoder(tally)
    tree = encoder.top(tool_name, value)
    codec = _codec_name(encoder.forms)
    if codec is None:
        return None
    compressed = style.dump(tree)
    return Candidate(compressed, codec, tally.delta([raw], [compressed]))


def _encode_text(raw: str, tally: TokenTally, min_saving: float) -> Candidate | None:
    parts = envelope.split(raw) or ["", raw, ""]
    bodies = [_encode_body(parts[index], tally, min_saving) for index in range(1, len(parts), 2)]
    codec = _codec_name(form for body in bodies for form in body.forms)
    if codec is None:
        return None
    compressed = parts.copy()
    for index, body in enumerate(bodies):
        compressed[2 * index + 1] = body.output
    return Candidate(envelope.join(compressed), codec, _wrapped_delta(parts, bodies, tally))


def _wrapped_delta(parts: list[str], bodies: list[_Body], tally: TokenTally) -> Delta:
    """The bodies' deltas add up when every wrapper meets its bodies at split points (the corpus
    wrappers end in a newline, so they do); otherwise count the runs of the whole texts."""
    wrappers = parts[0::2]
    if all(_meets(wrappers[i], body, wrappers[i + 1]) for i, body in enumerate(bodies)):
        present = [wrapper for wrapper in wrappers if wrapper]
        unchanged = Delta(Pending(), 0, tally.pending(Counter(present)))
        return sum((_delta_of(body, tally) for body in bodies), unchanged)
    original = _interleave(wrappers, [body.original_pieces for body in bodies])
    candidate = _interleave(wrappers, [body.pieces for body in bodies])
    return tally.delta(original, candidate)


def _delta_of(body: _Body, tally: TokenTally) -> Delta:
    if body.delta is not None:
        return body.delta
    if body.forms:  # escaped with the verbatim header
        return tally.delta(body.original_pieces, body.pieces)
    original = body.output  # left as it is: all of it is shared
    return Delta(Pending(), 0, tally.pending(Counter([original]) if original else Counter()))


def _meets(before: str, body: _Body, after: str) -> bool:
    for pieces in (body.original_pieces, body.pieces):
        first = next((piece for piece in pieces if piece), None)
        last = next((piece for piece in reversed(pieces) if piece), None)
        if first is None or last is None:
            return False
        if before and not is_split_point(before, first):
            return False
        if after and not is_split_point(last, after):
            return False
    return True


def _interleave(wrappers: list[str], bodies: list[Sequence[str]]) -> list[str]:
    pieces = [wrappers[0]]
    for body, wrapper in zip(bodies, wrappers[1:], strict=True):
        pieces += [*body, wrapper]
    return pieces


def _encode_body(body: str, tally: TokenTally, min_saving: float) -> _Body:
    """The cheapest form of one body, or the body itself (escaped if it would be misread)."""
    parsed = jsontext.parse(body)
    if parsed is not None:
        candidate = _encode_json_text("", body, parsed, tally)
        if candidate is not None and tally.saves(candidate.delta):
            forms = frozenset(candidate.codec.split("+"))
            return _Body(candidate.output, forms, [body], [candidate.output], candidate.delta)
    else:
        choice = text.best_form(body, tally, min_saving=min_saving)
        if choice is not None:
            forms = frozenset({choice.form})
            return _Body(choice.text, forms, choice.original_pieces, choice.pieces, choice.delta)
    raw = raw_body(body)
    if raw is body:
        return _Body(body, frozenset(), [body], [body], None)
    return _Body(raw, frozenset({text.VERBATIM}), [body], [raw], None)


def raw_body(body: str) -> str:
    """``body`` itself, or with the verbatim header when expanding would read it as a form."""
    return VERBATIM_HEADER + body if _mentions_forms(body) else body


def raw_form(output: Json) -> Json:
    """``output`` as it is, or escaped when :func:`decode` would read any of it as a form.

    This only looks for headers and ``_fmt`` keys and never expands anything, so raw output
    crafted to expand enormously is escaped at the cost of a scan.
    """
    if isinstance(output, str):
        parts = envelope.split(output)
        bodies = [output] if parts is None else parts[1::2]
        misread = text.is_framed(output) or any(_mentions_forms(body) for body in bodies)
        return VERBATIM_HEADER + output if misread else output
    if isinstance(output, (dict, list)) and structured.mentions_forms(output):
        return {FMT: structured.LITERAL, "value": output}
    return output


def _mentions_forms(body: str) -> bool:
    if text.is_framed(body):
        return True
    parsed = jsontext.parse(body)
    return parsed is not None and structured.mentions_forms(parsed[0])


def decode(output: Json) -> Json:
    budget = ExpansionBudget("decompress")
    if isinstance(output, str):
        return _decode_string(output, budget)
    if isinstance(output, (dict, list)) and structured.mentions_forms(output):
        return structured.decode(output, budget)
    return output


def _decode_string(output: str, budget: ExpansionBudget) -> str:
    expanded = text.expand(output, budget)
    if expanded is not None:
        return expanded
    parts = envelope.split(output)
    if parts is None:
        return _decode_body(output, budget)
    for index in range(1, len(parts), 2):
        parts[index] = _decode_body(parts[index], budget)
    return envelope.join(parts)


def _decode_body(body: str, budget: ExpansionBudget) -> str:
    expanded = text.expand(body, budget)
    if expanded is not None:
        return expanded
    parsed = jsontext.parse(body)
    if parsed is None or not structured.mentions_forms(parsed[0]):
        return body
    value, style = parsed
    return style.dump(structured.decode(value, budget))
