"""Schemathesis against the checked-in docs/openapi.json and a real ``compactor serve``: a
bounded number of generated requests per operation; no 5xx, and every answer's status, content
type and body are the ones the spec documents."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks
from support.http_support import KEY_A, Stack

from worker.api.spec import DOC

pytestmark = pytest.mark.slow

# createWebhook resolves the generated host names (DNS); its validation has its own tests.
SCHEMA = schemathesis.openapi.from_dict(json.loads(DOC.read_text())).exclude(
    operation_id="createWebhook"
)
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture(scope="module")
def server(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("schema"), redis_server)
    try:
        yield s.start(workers=False)
    finally:
        s.stop()


@SCHEMA.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_the_server_answers_as_the_spec_says(case: schemathesis.Case, server: Stack) -> None:
    # no workers here: /readyz and the compact endpoint answer their documented 503
    wanted = CHECKS[1:] if case.path in ("/readyz", "/v1/responses/compact") else CHECKS
    case.call_and_validate(
        base_url=server.base,
        headers={"Authorization": f"Bearer {KEY_A}"},
        checks=wanted,
        timeout=10,
    )
