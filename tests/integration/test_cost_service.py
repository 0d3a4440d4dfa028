"""The cost model through the service on a real Redis: the conversation's pace kept by submit
(``cw:{conv}:activity``) reaches the cost object, published compactions add what they spent and
saved to the counters in total and per tenant, Prometheus shows them with a tenant label, and
``compactor status`` totals them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.service_support import conversation

from worker.backend import keys
from worker.backend.connection import connect
from worker.backend.redis_state import RedisState
from worker.cli.redis_commands import cost_totals
from worker.config import Settings
from worker.ops.metrics import render_prometheus
from worker.pipeline import Adapters, Pipeline
from worker.runtime.service import Service
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent, parse_event

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def svc(redis_url: str, tmp_path: Path) -> Iterator[Service]:
    settings = Settings(compaction={"transcript_dir": str(tmp_path), "keep_recent_tool_results": 1})
    svc = Service(
        settings=settings,
        state=RedisState(connect(redis_url), settings.redis),
        pipeline=Pipeline(settings, Adapters(store=FileStore(tmp_path))),
        enqueue_summarize=lambda *_: None,
        enqueue_evaluate=lambda *_: None,
    )
    yield svc
    svc.state.client.close()


def compact(svc: Service, snap: dict[str, Any]) -> CompletedEvent:
    conv = snap["conversation_id"]
    assert svc.state.store_snapshot(conv, snap["revision"], json.dumps(snap).encode())
    assert svc.evaluate(conv) == "queued"
    assert svc.summarize(conv, snap["revision"]) == "completed"
    events = [parse_event(e) for _, e in svc.state.read_events(conv) if e is not None]
    done = [e for e in events if isinstance(e, CompletedEvent)]
    assert len(done) == 1
    return done[0]


def test_the_pace_of_submits_reaches_the_cost_and_the_counters_add_up_per_tenant(
    svc: Service, redis_url: str
) -> None:
    conv = "acme:c-paced"
    # Three earlier snapshots, each evaluated (skipped: a large window), then one over.
    for turns in (2, 3, 4):
        small = conversation(conv, turns, window=1_000_000)
        svc.state.store_snapshot(conv, small["revision"], json.dumps(small).encode())
        assert svc.evaluate(conv) == "skipped"
        time.sleep(0.05)  # distinct submit times: the interval is above 0
    pace = svc.state.client.hgetall(keys.activity(conv))
    assert int(pace[b"n"]) == 3 and float(pace[b"t"]) > float(pace[b"f"])
    assert svc.state.client.ttl(keys.activity(conv)) > 0
    assert svc.state.client.zscore(keys.idle_conversations("acme"), conv) == float(pace[b"t"])
    event = compact(svc, conversation(conv, 12, window=2000))
    cost = event.cost
    assert cost is not None and cost.priced and cost.turn_interval_s is not None
    assert cost.turn_interval_s > 0 and cost.cache_warm is True

    other = compact(svc, conversation("c-no-tenant", 12, window=2000))
    assert other.cost is not None and other.cost.priced

    counters = svc.state.counters()
    spent = cost.summary_usd + max(cost.cache_write_usd, 0.0)  # type: ignore[operator]
    saved = cost.saving_per_turn_usd * cost.horizon_turns + max(-cost.cache_write_usd, 0.0)  # type: ignore[operator]
    assert counters["cost_spent_usd_total:tenant:acme"] == pytest.approx(spent)
    assert counters["cost_saved_usd_total:tenant:acme"] == pytest.approx(saved)
    assert counters["cost_saved_tokens_total:tenant:acme"] == cost.saved_tokens_per_turn
    both = cost.saved_tokens_per_turn + other.cost.saved_tokens_per_turn
    assert counters["cost_saved_tokens_total"] == both

    text = render_prometheus(counters, {})
    assert (
        f'compactor_cost_saved_tokens_total{{tenant="acme"}} {cost.saved_tokens_per_turn}' in text
    )
    assert f"compactor_cost_saved_tokens_total {both}" in text
    assert text.count("# TYPE compactor_cost_saved_tokens_total counter") == 1

    totals = cost_totals(counters)
    assert totals["saved_tokens_per_turn"] == both
    assert totals["per_tenant"]["acme"]["saved_usd"] == pytest.approx(saved)


def test_an_unpriced_model_is_counted_as_such(svc: Service) -> None:
    snap = conversation("c-unpriced", 12, window=2000)
    snap["model"]["name"] = "acme-7b"
    event = compact(svc, snap)
    assert event.cost is not None and not event.cost.priced
    counters = svc.state.counters()
    assert counters["cost_unpriced_total"] == 1.0
    assert "cost_spent_usd_total" not in counters


def test_compactor_status_shows_the_cost_totals(svc: Service, redis_url: str) -> None:
    compact(svc, conversation("acme:c-status", 12, window=2000))
    run = subprocess.run(
        [sys.executable, "-m", "worker", "status"],
        env={"COMPACTOR_REDIS_URL": redis_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    doc = json.loads(run.stdout)  # no worker answers (exit 1), but the document is printed
    assert doc["cost"]["saved_tokens_per_turn"] > 0
    assert doc["cost"]["per_tenant"]["acme"]["spent_usd"] >= 0
