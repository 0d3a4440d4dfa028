"""What the agent goes on to use: the product's compaction against baselines, at equal size.

For each conversation of the shared corpus and each cut (before the first assistant message at
or past 40 %, 60 % and 80 % of its messages' JSON characters), the history before the cut is
compacted by the product: ``worker.pipeline.Pipeline.run`` on that snapshot, offline digest
(``local_only``), the threshold one token under the snapshot's own projected count so that it
compacts now.
**Gold facts** come from the conversation's own future: the paths and identifiers that the
agent's later messages use and that the compacted range held (``needed_gold``, which imports
nothing of the product; its docstring has the rules). **Score** = the share of gold facts
present, as whole tokens, in the compacted history (the summary and every carried message).

**Budgets.** Size = tokens of the compacted history (``needed_baselines.Sizer``: o200k_base via
``worker.tokens.count_tokens``, plus 4 a message), as a share of the range's size counted the
same way. For each nominal budget (default 0.15, 0.30, 0.45 of the range) the product gets the
largest ``summary_max_output_tokens`` (at least 16) that lands its compacted history at or
under the budget; the digest may stop short of it when it has nothing more to say, and when
even 16 is over (the carried task alone can be), the product is over budget and counted so.
Every baseline then gets exactly the product's achieved size, never more.

**Baselines** (``needed_baselines``): truncation, observation masking, tool-result clearing
(written there), and the product's own strategies (``worker.core.strategies``), all with the first
task message pinned, as the product carries it. Reported apart, not as the comparison: the
baselines given the whole nominal budget, and the strategies as shipped (task not pinned).

    .venv/bin/python bench/needed_later.py [--sample N] [--json PATH] [--cuts 0.4,0.6,0.8]
        [--budgets 0.15,0.30,0.45]

Prints Markdown tables: per budget, each method's mean and median score, size share and the
share of cases (conversation x cut) where the product scores at least as well; the curve over
the budgets; each cut; the 60 % cut alone; what each method keeps by kind of fact and by where
the range held it (the agent's calls, its text, tool outputs only); and the facts the product
misses most, by kind.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import conversations
from needed_baselines import OURS, STRATEGIES, History, Sizer, StrategyBaselines, Wire
from needed_gold import (
    KINDS,
    ORIGINS,
    Fact,
    first_task,
    gold_facts,
    message_text,
    occurs,
    origins,
)

from worker.config import CompactionConfig, Settings
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent

PRODUCT = "product"
METHODS = (PRODUCT, *OURS, *STRATEGIES)
# Truncation and SlidingWindow keep what TokenBudget keeps at the same size.
UNPINNED = ("TokenBudget", "SelectiveToolResult")
DEFAULT_CUTS = (0.4, 0.6, 0.8)
DEFAULT_BUDGETS = (0.15, 0.30, 0.45)
MIN_OUTPUT_TOKENS = 16  # CompactionConfig's floor for summary_max_output_tokens
MAX_BOUND_TRIES = 12


def cut_index(messages: list[Wire], share: float) -> int | None:
    """The first assistant message at or past ``share`` of the conversation's characters."""
    sizes = [len(json.dumps(m, ensure_ascii=False)) for m in messages]
    total = sum(sizes)
    seen = 0
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and i > 0 and seen >= share * total:
            return i
        seen += sizes[i]
    return None


# --- the product -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProductRun:
    bound: int
    start: int
    end: int
    replacement: list[Wire]
    size: int
    summary_tokens: int
    truncated: bool


