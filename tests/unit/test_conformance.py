"""One behaviour in two languages: the shared fixtures of tests/fixtures/conformance (histories,
real events, expected applied histories, derived ids, canonical JSON, webhook signatures),
run here against the Python package and by clients/typescript/test/conformance.test.ts
against the TypeScript client (integration/test_typescript_client.py runs that), so that the two
cannot drift. generate.py in that directory writes them from this package."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from worker.api import webhooks
from worker.errors import EventMismatch, InvalidSnapshot
from worker.session._history import History
from worker.wire.events import CompletedEvent, parse_event
from worker.wire.formats import source_ids
from worker.wire.history import apply_compaction, range_digest
from worker.wire.models import canonical_json, derived_message_id

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"
FILES = ("apply.json", "sequences.json", "canonical.json", "derived_ids.json", "webhooks.json")


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text(encoding="ascii"))


def named(cases: list[dict[str, Any]]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case", cases, ids=[c["name"] for c in cases])


# --- applying compactions ---------------------------------------------------------------------


def outcome(messages: Any, event: Any, conversation_id: str | None) -> dict[str, Any]:
    """What apply_compaction answers, in the fixtures' terms."""
    try:
        return {"messages": apply_compaction(messages, event, conversation_id=conversation_id)}
    except EventMismatch:
        return {"error": "event_mismatch"}
    except InvalidSnapshot as exc:
        return {"error": "invalid_snapshot", "field": exc.field}
    except ValidationError:
        return {"error": "invalid_event"}


@named(load("apply.json"))
def test_apply_compaction_answers_as_the_fixture_says(case: dict[str, Any]) -> None:
    got = outcome(case["messages"], case["event"], case.get("conversation_id"))
    assert got == case["expected"]


def test_the_apply_fixtures_cover_every_answer_and_format() -> None:
    cases = load("apply.json")
    answers = {c["expected"].get("error", "messages") for c in cases}
    assert answers == {"messages", "event_mismatch", "invalid_snapshot", "invalid_event"}
    events = [
        c["event"] for c in cases if isinstance(c["event"], dict) and "compaction" in c["event"]
    ]
    assert {e["compaction"]["format"] for e in events} == {"openai", "anthropic", "responses"}
    for event in events:  # real events, as the service publishes them
        assert isinstance(parse_event(event), CompletedEvent)


@named(load("sequences.json"))
def test_a_session_applies_a_stream_as_the_fixture_says(case: dict[str, Any]) -> None:
    """The session's own history (worker.session): completed events in stream order, each
    applied when it describes the history, skipped otherwise."""
    history = History(list(case["messages"]))
    for raw in case["events"]:
        event = parse_event(raw)
        if isinstance(event, CompletedEvent):
            history.apply(event, case["conversation_id"])
    expected = case["expected"]
    assert history.messages == expected["messages"]
    assert [a.event.event_id for a in history.applied] == expected["applied"]
    assert history.skipped == len(expected["skipped"])


# --- ids and canonical JSON -----------------------------------------------------------------------


@named(load("canonical.json"))
def test_canonical_json_is_the_fixture_text(case: dict[str, Any]) -> None:
    text = canonical_json(case["value"])
    assert text == case["canonical"]
    assert hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() == case["sha256"]
    if isinstance(case["value"], list):
        assert range_digest(case["value"]) == case["sha256"]


def test_derived_ids_are_the_fixture_ids() -> None:
    fixture = load("derived_ids.json")
    for single in fixture["messages"]:
        assert derived_message_id(single["index"], single["message"]) == single["id"]
    for history in fixture["histories"]:
        assert source_ids(history["messages"]) == history["ids"]
    for invalid in fixture["invalid"]:
        with pytest.raises(InvalidSnapshot) as caught:
            source_ids(invalid["messages"])
        assert caught.value.field == invalid["expected"]["field"]


# --- webhooks -------------------------------------------------------------------------------


def body_of(case: dict[str, Any]) -> bytes:
    if "body_base64" in case:
        return base64.b64decode(case["body_base64"])
    return str(case["body"]).encode("utf-8")


def test_signatures_are_the_fixture_headers() -> None:
    for case in load("webhooks.json")["signatures"]:
        assert webhooks.sign(case["secret"], case["timestamp"], body_of(case)) == case["header"]


@named(load("webhooks.json")["verifications"])
def test_verify_answers_as_the_fixture_says(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # verify reads the clock; the fixture says what time it is
    monkeypatch.setattr(webhooks, "time", types.SimpleNamespace(time=lambda: float(case["now"])))
    valid = webhooks.verify(
        case["secret"], case["header"], body_of(case), tolerance_s=case["tolerance_s"]
    )
    assert valid is case["valid"]


# --- the fixtures read the same in both languages -------------------------------------------------


def numbers(value: Any) -> Iterator[int | float]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int | float):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from numbers(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from numbers(item)


def hashed(name: str) -> Iterator[Any]:
    """What the fixtures hash or compare: messages and replacements, canonical values (an
    event's other numbers, a score of 1.0, are read by neither side's hashing)."""
    data = load(name)
    if name == "canonical.json":
        yield from (c["value"] for c in data)
    elif name == "derived_ids.json":
        yield data["messages"], data["histories"], data["invalid"]
    elif name in ("apply.json", "sequences.json"):
        for case in data:
            yield case["messages"], case["expected"].get("messages")
            events = case["events"] if "events" in case else [case["event"]]
            for event in events:
                if isinstance(event, str):
                    event = json.loads(event)
                compaction = event.get("compaction") if isinstance(event, dict) else None
                if isinstance(compaction, dict):
                    yield compaction.get("replacement")


@pytest.mark.parametrize("name", FILES)
def test_every_hashed_number_of_the_fixtures_reads_alike_in_javascript(name: str) -> None:
    """JavaScript has one number type: an int beyond 2**53 loses digits, and an integral float
    (`2.0`, `1e16`) is written back as an int. Neither may be in what a fixture hashes, or the
    two readers would hash different texts for reasons of their own."""
    for number in numbers(list(hashed(name))):
        if isinstance(number, int):
            assert abs(number) <= 2**53, (name, number)
        else:
            assert math.isfinite(number), (name, number)
            assert not number.is_integer() or abs(number) >= 1e21, (name, number)
