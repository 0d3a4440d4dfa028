"""The cost model: what a compaction costs and saves with a provider's prompt cache, and the
``cost`` policy's decision (docs/cost.md). Pure: prices, counts and times come in as values.

A compaction rewrites the prefix the provider has cached. The request after it writes the new,
shorter prefix to the cache (``tokens_after`` at the cache-write price) where it would
otherwise have read the old one (``tokens_before`` at the cached-input price) or, when the cache
would have expired by then anyway, written it too. Every later turn then sends
``tokens_before - tokens_after`` fewer tokens: read from the cache when turns come faster than
its lifetime, written again when they do not. The summary call is paid once, at the summarizing
model's prices (nothing for the offline digest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from worker.config import CompactionConfig, CostConfig, ModelPrices
from worker.core.prices import BUILTIN_PRICES
from worker.wire.events import Cost, CostPrices

PER_MILLION = 1_000_000


@dataclass(frozen=True)
class Priced:
    """A model's prices and where they were found (``builtin`` or ``config``)."""

    name: str
    prices: ModelPrices
    origin: str

    def shown(self) -> CostPrices:
        p = self.prices
        return CostPrices(
            model=self.name,
            input=p.input,
            cached_input=p.cached_input,
            cache_write=p.cache_write_price,
            output=p.output,
            cache_ttl_s=p.cache_ttl_s,
            min_cacheable_tokens=p.min_cacheable_tokens,
            origin=self.origin,
            source=p.source,
        )


def prices_for(model: str | None, config: CostConfig) -> Priced | None:
    """The prices of ``model``: the deployment's ``[cost.models]`` first, then the built-in
    table; an exact name first, else the longest name it starts with. None: unknown."""
    if not model:
        return None
    tables: list[tuple[str, dict[str, ModelPrices]]] = [("config", config.models)]
    if config.builtin_prices:
        tables.append(("builtin", _builtin()))
    for origin, table in tables:
        if model in table:
            return Priced(model, table[model], origin)
    for origin, table in tables:
        found = max((n for n in table if model.startswith(n)), key=len, default=None)
        if found is not None:
            return Priced(found, table[found], origin)
    return None


_BUILTIN: dict[str, ModelPrices] = {}


def _builtin() -> dict[str, ModelPrices]:
    if not _BUILTIN:
        _BUILTIN.update({k: ModelPrices.model_validate(v) for k, v in BUILTIN_PRICES.items()})
    return _BUILTIN


