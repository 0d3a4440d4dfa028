"""How many LLM summaries one worker process keeps in flight, and at what cost.

The stand-in provider runs in its own process with a fixed latency (2 s by default), so the
client process measured here does only what a worker does: build prompts, send them over the
shared connection pool, parse, and bound the answers with the real tokenizer. Callers are
threads, as in Celery's threads pool.

Waves: a warm-up, waves at ``--inflight`` (200) in flight, one at twice that, and a final one at
``--inflight`` again: throughput, latency and RSS per wave show whether memory stays bounded
as concurrency doubles and as waves repeat.

    .venv/bin/python bench/llm_concurrency_bench.py [--latency-s 2] [--inflight 200]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from worker.config import LLMConfig
from worker.summarize import SummaryRequest
from worker.summarize.llm import LLMSummarizer
from worker.tokens import count_tokens
from worker.wire.models import Message, ToolCall


@dataclass
class Wave:
    name: str
    inflight: int
    summaries: int
    seconds: float
    peak_inflight: int
    latencies_s: list[float]
    rss_mb: float
    cpu_s: float  # this process's CPU time over the wave

    @property
    def throughput(self) -> float:
        return self.summaries / self.seconds

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class InFlight:
    """Counts summaries between entry and return, and remembers the peak."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0

    @contextmanager
    def one(self) -> Iterator[None]:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            with self._lock:
                self.now -= 1


def conversation(i: int) -> list[Message]:
    """About 6 000 characters: a user ask, tool calls and results, assistant text."""
    out = [
        Message(
            id="u",
            role="user",
            content=f"Fix the failing test in tests/test_{i}.py",
            source_index=0,
        )
    ]
    for j in range(6):
        call = ToolCall(id=f"c{j}", name="read_file", arguments=f'{{"path": "src/pkg/m{j}.py"}}')
        out.append(
            Message(
                id=f"a{j}",
                role="assistant",
                content="Reading.",
                tool_calls=(call,),
                source_index=2 * j + 1,
            )
        )
        body = "\n".join(f"def f{k}(x):\n    return x * {k}" for k in range(30))
        out.append(
            Message(
                id=f"t{j}",
                role="tool",
                content=body,
                tool_call_id=f"c{j}",
                tool_name="read_file",
                source_index=2 * j + 2,
            )
        )
    return out


def request(i: int) -> SummaryRequest:
    return SummaryRequest(
        conversation_id=f"bench-{i}",
        revision=1,
        messages=conversation(i),
        max_input_chars=80_000,
        max_output_tokens=2_000,
        source_tokens=100_000,
        model="gpt-4.1",
    )


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_wave(summarizer: LLMSummarizer, name: str, inflight: int, summaries: int) -> Wave:
    counter = InFlight()
    latencies: list[float] = []
    requests = [request(i) for i in range(summaries)]

    def one(req: SummaryRequest) -> None:
        with counter.one():
            start = time.monotonic()
            summary = summarizer.summarize(req)
            latencies.append(time.monotonic() - start)
        assert summary.tokens == count_tokens(summary.text, req.model) <= req.max_output_tokens

    start, cpu = time.monotonic(), time.process_time()
    with ThreadPoolExecutor(max_workers=inflight) as pool:
        list(pool.map(one, requests))
    seconds = time.monotonic() - start
    cpu_s = time.process_time() - cpu
    return Wave(name, inflight, summaries, seconds, counter.peak, latencies, rss_mb(), cpu_s)


@contextmanager
def standin(latency_s: float) -> Iterator[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker.testing.standin_llm",
            "--port",
            "0",
            "--latency-s",
            str(latency_s),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().split()[-1]
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency-s", type=float, default=2.0)
    parser.add_argument("--inflight", type=int, default=200)
    parser.add_argument("--per-caller", type=int, default=5, help="summaries per caller per wave")
    args = parser.parse_args()
    n, k = args.inflight, args.per_caller
    with standin(args.latency_s) as url:
        config = LLMConfig(
            base_url=url + "/v1", max_concurrency=2 * n, timeout_s=30, deadline_s=120
        )
        with LLMSummarizer(config, environ={}) as summarizer:
            baseline = rss_mb()
            waves = [run_wave(summarizer, "warm-up", n, n)]
            waves += [run_wave(summarizer, f"wave {i}", n, n * k) for i in (1, 2)]
            waves.append(run_wave(summarizer, "double", 2 * n, 2 * n * k))
            waves.append(run_wave(summarizer, "wave 3", n, n * k))
            server = httpx.get(url + "/_stats").json()
    report(args, waves, baseline, server)
    target = 0.8 * n / args.latency_s
    return 0 if all(w.throughput >= target for w in waves[1:3]) else 1


HEADER = (
    "| wave | callers | summaries | seconds | summaries/s | % of ideal | peak in flight "
    "| p50 s | p99 s | client CPU ms/summary | RSS after, MiB |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def report(
    args: argparse.Namespace, waves: list[Wave], baseline: float, server: dict[str, int]
) -> None:
    ideal = args.inflight / args.latency_s
    print(f"stand-in latency {args.latency_s} s; ideal {ideal:.0f} summaries/s at {args.inflight}")
    print(f"in flight; target >= {0.8 * ideal:.0f}/s")
    print(f"client RSS before the first wave: {baseline:.0f} MiB")
    print(HEADER)
    for w in waves:
        pct = 100 * w.throughput / (w.inflight / args.latency_s)
        cells = [
            w.name,
            str(w.inflight),
            str(w.summaries),
            f"{w.seconds:.1f}",
            f"{w.throughput:.1f}",
            f"{pct:.0f}%",
            str(w.peak_inflight),
            f"{w.quantile(0.5):.2f}",
            f"{w.quantile(0.99):.2f}",
            f"{1000 * w.cpu_s / w.summaries:.1f}",
            f"{w.rss_mb:.0f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print(
        f"client peak RSS {peak_rss_mb():.0f} MiB; stand-in saw {server['requests']} requests, "
        f"peak {server['in_flight_peak']} in flight on {server['connections_peak']} connections "
        f"({server['connections_accepted']} accepted in all)"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"CPUs: {os.cpu_count()}; load average at the end {load}; Python {sys.version.split()[0]}"
    )


if __name__ == "__main__":
    sys.exit(main())
