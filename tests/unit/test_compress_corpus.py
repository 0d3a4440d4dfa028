"""Every tool result of the real agent conversations round-trips, and none gets larger."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from worker.compress import compress_tool_result, compress_with_stats, decompress_tool_result
from worker.compress.tally import chunks
from worker.tokens import count_tokens, encoding_name_for_model, get_encoding

pytestmark = pytest.mark.corpus

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


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


@pytest.mark.parametrize("model", [None, "gpt-4"])  # o200k_base and cl100k_base
def test_corpus_outputs_counted_in_chunks_add_up_to_their_count(model: str | None) -> None:
    # Cut small, so that every kind of line break the corpus has is tried as a cut.
    encoding = get_encoding(encoding_name_for_model(model))
    for raw in _tool_results():
        parts = list(chunks(raw, 64))
        assert "".join(parts) == raw
        counts = [len(tokens) for tokens in encoding.encode_ordinary_batch(parts)]
        assert sum(counts) == len(encoding.encode_ordinary(raw)), raw[:200]


def test_the_fast_gate_decides_like_the_exact_counts() -> None:
    # compress_tool_result stops counting once the gate is settled; compress_with_stats counts
    # everything. Both must return the same output for every result, at several gates.
    for raw in _tool_results():
        for min_tokens, min_saving in ((200, 0.15), (50, 0.3), (0, 0.05)):
            fast = compress_tool_result("bash", raw, min_tokens=min_tokens, min_saving=min_saving)
            exact = compress_with_stats("bash", raw, min_tokens=min_tokens, min_saving=min_saving)
            assert fast == exact.output
