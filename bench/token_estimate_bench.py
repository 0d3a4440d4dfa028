"""Calibrating the token estimate for models whose tokenizer we do not have (issue 14 §5).

tiktoken's o200k_base stands in for the unknown tokenizer. The characters per token are fitted
on half of the corpus (even positions: total characters / total tokens of every counted text)
and the estimate is judged on the other half, against the exact count of the whole request
(framing included, as ``count_request_tokens`` counts it), per conversation and per message.

    .venv/bin/python bench/token_estimate_bench.py [--chars-per-token R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import conversations

from worker.core.projection import count_message_tokens, count_request_tokens
from worker.tokens import (
    CALIBRATED_CHARS_PER_TOKEN,
    CalibratedEstimateTokenizer,
    TiktokenTokenizer,
)
from worker.wire import formats
from worker.wire.models import Message


def texts(m: Message) -> list[str]:
    out = [m.role, m.content, m.reasoning]
    for c in m.tool_calls:
        out += [c.name, c.arguments]
    return [t for t in out if t]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chars-per-token", type=float, default=None)
    args = parser.parse_args()
    exact = TiktokenTokenizer("gpt-4o")
    corpus = [formats.to_messages("openai", snap["messages"]) for _name, snap in conversations()]
    fit, held = corpus[::2], corpus[1::2]
    chars = sum(len(t) for ms in fit for m in ms for t in texts(m))
    tokens = sum(exact.count(t) for ms in fit for m in ms for t in texts(m))
    fitted = chars / tokens
    ratio = args.chars_per_token or CALIBRATED_CHARS_PER_TOKEN
    print(f"conversations: {len(corpus)} ({len(fit)} to fit, {len(held)} held out)")
    print(f"fitted chars/token (o200k_base): {fitted:.3f}; estimate judged: chars/{ratio:g}")
    estimate = CalibratedEstimateTokenizer(ratio)
    for label, group in (("held-out", held), ("all", corpus)):
        errors = []
        for ms in group:
            want = count_request_tokens(ms, exact)
            got = count_request_tokens(ms, estimate)
            errors.append((got - want) / want)
        absolute = [abs(e) for e in errors]
        print(
            f"{label} conversations, request tokens, (estimate - exact) / exact: "
            f"mean {statistics.mean(errors):+.1%}, "
            f"|error| median {statistics.median(absolute):.1%}, "
            f"p90 {pct(absolute, 0.9):.1%}, max {max(absolute):.1%}; "
            f"range {min(errors):+.1%} .. {max(errors):+.1%}"
        )
    per_message = []
    for ms in held:
        for m in ms:
            want = count_message_tokens(m, exact)
            if want >= 50:
                per_message.append((count_message_tokens(m, estimate) - want) / want)
    absolute = [abs(e) for e in per_message]
    print(
        f"held-out messages of 50+ tokens ({len(per_message)}): |error| median "
        f"{statistics.median(absolute):.1%}, p90 {pct(absolute, 0.9):.1%}, "
        f"max {max(absolute):.1%}; range {min(per_message):+.1%} .. {max(per_message):+.1%}"
    )


if __name__ == "__main__":
    main()
