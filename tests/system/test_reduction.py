"""``[compaction] reduction``: each strategy through the real pipeline (no summarizer called, the
replacement is the seed strategy's own output plus one marker, the applied history keeps every
tool call with its results and is smaller), the marker's counts across compactions, masking,
the setting's validation (file, snapshot, request) and the CLI reading it."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import CliRunner
from support.pairs_support import anthropic_pairs_intact, openai_pairs_intact
from support.service_support import conversation

from worker.config import Settings, settings_from_mapping
from worker.core.reduction import Masking, marker_counts, masked_output, token_budget
from worker.core.review import edited_summary
from worker.core.strategies import (
    OMITTED_TOOL_RESULT,
    CompactionStrategy,
    SelectiveToolResult,
    SelectiveToolResultConfig,
    SlidingWindow,
    SlidingWindowConfig,
    TokenBudget,
    TokenBudgetConfig,
    Truncation,
    TruncationConfig,
)
from worker.errors import ConfigError, InvalidInput, InvalidSnapshot
from worker.pipeline import Adapters, Pipeline, tokens_of
from worker.reuse import Reuse
from worker.summarize import SummaryRequest
from worker.summarize.digest import DigestSummarizer
from worker.transcripts.filesystem import FileStore
from worker.wire import formats
from worker.wire.events import SUMMARY_MARKER, CompletedEvent, Summary, event_id_for
from worker.wire.history import apply_compaction
from worker.wire.models import Message, ToolCall
from worker.wire.requests import CompactRequest

STRATEGIES = ["truncation", "sliding_window", "token_budget", "selective_tool_result", "masking"]
KNOBS = {
    "reduction_max_messages": 12,
    "reduction_window": 9,
    "reduction_max_tokens": 3000,
    "reduction_keep_tool_results": 2,
}


class CountingSummarizer:
    """The real digest, counting its calls: a strategy must never reach a summarizer."""

    def __init__(self) -> None:
        self.inner = DigestSummarizer()
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> Summary:
        self.calls += 1
        return self.inner.summarize(request)


class Run:
    def __init__(self, root: Path, reduction: str | None, **config: Any) -> None:
        # prefer_remote with an "LLM": under summary it is called, so a strategy's zero counts
        self.llm, self.digest = CountingSummarizer(), CountingSummarizer()
        chosen = {} if reduction is None else {"reduction": reduction}
        compaction = {"mode": "prefer_remote", **chosen, **KNOBS, **config}
        now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        adapters = Adapters(
            store=FileStore(root), llm=self.llm, digest=self.digest, now=lambda: now
        )
        self.pipeline = Pipeline(Settings(compaction=compaction), adapters, Reuse())

    def completed(self, snap: dict[str, Any]) -> CompletedEvent:
        event = self.pipeline.run(self.pipeline.parse(json.dumps(snap).encode()))[-1]
        assert isinstance(event, CompletedEvent), event
        return event

    def normalized(self, snap: dict[str, Any]) -> list[Message]:
        return self.pipeline.parse(json.dumps(snap).encode()).messages


def seed_strategy(reduction: str, run: Run) -> CompactionStrategy:
    """The seed's strategy with the test's knobs, built here rather than by the pipeline."""
    if reduction == "truncation":
        return Truncation(TruncationConfig(max_messages=KNOBS["reduction_max_messages"]))
    if reduction == "sliding_window":
        return SlidingWindow(SlidingWindowConfig(window=KNOBS["reduction_window"]))
    if reduction == "token_budget":
        tokenizer = run.pipeline.reuse.tokenizer("gpt-4.1")
        return TokenBudget(TokenBudgetConfig(max_tokens=KNOBS["reduction_max_tokens"]), tokenizer)
    if reduction == "selective_tool_result":
        keep = KNOBS["reduction_keep_tool_results"]
        return SelectiveToolResult(SelectiveToolResultConfig(keep_last=keep))
    return Masking(KNOBS["reduction_keep_tool_results"])


def coding_session(conversation_id: str, turns: int = 24) -> dict[str, Any]:
    """Tool exchanges with a user instruction in the middle and two calls answered at once."""
    snap = conversation(conversation_id, turns, body=200)
    messages = snap["messages"]
    messages.insert(10, {"id": "u-mid", "role": "user", "content": "Also check src/pkg/io.py."})
    double = {
        "id": "a-two",
        "role": "assistant",
        "content": "Two reads.",
        "tool_calls": [
            {"id": f"two{k}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
            for k in range(2)
        ],
    }
    results = [
        {"id": f"r-two{k}", "role": "tool", "tool_call_id": f"two{k}", "content": "x " * 300}
        for k in range(2)
    ]
    messages[15:15] = [double, *results]
    snap["revision"] = len(messages)
    return snap


def unanswered(messages: list[dict[str, Any]]) -> set[str]:
    calls = {c["id"] for m in messages for c in m.get("tool_calls") or []}
    return calls - {m["tool_call_id"] for m in messages if m["role"] == "tool"}


def expected_range(
    messages: list[Message], start: int, end: int, strategy: CompactionStrategy
) -> list[Message]:
    """The seed strategy's output over the whole history, the part in the range."""
    return [m for m in strategy.compact(messages) if start <= m.source_index < end]


