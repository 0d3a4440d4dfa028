"""Prometheus metrics from the counters every worker keeps in Redis (``cw:metrics``).

Counters live in Redis rather than in each process, so a prefork pool, many hosts and restarts
all add up into one view without Prometheus' multiprocess mode.
"""

from __future__ import annotations

from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HELP = {
    "snapshots_evaluated_total": "Snapshots evaluated (projected, counted, trigger decided).",
    "snapshots_rejected_total": "Snapshots rejected as invalid.",
    "compactions_completed_total": "Compactions published.",
    "compactions_skipped_total": "Evaluations that did not need a compaction.",
    "compactions_failed_total": "Compactions that failed (an event says why).",
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
}


def render_prometheus(counters: dict[str, float], queues: dict[str, int]) -> str:
    lines = []
    for name in sorted(set(_HELP) | set(counters)):
        metric = f"compactor_{name}"
        lines.append(f"# HELP {metric} {_HELP.get(name, name)}")
        lines.append(f"# TYPE {metric} counter")
        lines.append(f"{metric} {counters.get(name, 0.0):g}")
    lines.append("# HELP compactor_queue_length Messages waiting per queue.")
    lines.append("# TYPE compactor_queue_length gauge")
    for queue, length in sorted(queues.items()):
        lines.append(f'compactor_queue_length{{queue="{queue}"}} {length}')
    return "\n".join(lines) + "\n"


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
