"""``compactor status`` against real workers: which worker kinds answer (by the queues each node
consumes, whatever its name), and exit status 1 when a kind is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support.hosts_support import loopback_namespace_unavailable
from support.service_support import BROKERS, REPO_ROOT, ServiceEnv, client_for, conversation

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
    broker: str | None, service_env: ServiceEnv, run_cli: CliRunner
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


def test_status_without_a_redis_url_says_it_is_unset_and_where_it_looked(
    tmp_path: Path, subprocesses: None
) -> None:
    """Run where nothing listens on the built-in default (a network namespace of its own, so no
    Redis of this machine is touched): the first line says no URL is set and where it looked,
    then the failure to reach the default follows."""
    reason = loopback_namespace_unavailable()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    bare, configured = tmp_path / "bare", tmp_path / "configured"
    (configured / "config").mkdir(parents=True)
    bare.mkdir()
    (configured / "config" / "compactor.toml").write_text('[compaction]\nmode = "local_only"\n')
    for cwd, where in (
        (bare, f"there is no config/compactor.toml in {bare}"),
        (configured, f"{configured / 'config' / 'compactor.toml'} sets no [redis] url"),
    ):
        ran = subprocess.run(
            [
                "unshare",
                "--user",
                "--map-root-user",
                "--net",
                sys.executable,
                "-m",
                "worker",
                "status",
            ],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [json.loads(line) for line in ran.stderr.splitlines()]
        assert ran.returncode == 1 and lines[-1]["error"] == "redis_unavailable", ran.stderr
        warning = lines[0]
        assert warning["warning"] == "redis_url_unset", ran.stderr
        assert "COMPACTOR_REDIS_URL is not set" in warning["looked_at"]
        assert any(where in place for place in warning["looked_at"]), warning
        assert "redis://127.0.0.1:6379/0" in warning["message"]


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_status_with_a_redis_url_names_where_it_came_from_and_warns_of_nothing(
    broker: str | None, service_env: ServiceEnv, run_cli: CliRunner
) -> None:
    _, make = service_env
    workers = make()
    _, doc, err = status(run_cli, workers)
    assert doc["redis_from"] == "COMPACTOR_REDIS_URL"
    assert "redis_url_unset" not in err
