"""What CompactingSession adds to each turn of an agent loop, against compacting inline with
Agent Framework's own CompactionProvider, on the same histories in the same run.

Ours, at a window the history fits in and at half the history's tokens (the service compacts
it and the compactions land during the run): a real Redis (embedded) and real worker processes
(``running_services``, as ``compactor up``); each turn appends an assistant tool call and its
result with ``extend`` and asks ``request_messages`` for the next request: the time of those
two calls is the overhead (submitting, evaluating and compacting happen on the background
thread and in the workers).
Between turns the loop sleeps ``--model-latency-ms`` (the model's turn), as a real agent would
wait for its model.

Inline: ``CompactionProvider(before_strategy=...).before_run`` on the same messages (converted
with ``worker.integrations.agent_framework.from_openai``), as the framework calls it before
each run: ``ContextWindowCompactionStrategy`` (tool-result eviction, then truncation; no LLM)
with its default 4-characters-per-token estimate and with exact tiktoken counts, at a window
the history fits in (only counting) and at half the history's tokens (it compacts every
turn); and ``SummarizationStrategy`` with a chat client that answers at once, so its figure is
the framework's own work without the summarizing model's latency, which an inline summary adds
to every turn that summarizes.

Each size runs ``--sessions`` conversations of ``--turns`` turns from a history of that many
messages (so a 50-message history grows to 50 + 2 x turns); the first turn of each is a
warm-up and not counted (it parses and projects the whole history once).

    .venv/bin/python bench/session_overhead_bench.py [--sizes 50 500] [--turns 25] [--sessions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_framework import ChatResponse, CompactionProvider, Message, SessionContext
from agent_framework._compaction import (
    ContextWindowCompactionStrategy,
    SummarizationStrategy,
)

from worker.client import Client
from worker.config import load_settings, with_redis_url
from worker.integrations.agent_framework import from_openai
from worker.runtime.fleet import wait_for_workers
from worker.runtime.supervisor import running_services
from worker.session import CompactingSession
from worker.tokens import count_tokens


def history(n: int, *, body: int, prefix: str = "") -> list[dict[str, Any]]:
    """A coding conversation of ``n`` messages: a task, then tool calls and their results."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in src/pkg/core.py."},
    ]
    k = 0
    while len(out) < n:
        out += turn(k, body=body, prefix=prefix)
        k += 1
    return out[:n]


