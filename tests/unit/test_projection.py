"""Projection: keep_recent_tool_results markers and the strict byte budget (DESIGN.md §2)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.config import ProjectedToolResultBudget
from worker.core.projection import (
    ELLIPSIS,
    PREVIEW_JOINER,
    head_tail_preview,
    marker_for,
    project,
)
from worker.core.projection_policy import ProjectionPolicy
from worker.wire.models import Message, ToolCall


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _history(bodies: list[str], tool: str = "grep") -> list[Message]:
    calls = tuple(ToolCall(id=f"c{i}", name=tool, arguments="{}") for i in range(len(bodies)))
    out = [Message(id="a", role="assistant", tool_calls=calls, source_index=0)]
    out += [
        Message(
            id=f"r{i}",
            role="tool",
            tool_call_id=f"c{i}",
            tool_name=tool,
            content=b,
            source_index=i + 1,
        )
        for i, b in enumerate(bodies)
    ]
    return out


def _budget(max_bytes: int, recent: int = 0, preview: int = 200) -> ProjectionPolicy:
    return ProjectionPolicy(
        projected_tool_result_budget=ProjectedToolResultBudget(
            max_bytes=max_bytes, prioritize_recent_results=recent, max_preview_bytes=preview
        )
    )


def _bodies(messages: list[Message]) -> list[str]:
    return [m.content for m in messages if m.role == "tool"]


def test_keep_recent_marks_old_large_results_only() -> None:
    history = _history(["x" * 500, "y" * 100, "z" * 300, "w" * 400])
    out = project(history, ProjectionPolicy(keep_recent_tool_results=2))
    assert _bodies(out.messages) == [marker_for("grep"), "y" * 100, "z" * 300, "w" * 400]
    assert [(e.call_id, e.action, e.bytes_before, e.bytes_after) for e in out.elided] == [
        ("c0", "marker", 500, len("[Previous: used grep]"))
    ]


def test_keep_recent_none_changes_nothing_and_zero_marks_all_large() -> None:
    history = _history(["x" * 500, "y" * 500])
    assert project(history, ProjectionPolicy()).messages is history
    out = project(history, ProjectionPolicy(keep_recent_tool_results=0))
    assert _bodies(out.messages) == [marker_for("grep")] * 2
    assert out.bodies == {"c0": marker_for("grep"), "c1": marker_for("grep")}


def test_budget_under_the_cap_changes_nothing() -> None:
    history = _history(["a" * 100, "b" * 100])
    out = project(history, _budget(200))
    assert out.messages is history and out.elided == []


def test_budget_zero_empties_everything() -> None:
    out = project(_history(["a" * 100, "b"]), _budget(0))
    assert _bodies(out.messages) == ["", ""]


def test_budget_restores_newest_prioritized_whole() -> None:
    out = project(_history(["old" * 100, "new" * 100]), _budget(350, recent=1, preview=0))
    bodies = _bodies(out.messages)
    assert bodies[1] == "new" * 100
    assert bodies[0] in (marker_for("grep"), ELLIPSIS, "")


def test_budget_previews_text_but_never_json() -> None:
    text = "line\n" * 200
    structured = json.dumps({"rows": list(range(300))})
    out = project(_history([structured, text]), _budget(400, preview=150))
    previewed, marked = _bodies(out.messages)[1], _bodies(out.messages)[0]
    assert PREVIEW_JOINER in previewed and _size(previewed) <= 150
    assert previewed.startswith("line\n") and previewed.endswith("line\n")
    assert marked in (structured, marker_for("grep"), ELLIPSIS, "")
    assert PREVIEW_JOINER not in marked


def test_head_tail_preview_cuts_on_utf8_boundaries() -> None:
    text = "é🙂" * 300
    for limit in range(len(PREVIEW_JOINER.encode()), 120):
        preview = head_tail_preview(text, limit)
        if preview is not None:
            assert _size(preview) <= limit
            preview.encode("utf-8")  # no half characters


bodies_st = st.lists(
    st.one_of(
        st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=400),
        st.lists(st.integers(), max_size=60).map(json.dumps),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(
    bodies=bodies_st,
    max_bytes=st.integers(0, 3000),
    recent=st.integers(0, 4),
    preview=st.integers(0, 600),
)
def test_budget_properties(bodies: list[str], max_bytes: int, recent: int, preview: int) -> None:
    history = _history(bodies)
    out = project(history, _budget(max_bytes, recent, preview))
    projected = _bodies(out.messages)
    if sum(map(_size, bodies)) <= max_bytes:
        assert projected == bodies
        return
    assert sum(map(_size, projected)) <= max_bytes
    placeholders = {marker_for("grep"), ELLIPSIS, ""}
    for before, after in zip(bodies, projected, strict=True):
        if after == before or after in placeholders:
            continue
        # Anything else is a head+tail preview of a text (never JSON) body, within its cap.
        assert PREVIEW_JOINER in after and _size(after) <= preview
        assert not (before.lstrip()[:1] in "[{" and _is_json(before))
    changed = {e.call_id for e in out.elided}
    assert changed == {
        f"c{i}" for i, (b, a) in enumerate(zip(bodies, projected, strict=True)) if a != b
    }
    for e in out.elided:
        i = int(e.call_id[1:])
        assert (e.bytes_before, e.bytes_after) == (_size(bodies[i]), _size(projected[i]))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@settings(max_examples=100, deadline=None)
@given(bodies=bodies_st, keep=st.integers(0, 10))
def test_keep_recent_properties(bodies: list[str], keep: int) -> None:
    out = _bodies(
        project(_history(bodies), ProjectionPolicy(keep_recent_tool_results=keep)).messages
    )
    cut = max(len(bodies) - keep, 0)
    assert out[cut:] == bodies[cut:]
    for before, after in zip(bodies[:cut], out[:cut], strict=True):
        assert after == (marker_for("grep") if _size(before) > 100 else before)


def test_projection_is_deterministic_and_pure() -> None:
    history = _history(["x" * 800, "y" * 900])
    frozen = [m.model_dump() for m in history]
    first = project(history, _budget(500, preview=100))
    second = project(history, _budget(500, preview=100))
    assert first.messages == second.messages
    assert [m.model_dump() for m in history] == frozen


def test_a_grown_conversation_keeps_its_projected_prefix() -> None:
    """Compression is applied once per result and deterministically: appending messages never
    changes how earlier results project, so providers' prompt caches stay warm."""
    grep = "\n".join(f"src/pkg/mod_{i // 60}.py:{i}:    value = compute({i})" for i in range(400))
    listing = "\n".join(f"./src/pkg/sub_{i // 50}/file_{i}.py" for i in range(400))
    history = _history([grep, listing, "ok"], tool="bash")
    policy = ProjectionPolicy(compress_tool_results=True, model="gpt-4.1")
    first = project(history, policy).messages
    assert first[1].content != grep and first[2].content != listing  # both compressed
    grown = [*history, *_history(["new output " * 50], tool="bash")[1:]]
    grown[-1] = grown[-1].model_copy(update={"id": "late", "tool_call_id": "c0-late"})
    again = project(grown, policy).messages
    assert again[: len(first)] == first
