"""How the code-name scan (``worker.core.identifiers.code_names``) scales with the text.

Texts of 0.25 to 4 MB: the shared corpus's messages joined (what a range holds), and shapes
built to make a careless pattern re-scan (one endless name, a dotted chain, slashes, calls).
Each row: CPU time (best of 3, ``time.process_time``), and its ratio to the row before (the
text doubles each row, so linear cost reads about 2.0).

    .venv/bin/python bench/identifiers_scaling.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import conversations

from worker.core.identifiers import code_names
from worker.wire.models import Message

SIZES = [250_000, 500_000, 1_000_000, 2_000_000, 4_000_000]
SHAPES = {
    "one name": "a",
    "dotted chain": "Ab.",
    "slashes": "ab/",
    "calls": "f(",
    "paths": "ab/c.py ",
}


def corpus_text(limit: int) -> str:
    parts: list[str] = []
    size = 0
    for _, snapshot in conversations():
        for m in snapshot["messages"]:
            text = m["content"] if isinstance(m.get("content"), str) else json.dumps(m)
            parts.append(text)
            size += len(text)
            if size >= limit:
                return "\n".join(parts)[:limit]
    return "\n".join(parts)[:limit]


def seconds(text: str) -> float:
    """What a compaction pays: the names of a range whose tool output is ``text`` (a fresh
    message each time, so nothing is reused)."""
    best = float("inf")
    for k in range(3):
        message = Message(id=f"m{k}", role="tool", tool_call_id="c", content=text, source_index=0)
        start = time.process_time()
        code_names([message])
        best = min(best, time.process_time() - start)
    return best


def main() -> int:
    corpus = corpus_text(SIZES[-1])
    texts = {"corpus messages": corpus, **{k: v for k, v in SHAPES.items()}}
    print("| text | " + " | ".join(f"{s // 1000} kB" for s in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for label, source in texts.items():
        cells = []
        previous = None
        for size in SIZES:
            text = source[:size] if label == "corpus messages" else source * (size // len(source))
            took = seconds(text)
            ratio = f" (x{took / previous:.1f})" if previous else ""
            cells.append(f"{took * 1000:.0f} ms{ratio}")
            previous = took
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