@dataclass(frozen=True)
class Activity:
    """A conversation's pace as the service saw it (seconds since the epoch): how many
    snapshots, the first one's time and the newest one's (or the agent's last request, when
    later), and the time of the evaluation, ``now``."""

    snapshots: int = 1
    first_at: float | None = None
    last_at: float | None = None
    now: float | None = None

    @property
    def turn_interval_s(self) -> float | None:
        """The mean time between two snapshots; None before the second."""
        if self.snapshots < 2 or self.first_at is None or self.last_at is None:
            return None
        return max(self.last_at - self.first_at, 0.0) / (self.snapshots - 1)

    @property
    def next_request_in_s(self) -> float | None:
        """How long after the cache was last touched the next request is expected: the
        conversation's turn interval, or the time it has been idle when longer."""
        idle = None
        if self.last_at is not None and self.now is not None:
            idle = max(self.now - self.last_at, 0.0)
        known = [s for s in (self.turn_interval_s, idle) if s is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class CostInputs:
    """What a cost estimate needs: the counts before and after (estimated before the
    compaction exists), the summary call's size, the pace and how many later turns count."""

    tokens_before: int
    tokens_after: int
    summary_input_tokens: int
    summary_output_tokens: int
    horizon_turns: int
    activity: Activity = Activity()
    last_request: LastRequest | None = None


@dataclass(frozen=True)
class LastRequest:
    """What the provider reported of the agent's last request (the snapshot's ``usage``): all
    its input tokens, and those read from and written to the prompt cache (None: not said)."""

    input_tokens: int
    cache_reads: int | None = None
    cache_writes: int | None = None

    def left_the_cache_alone(self, min_cacheable_tokens: int) -> bool:
        """Long enough to be cached, it read nothing from the cache and wrote nothing to it:
        this conversation's prefix is not in the provider's cache (caching off, or expired)."""
        return (
            self.input_tokens >= max(min_cacheable_tokens, 1)
            and self.cache_reads == 0
            and not self.cache_writes
        )


def estimate(
    inputs: CostInputs,
    priced: Priced | None,
    summary_priced: Priced | None,
    *,
    policy: str,
    llm_summary: bool,
    model: str | None,
) -> Cost:
    """The ``cost`` object: tokens always, money where ``priced`` (and, for an LLM summary,
    ``summary_priced``) are known."""
    interval = inputs.activity.turn_interval_s
    gap = inputs.activity.next_request_in_s
    saved = max(inputs.tokens_before - inputs.tokens_after, 0)
    summary_in = inputs.summary_input_tokens if llm_summary else 0
    summary_out = inputs.summary_output_tokens if llm_summary else 0
    base = Cost(
        policy=policy,
        tokens_before=inputs.tokens_before,
        tokens_after=inputs.tokens_after,
        saved_tokens_per_turn=saved,
        cache_write_tokens=inputs.tokens_after,
        summary_input_tokens=summary_in,
        summary_output_tokens=summary_out,
        horizon_turns=inputs.horizon_turns,
        turn_interval_s=None if interval is None else round(interval, 3),
    )
    if priced is None:
        return base.model_copy(
            update={"note": f"no prices for model {model or '(none given)'}: tokens only"}
        )
    if llm_summary and summary_priced is None:
        return base.model_copy(
            update={
                "note": "no prices for the summarizing model: tokens only",
                "prices": priced.shown(),
            }
        )
    p = priced.prices
    warm = gap is None or gap < p.cache_ttl_s
    last = inputs.last_request
    if last is not None and last.left_the_cache_alone(p.min_cacheable_tokens):
        warm = False  # no cached prefix for the compaction to lose, whatever the pace
    # What the next request pays for its prefix without the compaction: a cache read when warm,
    # a fresh write when the cache will have expired anyway.
    old_prefix_price = p.cached_input if warm else p.cache_write_price
    cache_write_usd = _usd(inputs.tokens_after, p.cache_write_price) - _usd(
        inputs.tokens_before, old_prefix_price
    )
    saving = _usd(saved, p.cached_input if warm else p.cache_write_price)
    summary_usd = 0.0
    if llm_summary and summary_priced is not None:
        s = summary_priced.prices
        summary_usd = _usd(summary_in, s.input) + _usd(summary_out, s.output)
    spent = summary_usd + cache_write_usd
    return base.model_copy(
        update={
            "priced": True,
            "cache_warm": warm,
            "summary_usd": _round(summary_usd),
            "cache_write_usd": _round(cache_write_usd),
            "saving_per_turn_usd": _round(saving),
            "break_even_turns": _break_even(spent, saving),
            "expected_net_usd": _round(saving * inputs.horizon_turns - spent),
            "prices": priced.shown(),
            "summary_prices": summary_priced.shown() if llm_summary and summary_priced else None,
        }
    )


def _usd(tokens: int, per_million: float) -> float:
    return tokens * per_million / PER_MILLION


def _round(usd: float) -> float:
    return round(usd, 8)


def _break_even(spent: float, saving_per_turn: float) -> int | None:
    if spent <= 0:
        return 0
    if saving_per_turn <= 0:
        return None
    return math.ceil(spent / saving_per_turn)


def horizon_turns(turns_so_far: int, config: CompactionConfig) -> int:
    """Later turns a saving is counted over: as many as the conversation has had so far (a
    long conversation is likely to go on), at most ``cost_horizon_turns``."""
    return max(1, min(turns_so_far, config.cost_horizon_turns))


@dataclass(frozen=True)
class CostDecision:
    """The cost policy's verdict: compact or not, and the words a skipped event carries."""

    compact: bool
    reason: str
    cost: Cost


def decide(
    cost: Cost,
    projected_tokens: int,
    threshold: int | None,
    context_window: int | None,
    config: CompactionConfig,
) -> CostDecision:
    """Under ``policy = "cost"``: compact between the floor (``cost_floor_percent`` of the
    threshold) and the ceiling when the expected net gain is at least ``cost_min_gain_usd``;
    at or over the ceiling always (the context must not overflow); never below the floor. A
    warm cached prefix is never rewritten for less than the minimum; a cold one for any gain.
    Without prices, the threshold decides."""

    def verdict(compact: bool, reason: str) -> CostDecision:
        return CostDecision(compact, reason, cost.model_copy(update={"decision": reason}))

    if threshold is None:
        return verdict(False, "auto-compaction is off")
    over = projected_tokens > threshold
    if not cost.priced or cost.expected_net_usd is None:
        why = f"{cost.note or 'unpriced'}; the threshold decides"
        return verdict(over, why)
    ceiling = ceiling_tokens(threshold, context_window, config)
    if projected_tokens >= ceiling:
        return verdict(True, f"{projected_tokens} tokens >= ceiling {ceiling}: compacted")
    floor = threshold * config.cost_floor_percent // 100
    if projected_tokens < floor:
        return verdict(False, f"{projected_tokens} tokens < floor {floor}")
    gain = cost.expected_net_usd
    if cost.cache_warm is False:  # the cache expires before the next turn: no warm prefix lost
        if gain > 0:
            return verdict(True, f"cache cold; estimated net gain {usd(gain, 6)} > 0")
        return verdict(False, f"cache cold; estimated net gain {usd(gain, 6)} <= 0")
    minimum = config.cost_min_gain_usd
    if gain >= minimum and gain > 0:
        return verdict(True, f"estimated net gain {usd(gain, 6)} >= minimum {usd(minimum, 6)}")
    return verdict(
        False, f"estimated net gain {usd(gain, 6)} < minimum {usd(minimum, 6)} (cache warm)"
    )


def usd(amount: float, places: int = 4) -> str:
    """A dollar amount as people write it: ``$0.0045``, ``-$0.0045`` (never ``$-0.0045``)."""
    sign = "-" if amount < 0 else ""
    return f"{sign}${abs(amount):.{places}f}"


def ceiling_tokens(threshold: int, context_window: int | None, config: CompactionConfig) -> int:
    """The size at which the cost policy compacts whatever the numbers say."""
    if context_window is not None:
        return max(threshold, context_window * config.cost_ceiling_percent // 100)
    return threshold * 5 // 4


def recosted(cost: Cost, tokens_after: int) -> Cost:
    """``cost`` (docs/cost.md) as it would be had the compaction left ``tokens_after`` tokens:
    the saving per turn, the cache write, the break-even and the net gain again, at the same
    prices and cache state; the summary call stays what it cost (it was made)."""
    saved = max(cost.tokens_before - tokens_after, 0)
    tokens = {"tokens_after": tokens_after, "saved_tokens_per_turn": saved}
    tokens["cache_write_tokens"] = tokens_after
    p, spent_summary, write = cost.prices, cost.summary_usd, cost.cache_write_usd
    if not cost.priced or p is None or spent_summary is None or write is None:
        return cost.model_copy(update=tokens)
    per_token = (p.cached_input if cost.cache_warm is not False else p.cache_write) / PER_MILLION
    saving = saved * per_token
    cache_write = write + (tokens_after - cost.tokens_after) * p.cache_write / PER_MILLION
    spent = spent_summary + cache_write
    even = 0 if spent <= 0 else None if saving <= 0 else math.ceil(spent / saving)
    money = {
        "cache_write_usd": round(cache_write, 8),
        "saving_per_turn_usd": round(saving, 8),
        "break_even_turns": even,
        "expected_net_usd": round(saving * cost.horizon_turns - spent, 8),
    }
    return cost.model_copy(update=tokens | money)
