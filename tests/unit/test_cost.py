"""The cost model (worker.core.cost): prices by model with deployment overrides, the cost of a
compaction with a provider's prompt cache, the cost policy's decision, and the ``cost`` object
every completed event carries (tokens only for a model without prices)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support.service_support import conversation

from worker.config import CompactionConfig, CostConfig, Settings, settings_from_mapping
from worker.core.cost import (
    Activity,
    CostInputs,
    LastRequest,
    Priced,
    ceiling_tokens,
    decide,
    estimate,
    prices_for,
)
from worker.errors import ConfigError, InvalidSnapshot
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent, SkippedEvent, parse_event

NOW = datetime(2025, 9, 1, 12, 0, 0, tzinfo=UTC)


def test_a_dated_model_name_finds_its_family_and_the_longest_name_wins() -> None:
    config = CostConfig()
    found = prices_for("gpt-4o-mini-2024-07-18", config)
    assert found is not None and found.name == "gpt-4o-mini" and found.origin == "builtin"
    sonnet = prices_for("claude-sonnet-4-20250514", config)
    assert sonnet is not None and sonnet.name == "claude-sonnet-4"
    # Anthropic: writes at 1.25x input for the 5-minute TTL, reads at 0.1x
    assert sonnet.prices.cache_write_price == pytest.approx(3.75)
    assert sonnet.prices.cached_input == pytest.approx(0.30)
    assert sonnet.prices.cache_ttl_s == 300
    assert "anthropic.com" in sonnet.prices.source
    assert prices_for("my-local-llama", config) is None
    assert prices_for(None, config) is None


def test_the_deployment_overrides_a_builtin_model_and_adds_new_ones() -> None:
    settings = settings_from_mapping(
        {
            "cost": {
                "models": {
                    "gpt-4o": {"input": 1.0, "cached_input": 0.1, "output": 2.0},
                    "my-llama": {
                        "input": 0.5,
                        "cached_input": 0.05,
                        "output": 1.0,
                        "cache_write": {"5m": 0.6, "1h": 1.0},
                        "cache_ttl": "1h",
                    },
                }
            }
        }
    )
    ours = prices_for("gpt-4o-2024-08-06", settings.cost)
    assert ours is not None and ours.origin == "config" and ours.prices.input == 1.0
    llama = prices_for("my-llama", settings.cost)
    assert llama is not None and llama.prices.cache_write_price == 1.0  # the 1h TTL's price
    assert llama.prices.cache_ttl_s == 3600
    only = settings_from_mapping({"cost": {"builtin_prices": False}})
    assert prices_for("gpt-4o", only.cost) is None


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"models": {"m": {"input": -1, "cached_input": 0, "output": 0}}}, "cost.models.m.input"),
        ({"models": {"m": {"input": 1, "cached_input": 0}}}, "cost.models.m.output"),
        (
            {"models": {"m": {"input": 1, "cached_input": 0, "output": 0, "cache_ttl": "5 min"}}},
            "cost.models.m.cache_ttl",
        ),
        ({"model": {}}, "cost.model"),
    ],
)
def test_bad_prices_are_refused_naming_the_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping({"cost": table})
    assert caught.value.key == key


def priced(name: str = "claude-sonnet-4") -> Priced:
    found = prices_for(name, CostConfig())
    assert found is not None
    return found


def inputs(before: int, after: int, **pace: Any) -> CostInputs:
    return CostInputs(
        tokens_before=before,
        tokens_after=after,
        summary_input_tokens=before - after,
        summary_output_tokens=1000,
        horizon_turns=10,
        activity=Activity(**pace),
    )


def test_with_a_warm_cache_a_compaction_pays_the_write_and_saves_cached_reads() -> None:
    # Sonnet: write 3.75, read 0.30 per million; turns every 60 s (cache kept 300 s)
    pace = {"snapshots": 11, "first_at": 0.0, "last_at": 600.0, "now": 601.0}
    cost = estimate(
        inputs(100_000, 20_000, **pace),
        priced(),
        priced("gpt-4.1-mini"),
        policy="cost",
        llm_summary=True,
        model="claude-sonnet-4",
    )
    assert cost.priced and cost.cache_warm is True and cost.turn_interval_s == 60.0
    assert cost.saved_tokens_per_turn == 80_000 and cost.cache_write_tokens == 20_000
    # the next request writes 20k (0.075) instead of reading 100k (0.03)
    assert cost.cache_write_usd == pytest.approx(0.075 - 0.03)
    assert cost.saving_per_turn_usd == pytest.approx(80_000 * 0.30 / 1e6)
    # summary on gpt-4.1-mini: 80k in at 0.40, 1k out at 1.60
    assert cost.summary_usd == pytest.approx(0.032 + 0.0016)
    spent = cost.summary_usd + cost.cache_write_usd
    assert cost.break_even_turns == -(-spent // cost.saving_per_turn_usd)
    assert cost.expected_net_usd == pytest.approx(cost.saving_per_turn_usd * 10 - spent)
    assert cost.prices is not None and cost.prices.model == "claude-sonnet-4"
    assert cost.summary_prices is not None and cost.summary_prices.model == "gpt-4.1-mini"


def test_with_a_cold_cache_the_compaction_makes_the_next_write_cheaper() -> None:
    # turns every 20 minutes: the 5-minute cache has always expired by the next one
    pace = {"snapshots": 3, "first_at": 0.0, "last_at": 2400.0, "now": 2401.0}
    cost = estimate(
        inputs(100_000, 20_000, **pace),
        priced(),
        None,
        policy="threshold",
        llm_summary=False,
        model="claude-sonnet-4",
    )
    assert cost.cache_warm is False and cost.summary_usd == 0.0
    assert cost.cache_write_usd == pytest.approx((20_000 - 100_000) * 3.75 / 1e6)
    assert cost.break_even_turns == 0
    assert cost.saving_per_turn_usd == pytest.approx(80_000 * 3.75 / 1e6)


def test_an_idle_conversation_counts_as_cold_even_with_fast_turns() -> None:
    pace = {"snapshots": 11, "first_at": 0.0, "last_at": 600.0, "now": 600.0 + 3600}
    cost = estimate(
        inputs(50_000, 10_000, **pace), priced(), None, policy="x", llm_summary=False, model="m"
    )
    assert cost.turn_interval_s == 60.0 and cost.cache_warm is False


def test_a_last_request_that_left_the_cache_alone_means_no_warm_prefix_to_lose() -> None:
    """Turns every minute would keep a cache warm, but the provider said the agent's last
    request (long enough to be cached) read nothing from its cache and wrote nothing to it:
    caching is off for this conversation, so the compaction loses no cached prefix."""
    pace = {"snapshots": 11, "first_at": 0.0, "last_at": 600.0, "now": 601.0}

    def warm(last: LastRequest | None) -> bool | None:
        given = replace(inputs(100_000, 20_000, **pace), last_request=last)
        return estimate(given, priced(), None, policy="x", llm_summary=False, model="m").cache_warm

    assert warm(None) is True
    assert warm(LastRequest(input_tokens=90_000, cache_reads=0, cache_writes=0)) is False
    assert warm(LastRequest(input_tokens=90_000, cache_reads=0)) is False  # OpenAI says no writes
    assert warm(LastRequest(input_tokens=90_000, cache_reads=85_000)) is True  # a hit
    assert warm(LastRequest(input_tokens=90_000, cache_reads=0, cache_writes=90_000)) is True
    assert warm(LastRequest(input_tokens=90_000)) is True  # the provider said nothing of it
    assert warm(LastRequest(input_tokens=900, cache_reads=0, cache_writes=0)) is True  # too short


def test_an_unknown_model_gets_tokens_only_and_says_so() -> None:
    cost = estimate(
        inputs(50_000, 10_000), None, None, policy="threshold", llm_summary=False, model="llama"
    )
    assert not cost.priced and cost.note == "no prices for model llama: tokens only"
    assert cost.saved_tokens_per_turn == 40_000 and cost.cache_write_tokens == 10_000
    assert cost.summary_usd is None and cost.expected_net_usd is None and cost.prices is None


def decision_for(projected: int, net_usd: float, *, warm: bool = True, **config: Any) -> Any:
    base = estimate(
        inputs(projected, projected // 5),
        priced(),
        None,
        policy="cost",
        llm_summary=False,
        model="m",
    )
    cost = base.model_copy(update={"expected_net_usd": net_usd, "cache_warm": warm})
    return decide(cost, projected, 10_000, 100_000, CompactionConfig(policy="cost", **config))


def test_the_cost_policy_compacts_earlier_later_and_never_below_the_minimum() -> None:
    assert decision_for(6_000, 0.5).compact  # under the threshold, worth it: earlier
    assert not decision_for(4_000, 0.5).compact  # under the floor (50 % of 10,000)
    small = decision_for(20_000, 0.001, cost_min_gain_usd=0.01)  # over, warm, too little
    assert not small.compact and "< minimum" in small.reason
    assert small.cost.decision == small.reason
    assert decision_for(20_000, 0.001, warm=False).compact  # cold: any gain
    assert not decision_for(20_000, -0.1, warm=False).compact
    # at the ceiling (90 % of the window) whatever the numbers
    assert ceiling_tokens(10_000, 100_000, CompactionConfig()) == 90_000
    forced = decision_for(95_000, -1.0)
    assert forced.compact and "ceiling" in forced.reason
    assert ceiling_tokens(10_000, None, CompactionConfig()) == 12_500


def test_usage_may_report_cache_tokens_and_the_request_time_strictly() -> None:
    settings = Settings()
    snap = conversation("c-usage", 2)
    snap["usage"] = {
        "input_tokens": 900,
        "message_count": 3,
        "cached_input_tokens": 800,
        "cache_creation_input_tokens": 100,
        "requested_at": "2025-09-01T11:59:00Z",
    }
    runner = Pipeline(settings, Adapters(store=FileStore(Path("/nonexistent"))))
    parsed = runner.parse(json.dumps(snap).encode())
    assert parsed.snapshot.usage is not None
    assert parsed.snapshot.usage.cached_input_tokens == 800
    for bad, field in [
        ({"cached_input_tokens": 1000}, "usage"),
        ({"requested_at": "2025-09-01T11:59:00"}, "usage.requested_at"),  # no time zone
        ({"cache_read_tokens": 1}, "usage.cache_read_tokens"),
    ]:
        wrong = dict(snap, usage=snap["usage"] | bad)
        with pytest.raises(InvalidSnapshot) as caught:
            runner.parse(json.dumps(wrong).encode())
        assert caught.value.field == field


def run(tmp_path: Path, snap: dict[str, Any], **compaction: Any) -> list[Any]:
    settings = Settings(compaction={"keep_recent_tool_results": 1, **compaction})
    runner = Pipeline(settings, Adapters(store=FileStore(tmp_path), now=lambda: NOW), Reuse())
    return runner.run(runner.parse(json.dumps(snap).encode()))


def test_every_completed_event_carries_its_cost(tmp_path: Path) -> None:
    snap = conversation("c-cost", 12, window=2000)
    snap["model"]["name"] = "gpt-4.1"
    completed = run(tmp_path, snap)[-1]
    assert isinstance(completed, CompletedEvent) and completed.cost is not None
    cost = completed.cost
    assert cost.policy == "threshold" and cost.priced
    assert cost.tokens_before == completed.compaction.tokens_before
    assert cost.tokens_after == completed.compaction.tokens_after
    assert cost.saved_tokens_per_turn == cost.tokens_before - cost.tokens_after > 0
    assert cost.summary_usd == 0.0  # the offline digest
    assert cost.prices is not None and cost.prices.model == "gpt-4.1"
    again = parse_event(completed.to_json())  # published and read back
    assert isinstance(again, CompletedEvent) and again.cost == cost


def test_a_model_without_prices_carries_tokens_only(tmp_path: Path) -> None:
    snap = conversation("c-unpriced", 12, window=2000)
    snap["model"]["name"] = "acme-model-7"
    completed = run(tmp_path, snap)[-1]
    assert isinstance(completed, CompletedEvent) and completed.cost is not None
    assert not completed.cost.priced and completed.cost.summary_usd is None
    assert completed.cost.note == "no prices for model acme-model-7: tokens only"
    assert completed.cost.saved_tokens_per_turn > 0


def test_the_cost_policy_skips_a_warm_prefix_for_a_gain_under_the_minimum(tmp_path: Path) -> None:
    probe = run(tmp_path / "probe", conversation("c-small", 12, window=2000))[-1]
    tokens = probe.trigger.projected_tokens
    # threshold 75 % of the window = 0.9 x tokens; ceiling 90 % = 1.08 x tokens
    snap = conversation("c-small", 12, window=tokens * 6 // 5)
    over = run(tmp_path / "a", snap, policy="cost", cost_min_gain_usd=1000.0)[-1]
    assert isinstance(over, SkippedEvent) and over.cost is not None
    assert over.trigger is not None and over.trigger.kind == "cost"
    assert over.trigger.projected_tokens > (over.trigger.threshold_tokens or 0)
    assert "< minimum $1000" in over.reason and over.cost.decision is not None
    done = run(tmp_path / "b", snap, policy="cost", cost_min_gain_usd=0.0)[-1]
    assert isinstance(done, CompletedEvent) and done.trigger.kind == "cost"
    assert done.cost is not None and done.cost.decision is not None


@pytest.mark.parametrize("reduction", ["truncation", "masking"])
def test_under_a_strategy_the_cost_policy_costs_what_the_strategy_leaves(
    tmp_path: Path, reduction: str
) -> None:
    """A strategy is pure and calls no summarizer: the estimate the cost policy decides on is
    its compaction's exact tokens after, with no summary call."""
    # the projection keeps every output as it is: masking's placeholders shorten the request
    knobs = {
        "reduction": reduction,
        "reduction_max_messages": 6,
        "keep_recent_tool_results": "none",
    }
    probe = run(tmp_path / "probe", conversation("c-strat", 12, window=2000), **knobs)[-1]
    snap = conversation("c-strat", 12, window=probe.trigger.projected_tokens * 6 // 5)
    skipped = run(tmp_path / "a", snap, policy="cost", cost_min_gain_usd=1000.0, **knobs)[-1]
    assert isinstance(skipped, SkippedEvent) and skipped.cost is not None
    done = run(tmp_path / "b", snap, **knobs)[-1]  # the threshold policy makes it
    assert isinstance(done, CompletedEvent) and done.compaction.reduction == reduction
    assert skipped.cost.tokens_after == done.compaction.tokens_after
    assert skipped.cost.summary_input_tokens == skipped.cost.summary_output_tokens == 0


def test_a_strategy_that_would_not_shorten_the_request_is_skipped(tmp_path: Path) -> None:
    """The projection already shortens old outputs (``keep_recent_tool_results = 1``) more
    than masking's placeholders would: the compaction would make the request longer, so none
    is published, and the skip says why."""
    probe = run(tmp_path / "probe", conversation("c-mask", 12, window=2000))[-1]
    snap = conversation("c-mask", 12, window=probe.trigger.projected_tokens * 6 // 5)
    skipped = run(tmp_path / "a", snap, reduction="masking")[-1]
    assert isinstance(skipped, SkippedEvent), skipped
    assert skipped.why == "no_gain"
    assert "less than the minimum gain" in skipped.reason and "not published" in skipped.reason
    assert not list((tmp_path / "a").rglob("*.json*"))  # no transcript written either


def test_the_agents_usage_without_cache_reads_or_writes_tells_a_cold_cache(
    tmp_path: Path,
) -> None:
    snap = conversation("c-nocache", 12, window=2000)
    # the agent's last request held the first 10 messages, thousands of tokens, none cached
    snap["usage"] = {
        "input_tokens": 4000,
        "message_count": 10,
        "cached_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    cold = run(tmp_path / "cold", snap)[-1]
    assert isinstance(cold, CompletedEvent) and cold.cost is not None
    assert cold.trigger.usage_ignored is None  # the usage was taken
    assert cold.cost.cache_warm is False
    snap["usage"]["cached_input_tokens"] = 3500  # a cache hit: warm as the pace says
    warm = run(tmp_path / "warm", snap)[-1]
    assert isinstance(warm, CompletedEvent) and warm.cost is not None
    assert warm.cost.cache_warm is True


def test_the_agents_last_request_time_tells_a_cold_cache(tmp_path: Path) -> None:
    snap = conversation("c-cold", 12, window=2000)
    snap["usage"] = {"input_tokens": 20, "message_count": 1}
    warm = run(tmp_path / "warm", snap)[-1]
    assert isinstance(warm, CompletedEvent) and warm.cost is not None
    assert warm.cost.cache_warm is True  # pace unknown: assumed warm
    # sent 10 minutes before the evaluation: a 5-minute cache has expired
    snap["usage"]["requested_at"] = "2025-09-01T11:50:00+00:00"
    cold = run(tmp_path / "cold", snap)[-1]
    assert isinstance(cold, CompletedEvent) and cold.cost is not None
    assert cold.cost.cache_warm is False
    assert cold.cost.cache_write_usd is not None and cold.cost.cache_write_usd < 0
