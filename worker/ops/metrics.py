"""Prometheus metrics from the counters every worker keeps in Redis (``cw:metrics``).

Counters live in Redis rather than in each process, so a prefork pool, many hosts and restarts
all add up into one view without Prometheus' multiprocess mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HELP = {
    "snapshots_evaluated_total": "Snapshots evaluated (projected, counted, trigger decided).",
    "snapshots_rejected_total": "Snapshots rejected as invalid.",
    "compactions_completed_total": "Compactions published.",
    "compactions_skipped_total": "Evaluations that did not need a compaction.",
    "compactions_floor_total": (
        "Skips because a compaction could not pay: what it cannot remove leaves less than the "
        "minimum gain (skipped why=floor)."
    ),
    "compactions_no_gain_total": (
        "Compactions made but not published: they saved less than the minimum gain "
        "(skipped why=no_gain)."
    ),
    "compactions_failed_total": "Compactions that failed (an event says why).",
    "compactions_requested_total": "Compactions asked for on demand (whatever their outcome).",
    "compactions_reverted_total": "Compactions restored (undone) through the API or inspector.",
    "compactions_proposed_total": "Compactions held for review (compaction.proposed).",
    "compactions_approved_total": "Held compactions approved (published as completed).",
    "compactions_declined_total": "Held compactions declined.",
    "tokens_before_total": "Projected tokens before the published compactions.",
    "tokens_after_total": "Projected tokens after the published compactions.",
    "llm_summaries_total": "Summaries written by the LLM.",
    "llm_seconds_total": "Seconds spent in compactions whose summary came from the LLM.",
    "llm_failures_total": "Compactions failed by the LLM (remote_only).",
    "llm_fallbacks_total": "LLM failures answered with the offline digest (prefer_remote).",
    "leases_lost_total": "Compactions abandoned because the conversation lock was lost.",
    "queue_lag_seconds_total": "Sum of seconds from submit to evaluation start.",
    "queue_lag_samples_total": "Evaluations measured for queue lag.",
    "texts_tokenized_total": "Texts an evaluation had to tokenize (in no cache or memo).",
    "tool_results_compressed_total": "Tool results an evaluation had to try to compress.",
    "tokens_saved_total": "Projected tokens the published compactions took off (before - after).",
    # --- the cost model (docs/cost.md): per tenant too, as NAME:tenant:TENANT fields ---
    "cost_spent_usd_total": "US dollars compactions spent: summary calls and cache writes.",
    "cost_saved_usd_total": "US dollars compactions are expected to save over their horizon.",
    "cost_saved_tokens_total": "Tokens per later turn the published compactions saved.",
    "cost_unpriced_total": "Completed compactions of models without prices (tokens only).",
}
TENANT_SEPARATOR = ":tenant:"


def cost_counters(
    spent_usd: float | None,
    saved_usd: float | None,
    saved_tokens: int,
    tenant: str | None,
) -> dict[str, float]:
    """The cost counters of one compaction, as a total and, with a ``tenant``, per tenant."""
    counters = {"cost_saved_tokens_total": float(saved_tokens)}
    if spent_usd is None or saved_usd is None:
        counters["cost_unpriced_total"] = 1.0
    else:
        counters["cost_spent_usd_total"] = spent_usd
        counters["cost_saved_usd_total"] = saved_usd
    if tenant:
        counters |= {f"{k}{TENANT_SEPARATOR}{tenant}": v for k, v in list(counters.items())}
    return counters


def _labelled(name: str) -> tuple[str, str]:
    """``cost_spent_usd_total:tenant:acme`` -> (``cost_spent_usd_total``, ``{tenant="acme"}``)."""
    base, sep, tenant = name.partition(TENANT_SEPARATOR)
    if not sep:
        return name, ""
    escaped = tenant.replace("\\", "\\\\").replace('"', '\\"')
    return base, f'{{tenant="{escaped}"}}'


def render_prometheus(counters: dict[str, float], queues: dict[str, int]) -> str:
    counters, histograms = _split_histograms(counters)
    lines = []
    labelled: dict[str, list[str]] = {}
    for name, value in counters.items():
        base, labels = _labelled(name)
        if labels:
            labelled.setdefault(base, []).append(f"compactor_{base}{labels} {value:g}")
    for name in sorted(set(_HELP) | {n for n in counters if TENANT_SEPARATOR not in n}):
        metric = f"compactor_{name}"
        lines.append(f"# HELP {metric} {_HELP.get(name, name)}")
        lines.append(f"# TYPE {metric} counter")
        lines.append(f"{metric} {counters.get(name, 0.0):g}")
        lines.extend(sorted(labelled.get(name, [])))
    lines.append("# HELP compactor_queue_length Messages waiting per queue.")
    lines.append("# TYPE compactor_queue_length gauge")
    for queue, length in sorted(queues.items()):
        lines.append(f'compactor_queue_length{{queue="{queue}"}} {length}')
    lines.extend(_render_histograms(histograms))
    return "\n".join(lines) + "\n"


# --- latency histograms (worker.ops.tracing times the stages) ------------------------------
# Kept in cw:metrics beside the counters, one field per (stage, labels, bucket) holding the
# observations that fell in that bucket alone (so an observation is 3 increments, not one per
# bucket), plus _sum and _count; rendering makes the buckets cumulative, as Prometheus reads
# them. Bounded: the stages are fixed, the only other label is the store's kind.

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LATENCY_HISTOGRAM = "stage_seconds"
_HISTOGRAM_HELP = {
    LATENCY_HISTOGRAM: "Seconds per stage (evaluate, compact, summarize, llm, store_write, "
    "publish); store_write per store.",
}


def latency_counters(
    stage: str, seconds: float, labels: Mapping[str, str] | None = None
) -> dict[str, float]:
    """The ``cw:metrics`` increments that record one observation of ``stage``'s latency."""
    series = _labels({"stage": stage, **(labels or {})})
    le = next((f"{b:g}" for b in LATENCY_BUCKETS_S if seconds <= b), "+Inf")
    return {
        f'{LATENCY_HISTOGRAM}_bucket{{{series},le="{le}"}}': 1.0,
        f"{LATENCY_HISTOGRAM}_sum{{{series}}}": seconds,
        f"{LATENCY_HISTOGRAM}_count{{{series}}}": 1.0,
    }


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def _split_histograms(
    counters: dict[str, float],
) -> tuple[dict[str, float], dict[str, float]]:
    """(the other counters, the latency histogram's fields)."""
    prefix = f"{LATENCY_HISTOGRAM}_"
    plain = {k: v for k, v in counters.items() if not k.startswith(prefix)}
    return plain, {k: v for k, v in counters.items() if k.startswith(prefix)}