class Product:
    """The real pipeline over one snapshot, one run per output bound (cached)."""

    def __init__(self, snapshot: dict[str, Any], store_dir: Path, reuse: Reuse, sizer: Sizer):
        # No context window: the threshold in tokens alone decides.
        model = snapshot.get("model") or {}
        self.snapshot = {**snapshot, "model": {"name": model.get("name", "")}}
        self.store = FileStore(store_dir)
        self.reuse = reuse
        self.sizer = sizer
        probe = Pipeline(Settings(), Adapters(store=self.store), reuse)
        projected = probe.evaluate(probe.parse(self.snapshot)).evaluation.projected_tokens
        self.threshold = max(projected - 1, 0)
        self.runs: dict[int, ProductRun | None] = {}

    def run(self, bound: int) -> ProductRun | None:
        if bound not in self.runs:
            self.runs[bound] = self._run(bound)
        return self.runs[bound]

    def _run(self, bound: int) -> ProductRun | None:
        # Compacted now, whatever it gains, with the carried turns fitted under the threshold
        # itself: this compares what is kept at equal size, not when compacting pays.
        config = CompactionConfig(
            auto_compact_threshold_tokens=self.threshold,
            summary_max_output_tokens=bound,
            min_gain_percent=0,
            auto_compact_target_percent=100,
        )
        pipeline = Pipeline(Settings(compaction=config), Adapters(store=self.store), self.reuse)
        event = pipeline.run(pipeline.parse(self.snapshot))[-1]
        if not isinstance(event, CompletedEvent):
            return None
        c = event.compaction
        return ProductRun(
            bound=bound,
            start=c.start,
            end=c.end,
            replacement=c.replacement,
            size=self.sizer.history(c.replacement),
            summary_tokens=self.sizer.text(c.summary.text),
            truncated=c.summary.truncated,
        )

    def fit(self, budget: int) -> ProductRun | None:
        """The run with the largest bound whose compacted history is within ``budget`` (the
        run at the smallest bound when none is). Secant steps (the summary grows with the
        bound until the digest has said everything), bisection when they stall."""
        fits: ProductRun | None = None
        over = 1 << 30  # the smallest bound known to be over
        bound = max(budget, MIN_OUTPUT_TOKENS)
        for _ in range(MAX_BOUND_TRIES):
            run = self.run(bound)
            if run is None:  # a summary this long would not pay: a smaller bound
                over = min(over, bound)
                guess = over
            elif run.size <= budget:
                fits = run if fits is None or run.bound > fits.bound else fits
                if not run.truncated:
                    break  # the digest said all it had: a larger bound changes nothing
                guess = bound + (budget - run.size)
            else:
                over = min(over, bound)
                guess = min(bound, run.summary_tokens) - (run.size - budget)
            lo = fits.bound if fits else MIN_OUTPUT_TOKENS - 1
            if not lo < guess < over or guess in self.runs:
                guess = (lo + over) // 2
                if not lo < guess < over or guess in self.runs:
                    break
            bound = guess
        return fits or self.run(MIN_OUTPUT_TOKENS)


# --- one case: a conversation cut at one point ----------------------------------------------------


@dataclass
class MethodResult:
    tokens: int
    kept: list[Fact]
    missed: list[Fact]

    @property
    def score(self) -> float:
        total = len(self.kept) + len(self.missed)
        return len(self.kept) / total if total else 1.0


@dataclass
class BudgetResult:
    budget: float
    bound: int
    over_budget: bool
    methods: dict[str, MethodResult] = field(default_factory=dict)
    # The baselines again, given the whole nominal budget (more than the product used when
    # the digest stopped short of it): what the product leaves unspent, not the comparison.
    nominal: dict[str, MethodResult] = field(default_factory=dict)
    # The strategies as shipped, keeping only system messages: free to drop the task (whose
    # facts are not gold), at the product's size. Not the comparison either.
    unpinned: dict[str, MethodResult] = field(default_factory=dict)


@dataclass
class Case:
    name: str
    cut_share: float
    cut: int
    start: int
    end: int
    range_tokens: int
    gold: list[Fact]
    origin: dict[Fact, str] = field(default_factory=dict)  # where the range held each
    budgets: list[BudgetResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "conversation": self.name,
            "cut_share": self.cut_share,
            "cut": self.cut,
            "range": [self.start, self.end],
            "range_tokens": self.range_tokens,
            "gold": [[f.text, f.kind, self.origin.get(f, "")] for f in self.gold],
            "budgets": [
                {
                    "budget": b.budget,
                    "summary_max_output_tokens": b.bound,
                    "product_over_budget": b.over_budget,
                    "methods": {
                        name: {
                            "tokens": r.tokens,
                            "share": round(r.tokens / self.range_tokens, 4),
                            "score": round(r.score, 4),
                            "missed": [[f.text, f.kind] for f in r.missed],
                        }
                        for name, r in b.methods.items()
                    },
                    "baselines_at_nominal_budget": {
                        name: {"tokens": r.tokens, "score": round(r.score, 4)}
                        for name, r in b.nominal.items()
                    },
                    "strategies_task_unpinned": {
                        name: {"tokens": r.tokens, "score": round(r.score, 4)}
                        for name, r in b.unpinned.items()
                    },
                }
                for b in self.budgets
            ],
        }


