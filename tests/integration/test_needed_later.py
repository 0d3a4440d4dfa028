"""The needed-later benchmark (bench/needed_later.py): its gold extractor finds exactly what the
agent's future uses, its baselines keep to their budget with tool exchanges whole, and it runs
end to end, on a hand-built conversation and on one of the corpus (skipped where absent)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from worker.reuse import Reuse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from corpus import conversations, corpus_dir
from needed_baselines import (
    CLEARED,
    MASKED,
    OURS,
    STRATEGIES,
    History,
    Sizer,
    StrategyBaselines,
)
from needed_gold import Fact, gold_facts, occurs
from needed_later import PRODUCT, cut_index, run_case

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
Wire = dict[str, Any]


def user(mid: str, text: str) -> Wire:
    return {"id": mid, "role": "user", "content": text}


def bash(mid: str, command: str, text: str = "") -> Wire:
    call = {
        "id": f"call-{mid}",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    return {"id": mid, "role": "assistant", "content": text, "tool_calls": [call]}


def output(mid: str, of: str, text: str) -> Wire:
    return {"id": mid, "role": "tool", "tool_call_id": f"call-{of}", "content": text}


DIFF = (
    "diff --git a/django/forms/models.py b/django/forms/models.py\n--- a/django/forms/models.py\n"
    "+++ b/django/forms/models.py\n@@ -1 +1 @@\n-old\n+new\n"
    "diff --git a/django/db/models/query.py b/django/db/models/query.py\n"
)

# Cut before m10; the product compacts m1..m7 (m8/m9 are the protected tail).
CONVERSATION: list[Wire] = [
    {"id": "m0", "role": "system", "content": "You are an agent. Mind `SystemHelper`."},
    user("m1", "Fix `task_only_func` in pkg/task_file.py, please."),
    bash("m2", 'grep -rn "construct_instance" django/forms', "THOUGHT: find it."),
    output(
        "m3",
        "m2",
        "django/forms/models.py:31:def construct_instance(form, instance):\n"
        "django/forms/models.py:40:    tail_only_name = task_only_func()\n",
    ),
    bash("m4", "cat django/db/models/query.py"),
    output(
        "m5",
        "m4",
        "class QuerySet:\n    def _filter_or_exclude(self):\n        pass\n"
        "    def only_in_range_never_used(self):\n        pass\n",
    ),
    bash(
        "m6",
        "python -m pytest tests/model_forms/test_models.py::TestConstruct::test_keeps_initial -q",
    ),
    output(
        "m7",
        "m6",
        "tests/model_forms/test_models.py::TestConstruct::test_keeps_initial FAILED\n"
        "E   AttributeError: SystemHelper has no attribute 'x'\n",
    ),
    bash("m8", "cat tail_thing.py", "THOUGHT: look at `tail_only_name`."),
    output("m9", "m8", "tail_only_name = 1\n"),
    bash(
        "m10",
        "sed -i 's/old/new/' django/forms/models.py && python -m pytest "
        "tests/model_forms/test_models.py::TestConstruct::test_keeps_initial",
        "THOUGHT: I'll change `construct_instance` in django/forms/models.py and call "
        "`QuerySet._filter_or_exclude`; also `brand_new_helper`, `task_only_func`, "
        "`SystemHelper` and `tail_only_name`.",
    ),
    output("m11", "m10", "1 passed"),
    bash("m12", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"),
    user("m13", DIFF),
]
CUT, START, END = 10, 1, 8


def test_gold_facts_are_exactly_what_the_future_uses_from_the_range() -> None:
    gold = gold_facts(CONVERSATION, CUT, START, END)
    assert set(gold) == {
        Fact("construct_instance", "function"),
        Fact("_filter_or_exclude", "function"),
        Fact("QuerySet", "class"),
        Fact("TestConstruct", "test"),
        Fact("test_keeps_initial", "test"),
        Fact("tests/model_forms/test_models.py", "path"),
        # In the final diff: a diff file whatever else it was (the sed target here).
        Fact("django/forms/models.py", "diff_file"),
        Fact("django/db/models/query.py", "diff_file"),
    }
    # Not gold: brand_new_helper (only after the cut), QuerySet._filter_or_exclude (the range
    # never spells the dotted name), task_only_func and SystemHelper (in the system prompt and
    # task), tail_only_name (in the protected tail), only_in_range_never_used (never used).


def test_gold_ignores_what_the_range_does_not_hold() -> None:
    # Compacting only m1..m3: the query.py and pytest facts are no longer in the range, and
    # the paths of m2's grep are still found there.
    gold = {f.text for f in gold_facts(CONVERSATION, CUT, 1, 4)}
    assert gold == {"construct_instance", "django/forms/models.py"}


@pytest.mark.parametrize(
    ("fact", "text", "expected"),
    [
        (Fact("django/forms/models.py", "path"), "see /testbed/django/forms/models.py:3", True),
        (Fact("django/forms/models.py", "path"), "./django/forms/models.py", True),
        (Fact("django/forms/models.py", "path"), "models.py", False),
        (Fact("django/forms/models.py", "path"), "xdjango/forms/models.py", False),
        (Fact("django/forms/models.py", "path"), "django/forms/models.pyc", False),
        (Fact("django/forms/models.py", "path"), "django/forms/models.py.bak", False),
        (Fact("models.py", "path"), "in django/forms/models.py.", True),
        (Fact("construct_instance", "function"), "forms.models.construct_instance(f)", True),
        (Fact("construct_instance", "function"), "construct_instance_v2", False),
        (Fact("QuerySet", "class"), "class QuerySetMixin", False),
        (Fact("QuerySet", "class"), "a queryset", False),
        (Fact("models.Model", "dotted"), "django.db.models.Model.save", True),
        (Fact("models.Model", "dotted"), "models.Models", False),
    ],
)
def test_occurs_is_a_whole_token_case_sensitive_match(
    fact: Fact, text: str, expected: bool
) -> None:
    assert occurs(fact, text) is expected


def long_range(exchanges: int = 12) -> list[Wire]:
    """System, task, tool exchanges of growing size (one with two calls), and a tail."""
    messages: list[Wire] = [
        {"id": "s", "role": "system", "content": "be brief"},
        user("t", "the task " * 40),
    ]
    for k in range(exchanges):
        mid = f"a{k}"
        if k == 5:  # one message calling two tools: both results belong to it
            calls = [
                {
                    "id": f"c{k}{j}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": "{}"},
                }
                for j in range(2)
            ]
            messages.append({"id": mid, "role": "assistant", "content": "", "tool_calls": calls})
            for j in range(2):
                messages.append(
                    {
                        "id": f"o{k}{j}",
                        "role": "tool",
                        "tool_call_id": f"c{k}{j}",
                        "content": "y " * 90,
                    }
                )
            continue
        messages.append(bash(mid, f"cat file_{k}.py", f"THOUGHT: step {k}"))
        messages.append(output(f"o{k}", mid, f"line {k}\n" * (10 + 15 * k)))
    messages.append(bash("tail", "ls"))
    messages.append(output("tail-out", "tail", "a.py"))
    return messages


def assert_pairs_whole(kept: list[Wire], source: list[Wire]) -> None:
    calls = {c["id"] for m in kept for c in m.get("tool_calls") or []}
    results = {m["tool_call_id"] for m in kept if m["role"] == "tool"}
    assert calls == results
    # Kept in their order, as whole messages or with only a tool output replaced.
    by_id = {m["id"]: k for k, m in enumerate(source)}
    order = [by_id[m["id"]] for m in kept]
    assert order == sorted(order)
    for m in kept:
        original = source[by_id[m["id"]]]
        if m != original:
            assert m["role"] == "tool" and m["content"] in (
                MASKED,
                CLEARED,
                "[tool result omitted]",
            )


def test_every_baseline_keeps_to_its_budget_with_tool_exchanges_whole() -> None:
    history = long_range()
    start, end = 1, len(history) - 2
    ranged = history[start:end]
    sizer = Sizer()
    whole = sizer.history(ranged)
    strategies = StrategyBaselines(History(wire=history, start=start, end=end, task=1), sizer)
    as_shipped = StrategyBaselines(History(wire=history, start=start, end=end), sizer)
    task = sizer.message(history[1])
    for budget in [0, 50, task - 1, task, task + 100, whole // 4, whole // 2, whole - 1, whole]:
        results = {name: baseline(ranged, budget, sizer, 0) for name, baseline in OURS.items()}
        results |= {name: strategies.run(name, budget) for name in STRATEGIES}
        for name, kept in results.items():
            assert sizer.history(kept) <= budget, (name, budget)
            assert_pairs_whole(kept, history)
            if budget >= task:
                assert kept[:1] == [history[1]], (name, budget)  # the task stays pinned
        for name in STRATEGIES:  # as shipped: the task is history like any other
            kept = as_shipped.run(name, budget)
            assert sizer.history(kept) <= budget, (name, budget)
            assert_pairs_whole(kept, history)
            if name != "SelectiveToolResult":  # the dropping ones keep it only with everything
                assert (history[1] in kept) == (kept == ranged), (name, budget)
    # Given the whole range, nothing needs to go; given most of it, they keep a lot.
    for name, baseline in OURS.items():
        if name != "clearing":  # clearing always clears all but the newest three outputs
            assert baseline(ranged, whole, sizer, 0) == ranged, name
    for name in STRATEGIES:
        assert strategies.run(name, whole) == ranged, name
    masking = OURS["masking"](ranged, whole // 2, sizer, 0)
    assert len(masking) == len(ranged) and any(m.get("content") == MASKED for m in masking)
    cleared = OURS["clearing"](ranged, whole, sizer, 0)
    assert (
        sum(m.get("content") == CLEARED for m in cleared)
        == len([m for m in ranged if m["role"] == "tool"]) - 3
    )


def test_a_hand_built_conversation_end_to_end(tmp_path: Path) -> None:
    snapshot = {"conversation_id": "needed-later", "revision": 1, "messages": CONVERSATION}
    case = run_case("needed-later", CONVERSATION, snapshot, 0.6, [0.3, 2.0], tmp_path, Reuse())
    assert case is not None
    assert (case.cut, case.start, case.end) == (CUT, START, END)
    assert {f.text for f in case.gold} >= {"construct_instance", "QuerySet"}
    for result in case.budgets:
        product = result.methods[PRODUCT]
        assert product.tokens > 0
        for name, r in result.methods.items():
            assert r.tokens <= product.tokens, name  # never more than the product used
            assert len(r.kept) + len(r.missed) == len(case.gold)
    # With room to spare, the digest keeps the files the calls read (it lists them).
    roomy = case.budgets[-1].methods[PRODUCT]
    assert Fact("django/db/models/query.py", "diff_file") in roomy.kept


def test_cut_points_fall_before_an_assistant_message() -> None:
    for share in (0.0, 0.4, 0.6, 0.8):
        cut = cut_index(CONVERSATION, share)
        assert cut is not None and CONVERSATION[cut]["role"] == "assistant"
    assert cut_index(CONVERSATION, 0.99) is None  # no assistant message after that point


@pytest.mark.corpus
@pytest.mark.skipif(
    corpus_dir() is None,
    reason="corpus absent: set COMPACTOR_CORPUS_DIR or place it at ../shared/corpus",
)
def test_one_corpus_conversation_end_to_end(tmp_path: Path, sockets: None) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "needed_later.py"),
            "--sample",
            "1",
            "--cuts",
            "0.6",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| product |" in proc.stdout and "What the product misses most" in proc.stdout
    (case,) = json.loads(out.read_text())
    name, snapshot = next(conversations())
    assert case["conversation"] == name
    assert case["cut"] == cut_index(snapshot["messages"], 0.6)
    assert case["gold"], "a real conversation's future uses something of its past"
    for budget in case["budgets"]:
        methods = budget["methods"]
        product = methods[PRODUCT]["tokens"]
        assert set(methods) == {PRODUCT, *OURS, *STRATEGIES}
        for name, r in methods.items():
            assert r["tokens"] <= product, name
            assert 0.0 <= r["score"] <= 1.0