def _render_histograms(fields: dict[str, float]) -> list[str]:
    """Each histogram's series: cumulative buckets in order, ``+Inf``, ``_sum``, ``_count``."""
    series: dict[tuple[str, str], dict[str, float]] = {}
    for field, value in fields.items():
        name, _, rest = field.partition("{")
        labels = rest.rstrip("}")
        base, _, part = name.rpartition("_")
        if part == "bucket":
            labels, _, le = labels.rpartition(",le=")
            part = le.strip('"')
        series.setdefault((base, labels), {})[part] = value
    lines: list[str] = []
    for base in sorted({b for b, _ in series}):
        metric = f"compactor_{base}"
        lines.append(f"# HELP {metric} {_HISTOGRAM_HELP.get(base, base)}")
        lines.append(f"# TYPE {metric} histogram")
        for (b, labels), parts in sorted(series.items()):
            if b != base:
                continue
            cumulative = 0.0
            for le in (*(f"{x:g}" for x in LATENCY_BUCKETS_S), "+Inf"):
                cumulative += parts.get(le, 0.0)
                lines.append(f'{metric}_bucket{{{labels},le="{le}"}} {cumulative:.15g}')
            lines.append(f"{metric}_sum{{{labels}}} {parts.get('sum', 0.0):.15g}")
            lines.append(f"{metric}_count{{{labels}}} {parts.get('count', 0.0):.15g}")
    return lines


def serve(render: Callable[[], str], *, port: int, host: str = "127.0.0.1") -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    ThreadingHTTPServer((host, port), Handler).serve_forever()
