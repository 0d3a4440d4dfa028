"""Where the shared corpus lives: ``$COMPACTOR_CORPUS_DIR`` or ``../shared/corpus`` beside the
checkout. Benchmarks read it in place; nothing from it is copied into the project."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def corpus_dir() -> Path | None:
    explicit = os.environ.get("COMPACTOR_CORPUS_DIR")
    candidates = [Path(explicit)] if explicit else []
    candidates.append(ROOT.parent / "shared" / "corpus")
    for base in candidates:
        for d in (base / "swe-trajectories", base):
            if any(d.glob("*.json.gz")):
                return d
    return None


def conversations() -> Iterator[tuple[str, dict[str, Any]]]:
    d = corpus_dir()
    if d is None:
        raise SystemExit("corpus not found: set COMPACTOR_CORPUS_DIR or put it at ../shared/corpus")
    for path in sorted(d.glob("*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            yield path.name.removesuffix(".json.gz"), json.load(f)
