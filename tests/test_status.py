"""``compactor status`` against real workers: which worker kinds answer (by the queues each node
consumes, whatever its name), and exit status 1 when a kind is missing."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from service_support import BROKERS, ServiceEnv, client_for, conversation

from worker.runtime.fleet import classify_workers

if TYPE_CHECKING:
    from conftest import CliRunner

pytestmark = pytest.mark.slow

ALL = "compactor.evaluate,compactor.summarize,compactor.maintenance"


def status(run_cli: CliRunner, workers: Any) -> tuple[int, dict[str, Any], str]:
    env = {"COMPACTOR_REDIS_URL": workers.url}
    if workers.broker:
        env["COMPACTOR_BROKER_URL"] = workers.broker
    result = run_cli("status", "--config", workers.config, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    doc = json.loads(result.stdout)
    assert doc["broker_kind"] == ("rabbitmq" if workers.broker else "redis")
    assert "guest:guest" not in result.stdout  # the broker's password is masked
    return result.code, doc, result.stderr


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_status_names_the_kinds_that_answer_and_fails_when_one_is_missing(
    service_env: ServiceEnv, run_cli: CliRunner
) -> None:
    _, make = service_env
    workers = make()

    client = client_for(workers)
    client.submit(conversation("c-status", 2, window=100_000))  # waits: no worker yet
    client.close()
    code, doc, err = status(run_cli, workers)
    assert code == 1 and doc["workers"] == []
    assert doc["queues"] == {
        "compactor.evaluate": 1,
        "compactor.summarize": 0,
        "compactor.maintenance": 0,
    }
    assert doc["missing_kinds"] == ["evaluate", "summarize"]
    assert "evaluate, summarize" in json.loads(err.strip().splitlines()[-1])["error"]

    # Named like `compactor worker --queues ...` would be: classified by what it consumes.
    workers.start("only-eval", queues="compactor.evaluate,compactor.maintenance")
    code, doc, err = status(run_cli, workers)
    assert code == 1, doc
    assert [n.split("@")[0] for n in doc["kinds"]["evaluate"]] == ["only-eval"]
    assert doc["kinds"]["summarize"] == [] and doc["missing_kinds"] == ["summarize"]
    assert doc["queues_without_consumer"] == ["compactor.summarize"]
    assert "summarize" in err

    workers.start("summarize", queues="compactor.summarize")
    code, doc, err = status(run_cli, workers)
    assert code == 0, (doc, err)
    assert doc["missing_kinds"] == [] and doc["queues_without_consumer"] == []
    assert [n.split("@")[0] for n in doc["kinds"]["summarize"]] == ["summarize"]

    workers.stop("only-eval")
    code, doc, _ = status(run_cli, workers)
    assert code == 1 and doc["missing_kinds"] == ["evaluate"]

    # One worker consuming every queue counts for every kind.
    workers.stop("summarize")
    workers.start("all", queues=ALL)
    code, doc, _ = status(run_cli, workers)
    assert code == 0, doc
    assert {k: [n.split("@")[0] for n in v] for k, v in doc["kinds"].items()} == {
        "evaluate": ["all"],
        "summarize": ["all"],
    }


def test_classify_workers_by_queue() -> None:
    def q(*names: str) -> list[dict[str, Any]]:
        return [{"name": n, "exchange": {"name": n}} for n in names]

    kinds = classify_workers(
        {
            "summarize@h": q("compactor.summarize"),
            "evaluate@h": q("compactor.evaluate", "compactor.maintenance"),
            "compactor@h": q(*ALL.split(",")),
            "other@h": q("celery"),
        }
    )
    assert kinds == {
        "evaluate": ["compactor@h", "evaluate@h"],
        "summarize": ["compactor@h", "summarize@h"],
    }
    assert classify_workers({}) == {"evaluate": [], "summarize": []}