@pytest.mark.parametrize("reduction", STRATEGIES)
def test_each_strategy_through_the_pipeline_replaces_the_range_by_its_own_output(
    tmp_path: Path, reduction: str
) -> None:
    run = Run(tmp_path, reduction)
    snap = coding_session(f"c-{reduction}")
    event = run.completed(snap)
    c = event.compaction
    assert (c.reduction, c.summary.source, c.summary.fidelity) == (reduction, "strategy", None)
    assert run.llm.calls == run.digest.calls == 0

    kept = expected_range(run.normalized(snap), c.start, c.end, seed_strategy(reduction, run))
    *body, marker = c.replacement
    assert [m["id"] for m in body] == [m.id for m in kept]
    assert [m.get("content") for m in body] == [m.content for m in kept]
    assert c.preserved_ids == [m.id for m in kept]
    omitted = (c.end - c.start) - len(kept)
    rewritten = [d for d in c.dropped if d.kind == "tool_output_omitted"]
    assert marker["role"] == "user" and marker["content"] == c.summary.text
    assert marker_counts(Message(id="m", role="user", content=c.summary.text, source_index=0)) == (
        omitted,
        len(rewritten),
    )
    assert [d.message_id for d in c.dropped if d.kind == "message_omitted"] == [
        m["id"] for m in snap["messages"][c.start : c.end] if m["id"] not in c.preserved_ids
    ]
    assert c.summary.sections[0].source_ids  # the marker's sources: what it stands for

    applied = apply_compaction(snap["messages"], event)
    openai_pairs_intact(applied)
    parsed = run.pipeline.parse(json.dumps(snap).encode())
    assert tokens_of(applied, parsed, run.pipeline.reuse.tokenizer("gpt-4.1")) == c.tokens_after
    assert c.tokens_after < c.tokens_before
    assert event.cost is not None and event.cost.summary_usd in (0, 0.0, None)


def test_the_dropping_strategies_drop_and_the_rewriting_ones_only_rewrite(tmp_path: Path) -> None:
    snap = coding_session("c-kinds")
    kinds = {}
    for reduction in STRATEGIES:
        c = Run(tmp_path / reduction, reduction).completed(snap).compaction
        kinds[reduction] = {d.kind for d in c.dropped}
    for reduction in ("truncation", "sliding_window", "token_budget"):
        assert kinds[reduction] == {"message_omitted"}, reduction
    for reduction in ("selective_tool_result", "masking"):
        assert kinds[reduction] == {"tool_output_omitted"}, reduction


def test_selective_tool_result_and_masking_placeholders(tmp_path: Path) -> None:
    snap = coding_session("c-placeholders")
    by_id = {m["id"]: m for m in snap["messages"]}
    for reduction in ("selective_tool_result", "masking"):
        c = Run(tmp_path / reduction, reduction).completed(snap).compaction
        outputs = [m for m in c.replacement if m["role"] == "tool"]
        whole = [m for m in outputs if m["content"] == by_id[m["id"]]["content"]]
        assert len(whole) == KNOBS["reduction_keep_tool_results"]  # the tail holds none
        assert outputs[-len(whole) :] == whole  # the newest ones
        for m in outputs[: -len(whole)]:
            original = by_id[m["id"]]["content"]
            if reduction == "masking":
                assert m["content"] == masked_output(original)
            else:
                assert m["content"] == OMITTED_TOOL_RESULT


