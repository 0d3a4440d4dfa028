"""Cost that grows with the work, not faster.

``compactor compact`` (the real CLI, a process per run) of 50,000 short messages costs at most
five times the CPU seconds of 10,000: CPU time of the process (user + system, from ``wait4``) is
what the work cost whatever else the machine runs; wall time only bounds a hang. The
conversations are bench/scaling_compact_bench.py's (a coding agent's short messages).

And the steps made linear give what the simple way gives: giving up carried items keeps a
running total instead of recounting every carried message after each one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.histories import histories

from worker.config import CompactionConfig
from worker.core import planning as compaction
from worker.core.planning import RangePlan, fit_carried, plan_range, resolve_tool_policies
from worker.core.projection import count_message_tokens
from worker.tokens import tokenizer_for
from worker.wire.formats import to_messages
from worker.wire.models import Message

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from scaling_compact_bench import scaling_snapshot

HANG_S = 900.0
RUNS = 2  # of each size; the least CPU of them counts (a run can lose its caches to a neighbour)


def _compact_cpu(snapshot_path: Path, work: Path) -> float:
    """CPU seconds of one ``python -m worker compact`` process, which must complete."""
    work.mkdir(exist_ok=True)
    config = work / "compactor.toml"
    config.write_text(f'[compaction]\ntranscript_dir = "{work / "transcripts"}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    out, err = work / "stdout", work / "stderr"
    command = ["-m", "worker", "compact", str(snapshot_path), "--config", str(config)]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, *command],
            cwd=work,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
        timer = threading.Timer(HANG_S, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    assert proc.returncode == 0, err.read_text(errors="replace")
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert events[-1]["type"] == "compaction.completed", events[-1]
    return usage.ru_utime + usage.ru_stime


@pytest.mark.slow
def test_fifty_thousand_messages_cost_at_most_five_times_ten_thousand(
    tmp_path: Path, subprocesses: None
) -> None:
    cpu: dict[int, float] = {}
    for n in (10_000, 50_000):
        path = tmp_path / f"snapshot-{n}.json"
        path.write_text(json.dumps(scaling_snapshot(n)))
        cpu[n] = min(_compact_cpu(path, tmp_path / f"run-{n}-{k}") for k in range(RUNS))
    assert cpu[50_000] <= 5 * cpu[10_000], cpu


# --- giving up carried items: a running total is the recount --------------------------------


def _fit_by_recounting(plan: RangePlan, budget: int, count: Any, order: dict[str, int]) -> None:
    """What fitting the carried items means: after each item given up, count every carried
    message again."""

    def total() -> int:
        return sum(count(m) for m in plan.carried)

    while total() > budget and plan.delegation_calls:
        call_id = plan.delegation_calls.pop(0)
        kept: list[Message] = []
        for m in plan.carried:
            if m.role == "tool" and m.tool_call_id == call_id:
                plan.to_summarize.append(m)
                continue
            calls = tuple(c for c in m.tool_calls if c.id == call_id)
            if calls:
                plan.to_summarize.append(m.model_copy(update={"tool_calls": calls}))
                rest = tuple(c for c in m.tool_calls if c.id != call_id)
                if not rest:
                    continue
                m = m.model_copy(update={"tool_calls": rest})
            kept.append(m)
        plan.carried = kept
    newest = plan.user_ids[-1] if plan.user_ids else None
    task = plan.task_id if plan.task_id != newest else None
    for message_id in [u for u in plan.user_ids if u not in (task, newest)]:
        if total() <= budget:
            break
        plan.user_ids.remove(message_id)
        plan.to_summarize.extend(m for m in plan.carried if m.id == message_id)
        plan.carried = [m for m in plan.carried if m.id != message_id]
    over = total() - budget
    if over > 0 and task is not None:
        over -= compaction._cut_user_turn(
            plan, task, over, count, least=compaction.TASK_LEAST_TOKENS
        )
    if over > 0 and newest is not None:
        compaction._cut_user_turn(plan, newest, over, count)
    plan.to_summarize.sort(key=lambda m: order.get(m.id, 0))


@settings(max_examples=150)
@given(
    raw=histories(max_turns=30),
    users=st.integers(0, 400),
    delegations=st.integers(0, 6),
    share=st.floats(0, 1.2),
)
def test_fitting_the_carried_items_with_a_running_total_is_the_recount(
    raw: list[dict[str, Any]], users: int, delegations: int, share: float
) -> None:
    messages = to_messages("openai", raw)
    config = CompactionConfig(
        preserve_recent_user_tokens=users,
        preserve_recent_delegation_results=delegations,
        delegation_tools=["delegate_task", "grep"],
    )
    policies = resolve_tool_policies({})
    tokenizer = tokenizer_for("gpt-4.1")

    def count(m: Message) -> int:
        return count_message_tokens(m, tokenizer)

    plans = [plan_range(messages, config, policies, count=count) for _ in range(2)]
    if plans[0] is None or plans[1] is None:
        return
    budget = int(sum(count(m) for m in plans[0].carried) * share)
    order = {m.id: i for i, m in enumerate(messages)}
    fit_carried(plans[0], budget, count, order)
    _fit_by_recounting(plans[1], budget, count, order)
    assert plans[0] == plans[1]
