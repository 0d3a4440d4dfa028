"""The non-LLM compaction strategies: examples per strategy, and properties over generated
histories (ordered subsequence, tool pairs never split, newest group and leading systems kept,
bound held wherever it is satisfiable)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from worker.core.groups import group_messages
from worker.core.projection import count_message_tokens
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
from worker.tokens import CharEstimateTokenizer, TiktokenTokenizer, Tokenizer, tokenizer_for
from worker.wire.models import Message, ToolCall

ESTIMATE = CharEstimateTokenizer()
LONG = "x" * 200  # longer than OMITTED_TOOL_RESULT, so SelectiveToolResult replaces it

# --- hand-built messages ------------------------------------------------------------------------


def system(mid: str, text: str = "be brief") -> Message:
    return Message(id=mid, role="system", content=text, source_index=0)


def user(mid: str, text: str = "hi") -> Message:
    return Message(id=mid, role="user", content=text, source_index=0)


def reply(mid: str, text: str = "ok") -> Message:
    return Message(id=mid, role="assistant", content=text, source_index=0)


def call(mid: str, *call_ids: str) -> Message:
    calls = tuple(ToolCall(id=c, name="bash", arguments='{"cmd": "ls"}') for c in call_ids)
    return Message(id=mid, role="assistant", tool_calls=calls, source_index=0)


def result(mid: str, call_id: str, text: str = LONG) -> Message:
    return Message(
        id=mid, role="tool", content=text, tool_call_id=call_id, tool_name="bash", source_index=0
    )


def numbered(*messages: Message) -> list[Message]:
    """One wire message each, as the OpenAI format yields them."""
    return [m.model_copy(update={"source_index": i}) for i, m in enumerate(messages)]


def ids(messages: list[Message]) -> list[str]:
    return [m.id for m in messages]


def tokens(messages: list[Message], tokenizer: Tokenizer = ESTIMATE) -> int:
    return sum(count_message_tokens(m, tokenizer) for m in messages)


# --- Truncation ---------------------------------------------------------------------------------


def test_truncation_keeps_the_newest_messages_and_the_system_prompt() -> None:
    history = numbered(system("s"), user("u1"), reply("a1"), user("u2"), reply("a2"))
    out = Truncation(TruncationConfig(max_messages=3)).compact(history)
    assert ids(out) == ["s", "u2", "a2"]
    assert all(any(m is h for h in history) for m in out)  # the same objects, not copies


def test_truncation_drops_a_group_the_bound_falls_inside() -> None:
    history = numbered(
        system("s"),
        user("u1"),
        call("x", "c1", "c2"),
        result("r1", "c1"),
        result("r2", "c2"),
        user("u2"),
    )
    # s + u2 = 2; the exchange would make 5 > 4, so it goes whole and the result stays under.
    assert ids(Truncation(TruncationConfig(max_messages=4)).compact(history)) == ["s", "u2"]
    assert ids(Truncation(TruncationConfig(max_messages=5)).compact(history)) == [
        "s",
        "x",
        "r1",
        "r2",
        "u2",
    ]


def test_truncation_keeps_a_newest_group_larger_than_the_bound() -> None:
    history = numbered(
        system("s1"),
        system("s2"),
        user("u1"),
        call("x", "c1", "c2"),
        result("r1", "c1"),
        result("r2", "c2"),
    )
    out = Truncation(TruncationConfig(max_messages=1)).compact(history)
    assert ids(out) == ["s1", "s2", "x", "r1", "r2"]


def test_truncation_keeps_a_call_still_waiting_for_its_result() -> None:
    history = numbered(
        system("s"), user("u1"), reply("a1"), user("u2"), call("x", "c1", "c2"), result("r1", "c1")
    )
    assert ids(Truncation(TruncationConfig(max_messages=4)).compact(history)) == [
        "s",
        "u2",
        "x",
        "r1",
    ]


def test_an_abandoned_call_mid_history_is_compacted_like_anything_else() -> None:
    # Only calls still waiting at the end are protected (groups.protected_tail_start); one the
    # conversation moved on from is an ordinary group.
    history = numbered(user("u1"), call("x", "c1"), user("u2"), reply("a2"))
    assert ids(Truncation(TruncationConfig(max_messages=1)).compact(history)) == ["a2"]
    assert ids(Truncation(TruncationConfig(max_messages=3)).compact(history)) == ["x", "u2", "a2"]


# --- SlidingWindow ------------------------------------------------------------------------------


def test_sliding_window_keeps_systems_and_the_last_non_system_messages() -> None:
    history = numbered(system("s1"), system("s2"), user("u1"), reply("a1"), user("u2"), reply("a2"))
    out = SlidingWindow(SlidingWindowConfig(window=2)).compact(history)
    assert ids(out) == ["s1", "s2", "u2", "a2"]


def test_sliding_window_does_not_count_a_system_message_inside_the_window() -> None:
    history = numbered(system("s"), user("u1"), reply("a1"), system("s2"), user("u2"), reply("a2"))
    out = SlidingWindow(SlidingWindowConfig(window=2)).compact(history)
    assert ids(out) == ["s", "s2", "u2", "a2"]


def test_sliding_window_drops_a_group_its_edge_falls_inside() -> None:
    history = numbered(system("s"), user("u1"), call("x", "c1"), result("r1", "c1"), reply("a1"))
    assert ids(SlidingWindow(SlidingWindowConfig(window=2)).compact(history)) == ["s", "a1"]
    assert ids(SlidingWindow(SlidingWindowConfig(window=3)).compact(history)) == [
        "s",
        "x",
        "r1",
        "a1",
    ]


# --- TokenBudget --------------------------------------------------------------------------------


def test_token_budget_keeps_what_fits_exactly_and_no_more() -> None:
    s, u1, a1, u2, a2 = numbered(
        system("s"),
        user("u1", "a" * 40),
        reply("a1", "b" * 40),
        user("u2", "c" * 40),
        reply("a2", "d" * 40),
    )
    history = [s, u1, a1, u2, a2]
    fits = tokens([s, u2, a2])
    budget = TokenBudget(TokenBudgetConfig(max_tokens=fits), ESTIMATE)
    assert budget.compact(history) == [s, u2, a2]
    tighter = TokenBudget(TokenBudgetConfig(max_tokens=fits - 1), ESTIMATE)
    assert tighter.compact(history) == [s, a2]


def test_token_budget_stops_at_the_first_group_that_does_not_fit() -> None:
    s, small, big, u2 = numbered(
        system("s"), user("small", "a"), reply("big", "b" * 4000), user("u2", "c")
    )
    budget = TokenBudget(TokenBudgetConfig(max_tokens=tokens([s, small, u2])), ESTIMATE)
    # The older small turn would fit on its own, but skipping `big` would leave a hole.
    assert budget.compact([s, small, big, u2]) == [s, u2]


def test_token_budget_keeps_a_newest_group_over_the_budget() -> None:
    history = numbered(system("s"), user("u1"), call("x", "c1"), result("r1", "c1", "z" * 9000))
    out = TokenBudget(TokenBudgetConfig(max_tokens=50), ESTIMATE).compact(history)
    assert ids(out) == ["s", "x", "r1"]
    assert tokens(out) > 50


@pytest.fixture(scope="module")
def tiktoken_o200k() -> Tokenizer:
    tokenizer = tokenizer_for("gpt-4o")
    assert isinstance(tokenizer, TiktokenTokenizer)  # exact counts, not the estimate
    return tokenizer


def test_token_budget_with_real_tiktoken_counts(tiktoken_o200k: Tokenizer) -> None:
    history = numbered(
        system("s", "You are a coding agent."),
        user("u1", "漢字 and emoji 😀🚀🎉 " * 6),  # many tokens for few characters
        reply("a1", "def f(x):\n    return x ** 2\n"),
        user("u2", "ls -la /tmp && grep -rn 'TODO' src/"),
    )
    s, u1, a1, u2 = history
    # Room for u1 by the chars/4 estimate but not by tiktoken's exact count.
    max_tokens = tokens([s, a1, u2], tiktoken_o200k) + tokens([u1], ESTIMATE)
    config = TokenBudgetConfig(max_tokens=max_tokens)
    out = TokenBudget(config, tiktoken_o200k).compact(history)
    assert out == [s, a1, u2]
    assert tokens(out, tiktoken_o200k) <= max_tokens
    # So the test notices a strategy that ignores the tokenizer it was given.
    assert TokenBudget(config, ESTIMATE).compact(history) == history


# --- SelectiveToolResult ------------------------------------------------------------------------


def _tool_history() -> list[Message]:
    return numbered(
        system("s"),
        user("u1"),
        call("x1", "c1"),
        result("r1", "c1"),
        call("x2", "c2", "c3"),
        result("r2", "c2"),
        result("r3", "c3", "ok"),
        user("u2"),
        call("x4", "c4"),
        result("r4", "c4"),
    )


@pytest.mark.parametrize(
    ("keep_last", "omitted"),
    [(0, ["r1", "r2"]), (1, ["r1", "r2"]), (2, ["r1", "r2"]), (3, ["r1"]), (4, []), (99, [])],
)
def test_selective_tool_result_omits_all_but_the_newest_results(
    keep_last: int, omitted: list[str]
) -> None:
    history = _tool_history()
    out = SelectiveToolResult(SelectiveToolResultConfig(keep_last=keep_last)).compact(history)
    assert len(out) == len(history)
    assert [m.id for m in out if m.content == OMITTED_TOOL_RESULT] == omitted
    for before, after in zip(history, out, strict=True):
        if before.id in omitted:
            assert after == before.model_copy(update={"content": OMITTED_TOOL_RESULT})
        else:
            assert after is before


def test_selective_tool_result_keeps_the_newest_groups_results_even_at_zero() -> None:
    history = numbered(user("u1"), call("x1", "c1", "c2"), result("r1", "c1"), result("r2", "c2"))
    out = SelectiveToolResult(SelectiveToolResultConfig(keep_last=0)).compact(history)
    assert out == history
    assert all(a is b for a, b in zip(out, history, strict=True))


# --- configs and edge cases ---------------------------------------------------------------------

CONFIGS: list[tuple[type[BaseModel], str, int]] = [
    (TruncationConfig, "max_messages", 1),
    (SlidingWindowConfig, "window", 1),
    (TokenBudgetConfig, "max_tokens", 1),
    (SelectiveToolResultConfig, "keep_last", 0),
]


@pytest.mark.parametrize(("config", "name", "lowest"), CONFIGS)
def test_configs_validate_their_bounds(config: type[BaseModel], name: str, lowest: int) -> None:
    assert getattr(config(**{name: lowest}), name) == lowest
    for bad in (lowest - 1, -5, "3", 2.5, True, None):
        with pytest.raises(ValidationError, match=name):
            config(**{name: bad})
    with pytest.raises(ValidationError, match="extra"):
        config(**{name: lowest, "unknown": 1})
    frozen = config(**{name: lowest})
    with pytest.raises(ValidationError, match="frozen"):
        setattr(frozen, name, lowest + 1)


def every_strategy(bound: int = 1) -> list[CompactionStrategy]:
    return [
        Truncation(TruncationConfig(max_messages=bound)),
        SlidingWindow(SlidingWindowConfig(window=bound)),
        TokenBudget(TokenBudgetConfig(max_tokens=bound), ESTIMATE),
        SelectiveToolResult(SelectiveToolResultConfig(keep_last=bound)),
    ]


@pytest.mark.parametrize("strategy", every_strategy(), ids=lambda s: type(s).__name__)
def test_empty_and_system_only_histories(strategy: CompactionStrategy) -> None:
    assert strategy.compact([]) == []
    systems = numbered(system("s1", LONG), system("s2", LONG))
    assert strategy.compact(systems) == systems


# --- generated histories ------------------------------------------------------------------------

TEXT = st.text(alphabet=st.sampled_from(list("aeiou xyz\n{}:éß漢😀")), max_size=120)
TOOL_NAMES = st.sampled_from(["bash", "grep", "read_file"])


@dataclass
class History:
    """A valid history and the atomic groups it was built from (the test's own oracle)."""

    messages: list[Message] = field(default_factory=list)
    turns: list[list[Message]] = field(default_factory=list)
    wire: int = 0  # the next wire message's source_index
    calls: int = 0

    def add(self, role: Any, *, same_wire: bool = False, **fields: Any) -> Message:
        if not same_wire:
            self.wire += 1
        m = Message(id=f"m{len(self.messages)}", role=role, source_index=self.wire, **fields)
        self.messages.append(m)
        return m

    def leading(self) -> int:
        n = 0
        while n < len(self.turns) and self.turns[n][0].role == "system":
            n += 1
        return n

    def mandatory(self) -> list[Message]:
        """Leading system turns and the newest turn: what every dropping strategy keeps."""
        lead = self.leading()
        picked = self.turns[:lead] + ([self.turns[-1]] if len(self.turns) > lead else [])
        return [m for turn in picked for m in turn]


@st.composite
def histories(draw: st.DrawFn) -> History:
    """Leading systems, then user turns, replies, tool exchanges (1-3 calls, results in any
    order, Anthropic-style results sharing one wire message with trailing user text) and the
    odd mid-history system message; optionally a final exchange still waiting for results."""
    h = History()
    for _ in range(draw(st.integers(0, 2))):
        h.turns.append([h.add("system", content=draw(TEXT))])
    kinds = st.sampled_from(["user", "assistant", "tools", "tools", "system"])
    for kind in draw(st.lists(kinds, max_size=14)):
        if kind == "tools":
            h.turns.append(_exchange(draw, h, answered_all=True))
        else:
            extra: dict[str, Any] = {"reasoning": draw(TEXT)} if kind == "assistant" else {}
            h.turns.append([h.add(kind, content=draw(TEXT), **extra)])
    if draw(st.booleans()):
        h.turns.append(_exchange(draw, h, answered_all=False))
    return h


def _exchange(draw: st.DrawFn, h: History, *, answered_all: bool) -> list[Message]:
    names = draw(st.lists(TOOL_NAMES, min_size=1, max_size=3))
    calls = []
    for name in names:
        h.calls += 1
        calls.append(ToolCall(id=f"call_{h.calls}", name=name, arguments=draw(TEXT)))
    turn = [h.add("assistant", content=draw(TEXT), tool_calls=tuple(calls))]
    answered = draw(st.permutations(calls))
    if not answered_all:
        answered = answered[: draw(st.integers(0, len(calls) - 1))]
    one_wire = draw(st.booleans())
    for k, c in enumerate(answered):
        turn.append(
            h.add(
                "tool",
                content=draw(TEXT),
                tool_call_id=c.id,
                tool_name=c.name,
                same_wire=one_wire and k > 0,
            )
        )
    if answered_all and one_wire and draw(st.booleans()):
        turn.append(h.add("user", content=draw(TEXT), same_wire=True))
    return turn


Cost = Callable[[Message], int]


@dataclass(frozen=True)
class Dropping:
    """A strategy that drops groups, with the per-message cost its bound is measured in."""

    make: Callable[[int], CompactionStrategy]
    cost: Cost


DROPPING = {
    "truncation": Dropping(lambda n: Truncation(TruncationConfig(max_messages=n)), lambda m: 1),
    "sliding_window": Dropping(
        lambda n: SlidingWindow(SlidingWindowConfig(window=n)),
        lambda m: int(m.role != "system"),
    ),
    "token_budget": Dropping(
        lambda n: TokenBudget(TokenBudgetConfig(max_tokens=n), ESTIMATE),
        lambda m: count_message_tokens(m, ESTIMATE),
    ),
}


def assert_ordered_subsequence(out: list[Message], messages: list[Message]) -> None:
    rest: Iterator[Message] = iter(messages)
    for m in out:
        assert any(m is candidate for candidate in rest), f"{m.id} is not in order or not ours"


def assert_pairs_intact(out: list[Message]) -> None:
    kept_calls = {c.id for m in out for c in m.tool_calls}
    kept_results = {m.tool_call_id for m in out if m.role == "tool"}
    assert kept_results <= kept_calls, "a result was kept without its call"


def kept_turn_indices(h: History, out: list[Message]) -> list[int]:
    """Which of the generated turns were kept; fails if any was kept only in part."""
    kept_ids = set(ids(out))
    kept = []
    for k, turn in enumerate(h.turns):
        inside = [m.id in kept_ids for m in turn]
        assert all(inside) or not any(inside), f"turn {k} was split: {ids(turn)}"
        if all(inside):
            kept.append(k)
    return kept


def assert_groups_kept_whole(h: History, out: list[Message]) -> None:
    kept = kept_turn_indices(h, out)
    all_results = {m.tool_call_id for m in h.messages if m.role == "tool"}
    kept_results = {m.tool_call_id for m in out if m.role == "tool"}
    answered_calls = {c.id for m in out for c in m.tool_calls} & all_results
    assert answered_calls <= kept_results, "a call was kept without its results"
    assert_pairs_intact(out)
    lead = h.leading()
    assert kept[:lead] == list(range(lead)), "a leading system message was dropped"
    if len(h.turns) > lead:
        assert kept[-1] == len(h.turns) - 1, "the newest group was dropped"


@settings(max_examples=100, deadline=None)
@given(h=histories())
def test_generated_turns_are_the_atomic_groups(h: History) -> None:
    # The properties below use the generator's turns as the oracle; make sure it agrees with
    # worker.core.groups, which the strategies rely on.
    assert [[m.id for m in h.messages[g.start : g.end]] for g in group_messages(h.messages)] == [
        ids(turn) for turn in h.turns
    ]


def bounds_near_turn_edges(h: History, cost: Cost) -> st.SearchStrategy[int]:
    """Bounds at or next to what keeping the leading systems and the last k turns costs, so
    every regime is common (nothing dropped, some turns dropped, the mandatory part alone
    over the bound) and the exact edges get tested."""
    lead = h.leading()
    edges = [
        sum(cost(m) for turn in h.turns[:lead] + h.turns[k:] for m in turn)
        for k in range(lead, len(h.turns) + 1)
    ]
    return st.builds(
        lambda edge, delta: max(edge + delta, 1), st.sampled_from(edges), st.integers(-2, 2)
    )


@pytest.mark.parametrize("name", list(DROPPING))
@settings(max_examples=100, deadline=None)
@given(data=st.data(), h=histories())
def test_dropping_strategies_keep_a_valid_bounded_history(
    name: str, data: st.DataObject, h: History
) -> None:
    spec = DROPPING[name]
    bound = data.draw(bounds_near_turn_edges(h, spec.cost), label="bound")
    out = spec.make(bound).compact(h.messages)

    assert_ordered_subsequence(out, h.messages)
    assert_groups_kept_whole(h, out)
    total = sum(spec.cost(m) for m in out)
    mandatory = h.mandatory()
    if sum(spec.cost(m) for m in mandatory) <= bound:
        assert total <= bound
    else:
        assert out == mandatory  # unsatisfiable: nothing beyond what must stay
    # Kept turns are the leading systems plus a contiguous run ending at the newest, and the
    # run could not have grown by one more turn without breaking the bound.
    kept = kept_turn_indices(h, out)
    lead = h.leading()
    run = kept[lead:]
    assert run == list(range(len(h.turns) - len(run), len(h.turns)))
    if run and run[0] > lead:
        assert total + sum(spec.cost(m) for m in h.turns[run[0] - 1]) > bound
    assert spec.make(bound).compact(out) == out  # compacting again changes nothing


@settings(max_examples=100, deadline=None)
@given(data=st.data(), h=histories())
def test_selective_tool_result_only_blanks_old_results(data: st.DataObject, h: History) -> None:
    keep_last = data.draw(st.integers(0, 12), label="keep_last")
    strategy = SelectiveToolResult(SelectiveToolResultConfig(keep_last=keep_last))
    out = strategy.compact(h.messages)

    assert len(out) == len(h.messages)
    newest = {m.id for m in h.turns[-1]} if h.turns else set()
    results = [m for m in h.messages if m.role == "tool"]
    old = results[: max(len(results) - keep_last, 0)]
    expected = {
        m.id for m in old if m.id not in newest and len(m.content) > len(OMITTED_TOOL_RESULT)
    }
    for before, after in zip(h.messages, out, strict=True):
        if before.id in expected:
            assert after == before.model_copy(update={"content": OMITTED_TOOL_RESULT})
        else:
            assert after is before
    assert_pairs_intact(out)
    assert strategy.compact(out) == out


@settings(max_examples=30, deadline=None)
@given(data=st.data(), h=histories())
def test_token_budget_bound_with_real_tiktoken(
    tiktoken_o200k: Tokenizer, data: st.DataObject, h: History
) -> None:
    bound = data.draw(
        bounds_near_turn_edges(h, lambda m: count_message_tokens(m, tiktoken_o200k)),
        label="max_tokens",
    )
    out = TokenBudget(TokenBudgetConfig(max_tokens=bound), tiktoken_o200k).compact(h.messages)
    assert_ordered_subsequence(out, h.messages)
    assert_groups_kept_whole(h, out)
    if tokens(h.mandatory(), tiktoken_o200k) <= bound:
        assert tokens(out, tiktoken_o200k) <= bound
    else:
        assert out == h.mandatory()


# Arbitrary, often invalid lists: orphan results, reused call ids, results before calls.
ANY_MESSAGE = st.builds(
    Message,
    id=st.sampled_from(["a", "b", "c"]),
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=TEXT,
    tool_calls=st.lists(
        st.builds(ToolCall, id=st.sampled_from(["c1", "c2", "c3"]), name=TOOL_NAMES), max_size=2
    ).map(tuple),
    tool_call_id=st.sampled_from([None, "c1", "c2", "c3"]),
    source_index=st.integers(0, 6),
)


@settings(max_examples=100, deadline=None)
@given(messages=st.lists(ANY_MESSAGE, max_size=12), bound=st.integers(1, 20))
def test_no_content_makes_a_strategy_fail(messages: list[Message], bound: int) -> None:
    groups = group_messages(messages)
    for strategy in every_strategy(bound):
        out = strategy.compact(messages)
        if isinstance(strategy, SelectiveToolResult):
            assert len(out) == len(messages)
            continue
        assert_ordered_subsequence(out, messages)
        if messages:
            assert out[-1] is messages[-1]
        kept = {id(m) for m in out}
        for g in groups:  # whole groups, by worker.core.groups' own account
            inside = [id(messages[i]) in kept for i in g.indices()]
            assert all(inside) or not any(inside)