def scored(gold: list[Fact], kept: list[Wire], tokens: int) -> MethodResult:
    text = "\n".join(message_text(m) for m in kept)
    present = [f for f in gold if occurs(f, text)]
    return MethodResult(tokens=tokens, kept=present, missed=[f for f in gold if f not in present])


def first_task_index(messages: list[Wire], start: int, end: int) -> int | None:
    """Where the first task message is, when the range holds it (every baseline pins it)."""
    head = first_task(messages)
    k = len(head) - 1
    if head and head[-1].get("role") == "user" and start <= k < end:
        return k
    return None


def run_case(
    name: str,
    messages: list[Wire],
    snapshot: dict[str, Any],
    share: float,
    budgets: Iterable[float],
    store_dir: Path,
    reuse: Reuse,
) -> Case | None:
    cut = cut_index(messages, share)
    if cut is None:
        return None
    sizer = Sizer()
    product = Product({**snapshot, "messages": messages[:cut]}, store_dir, reuse, sizer)
    probe = product.run(MIN_OUTPUT_TOKENS)
    if probe is None:
        return None
    start, end = probe.start, probe.end
    ranged = messages[start:end]
    range_tokens = sizer.history(ranged)
    case = Case(
        name=name,
        cut_share=share,
        cut=cut,
        start=start,
        end=end,
        range_tokens=range_tokens,
        gold=gold_facts(messages, cut, start, end),
    )
    case.origin = origins(case.gold, ranged)
    task = first_task_index(messages, start, end)
    history = History(wire=messages[:cut], start=start, end=end, task=task)
    strategies = StrategyBaselines(history, sizer)
    as_shipped = StrategyBaselines(History(wire=messages[:cut], start=start, end=end), sizer)
    pinned = task - start if task is not None else None

    def baselines(tokens: int) -> dict[str, MethodResult]:
        results = {}
        for method, baseline in OURS.items():
            kept = baseline(ranged, tokens, sizer, pinned)
            results[method] = scored(case.gold, kept, sizer.history(kept))
        for method in STRATEGIES:
            kept = strategies.run(method, tokens)
            results[method] = scored(case.gold, kept, sizer.history(kept))
        return results

    for budget in budgets:
        nominal = int(budget * range_tokens)
        run = product.fit(nominal)
        if run is None:
            return None
        result = BudgetResult(budget=budget, bound=run.bound, over_budget=run.size > nominal)
        result.methods[PRODUCT] = scored(case.gold, run.replacement, run.size)
        result.methods.update(baselines(run.size))
        result.nominal = baselines(nominal) if nominal > run.size else dict(result.methods)
        result.nominal.pop(PRODUCT, None)
        for method in UNPINNED:
            kept = as_shipped.run(method, run.size)
            result.unpinned[method] = scored(case.gold, kept, sizer.history(kept))
        case.budgets.append(result)
    return case


# --- report ----------------------------------------------------------------------------------


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def scoring(cases: list[Case]) -> list[Case]:
    """The cases that have gold facts (a score of nothing says nothing)."""
    return [c for c in cases if c.gold]


def at(case: Case, budget: float) -> BudgetResult:
    return next(b for b in case.budgets if b.budget == budget)


def method_table(cases: list[Case], budget: float) -> list[str]:
    rows = [
        "| method | mean score | median score | size / range (mean) | product >= method |",
        "|---|---|---|---|---|",
    ]
    for method in METHODS:
        scores = [at(c, budget).methods[method].score for c in cases]
        shares = [at(c, budget).methods[method].tokens / c.range_tokens for c in cases]
        wins = [
            at(c, budget).methods[PRODUCT].score >= at(c, budget).methods[method].score
            for c in cases
        ]
        beat = "—" if method == PRODUCT else f"{mean([float(w) for w in wins]):.0%}"
        rows.append(
            f"| {method} | {mean(scores):.3f} | {median(scores):.3f} | {mean(shares):.3f} | "
            f"{beat} |"
        )
    every = [product_leads(at(c, budget)) for c in cases]
    over = sum(at(c, budget).over_budget for c in cases)
    rows.append("")
    rows.append(
        f"product >= every baseline in {mean([float(e) for e in every]):.0%} of {len(cases)} "
        f"cases; product over the nominal budget (even at the smallest bound) in {over}"
    )
    return rows