def test_summary_is_todays_behaviour_and_its_event_id(tmp_path: Path) -> None:
    snap = coding_session("c-summary")
    explicit = Run(tmp_path, "summary")
    event = explicit.completed(snap)
    default = Run(tmp_path, None)
    assert event.to_json() == default.completed(snap).to_json()
    c = event.compaction
    assert c.reduction == "summary" and explicit.llm.calls == 1
    assert event.event_id == event_id_for(
        "c-summary", snap["revision"], "compaction.completed", c.start, c.end
    )
    assert Settings().compaction.reduction == "summary"


def test_a_later_reduction_takes_the_earlier_marker_over_and_adds_its_count(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, "truncation")
    first = conversation("c-again", 20, body=200)
    event = run.completed(first)
    once = marker_counts(message_of(event.compaction.summary.text))
    assert once is not None and once[0] > 0
    history = apply_compaction(first["messages"], event)[:-1]  # without the closing turn
    grown = conversation("c-again", 20, body=200, id_prefix="n")["messages"][2:]
    second = dict(first, messages=history + grown, revision=first["revision"] + 100)
    again = run.completed(second)
    applied = apply_compaction(second["messages"], again)
    markers = [m for m in applied if marker_counts(message_of(m.get("content") or "")) is not None]
    assert markers == [again.compaction.replacement[-1]]  # one marker: the earlier one taken over
    twice = marker_counts(message_of(again.compaction.summary.text))
    assert twice is not None
    omitted_now = (
        sum(1 for d in again.compaction.dropped if d.kind == "message_omitted") - 1
    )  # the earlier marker is listed as omitted, but counted by what it said
    assert twice[0] == once[0] + omitted_now
    openai_pairs_intact(applied)


def message_of(text: str) -> Message:
    return Message(id="m", role="user", content=text, source_index=0)


def test_a_strategy_that_changes_nothing_is_skipped(tmp_path: Path) -> None:
    run = Run(tmp_path, "truncation", reduction_max_messages=10_000)
    snap = coding_session("c-fits")
    events = run.pipeline.run(run.pipeline.parse(json.dumps(snap).encode()))
    assert events[-1].type == "compaction.skipped"
    assert "the truncation reduction keeps it" in events[-1].reason
    assert run.llm.calls == run.digest.calls == 0


def test_masking_keeps_the_newest_outputs_before_the_tail_and_the_tail_whole() -> None:
    def msg(i: int, role: str, content: str, **more: Any) -> Message:
        return Message(id=f"m{i}", role=role, content=content, source_index=i, **more)

    messages = [msg(0, "system", "sys"), msg(1, "user", "task")]
    for k in range(4):
        call = ToolCall(id=f"c{k}", name="bash", arguments="{}")
        messages.append(msg(2 + 2 * k, "assistant", "", tool_calls=(call,)))
        messages.append(msg(3 + 2 * k, "tool", "line\n" * 40, tool_call_id=f"c{k}"))
    out = Masking(1).compact(messages)
    contents = [m.content for m in out if m.role == "tool"]
    # the last exchange is the protected tail (kept, not counted); of the three before it, the
    # newest one stays whole
    assert contents == [masked_output("line\n" * 40)] * 2 + ["line\n" * 40] * 2
    assert masked_output("a\nb") == "[tool output masked: 2 lines omitted]"
    assert Masking(0).compact(messages[:2]) == messages[:2]


def test_token_budget_defaults_to_half_the_threshold() -> None:
    config = Settings(compaction={"reduction": "token_budget"}).compaction
    assert token_budget(config, 8000) == 4000
    assert token_budget(config, None) == 25_000
    config = Settings(compaction={"reduction_max_tokens": 1234}).compaction
    assert token_budget(config, 8000) == 1234


def test_a_real_conversation_reduced_by_each_strategy(tmp_path: Path, corpus_dir: Path) -> None:
    path = max(corpus_dir.glob("*.json.gz"), key=lambda p: p.stat().st_size)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        snap = json.load(f)
    snap["model"] = {"name": "gpt-4.1", "context_window": None}
    for reduction in STRATEGIES:
        run = Run(
            tmp_path / reduction,
            reduction,
            auto_compact_threshold_tokens=4000,
            auto_compact_threshold_percent="none",
            reduction_max_tokens=None,
        )
        event = run.completed(snap)
        c = event.compaction
        assert c.reduction == reduction and run.llm.calls == run.digest.calls == 0
        applied = apply_compaction(snap["messages"], event)
        # the trajectories hold calls never answered; a reduction adds none, and no orphan result
        assert unanswered(applied) <= unanswered(snap["messages"])
        calls = {c["id"] for m in applied for c in m.get("tool_calls") or []}
        assert {m["tool_call_id"] for m in applied if m["role"] == "tool"} <= calls
        assert c.tokens_after < c.tokens_before, reduction


