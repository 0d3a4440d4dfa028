"""The pure parts of the inspector and of restoring: the composition keeps one level to go back
to (worker.wire.composed), a compaction beside what it replaced and a conversation's timeline
(worker.core.inspection), and pages that escape everything they show (worker.api.pages)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_composed import Session, turn

from worker.api.conversations import ConversationRow, Page
from worker.api.pages import Frame, compaction_page, conversations_page, timeline_page
from worker.core.inspection import compaction_view, redactions, timeline
from worker.wire.composed import apply_composed, without
from worker.wire.events import CompletedEvent
from worker.wire.formats import source_ids


def compacted_three_times(root: Path) -> tuple[Session, list[dict[str, Any]], list[Any]]:
    """A full history sent every turn until three compactions: (session, history, views)."""
    session = Session(root)
    full: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    composed = []
    k = 0
    while len(session.events) < 3:
        full += turn(k)
        before = len(session.events)
        session.submit(copy.deepcopy(full), k)
        if len(session.events) > before:
            composed.append(session.composed)
        k += 1
    return session, full, composed


def test_a_composition_keeps_the_one_before_its_newest(tmp_path: Path) -> None:
    session, full, composed = compacted_three_times(tmp_path)
    first, second, third = composed
    assert first.previous is None
    assert second.previous == first.model_copy(update={"previous": None})
    assert third.previous == second.model_copy(update={"previous": None})
    assert third.previous.previous is None  # one level: the record stays bounded
    back = without(third, session.events[-1].event_id)
    assert back is not None and back.event_id == session.events[-2].event_id
    # what goes out after a restore: the history with the first two compactions only
    assert apply_composed(full, back) == apply_composed(full, second)
    assert without(back, back.event_id) is None  # two restores in a row: none left
    assert without(third, session.events[0].event_id) is None  # not the newest
    assert without(None, "x") is None


def test_a_compaction_beside_what_it_replaced(tmp_path: Path) -> None:
    session, full, _ = compacted_three_times(tmp_path)
    event = session.events[0]
    c = event.compaction
    # the first compaction was computed on a prefix of the full history
    original = full[: c.end + 8]
    view = compaction_view(event, original, raw=json.loads(event.to_json()))
    ids = source_ids(original)
    assert [m.id for m in view.replaced] == ids[c.start : c.end]
    assert view.sections and view.fidelity == c.summary.fidelity
    assert view.redactions == c.summary.redactions == {}  # counted, and this session has none
    drawn_from = {n.number: set(n.source_ids) for n in view.sections}
    for message in view.replaced:
        for number in message.sections:
            assert message.id in drawn_from[number]
    for number, sources in drawn_from.items():
        assert sources <= {m.id for m in view.replaced if number in m.sections}
    published = [s for s in c.summary.sections if s.source_ids]
    assert [list(s.source_ids) for s in view.sections if s.source_ids] == [
        s.source_ids for s in published
    ]
    # an edited transcript is not shown as this compaction's
    edited = copy.deepcopy(original)
    edited[c.start + 1]["content"] = "edited"
    shown = compaction_view(event, edited)
    assert shown.replaced == [] and "does not match" in (shown.transcript_problem or "")
    unreadable = compaction_view(event, None, transcript_problem="pruned")
    assert unreadable.replaced == [] and unreadable.transcript_problem == "pruned"


def _doc(kind: str, event_id: str, revision: int, **more: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "type": kind,
        "event_id": event_id,
        "conversation_id": "c",
        "revision": revision,
        "created_at": "2026-01-01T00:00:00Z",
        **more,
    }


def test_a_timeline_reads_every_event_tolerantly(tmp_path: Path) -> None:
    session, _, _ = compacted_three_times(tmp_path)
    one, two = (json.loads(e.to_json()) for e in session.events[:2])
    trigger = {"kind": "thresholds", "threshold_tokens": 100, "projected_tokens": 50}
    entries = [
        ("1-0", _doc("compaction.skipped", "s1", 1, reason="50 <= 100", trigger=trigger)),
        ("2-0", one),
        ("3-0", two),
        ("4-0", _doc("compaction.reverted", "r1", 3, reverted_event_id=two["event_id"])),
        ("5-0", _doc("compaction.proposed", "p1", 5, compaction={"tokens_before": 9})),
        ("6-0", _doc("compaction.proposed", "p2", 6)),
        ("7-0", _doc("compaction.approved", "a2", 6, proposal_event_id="p2")),
        ("8-0", _doc("something.new", "n1", 7, whatever=[1])),
    ]
    line = timeline(entries)
    assert [p.type for p in line.points][:4] == [
        "compaction.skipped",
        "compaction.completed",
        "compaction.completed",
        "compaction.reverted",
    ]
    skipped = line.points[0]
    assert (skipped.before, skipped.after, skipped.threshold) == (50, 50, 100)
    assert skipped.note == "50 <= 100"
    assert line.points[2].reverted and not line.points[1].reverted
    assert line.newest_completed == one["event_id"]  # the newest one not restored
    assert [p.event_id for p in line.proposed] == ["p1"]  # p2 was decided
    assert line.proposed[0].before == 9
    assert line.points[-1].type == "something.new"
    assert [p.type for p in line.outcomes] == [
        "compaction.skipped",
        "compaction.completed",
        "compaction.completed",
    ]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({}, None),
        ({"redactions": 3}, {"total": 3}),
        ({"redactions": True}, None),
        (
            {"compaction": {"redactions": {"api_key": 2, "email": 1, "bad": "x"}}},
            {"api_key": 2, "email": 1},
        ),
        ({"compaction": {"summary": {"redactions": {"api_key": 2}}}}, {"api_key": 2}),
    ],
)
def test_redaction_counts_are_read_where_they_may_be(
    doc: dict[str, Any], expected: dict[str, int] | None
) -> None:
    assert redactions(doc) == expected


HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


def _no_markup_from_data(page: str) -> None:
    assert "<script>alert" not in page and "<img" not in page
    assert len(re.findall(r"<script\b", page)) == 1  # ours: src="/ui/static/inspector.js"
    assert 'src="/ui/static/inspector.js"' in page


def test_pages_escape_what_they_show(tmp_path: Path) -> None:
    frame = Frame(tenant="acme", csrf="token", notice=HOSTILE)
    row = ConversationRow(HOSTILE, 0.0, 1, 2, {"type": HOSTILE, "revision": 1}, 5, 6)
    _no_markup_from_data(conversations_page(Page([row], HOSTILE), frame))

    session, full, _ = compacted_three_times(tmp_path)
    doc = json.loads(session.events[0].to_json())
    doc["compaction"]["summary"]["text"] += f"\n## {HOSTILE}\n{HOSTILE}\n"
    doc["compaction"]["summary"]["sections"].append({"title": HOSTILE, "source_ids": [HOSTILE]})
    event = CompletedEvent.model_validate(doc)
    skipped = _doc("compaction.skipped", HOSTILE, 1, reason=HOSTILE)
    line = timeline([("1-0", skipped), ("2-0", doc)])
    _no_markup_from_data(timeline_page(HOSTILE, line, frame))
    view = compaction_view(event, full[: event.compaction.end + 8], raw=doc)
    page = compaction_page(HOSTILE, view, line, frame)
    _no_markup_from_data(page)
    assert 'href="#m-%3Cscript%3Ealert' in page  # a source id as a fragment, encoded
