"""The SDKs are the oracle: every block, part, tool call and item type that the installed
``anthropic`` and ``openai`` SDKs define is known to the formats, and one instance of each,
built from the SDKs' own type definitions (tests/support/sdk_instances.py), goes through a real
compaction in a history over the threshold: accepted, named in no ``unknown_types``, its opaque
fields carried byte for byte with their block or item (or gone with it), and never in a
summary, an event or a log. An SDK upgrade that adds a type fails here, naming the type.

Each compaction runs in process (the pipeline with a file transcript store in ``tmp_path``),
summarized twice: by the offline digest, and by the LLM summarizer over the stand-in provider
on loopback (a thread), whose recorded requests show everything a model would read.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pydantic
import pytest
from support.sdk_instances import (
    MARKER,
    Markers,
    Member,
    Unit,
    anthropic_beta_blocks,
    anthropic_blocks,
    chat_parts,
    chat_roles,
    chat_tool_calls,
    every_member,
    instance,
    responses_items,
    unit,
)

from worker.client import apply_compaction
from worker.config import LLMConfig, Settings
from worker.errors import InvalidSnapshot
from worker.pipeline import Adapters, Pipeline
from worker.summarize.llm import LLMSummarizer
from worker.testing import StandinLLM
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompactionEvent, CompletedEvent
from worker.wire.formats import anthropic, openai, responses
from worker.wire.models import canonical_json

MEMBERS = every_member()
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4.1", "responses": "gpt-4.1"}
# Over the threshold by the turns between the two copies alone; only the newest user turn of
# the range is carried (so the first copy is summarized, the second carried where it is one).
CONFIG = {"auto_compact_threshold_tokens": 2000, "preserve_recent_user_tokens": 0}
FILLER_PAIRS = 6
# The lists of a wire message whose elements are blocks, parts or tool calls (each carried or
# dropped whole); every other field belongs to the message (item) itself.
BLOCK_LISTS = {
    "anthropic": {"content"},
    "openai": {"content", "tool_calls"},
    "responses": {"content", "output"},
}


# --- every type is known --------------------------------------------------------------------


def _known_cases() -> list[tuple[Any, str, Member]]:
    """(format module, constant, member) for each type string, once per constant."""
    groups = [
        (anthropic, "BLOCK_TYPES", [*anthropic_blocks(), *anthropic_beta_blocks()]),
        (openai, "ROLES", chat_roles()),
        (openai, "PART_TYPES", chat_parts()),
        (openai, "TOOL_CALL_TYPES", chat_tool_calls()),
        (responses, "ITEM_TYPES", responses_items()),
    ]
    cases: dict[tuple[str, str], tuple[Any, str, Member]] = {}
    for module, constant, members in groups:
        for m in members:
            cases.setdefault((constant, m.type), (module, constant, m))
    return list(cases.values())


KNOWN_CASES = _known_cases()


@pytest.mark.parametrize(
    ("module", "constant", "member"),
    KNOWN_CASES,
    ids=[f"{c}:{m.type}" for _, c, m in KNOWN_CASES],
)
def test_every_sdk_type_is_known_to_its_format(module: Any, constant: str, member: Member) -> None:
    name = f"{module.__name__}.{constant}"
    assert hasattr(module, constant), f"{name} is missing (the set of types the format knows)"
    known = getattr(module, constant)
    assert isinstance(known, frozenset), f"{name} must be a frozenset of type strings"
    assert member.type in known, (
        f"{member.type!r} ({member.cls.__module__}.{member.cls.__name__}) is not in {name}"
    )


@pytest.mark.parametrize("member", MEMBERS, ids=[m.id for m in MEMBERS])
def test_each_generated_instance_is_what_its_sdk_type_accepts(member: Member) -> None:
    """The oracle's own check: pydantic validates each instance against its SDK type."""
    built = instance(member.cls, Markers())
    pydantic.TypeAdapter(member.cls).validate_python(built)


# --- one instance of each type through a compaction -----------------------------------------