# --- the setting ----------------------------------------------------------------------------


def test_an_unknown_reduction_is_refused_naming_the_setting_and_the_values() -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping({"compaction": {"reduction": "summarise"}})
    message = str(caught.value)
    assert message.startswith("compaction.reduction: ")
    for value in ["summary", *STRATEGIES]:
        assert f"'{value}'" in message
    with pytest.raises(ConfigError, match=r"compaction\.reduction_window"):
        settings_from_mapping({"compaction": {"reduction_window": 0}})


def test_a_snapshot_may_choose_a_reduction_strictly_validated(tmp_path: Path) -> None:
    run = Run(tmp_path, "summary")
    snap = coding_session("c-own") | {"config": {"reduction": "masking"}}
    event = run.completed(snap)
    assert event.compaction.reduction == "masking" and run.llm.calls == 0
    bad = snap | {"config": {"reduction": "drop_everything"}}
    with pytest.raises(InvalidSnapshot) as caught:
        run.pipeline.parse(json.dumps(bad).encode())
    assert caught.value.field == "config.reduction"
    assert "'masking'" in caught.value.reason


def test_a_requested_compaction_may_choose_a_reduction(tmp_path: Path) -> None:
    run = Run(tmp_path, "summary")
    snap = conversation("c-asked", 10, window=1_000_000)
    request = CompactRequest(request_id="0" * 32, config={"reduction": "sliding_window"})
    parsed = run.pipeline.parse(json.dumps(snap).encode(), request=request)
    event = run.pipeline.compact_requested(parsed, request)
    assert isinstance(event, CompletedEvent)
    assert event.compaction.reduction == "sliding_window" and event.trigger.kind == "requested"


def test_a_strategy_compaction_has_no_summary_for_a_reviewer_to_edit(tmp_path: Path) -> None:
    compaction = Run(tmp_path, "truncation").completed(coding_session("c-edit")).compaction
    with pytest.raises(InvalidInput, match="truncation reduction has no summary to edit"):
        edited_summary(compaction, "my summary", {}, delegation_tools=[], max_output_tokens=2000)


# --- the CLI --------------------------------------------------------------------------------


def test_the_offline_cli_honours_the_configured_reduction(run_cli_in_process: CliRunner) -> None:
    cwd = run_cli_in_process.cwd
    (cwd / "config").mkdir()
    (cwd / "config" / "compactor.toml").write_text(
        '[compaction]\nreduction = "token_budget"\nreduction_max_tokens = 2000\n'
    )
    (cwd / "snap.json").write_text(json.dumps(coding_session("c-cli")))
    result = run_cli_in_process("compact", "snap.json")
    assert result.code == 0, result.stderr
    completed = json.loads(result.stdout.splitlines()[-1])
    assert completed["compaction"]["reduction"] == "token_budget"
    assert completed["compaction"]["summary"]["source"] == "strategy"
    assert completed["compaction"]["replacement"][-1]["content"].startswith(SUMMARY_MARKER)

    env = {"COMPACTOR_REDUCTION": "everything"}
    refused = run_cli_in_process("compact", "snap.json", env=env)
    assert refused.code == 2
    assert "compaction.reduction" in refused.stderr and "'sliding_window'" in refused.stderr


# A 1x1 grey PNG.
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="
)


def test_the_images_of_omitted_messages_are_itemised_in_dropped(tmp_path: Path) -> None:
    snap = conversation("c-pixel", 20)
    task = snap["messages"][1]
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}
    task["content"] = [{"type": "text", "text": task["content"]}, image]
    c = Run(tmp_path, "truncation").completed(snap).compaction
    assert task["id"] not in c.preserved_ids
    items = [(d.kind, d.message_id) for d in c.dropped if d.message_id == task["id"]]
    assert items == [("message_omitted", task["id"]), ("attachment_dropped", task["id"])]
    lost = next(d for d in c.dropped if d.kind == "attachment_dropped")
    assert lost.attachment and lost.attachment.startswith("[image")


# --- other wire formats ---------------------------------------------------------------------


