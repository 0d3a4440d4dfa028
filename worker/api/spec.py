"""The OpenAPI 3.1 document of ``compactor serve``: ``worker/api/openapi.json``, written by hand
and shipped as package data, served as it is at ``GET /openapi.json``.

``docs/openapi.json`` is a byte-for-byte copy for readers of the repository;
``python -m worker.api.spec`` rewrites it from the package's, ``--check`` exits 1 if they differ
(``tests/unit/test_openapi.py`` checks that too, that the app's routes are the document's, and that
the limits the document states are the code's).
"""

from __future__ import annotations

import functools
import json
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

#: The repository's copy (absent from an installed package; only the check and tests use it).
DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "openapi.json"
_PACKAGED = "openapi.json"


@functools.cache
def document_bytes() -> bytes:
    """The document as shipped, read once: what ``GET /openapi.json`` answers."""
    return files(__package__ or "worker.api").joinpath(_PACKAGED).read_bytes()


def openapi() -> dict[str, Any]:
    """The document, parsed (a fresh copy each call: a caller may change it)."""
    parsed: dict[str, Any] = json.loads(document_bytes())
    return parsed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        same = DOC.is_file() and DOC.read_bytes() == document_bytes()
        if not same:
            print(f"{DOC} differs: run python -m worker.api.spec", file=sys.stderr)
        return 0 if same else 1
    DOC.write_bytes(document_bytes())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