@dataclass
class History:
    """A snapshot's messages around copies of one instance: ``first`` (the wire index of the
    copy inside the range) and ``boundary`` (the index of a provider-native compaction)."""

    fmt: str
    messages: list[dict[str, Any]]
    markers: Markers
    first: int
    boundary: int | None = None

    def snapshot(self, conversation_id: str) -> dict[str, Any]:
        snap: dict[str, Any] = {
            "conversation_id": conversation_id,
            "revision": len(self.messages),
            "model": {"name": MODELS[self.fmt]},
            "format": self.fmt,
            "messages": self.messages,
            "config": CONFIG,
        }
        if self.fmt == "anthropic":
            snap["system"] = "You are a coding agent. Keep the build green."
        return snap


def filler(fmt: str, role: str, n: int) -> dict[str, Any]:
    """A plain turn of about 250 tokens."""
    said = " ".join(
        f"Step {n}.{k}: read src/pkg/mod_{n}_{k}.py and note its role." for k in range(20)
    )
    if fmt == "responses":
        return {"type": "message", "role": role, "content": said}
    return {"role": role, "content": said}


class Turns:
    """Appends units and fillers; an Anthropic history alternates user and assistant turns."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.messages: list[dict[str, Any]] = []
        self.count = 0

    def fill(self, *roles: str) -> None:
        for role in roles:
            self.join([filler(self.fmt, role, self.count)])
            self.count += 1

    def join(self, messages: list[dict[str, Any]]) -> int:
        """Appends ``messages`` (one unit); returns the index of its first message."""
        last = self.messages[-1].get("role") if self.messages else None
        first = messages[0].get("role")
        if self.fmt == "anthropic" and last == first:
            other = "user" if first == "assistant" else "assistant"
            self.messages.append(filler(self.fmt, other, self.count))
            self.count += 1
        self.messages.extend(messages)
        return len(self.messages) - len(messages)


def history(fmt: str, make: Callable[[Markers], Unit]) -> History:
    """Two plain turns, a unit (inside the range), plain turns over the threshold, a second
    unit (the range's newest user turn, when it is one), a reply, and a third unit as the
    protected newest turn; each unit ``make`` makes has fresh markers. A provider-native
    compaction sits once, after the first turns: what is before it is superseded, what comes
    after is compacted."""
    markers = Markers()
    out = Turns(fmt)
    out.fill("user", "assistant")
    first = make(markers)
    at = out.join(first.messages)
    if first.boundary:
        out.fill(*["user", "assistant"] * (FILLER_PAIRS + 1), "user")
        return History(fmt, out.messages, markers, first=at, boundary=at)
    out.fill(*["user", "assistant"] * FILLER_PAIRS)
    out.join(make(markers).messages)
    out.fill("assistant")
    out.join(make(markers).messages)
    return History(fmt, out.messages, markers, first=at)


@pytest.fixture(scope="module")
def provider(sockets: None) -> Iterator[StandinLLM]:
    with StandinLLM() as server:
        yield server


def compacted(
    snap: dict[str, Any], root: Path, provider: StandinLLM | None
) -> list[CompactionEvent]:
    """The events of ``snap``'s compaction, summarized by the digest, or with a ``provider``
    by the LLM summarizer over it (``remote_only``: no digest to fall back on)."""
    with ExitStack() as stack:
        llm = None
        if provider is not None:
            snap = {**snap, "config": {**snap["config"], "mode": "remote_only"}}
            config = LLMConfig(base_url=provider.openai_base_url, api_key_env="K", max_retries=0)
            llm = stack.enter_context(LLMSummarizer(config, environ={"K": "sk-test"}))
        adapters = Adapters(store=FileStore(root), llm=llm, now=lambda: NOW)
        runner = Pipeline(Settings(), adapters)
        return runner.run(runner.parse(json.dumps(snap).encode()))


def run(
    member_id: str, snap: dict[str, Any], root: Path, provider: StandinLLM | None = None
) -> tuple[list[CompactionEvent], CompletedEvent]:
    """The events of a compaction of ``snap``, and its completed event (the test fails,
    naming the type and the field, when the snapshot is refused)."""
    try:
        events = compacted(snap, root, provider)
    except InvalidSnapshot as e:
        pytest.fail(f"{member_id}: refused: {e}")
    done = [e for e in events if isinstance(e, CompletedEvent)]
    assert done, f"{member_id}: not compacted: {[e.type for e in events]}"
    return events, done[-1]


@pytest.mark.parametrize("member", MEMBERS, ids=[m.id for m in MEMBERS])
@pytest.mark.parametrize("summarizer", ["digest", "llm"])
def test_one_instance_of_each_type_goes_through_a_compaction_unread(
    summarizer: str,
    member: Member,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    provider: StandinLLM,
) -> None:
    caplog.set_level(logging.DEBUG)
    provider.reset()
    made = history(member.fmt, partial(unit, member))
    used = provider if summarizer == "llm" else None
    events, event = run(member.id, made.snapshot("c-sdk"), tmp_path, used)
    trigger, c = event.trigger, event.compaction
    assert c.summary.source == summarizer
    assert trigger.unknown_types == {}, (
        f"{member.id}: unknown to the format: {trigger.unknown_types}"
    )
    if made.boundary is not None:
        assert trigger.native_compaction, f"{member.id}: not read as a native compaction"
        assert c.start > made.boundary, f"{member.id}: compacted at or before the boundary"
    else:
        assert c.start <= made.first < c.end, f"{member.id}: the first copy is not compacted"
    applied = apply_compaction(made.messages, event)
    problems = [
        *carried_or_gone(made, applied),
        *leaks(made.markers, events, caplog.records),
        *sent_to_the_model(made.markers, provider if used else None),
    ]
    assert not problems, f"{member.id}:\n" + "\n".join(problems)


# --- what the checks look at ----------------------------------------------------------------


def containers(fmt: str, message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The wire message's blocks, parts and tool calls, and the message itself."""
    yield message
    for key in BLOCK_LISTS[fmt]:
        value = message.get(key)
        if isinstance(value, list):
            yield from (v for v in value if isinstance(v, dict))


def own_markers(
    fmt: str, container: dict[str, Any], message: dict[str, Any], found: set[str]
) -> set[str]:
    """The markers of ``found`` that belong to ``container`` itself (a message's own markers
    are those outside its blocks)."""
    if container is not message:
        text = canonical_json(container)
        return {m for m in found if m in text}
    rest = {
        k: v for k, v in message.items() if k not in BLOCK_LISTS[fmt] or not isinstance(v, list)
    }
    text = canonical_json(rest)
    return {m for m in found if m in text}


def every_dict(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from every_dict(v)
    elif isinstance(value, list):
        for v in value:
            yield from every_dict(v)


def without_markers(value: Any, markers: set[str]) -> Any:
    """``value`` less every field whose value holds a marker, at any depth."""
    if isinstance(value, dict):
        return {
            k: without_markers(v, markers)
            for k, v in value.items()
            if not any(m in canonical_json(v) for m in markers)
        }
    if isinstance(value, list):
        return [without_markers(v, markers) for v in value]
    return value


def carried_or_gone(made: History, applied: list[dict[str, Any]]) -> list[str]:
    """Each secret marker of the snapshot is in the applied history exactly where it was (its
    block or item byte for byte; a Responses item may lose its own ``id``, which the API
    assigns) or not at all, with nothing left of its block or item without it."""
    every = made.markers.every
    applied_text = canonical_json(applied)
    original = {canonical_json(d) for d in every_dict(made.messages)}
    found = {canonical_json(d) for d in every_dict(applied)}
    stripped_copies = {
        canonical_json(without_markers(d, every))
        for d in every_dict(applied)
        if canonical_json(d) not in original
    }
    problems = []
    for message in made.messages:
        for container in containers(made.fmt, message):
            secrets = own_markers(made.fmt, container, message, made.markers.secret)
            if not secrets:
                continue
            present = sorted(m for m in secrets if m in applied_text)
            if present and not _found(made.fmt, container, message, found):
                problems.append(f"{present} carried, but their block or item changed: {container}")
            elif (
                not present and canonical_json(without_markers(container, every)) in stripped_copies
            ):
                problems.append(f"kept without its opaque fields {sorted(secrets)}: {container}")
    return problems


def _found(fmt: str, container: dict[str, Any], message: dict[str, Any], found: set[str]) -> bool:
    if canonical_json(container) in found:
        return True
    if fmt == "responses" and container is message:
        return canonical_json({k: v for k, v in container.items() if k != "id"}) in found
    return False


def leaks(
    markers: Markers, events: list[CompactionEvent], records: list[logging.LogRecord]
) -> list[str]:
    """No secret marker in any event outside its replacement (whose carried blocks and items
    :func:`carried_or_gone` looks at), the summary's text included; no marker of any kind in
    a log record. Structural markers (ids that name a message or pair a call) may appear in an
    event, its summary too: the summary names an image or file by its message's id."""
    problems = []
    for e in events:
        published = json.loads(e.to_json())
        published.get("compaction", {}).pop("replacement", None)
        summary = published.get("compaction", {}).get("summary", {}).get("text", "")
        text = json.dumps(published, ensure_ascii=False)
        said = sorted(m for m in markers.secret if m in text)
        if said:
            where = "the summary's text" if any(m in summary for m in said) else "the event"
            problems.append(f"in {where} of {e.type}: {said}")
    for r in records:
        text = r.getMessage() + (r.exc_text or "") + json.dumps(r.__dict__, default=str)
        if MARKER in text:
            problems.append(f"in a log record of {r.name}: {r.getMessage()[:200]}")
    return problems


def sent_to_the_model(markers: Markers, provider: StandinLLM | None) -> list[str]:
    """No secret marker in any request the summarizer sent the provider: what a model reads
    of the range."""
    if provider is None:
        return []
    assert provider.requests, "the LLM summarizer sent nothing"
    problems = []
    for request in provider.requests:
        text = json.dumps(request.body, ensure_ascii=False)
        said = sorted(m for m in markers.secret if m in text)
        if said:
            problems.append(f"sent to the model: {said}")
    return problems


# --- a type the formats do not know ---------------------------------------------------------

UNKNOWN = "sdk_oracle_made_up"


def unknown_unit(fmt: str, markers: Markers) -> Unit:
    """A block, part or item of a made-up type, whose fields are all unread: in a user turn
    beside a text (Anthropic, Chat Completions), or an item of its own (Responses)."""
    payload = {
        "type": UNKNOWN,
        "note": markers.new(UNKNOWN, "note"),
        "detail": {"text": markers.new(UNKNOWN, "text")},
    }
    if fmt == "responses":
        return Unit([payload])
    text = {"type": "text", "text": "Here is what the new tool returned."}
    return Unit([{"role": "user", "content": [text, payload]}])


def without_unknown(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same history with no made-up payload."""
    out = []
    for message in messages:
        content = message.get("content")
        if message.get("type") == UNKNOWN:
            continue
        if isinstance(content, list):
            message = {**message, "content": [b for b in content if b.get("type") != UNKNOWN]}
        out.append(message)
    return out


@pytest.mark.parametrize("fmt", ["anthropic", "openai", "responses"])
@pytest.mark.parametrize("summarizer", ["digest", "llm"])
def test_a_type_no_format_knows_is_accepted_carried_counted_and_named(
    summarizer: str,
    fmt: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    provider: StandinLLM,
) -> None:
    caplog.set_level(logging.DEBUG)
    provider.reset()
    made = history(fmt, partial(unknown_unit, fmt))
    used = provider if summarizer == "llm" else None
    events, event = run(f"{fmt}:{UNKNOWN}", made.snapshot("c-unknown"), tmp_path / "with", used)
    trigger = event.trigger
    assert trigger.unknown_types == {UNKNOWN: 3}  # named: the three copies
    assert trigger.counted_by.endswith("+opaque-estimate"), trigger.counted_by
    # Counted: each copy at least at the conservative estimate of its JSON's size.
    payloads = [d for d in every_dict(made.messages) if d.get("type") == UNKNOWN]
    estimate = sum(math.ceil(len(canonical_json(p)) / 3) for p in payloads)
    plain = {**made.snapshot("c-plain"), "messages": without_unknown(made.messages)}
    _, without = run(f"{fmt}:plain", plain, tmp_path / "without")
    assert trigger.projected_tokens - without.trigger.projected_tokens >= estimate
    # Carried: the protected copy, and the range's carried user turn where it is one, as they
    # were; never read: no part of any copy in a summary, an event, a log or a request.
    applied = apply_compaction(made.messages, event)
    kept = {canonical_json(d) for d in every_dict(applied)}
    assert canonical_json(payloads[-1]) in kept
    if fmt != "responses":
        assert canonical_json(payloads[-2]) in kept
    problems = [
        *carried_or_gone(made, applied),
        *leaks(made.markers, events, caplog.records),
        *sent_to_the_model(made.markers, used),
    ]
    assert not problems, "\n".join(problems)
