"""What the next model request would see: a pure function of messages plus a policy.

Applied to tool-result bodies only, in this order: lossless compression (each result on its
own, deterministic, so a result projects the same way every time and providers' prompt caches
stay warm), then either the strict byte budget or the recent-count markers
(docs/configuration.md, "Projection"). The trigger is evaluated on this projection, and agents
import the same function to build the request they send, so what the worker measures is what
the model receives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from worker.cache import ContentCache, FrontCache, Recorder, content_key
from worker.compress import CODECS_VERSION, compress_tool_result
from worker.config import ProjectedToolResultBudget
from worker.core.projection_policy import ProjectionPolicy
from worker.tokens import Tokenizer
from worker.wire.events import ElidedResult
from worker.wire.models import Message

SMALL_RESULT_BYTES = 100  # keep_recent_tool_results never rewrites results this small
ELLIPSIS = "…"
PREVIEW_JOINER = "\n…[omitted]…\n"


@dataclass(frozen=True)
class Projection:
    messages: list[Message]
    bodies: dict[str, str] = field(default_factory=dict)  # call id -> changed body
    elided: list[ElidedResult] = field(default_factory=list)


def marker_for(tool: str | None) -> str:
    return f"[Previous: used {tool or 'tool'}]"


def project(
    messages: list[Message],
    policy: ProjectionPolicy,
    *,
    compressed: CompressionCache | None = None,
) -> Projection:
    """The request view of ``messages`` under ``policy``. Never mutates its input.

    ``compressed``: a cache of compressed bodies (a process's :class:`worker.reuse.Reuse` has
    one); without it every tool result is compressed again."""
    results = [i for i, m in enumerate(messages) if m.role == "tool"]
    bodies = {i: messages[i].content for i in results}
    if policy.compress_tool_results:
        bodies = {i: _compressed(messages[i], policy, compressed) for i in results}
    elided: list[ElidedResult] = []
    if policy.projected_tool_result_budget is not None:
        bodies, elided = _apply_budget(
            messages, results, bodies, policy.projected_tool_result_budget
        )
    elif policy.keep_recent_tool_results is not None:
        bodies, elided = _apply_recent(messages, results, bodies, policy.keep_recent_tool_results)
    changed = {i: b for i, b in bodies.items() if b != messages[i].content}
    if not changed:
        return Projection(messages=messages)
    projected = [
        m.model_copy(update={"content": changed[i]}) if i in changed else m
        for i, m in enumerate(messages)
    ]
    by_call = {messages[i].tool_call_id or "": b for i, b in changed.items()}
    return Projection(messages=projected, bodies=by_call, elided=elided)


# Compression is deterministic, so each distinct result is compressed once per process (and
# the outcome travels with the conversation's memo). None: the result stays as it is.
COMPRESSED_CACHE = f"compressed:v{CODECS_VERSION}"
# (tool, result, model, gate) -> the compressed body, in front of the digest-keyed cache.
CompressionInput = tuple[str, str, str, str]
CompressionCache = FrontCache[CompressionInput, str | None]


def new_compression_cache(
    *, recorder: Recorder | None = None, max_entries: int = 50_000, max_chars: int = 32 * 2**20
) -> CompressionCache:
    return FrontCache(
        ContentCache(max_entries, name=COMPRESSED_CACHE, recorder=recorder),
        max_size=max_chars,
        max_entries=max_entries,
        size_of=lambda item: sum(map(len, item)),
        key_of=lambda item: content_key(*item),
    )


def _compressed(message: Message, policy: ProjectionPolicy, cache: CompressionCache | None) -> str:
    if cache is None:
        body = _compress_now(message, policy)
    else:
        item = (
            message.tool_name or "",
            message.content,
            policy.model or "",
            f"{policy.compress_min_tokens}:{policy.compress_min_saving}",
        )
        body = cache.get_or_compute(item, lambda: _compress_now(message, policy))
    return message.content if body is None else body


def _compress_now(message: Message, policy: ProjectionPolicy) -> str | None:
    out = compress_tool_result(
        message.tool_name or "",
        message.content,
        min_tokens=policy.compress_min_tokens,
        min_saving=policy.compress_min_saving,
        model=policy.model,
    )
    return out if isinstance(out, str) and out != message.content else None


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _record(m: Message, before: str, after: str, action: str) -> ElidedResult:
    return ElidedResult(
        call_id=m.tool_call_id or "",
        tool=m.tool_name or "",
        action=action,
        bytes_before=_size(before),
        bytes_after=_size(after),
    )


def _apply_recent(
    messages: list[Message], results: list[int], bodies: dict[int, str], keep: int
) -> tuple[dict[int, str], list[ElidedResult]]:
    """Every result older than the ``keep`` newest and larger than 100 bytes becomes a marker."""
    old = results[: max(len(results) - keep, 0)]
    out = dict(bodies)
    elided = []
    for i in old:
        if _size(bodies[i]) > SMALL_RESULT_BYTES:
            out[i] = marker_for(messages[i].tool_name)
            elided.append(_record(messages[i], bodies[i], out[i], "marker"))
    return out, elided


def _is_structured(body: str) -> bool:
    head = body.lstrip()[:1]
    if head not in ("{", "["):
        return False
    try:
        json.loads(body)
    except (ValueError, RecursionError):
        return False
    return True


def _apply_budget(
    messages: list[Message],
    results: list[int],
    bodies: dict[int, str],
    budget: ProjectedToolResultBudget,
) -> tuple[dict[int, str], list[ElidedResult]]:
    """The strict aggregate cap; its steps are in docs/configuration.md ("Projection")."""
    if sum(_size(bodies[i]) for i in results) <= budget.max_bytes:
        return bodies, []
    newest_first = results[::-1]
    out, left = _placeholders(messages, newest_first, bodies, budget.max_bytes)
    left = _restore_whole(newest_first[: budget.prioritize_recent_results], bodies, out, left)
    left = _previews(newest_first, bodies, out, left, budget.max_preview_bytes)
    _restore_whole(newest_first, bodies, out, left)
    elided = [
        _record(messages[i], bodies[i], out[i], _action(bodies[i], out[i], messages[i]))
        for i in results
        if out[i] != bodies[i]
    ]
    return out, elided


def _placeholders(
    messages: list[Message], newest_first: list[int], bodies: dict[int, str], left: int
) -> tuple[dict[int, str], int]:
    """First pass: each body keeps itself if no longer than its marker, else the marker,
    else an ellipsis, else nothing, whichever first fits what is left."""
    out: dict[int, str] = {}
    for i in newest_first:
        marker = marker_for(messages[i].tool_name)
        own = [bodies[i]] if _size(bodies[i]) <= _size(marker) else []
        for candidate in [*own, marker, ELLIPSIS, ""]:
            if _size(candidate) <= left:
                out[i] = candidate
                left -= _size(candidate)
                break
    return out, left


def _restore_whole(order: list[int], bodies: dict[int, str], out: dict[int, str], left: int) -> int:
    for i in order:
        extra = _size(bodies[i]) - _size(out[i])
        if out[i] != bodies[i] and extra <= left:
            out[i] = bodies[i]
            left -= extra
    return left


def _previews(
    newest_first: list[int], bodies: dict[int, str], out: dict[int, str], left: int, cap: int
) -> int:
    """Text bodies get a head+tail preview; structured (JSON) bodies are all-or-marker."""
    for i in newest_first:
        if out[i] == bodies[i] or _is_structured(bodies[i]):
            continue
        room = min(cap, left + _size(out[i]))
        preview = head_tail_preview(bodies[i], room)
        if preview is not None and _size(preview) > _size(out[i]):
            left -= _size(preview) - _size(out[i])
            out[i] = preview
    return left


def head_tail_preview(text: str, max_bytes: int) -> str | None:
    """Head and tail of ``text`` around the omission joiner, within ``max_bytes`` of UTF-8,
    cut on character boundaries; None when not even the joiner fits or nothing would remain."""
    data = text.encode("utf-8", "surrogatepass")
    room = max_bytes - _size(PREVIEW_JOINER)
    if room <= 0 or len(data) <= max_bytes:
        return None
    head = _cut_utf8(data[: room - room // 2])
    tail = _cut_utf8_front(data[len(data) - room // 2 :]) if room // 2 else b""
    if not head and not tail:
        return None
    return (head + PREVIEW_JOINER.encode() + tail).decode("utf-8", "surrogatepass")


def _cut_utf8(chunk: bytes) -> bytes:
    """Drop a partial character at the end."""
    end = len(chunk)
    while end > 0 and end > len(chunk) - 4:
        try:
            chunk[:end].decode("utf-8")
            return chunk[:end]
        except UnicodeDecodeError:
            end -= 1
    return chunk[:end]


def _cut_utf8_front(chunk: bytes) -> bytes:
    """Drop continuation bytes at the start (a character cut in half)."""
    start = 0
    while start < len(chunk) and start < 4 and (chunk[start] & 0xC0) == 0x80:
        start += 1
    return chunk[start:]


def _action(before: str, after: str, m: Message) -> str:
    if after == marker_for(m.tool_name):
        return "marker"
    if after == ELLIPSIS:
        return "ellipsis"
    if after == "":
        return "emptied"
    return "preview"


# --- request token counting -------------------------------------------------------------------

MESSAGE_OVERHEAD_TOKENS = 3  # per message, as OpenAI's chat format frames each message
REPLY_PRIMING_TOKENS = 3  # every reply is primed with <|start|>assistant<|message|>
TOOL_CALL_OVERHEAD_TOKENS = 3


def count_message_tokens(message: Message, tokenizer: Tokenizer) -> int:
    """Tokens of one message: exact tiktoken counts of its texts plus the chat framing, plus
    its images and files as the provider bills them (:mod:`worker.wire.media`). A message a
    provider-native compaction superseded costs nothing: the provider does not read it."""
    if message.superseded:
        return 0
    n = MESSAGE_OVERHEAD_TOKENS + tokenizer.count(message.role)
    if message.content:
        n += tokenizer.count(message.content)
    if message.reasoning:
        n += tokenizer.count(message.reasoning)
    if message.attachments:
        n += message.attachment_tokens  # as the provider bills them (worker.wire.media)
    for call in message.tool_calls:
        n += (
            TOOL_CALL_OVERHEAD_TOKENS + tokenizer.count(call.name) + tokenizer.count(call.arguments)
        )
    return n


@dataclass(frozen=True)
class CountedProjection:
    """A projection with each projected message's exact token count: what the next evaluation
    of the grown conversation reuses for the messages it shares (the very same objects, as a
    parse that reuses its earlier parse hands back)."""

    source: list[Message]
    projection: Projection
    counts: list[int]  # per projected message, framing included
    policy: ProjectionPolicy
    tokenizer: str

    @property
    def tokens(self) -> int:
        return REPLY_PRIMING_TOKENS + sum(self.counts)


def project_and_count(
    messages: list[Message],
    policy: ProjectionPolicy,
    tokenizer: Tokenizer,
    prior: CountedProjection | None = None,
    *,
    compressed: CompressionCache | None = None,
) -> CountedProjection:
    """:func:`project` and count; with a ``prior`` of the same conversation, the leading
    messages it shares are neither projected nor counted again, when each message projects on
    its own (no budget or recency across messages)."""
    shared = _shared_prefix(prior, messages, policy, tokenizer)
    if prior is None or shared == 0:
        projection = project(messages, policy, compressed=compressed)
        counts = [count_message_tokens(m, tokenizer) for m in projection.messages]
        return CountedProjection(messages, projection, counts, policy, tokenizer.name)
    rest = project(messages[shared:], policy, compressed=compressed)
    kept_calls = {m.tool_call_id for m in messages[:shared] if m.role == "tool"}
    bodies = {cid: b for cid, b in prior.projection.bodies.items() if cid in kept_calls}
    projection = Projection(
        messages=prior.projection.messages[:shared] + rest.messages,
        bodies=bodies | rest.bodies,
    )
    counts = prior.counts[:shared] + [count_message_tokens(m, tokenizer) for m in rest.messages]
    return CountedProjection(messages, projection, counts, policy, tokenizer.name)


def _shared_prefix(
    prior: CountedProjection | None,
    messages: list[Message],
    policy: ProjectionPolicy,
    tokenizer: Tokenizer,
) -> int:
    if (
        prior is None
        or policy.projected_tool_result_budget is not None
        or policy.keep_recent_tool_results is not None
        or prior.policy != policy
        or prior.tokenizer != tokenizer.name
    ):
        return 0
    shared = 0
    for mine, theirs in zip(messages, prior.source, strict=False):
        if mine is not theirs:
            break
        shared += 1
    return shared


def count_request_tokens(messages: list[Message], tokenizer: Tokenizer) -> int:
    """The tokens a request carrying ``messages`` costs (framing included)."""
    return REPLY_PRIMING_TOKENS + sum(count_message_tokens(m, tokenizer) for m in messages)
