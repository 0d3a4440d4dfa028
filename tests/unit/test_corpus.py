"""Realism: compaction over real agent conversations from ../shared/corpus (skipped if absent).

The full run over all 100 is bench/corpus_compact_bench.py; this takes every fifth one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from corpus import conversations, corpus_dir
from corpus_compact_bench import run_one, with_small_window

pytestmark = [
    pytest.mark.corpus,
    pytest.mark.skipif(
        corpus_dir() is None,
        reason="corpus absent: set COMPACTOR_CORPUS_DIR or place it at ../shared/corpus",
    ),
]


def _sample() -> list[tuple[str, dict[str, Any]]]:
    return [c for k, c in enumerate(conversations()) if k % 5 == 0] if corpus_dir() else []


@pytest.mark.parametrize(
    ("name", "snapshot"), _sample(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_real_conversation_compacts_under_threshold_keeping_paths(
    name: str,
    snapshot: dict[str, Any],
    tmp_path: Path,
) -> None:
    row = run_one(with_small_window(snapshot), tmp_path)
    assert row["type"] == "compaction.completed", name
    assert row["under"], f"{name}: {row['after']} tokens after, threshold {row['threshold']}"
    assert row["paths_kept"] == row["paths"], f"{name}: lost {row['missing']}"