def anthropic_session(turns: int) -> dict[str, Any]:
    """An Anthropic Messages history: tool_use blocks answered by tool_result blocks."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for k in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{k}", "name": "bash", "input": {"n": k}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Go."}, use]})
        body = " ".join(f"w{k}_{i}" for i in range(300))
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": body}
        messages.append({"role": "user", "content": [result]})
    messages.append({"role": "assistant", "content": "Continuing."})
    return {
        "conversation_id": "c-anthropic",
        "revision": 1,
        "format": "anthropic",
        "model": {"name": "claude-sonnet-4", "context_window": 8000},
        "system": "You are a coding agent.",
        "messages": messages,
    }


def _summarized_keeping_the_first_call(
    snap: dict[str, Any], root: Path
) -> tuple[CompletedEvent, list[dict[str, Any]]]:
    """``snap`` with its first call a tool to keep and a newer user turn in the range (carried
    as the newest, after that call's result), summarized by the digest: the event and the
    history with it applied (its calls answered)."""
    snap["messages"][1]["content"][1]["name"] = "plan"
    snap["messages"].insert(11, {"role": "user", "content": "Also check the docs."})
    adapters = Adapters(store=FileStore(root), digest=DigestSummarizer())
    settings = Settings(
        compaction={"mode": "local_only", "preserve_recent_user_tokens": 0},
        tools={"plan": {"compaction": "keep"}},
    )
    pipeline = Pipeline(settings, adapters, Reuse())
    event = pipeline.run(pipeline.parse(json.dumps(snap).encode()))[-1]
    assert isinstance(event, CompletedEvent), event
    applied = apply_compaction(snap["messages"], event)
    anthropic_pairs_intact(applied)
    return event, applied


def test_a_summary_carrying_a_kept_call_still_opens_an_anthropic_history_with_the_task(
    tmp_path: Path,
) -> None:
    """A kept tool's call is carried; on Anthropic's wire it would open the compacted history
    (refused by the Messages API): the task is carried before it."""
    snap = anthropic_session(20)
    event, applied = _summarized_keeping_the_first_call(snap, tmp_path)
    assert applied[0] == snap["messages"][0]  # the task, as it was
    assert [b["type"] for b in applied[1]["content"]] == ["tool_use"]  # the kept call
    assert applied[1]["content"][0]["name"] == "plan"
    assert {"role": "user", "content": "Also check the docs."} in applied
    assert event.compaction.replacement[-1]["content"][0]["text"] == event.compaction.summary.text

    # Chat Completions takes a history opening with the call: nothing is added there.
    assert not formats.opens_with_user("openai")


def _after_an_earlier_summary(snap: dict[str, Any]) -> dict[str, Any]:
    """The history's only user turn before its calls is an earlier compaction's summary (an
    agent that applied one whose range had no task left to lead it)."""
    snap["messages"][0] = {"role": "user", "content": f"{SUMMARY_MARKER}\nThe parser is fixed."}
    return snap


def test_a_kept_call_with_only_an_earlier_summary_before_it_is_summarized_not_leading(
    tmp_path: Path,
) -> None:
    """No user turn in the range can lead the kept call on Anthropic's wire: rather than a
    history the Messages API refuses, the call is summarized, and the newest user turn leads."""
    snap = _after_an_earlier_summary(anthropic_session(20))
    event, applied = _summarized_keeping_the_first_call(snap, tmp_path)
    assert applied[0] == {"role": "user", "content": "Also check the docs."}
    assert "toolu_0" not in json.dumps(applied)  # the kept call went to the summary
    # Without wire ids, a message's id starts with its position: only the newest user turn
    # (position 11) is carried, the kept call (position 1) is not.
    assert [i.split("-")[0] for i in event.compaction.preserved_ids] == ["m11"]


@pytest.mark.parametrize("reduction", STRATEGIES)
def test_each_strategy_opens_an_anthropic_history_with_a_user_turn_after_a_summary(
    tmp_path: Path, reduction: str
) -> None:
    snap = _after_an_earlier_summary(anthropic_session(20))
    event = Run(tmp_path, reduction).completed(snap)
    applied = apply_compaction(snap["messages"], event)
    anthropic_pairs_intact(applied)
    assert applied[0]["role"] == "user"
    opening = applied[0]["content"]
    assert isinstance(opening, str) or all(b["type"] != "tool_result" for b in opening)
    assert applied[-1] == snap["messages"][-1]


@pytest.mark.parametrize("reduction", STRATEGIES)
def test_each_strategy_on_an_anthropic_history(tmp_path: Path, reduction: str) -> None:
    snap = anthropic_session(20)
    event = Run(tmp_path, reduction).completed(snap)
    c = event.compaction
    assert c.format == "anthropic" and c.reduction == reduction
    applied = apply_compaction(snap["messages"], event)
    anthropic_pairs_intact(applied)
    # Anthropic refuses a history that does not open with a user turn: the task leads it.
    assert applied[0] == snap["messages"][0]
    assert applied[-1] == snap["messages"][-1]
    assert c.replacement[-1]["content"][0]["text"] == c.summary.text
    assert c.tokens_after < c.tokens_before


class _AnthropicDay:
    """300 turns of an Anthropic agent (a call, its result) after ``first``, each compaction
    applied as it comes and the worker's pipeline replaced midway (a restart: nothing kept in
    memory)."""

    def __init__(
        self, root: Path, settings: Settings, first: dict[str, Any], tool_of: Callable[[int], str]
    ) -> None:
        self.root, self.settings, self.first, self.tool_of = root, settings, first, tool_of
        self.compactions = 0

    def turns(self) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """After each turn: the turn and the history the agent holds."""
        snap = anthropic_session(0)
        snap["model"]["context_window"] = 6000
        history: list[dict[str, Any]] = [self.first]
        runner = self._pipeline()
        for turn in range(300):
            if turn == 150:
                runner = self._pipeline()
            use = {"type": "tool_use", "id": f"toolu_{turn}", "name": self.tool_of(turn)}
            use["input"] = {"n": turn}
            body = " ".join(f"w{turn}_{i}" for i in range(120))
            result = {"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": body}
            history += [
                {"role": "assistant", "content": [{"type": "text", "text": f"Step {turn}."}, use]},
                {"role": "user", "content": [result]},
            ]
            sent = {**snap, "revision": turn + 1, "messages": history}
            for event in runner.run(runner.parse(json.dumps(sent).encode())):
                if isinstance(event, CompletedEvent):
                    history = apply_compaction(history, event)
                    self.compactions += 1
            yield turn, history

    def _pipeline(self) -> Pipeline:
        return Pipeline(self.settings, Adapters(store=FileStore(self.root)), Reuse())


@pytest.mark.parametrize("reduction", ["summary", "truncation"])
def test_300_anthropic_turns_always_open_with_the_task(tmp_path: Path, reduction: str) -> None:
    """A working day of an Anthropic agent, each compaction applied as it comes and the
    worker's pipeline replaced midway (a restart: nothing kept in memory): every history the
    agent ends up with opens with the task, its calls answered, and stays bounded."""
    task = anthropic_session(0)["messages"][0]
    settings = Settings(compaction={"reduction": reduction, "reduction_max_messages": 12})
    day, peak = _AnthropicDay(tmp_path, settings, task, lambda _: "bash"), 0
    for turn, history in day.turns():
        assert history[0] == task, turn
        anthropic_pairs_intact(history)
        peak = max(peak, len(json.dumps(history)))
    # Each compaction lands at the target (half the 4,500-token threshold): one every 16-20 turns.
    assert day.compactions >= 15
    assert peak < 60_000  # bounded: 300 turns hold about 300 KB uncompacted


def _every_7th_kept(turn: int) -> str:
    return "plan" if turn % 7 == 0 else "bash"


@pytest.mark.parametrize("reduction", ["summary", "truncation"])
def test_300_anthropic_turns_after_only_a_summary_always_open_with_a_user_turn(
    tmp_path: Path, reduction: str
) -> None:
    """The same day when the history holds no task, only an earlier summary, and every seventh
    call is a tool to keep: no user turn can ever lead a carried call, and still every history
    opens with a user turn that is not a tool's result, its calls answered, and stays bounded."""
    earlier = {"role": "user", "content": f"{SUMMARY_MARKER}\nThe parser is fixed."}
    settings = Settings(
        compaction={"reduction": reduction, "reduction_max_messages": 12},
        tools={"plan": {"compaction": "keep"}},
    )
    day, peak = _AnthropicDay(tmp_path, settings, earlier, _every_7th_kept), 0
    for turn, history in day.turns():
        opening = history[0]
        assert opening["role"] == "user", turn
        assert isinstance(opening["content"], str) or all(
            block["type"] != "tool_result" for block in opening["content"]
        ), turn
        anthropic_pairs_intact(history)
        peak = max(peak, len(json.dumps(history)))
    assert day.compactions >= 15  # truncation makes fewer, larger cuts here (17)
    assert peak < 60_000