def curve_table(cases: list[Case], budgets: list[float]) -> list[str]:
    """Mean scores by budget: every method at the product's achieved size, then the baselines
    given the whole nominal budget, then strategies as shipped (the task not pinned)."""
    head = " | ".join(f"{b:.2f}" for b in budgets)
    rows = [f"| method | {head} |", "|---" * (len(budgets) + 1) + "|"]

    def row(label: str, values: list[float]) -> str:
        return f"| {label} | " + " | ".join(f"{v:.3f}" for v in values) + " |"

    rows.append(
        row(
            "*product's size / range*",
            [
                mean([at(c, b).methods[PRODUCT].tokens / c.range_tokens for c in cases])
                for b in budgets
            ],
        )
    )
    for method in METHODS:
        rows.append(
            row(method, [mean([at(c, b).methods[method].score for c in cases]) for b in budgets])
        )
    for method in METHODS[1:]:
        rows.append(
            row(
                f"{method} at the nominal budget",
                [mean([at(c, b).nominal[method].score for c in cases]) for b in budgets],
            )
        )
    for method in UNPINNED:
        rows.append(
            row(
                f"{method}, task not pinned",
                [mean([at(c, b).unpinned[method].score for c in cases]) for b in budgets],
            )
        )
    return rows


def cut_table(cases: list[Case], budgets: list[float], cuts: list[float]) -> list[str]:
    rows = [
        "| cut | budget | cases | product size / range | product | best baseline "
        "| product >= every baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for cut in cuts:
        at_cut = [c for c in cases if c.cut_share == cut]
        for budget in budgets if at_cut else []:
            means = {m: mean([at(c, budget).methods[m].score for c in at_cut]) for m in METHODS}
            best = max((m for m in METHODS if m != PRODUCT), key=lambda m: means[m])
            size = mean([at(c, budget).methods[PRODUCT].tokens / c.range_tokens for c in at_cut])
            every = mean([float(product_leads(at(c, budget))) for c in at_cut])
            rows.append(
                f"| {cut:.0%} | {budget:.2f} | {len(at_cut)} | {size:.3f} | "
                f"{means[PRODUCT]:.3f} | {best} {means[best]:.3f} | {every:.0%} |"
            )
    return rows


def product_leads(result: BudgetResult) -> bool:
    """Whether the product scores at least as well as every baseline."""
    own = result.methods[PRODUCT].score
    return all(r.score <= own for m, r in result.methods.items() if m != PRODUCT)


def kind_table(cases: list[Case], budget: float) -> list[str]:
    methods = [PRODUCT, *OURS, *STRATEGIES]
    rows = [
        "| kind | gold facts | " + " | ".join(methods) + " |",
        "|---" * (len(methods) + 2) + "|",
    ]
    for kind in KINDS:
        gold = sum(1 for c in cases for f in c.gold if f.kind == kind)
        if not gold:
            continue
        cells = []
        for method in methods:
            kept = sum(
                1 for c in cases for f in at(c, budget).methods[method].kept if f.kind == kind
            )
            cells.append(f"{kept / gold:.0%}")
        rows.append(f"| {kind} | {gold} | " + " | ".join(cells) + " |")
    return rows


def origin_table(cases: list[Case], budget: float) -> list[str]:
    """Kept shares by where the range held the fact (the agent's calls, its text, outputs)."""
    methods = [PRODUCT, *OURS]
    rows = [
        "| held in the range by | gold facts | " + " | ".join(methods) + " |",
        "|---" * (len(methods) + 2) + "|",
    ]
    for where in ORIGINS:
        facts = [(c, f) for c in cases for f in c.gold if c.origin.get(f) == where]
        if not facts:
            continue
        cells = []
        for method in methods:
            kept = sum(f in set(at(c, budget).methods[method].kept) for c, f in facts)
            cells.append(f"{kept / len(facts):.0%}")
        rows.append(f"| {where} | {len(facts)} | " + " | ".join(cells) + " |")
    return rows


def most_missed(cases: list[Case], budget: float, per_kind: int = 6) -> list[str]:
    missed: dict[str, Counter[str]] = defaultdict(Counter)
    for c in cases:
        for f in at(c, budget).methods[PRODUCT].missed:
            missed[f.kind][f.text] += 1
    rows = []
    for kind in KINDS:
        if missed[kind]:
            top = ", ".join(f"`{t}` ({n})" for t, n in missed[kind].most_common(per_kind))
            rows.append(f"- {kind} ({sum(missed[kind].values())} missed): {top}")
    return rows


def report(cases: list[Case], budgets: list[float], cuts: list[float], seconds: float) -> str:
    scored_cases = scoring(cases)
    golds = [len(c.gold) for c in cases]
    shares = Counter(f.kind for c in cases for f in c.gold)
    out = [
        f"conversations: {len({c.name for c in cases})}; cases (conversation x cut): "
        f"{len(cases)}; with gold facts: {len(scored_cases)}; gold facts: {sum(golds)} "
        f"(median {median([float(g) for g in golds]):.0f} a case); by kind: "
        + ", ".join(f"{k} {shares[k]}" for k in KINDS if shares[k]),
        f"range size (tokens): median {median([float(c.range_tokens) for c in cases]):.0f}; "
        f"run time {seconds:.0f} s",
        "",
    ]
    for budget in budgets:
        out += [f"### Budget {budget:.2f} of the range, cuts {', '.join(map(str, cuts))}", ""]
        out += [*method_table(scored_cases, budget), ""]
    out += ["### Curve: mean score by budget (all cuts)", "", *curve_table(scored_cases, budgets)]
    out += ["", "### By cut", "", *cut_table(scored_cases, budgets, cuts)]
    middle = [c for c in scored_cases if c.cut_share == 0.6]
    if middle:
        mid_budget = min(budgets, key=lambda b: abs(b - 0.30))
        out += ["", f"### The 60 % cut alone, budget {mid_budget:.2f}", ""]
        out += method_table(middle, mid_budget)
        out += ["", "### Curve at the 60 % cut", "", *curve_table(middle, budgets)]
    for budget in budgets:
        out += ["", f"### Kept by kind, budget {budget:.2f} (all cuts)", ""]
        out += kind_table(scored_cases, budget)
    focus = min(budgets, key=lambda b: abs(b - 0.30))
    out += ["", f"### Kept by where the range held the fact, budget {focus:.2f}", ""]
    out += origin_table(scored_cases, focus)
    out += ["", f"### What the product misses most, budget {focus:.2f} (times missed)", ""]
    out += most_missed(scored_cases, focus)
    return "\n".join(out)


def sample(items: list[Any], n: int | None) -> list[Any]:
    """``n`` items spread evenly over the list (all when ``n`` is None)."""
    if n is None or n >= len(items):
        return items
    step = len(items) / n
    return [items[int(k * step)] for k in range(n)]


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, help="this many conversations, spread evenly")
    parser.add_argument("--json", type=Path, help="write per-case results here")
    parser.add_argument("--cuts", type=floats, default=list(DEFAULT_CUTS))
    parser.add_argument("--budgets", type=floats, default=list(DEFAULT_BUDGETS))
    args = parser.parse_args()
    names = sample([name for name, _ in conversations()], args.sample)
    wanted = set(names)
    t0 = time.perf_counter()
    cases: list[Case] = []
    skipped: list[str] = []
    reuse = Reuse()
    with tempfile.TemporaryDirectory() as tmp:
        for name, snapshot in conversations():
            if name not in wanted:
                continue
            for share in args.cuts:
                case = run_case(
                    name, snapshot["messages"], snapshot, share, args.budgets, Path(tmp), reuse
                )
                if case is None:
                    skipped.append(f"{name}@{share}")
                else:
                    cases.append(case)
    seconds = time.perf_counter() - t0
    print(report(cases, args.budgets, args.cuts, seconds))
    if skipped:
        print(f"\nskipped (no cut point or nothing to compact): {', '.join(skipped)}")
    if args.json:
        args.json.write_text(json.dumps([c.to_json() for c in cases], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
