"""Every tool result of the real agent conversations round-trips, and none gets larger."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from worker.compress import compress_with_stats, decompress_tool_result
from worker.tokens import count_tokens

pytestmark = pytest.mark.corpus

REPO_ROOT = Path(__file__).resolve().parent.parent


def _corpus_files() -> list[Path]:
    places = [REPO_ROOT.parent / "shared" / "corpus"]
    if os.environ.get("COMPACTOR_CORPUS_DIR"):
        places.insert(0, Path(os.environ["COMPACTOR_CORPUS_DIR"]))
    for place in places:
        files = sorted(place.glob("*.json.gz")) or sorted(place.glob("*/*.json.gz"))
        if files:
            return files
    pytest.skip(
        "corpus not found: set $COMPACTOR_CORPUS_DIR or put it at "
        f"{places[-1]} (looked at {', '.join(map(str, places))})"
    )


def _tool_results() -> list[str]:
    results = []
    for path in _corpus_files():
        snapshot = json.loads(gzip.decompress(path.read_bytes()))
        results += [m["content"] for m in snapshot["messages"] if m.get("role") == "tool"]
    return results


def test_every_corpus_tool_result_round_trips_and_never_grows() -> None:
    results = _tool_results()
    compressed = 0
    for raw in results:
        outcome = compress_with_stats("bash", raw)
        assert decompress_tool_result("bash", outcome.output) == raw
        assert outcome.tokens_after <= outcome.tokens_before
        if outcome.compressed:
            compressed += 1
            assert outcome.tokens_after == count_tokens(outcome.output)
            assert outcome.tokens_after < 0.85 * outcome.tokens_before
    assert len(results) > 1000
    assert compressed > 50  # the corpus has plenty of grep, listing, nl and log output
