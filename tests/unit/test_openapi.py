"""The OpenAPI document ``compactor serve`` ships (``worker/api/openapi.json``, package data):
the repository's ``docs/openapi.json`` is the same bytes, the app's routes are its paths, the
limits it states are the ones the code enforces, and an installed package carries it. Offline:
the app is built, never served (integration/test_http_api.py and integration/test_http_schema.py
ask a real
server)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from starlette.routing import Route

from worker.api.app import create_app
from worker.api.responses_compact import IGNORED_FIELDS, MAX_MODEL_CHARS
from worker.api.spec import DOC, document_bytes, main, openapi
from worker.config import settings_from_mapping
from worker.wire.models import CONVERSATION_ID_PATTERN, MAX_REVISION
from worker.wire.requests import MAX_INSTRUCTIONS_CHARS

REPO = Path(__file__).resolve().parent.parent.parent
# Routes the document does not describe, and where they are described instead: the proxy
# forwards the providers' own APIs (docs/http.md), the inspector is HTML (docs/inspector.md).
UNDOCUMENTED_PREFIXES = ("/proxy/", "/ui")


def test_the_docs_copy_is_the_shipped_document_byte_for_byte() -> None:
    assert DOC.read_bytes() == document_bytes(), "run python -m worker.api.spec"
    assert main(["--check"]) == 0


def test_the_document_is_openapi_3_1_and_each_call_parses_afresh() -> None:
    doc = openapi()
    assert doc["openapi"].startswith("3.1.")
    doc["paths"].clear()
    assert openapi()["paths"], "a caller's change reaches no other caller"


def test_the_apps_routes_are_the_documents_paths(tmp_path: Path) -> None:
    settings = settings_from_mapping(
        # never connected to: building the app opens no socket
        {"redis": {"url": "redis://127.0.0.1:9/0"}, "compaction": {"transcript_dir": str(tmp_path)}}
    )
    app = create_app(settings, environ={})
    served = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route) and not route.path.startswith(UNDOCUMENTED_PREFIXES)
        for method in route.methods or ()
        if method != "HEAD"  # Starlette adds HEAD to every GET
    }
    documented = {(m.upper(), path) for path, ops in openapi()["paths"].items() for m in ops}
    assert served == documented


def _parameters(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for operations in doc["paths"].values():
        for operation in operations.values():
            yield from operation.get("parameters", [])


def test_the_documents_limits_are_the_codes() -> None:
    doc = openapi()
    conversation = [
        p["schema"]["pattern"]
        for p in _parameters(doc)
        if p["name"] in ("conversation_id", "X-Compactor-Conversation")
    ]
    assert len(conversation) >= 10 and set(conversation) == {CONVERSATION_ID_PATTERN}
    revisions = [p["schema"] for p in _parameters(doc) if p["name"] == "revision"]
    assert revisions and all(s["maximum"] == MAX_REVISION for s in revisions)
    schemas = doc["components"]["schemas"]
    instructions = schemas["CompactRequest"]["properties"]["instructions"]
    assert instructions["maxLength"] == MAX_INSTRUCTIONS_CHARS
    compact = schemas["ResponsesCompactRequest"]["properties"]
    assert compact["model"]["maxLength"] == MAX_MODEL_CHARS
    # every field OpenAI's client may send and the endpoint accepts unread is documented
    assert compact.keys() >= IGNORED_FIELDS
    assert schemas["ResponsesCompactRequest"]["additionalProperties"] is False


def test_a_non_editable_install_carries_the_document() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    assert "openapi.json" in package_data["worker.api"]
    json.loads(document_bytes())  # and it parses
