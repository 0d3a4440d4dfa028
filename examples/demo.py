"""The README's main job on embedded defaults: compact the sample conversations in-process.

No Redis, no LLM, no network: each snapshot in examples/ goes through the whole pipeline
(evaluate, select, summarize with the offline digest, persist the transcript) and its event is
printed, followed by the history an agent gets by applying it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from worker.client import apply_compaction
from worker.config import load_settings
from worker.pipeline import Adapters, run_pipeline
from worker.snapshots import parse_snapshot
from worker.transcripts import TranscriptStore

HERE = Path(__file__).parent


def _show(snapshot_path: Path) -> None:
    settings = load_settings(HERE / "demo.toml")
    parsed = parse_snapshot(snapshot_path.read_bytes(), settings)
    store = TranscriptStore(parsed.settings.compaction.transcript_dir)
    event = run_pipeline(parsed, Adapters(store=store))[-1]
    print(f"\n=== {snapshot_path.name}: {event.type}")
    print(json.dumps(json.loads(event.to_json()), indent=1, ensure_ascii=False)[:1500], "…")
    if event.compaction is None:
        return
    c = event.compaction
    applied = apply_compaction(parsed.snapshot.messages, event)
    print(
        f"--> {len(parsed.snapshot.messages)} messages became {len(applied)}; "
        f"{c.tokens_before} projected tokens became {c.tokens_after} "
        f"(threshold {event.trigger.threshold_tokens if event.trigger else '-'}); "
        f"transcript {c.transcript.uri if c.transcript else '-'}"
    )
    print("--> the summary the agent now sees:\n" + c.summary.text)


def main() -> int:
    for path in sorted(HERE.glob("*-session.json")):
        _show(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