def turn(k: int, *, body: int, prefix: str = "") -> list[dict[str, Any]]:
    cid = f"{prefix}call{k}"
    words = " ".join(f"src/pkg/mod_{k}.py:{i}: value_{i} = compute({i})" for i in range(body))
    return [
        {
            "role": "assistant",
            "content": f"Step {k}: reading module {k}.",
            "tool_calls": [
                {
                    "id": cid,
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "arguments": json.dumps({"path": f"src/pkg/mod_{k}.py"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": cid, "content": words},
    ]


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"median_ms": statistics.median(ordered) * 1e3, "p99_ms": p99 * 1e3, "n": len(ordered)}


# --- ours ------------------------------------------------------------------------------------


def ours(client: Client, n: int, args: argparse.Namespace, window: int) -> list[float]:
    samples: list[float] = []
    applied = 0
    for s in range(args.sessions):
        session = CompactingSession(
            f"bench-overhead-{n}-{s}-{time.time_ns()}",
            client=client,
            model="gpt-4.1",
            context_window=window,
            messages=history(n, body=args.body),
        )
        try:
            for k in range(args.turns + 1):
                new = turn(10_000 + k, body=args.body)
                start = time.perf_counter()
                session.extend(new)
                session.request_messages()
                elapsed = time.perf_counter() - start
                if k:  # the first turn is the warm-up
                    samples.append(elapsed)
                time.sleep(args.model_latency_ms / 1e3)
            applied += len(session.compactions)
        finally:
            session.close()
    print(f"  window {window}: {applied} compactions applied", flush=True)
    return samples


# --- inline, with Agent Framework ------------------------------------------------------------


class ExactTokenizer:
    def count_tokens(self, text: str) -> int:
        return count_tokens(text, "gpt-4.1")


class InstantSummarizer:
    """A chat client that summarizes at once (the framework's work, not the model's)."""

    async def get_response(self, messages: Sequence[Message], **kwargs: Any) -> ChatResponse[Any]:
        return ChatResponse(messages=[Message("assistant", ["Summary: read modules, no fix yet."])])


def history_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(count_tokens(json.dumps(m), "gpt-4.1") for m in messages)


def inline(n: int, args: argparse.Namespace, make: Any) -> list[float]:
    async def run() -> list[float]:
        samples: list[float] = []
        for _ in range(args.sessions):
            provider = CompactionProvider(before_strategy=make(n), history_source_id="in_memory")
            stored = from_openai(history(n, body=args.body))
            for k in range(args.turns + 1):
                stored += from_openai(turn(10_000 + k, body=args.body))
                context = SessionContext(input_messages=[Message("user", ["Go on."])])
                context.extend_messages("in_memory", stored)  # as the history provider loads
                start = time.perf_counter()
                await provider.before_run(agent=None, session=None, context=context, state={})
                elapsed = time.perf_counter() - start
                if k:
                    samples.append(elapsed)
        return samples

    return asyncio.run(run())


def strategies(args: argparse.Namespace) -> dict[str, Any]:
    def window(n: int, *, compacting: bool, exact: bool) -> Any:
        tokens = history_tokens(history(n + 2 * args.turns, body=args.body))
        size = tokens // 2 if compacting else tokens * 4
        return ContextWindowCompactionStrategy(
            max_context_window_tokens=size,
            max_output_tokens=min(4096, size // 8),
            tokenizer=ExactTokenizer() if exact else None,
        )

    return {
        "AF ContextWindow, fits (estimate)": lambda n: window(n, compacting=False, exact=False),
        "AF ContextWindow, compacts (estimate)": lambda n: window(n, compacting=True, exact=False),
        "AF ContextWindow, compacts (tiktoken)": lambda n: window(n, compacting=True, exact=True),
        "AF Summarization, instant model": lambda n: SummarizationStrategy(
            client=InstantSummarizer(), target_count=max(4, n // 2)
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[50, 500])
    p.add_argument("--turns", type=int, default=25, help="timed turns per conversation")
    p.add_argument("--sessions", type=int, default=4, help="conversations per size")
    p.add_argument("--body", type=int, default=20, help="lines per tool result")
    p.add_argument("--window", type=int, default=400_000, help="our window where it fits")
    p.add_argument("--model-latency-ms", type=float, default=50.0)
    args = p.parse_args()
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        config = Path(tmp) / "compactor.toml"
        config.write_text(f'[compaction]\ntranscript_dir = "{tmp}/transcripts"\n')
        settings = load_settings(config, environ={})
        with running_services(
            settings, str(config), workdir=Path(tmp) / "up", summarize_concurrency=4
        ) as url:
            if not wait_for_workers(url, settings, expected=2, timeout_s=60):
                raise SystemExit("workers did not start")
            client = Client(with_redis_url(settings, url))
            try:
                for n in args.sizes:
                    tokens = history_tokens(history(n, body=args.body))
                    print(f"# {n} messages, {tokens} tokens (JSON, o200k)", flush=True)
                    fits = quantiles(ours(client, n, args, args.window))
                    results.setdefault("CompactingSession, fits", {})[n] = fits
                    half = history_tokens(history(n + 2 * args.turns, body=args.body)) // 2
                    landing = quantiles(ours(client, n, args, half))
                    results.setdefault("CompactingSession, compactions landing", {})[n] = landing
                    for name, make in strategies(args).items():
                        results.setdefault(name, {})[n] = quantiles(inline(n, args, make))
            finally:
                client.close()
    sizes = args.sizes
    print("| per turn | " + " | ".join(f"{n} msgs: median / p99 (ms)" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name, by_size in results.items():
        cells = [f"{by_size[n]['median_ms']:.2f} / {by_size[n]['p99_ms']:.2f}" for n in sizes]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
