"""OpenTelemetry: one trace per snapshot from the agent's submit to the published event, across
the Celery hop, received by a real OTLP/HTTP receiver on loopback from real worker processes;
the stage histograms (OpenTelemetry's and Prometheus'); and nothing of OpenTelemetry imported
when ``[otel]`` is not configured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.otlp_support import OtlpReceiver, ReceivedSpan
from support.service_support import BROKERS, REPO_ROOT, ServiceEnv, conversation, wait_for_outcome

from worker.backend.queues import task_message
from worker.client import Client
from worker.config import Settings, load_settings, shown_settings
from worker.errors import ConfigError
from worker.ops.metrics import latency_counters, render_prometheus
from worker.ops.telemetry import telemetry
from worker.ops.tracing import Telemetry
from worker.testing import StandinLLM

WORKER_STAGES = {"evaluate", "compact", "summarize", "llm", "store_write", "publish"}


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the settings a test gives configure OpenTelemetry (not the machine's)."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def of_conversation(spans: list[ReceivedSpan], conversation_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.attributes.get("gen_ai.conversation.id") == conversation_id]


def ancestry(span: ReceivedSpan, spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """``span``, its parent, its parent's parent, ... up to the trace's root."""
    by_id = {s.span_id: s for s in spans}
    chain = [span]
    while chain[-1].parent_span_id:
        parent = by_id.get(chain[-1].parent_span_id)
        assert parent is not None, f"{chain[-1].name}'s parent was never received"
        chain.append(parent)
    return chain


def published(spans: list[ReceivedSpan], event_type: str, revision: int) -> list[ReceivedSpan]:
    return [
        s
        for s in spans
        if s.name == "compactor.publish"
        and s.attributes.get("compactor.event.type") == event_type
        and s.attributes.get("compactor.revision") == revision
    ]


# --- end to end through real workers ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("broker", BROKERS, indirect=True)  # the task messages' headers on each
def test_one_trace_per_snapshot_from_submit_to_publish_across_processes(
    broker: str | None,
    service_env: ServiceEnv,
    otlp: OtlpReceiver,
    no_otel_env: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, make_workers = service_env
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # the workers' environment: the stand-in's
    with StandinLLM() as llm:
        workers = make_workers(f"""mode = "prefer_remote"
[llm]
base_url = "{llm.openai_base_url}"
model = "stand-in-model"
[otel]
endpoint = "{otlp.endpoint}"
export_interval_s = 0.2
""")
        workers.start("w1")
        settings = workers.settings()
        agent = settings.otel.model_copy(update={"service_name": "test-agent"})
        client = Client(settings.model_copy(update={"otel": agent}))
        try:
            big = conversation("otel-big", 30)
            client.submit(big)
            events = wait_for_outcome(client, "otel-big", timeout_s=120)
            assert events[-1].type == "compaction.completed"
            assert events[-1].compaction.summary.source == "llm"
            small = [conversation("otel-small", 1), conversation("otel-small", 2)]
            for snapshot in small:  # one at a time: each its own submit, so its own trace
                client.submit(snapshot)
                outcome = wait_for_outcome(client, "otel-small", revision=snapshot["revision"])
                assert outcome[-1].type == "compaction.skipped"
            otlp.wait_for(
                lambda r: (
                    bool(published(r.spans, "compaction.completed", big["revision"]))
                    and all(published(r.spans, "compaction.skipped", s["revision"]) for s in small)
                ),
                what="publish spans of the three snapshots",
            )
            prometheus = render_prometheus(client.state.counters(), {})
        finally:
            client.close()
            workers.stop_all()
        assert len(llm.requests) >= 1

    spans = otlp.spans
    # The compaction: publish <- compact <- evaluate <- submit, the last in the agent's
    # process, the others in the worker's; everything of the conversation in that one trace.
    [publish] = published(spans, "compaction.completed", big["revision"])
    chain = ancestry(publish, spans)
    assert [s.name for s in chain] == [
        "compactor.publish",
        "compactor.compact",
        "compactor.evaluate",
        "compactor.submit",
    ]
    assert [s.service for s in chain] == ["compaction-worker"] * 3 + ["test-agent"]
    assert [s.kind for s in chain] == ["internal", "consumer", "consumer", "producer"]
    submit, evaluate, compact = chain[3], chain[2], chain[1]
    assert submit.parent_span_id == ""
    assert submit.attributes["compactor.submit.status"] == "queued"
    big_spans = of_conversation(spans, "otel-big")
    assert {s.trace_id for s in big_spans} == {submit.trace_id}
    assert evaluate.attributes["compactor.outcome"] == "queued"
    assert evaluate.attributes["compactor.over_threshold"] is True
    assert evaluate.attributes["gen_ai.request.model"] == "gpt-4.1"
    assert evaluate.attributes["compactor.tokens"] > evaluate.attributes["compactor.threshold"]
    assert compact.attributes["compactor.outcome"] == "completed"
    completed = events[-1].compaction
    assert compact.attributes["compactor.tokens_before"] == completed.tokens_before
    assert compact.attributes["compactor.tokens_after"] == completed.tokens_after

    # The stages of the compaction, each a child of the compaction task's span; the LLM call
    # (GenAI conventions) a child of the summary.
    children = {s.name: s for s in big_spans if s.parent_span_id == compact.span_id}
    assert {"compactor.summarize", "compactor.store_write", "compactor.publish"} <= set(children)
    summarize, store_write = children["compactor.summarize"], children["compactor.store_write"]
    assert summarize.attributes["compactor.summary.source"] == "llm"
    assert store_write.attributes["compactor.store"] == "file"
    [chat] = [s for s in big_spans if s.parent_span_id == summarize.span_id]
    assert chat.name == "chat stand-in-model"
    assert chat.kind == "client"
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "stand-in-model"
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    # The LLM's answer as it came (the published summary is that, checked and repaired).
    assert 0 < chat.attributes["gen_ai.usage.output_tokens"] <= 300  # summary_max_output_tokens
    assert chat.attributes["gen_ai.usage.input_tokens"] > completed.tokens_after

    # One trace per snapshot: the two skipped revisions, two traces of three spans each.
    traces = []
    for snapshot in small:
        [skip] = published(spans, "compaction.skipped", snapshot["revision"])
        chain = ancestry(skip, spans)
        assert [s.name for s in chain] == [
            "compactor.publish",
            "compactor.evaluate",
            "compactor.submit",
        ]
        assert chain[-1].attributes["compactor.revision"] == snapshot["revision"]
        traces.append(skip.trace_id)
    assert len(set(traces)) == 2
    assert not {s.trace_id for s in big_spans} & set(traces)

    # Metrics: the stage histograms and the tokens saved, over OTLP and in Prometheus' text.
    otlp.wait_for(
        lambda r: (
            {
                p.attributes.get("compactor.stage")
                for p in r.points
                if p.metric == "compactor.stage.duration" and p.count > 0
            }
            >= WORKER_STAGES | {"submit"}  # the submit's from the agent's process
        ),
        what="a duration histogram point for every stage",
    )
    saved = [p for p in otlp.points if p.metric == "compactor.tokens.saved"]
    assert max(p.count for p in saved) == completed.tokens_before - completed.tokens_after
    for stage in WORKER_STAGES - {"store_write"}:
        assert f'compactor_stage_seconds_count{{stage="{stage}"}}' in prometheus, stage
    assert 'compactor_stage_seconds_count{stage="store_write",store="file"} 1' in prometheus
    saving = completed.tokens_before - completed.tokens_after
    assert f"compactor_tokens_saved_total {saving}" in prometheus


# --- nothing imported when not configured -------------------------------------------------------

# redis-py (from 8) imports OpenTelemetry's SDK itself whenever it is installed
# (redis/observability/providers.py), whatever we do. So the unconfigured run refuses every
# opentelemetry import, as where the otel extra is not installed, and records who asked: the
# importing module outside the import machinery.
SCRIPT = """
import importlib.abc, json, sys

asked = []

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "opentelemetry":
            return None
        frame = sys._getframe(1)
        while frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
            frame = frame.f_back
        asked.append((frame.f_globals.get("__name__", "?"), name))
        raise ModuleNotFoundError(name)

if sys.argv[2] == "refuse":
    sys.meta_path.insert(0, Refuse())

from worker.client import Client
from worker.config import load_settings
from worker.runtime import tasks  # the worker's tasks, as `celery -A worker worker` loads them

snapshot = json.load(open(sys.argv[1]))
cid, revision = snapshot["conversation_id"], snapshot["revision"]
settings = load_settings()
client = Client(settings)
client.submit(snapshot)  # the task message goes to the queue no worker reads here
svc = tasks._build(settings)  # the worker's service, as each worker process builds it
outcomes = [svc.evaluate(cid, trace={}), svc.summarize(cid, revision, trace={})]
client.close()
svc.telemetry.shutdown()
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
print(json.dumps({"outcomes": outcomes, "opentelemetry": loaded, "asked": asked}))
"""


def run_paths(tmp_path: Path, redis_url: str, how: str, **env: str) -> dict[str, list[Any]]:
    """The client's submit, then the worker's evaluate and summarize, in a fresh interpreter
    (``how``: ``refuse`` OpenTelemetry's imports, or ``allow`` them)."""
    tmp_path.mkdir()
    config = tmp_path / "compactor.toml"
    config.write_text(f'[compaction]\ntranscript_dir = "{tmp_path / "transcripts"}"\n')
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(conversation(tmp_path.name, 30)))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("COMPACTOR_", "OTEL_"))}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(snapshot), how],
        env=base
        | {"COMPACTOR_CONFIG": str(config), "COMPACTOR_REDIS_URL": redis_url, "PYTHONPATH": "."}
        | env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, list[Any]] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_unconfigured_client_and_worker_paths_import_no_opentelemetry(
    tmp_path: Path, redis_url: str, otlp: OtlpReceiver
) -> None:
    quiet = run_paths(tmp_path / "quiet", redis_url, "refuse")
    assert quiet["outcomes"] == ["queued", "completed"]
    assert quiet["opentelemetry"] == []
    importers = {importer for importer, _ in quiet["asked"]}
    assert not {i for i in importers if i.split(".")[0] == "worker"}, quiet["asked"]
    assert "redis.observability.providers" in importers  # the refusal saw who asked
    # The same paths configured by OpenTelemetry's own variable: imported, and spans sent.
    traced = run_paths(
        tmp_path / "traced", redis_url, "allow", OTEL_EXPORTER_OTLP_ENDPOINT=otlp.endpoint
    )
    assert traced["outcomes"] == ["queued", "completed"]
    assert "opentelemetry.sdk.trace" in traced["opentelemetry"]
    otlp.wait_for(
        lambda r: (
            {"compactor.submit", "compactor.evaluate", "compactor.compact"}
            <= {s.name for s in r.spans}
        ),
        what="the traced run's spans",
    )


# --- the pieces ---------------------------------------------------------------------------------


def test_task_message_carries_only_the_w3c_trace_headers() -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    _, headers, _ = task_message(
        "compactor.evaluate",
        ["c-1", 1.0],
        trace={"traceparent": traceparent, "tracestate": "a=1", "baggage": "user=x"},
    )
    assert headers["traceparent"] == traceparent
    assert headers["tracestate"] == "a=1"
    assert "baggage" not in headers
    _, plain, _ = task_message("compactor.evaluate", ["c-1", 1.0])
    assert "traceparent" not in plain


def test_the_standard_endpoint_variable_configures_otel_unless_ours_is_set() -> None:
    standard = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SERVICE_NAME": "a"}
    settings = load_settings(environ=standard)
    assert settings.otel.endpoint is not None
    assert settings.otel.endpoint.get_secret_value() == "http://127.0.0.1:4318"
    assert settings.otel.service_name == "a"
    assert settings.origin_of("otel.endpoint") == "OTEL_EXPORTER_OTLP_ENDPOINT"
    ours = load_settings(environ=standard | {"COMPACTOR_OTEL_ENDPOINT": "http://127.0.0.1:9"})
    assert ours.otel.endpoint is not None
    assert ours.otel.endpoint.get_secret_value() == "http://127.0.0.1:9"
    assert ours.origin_of("otel.endpoint") == "COMPACTOR_OTEL_ENDPOINT"
    assert load_settings(environ={}).otel.endpoint is None


def test_a_bad_endpoint_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(environ={"COMPACTOR_OTEL_ENDPOINT": "grpc://127.0.0.1:4317"})
    assert refused.value.key == "otel.endpoint"
    assert "grpc" in str(refused.value)


def test_unconfigured_telemetry_still_times_the_stages_for_prometheus() -> None:
    quiet = telemetry(Settings())
    assert type(quiet) is Telemetry and not quiet.enabled
    timings: dict[str, float] = {}
    with quiet.stage("store_write", labels={"store": "s3"}, into=timings) as stage:
        assert quiet.carrier() == {}
    assert stage.seconds >= 0
    assert timings['stage_seconds_count{stage="store_write",store="s3"}'] == 1


def test_prometheus_histograms_are_cumulative_and_end_with_inf() -> None:
    counters: dict[str, float] = {"snapshots_evaluated_total": 3}
    for seconds in (0.003, 0.2, 0.2, 400.0):  # the last beyond every bucket
        for name, amount in latency_counters("evaluate", seconds).items():
            counters[name] = counters.get(name, 0.0) + amount
    text = render_prometheus(counters, {})
    lines = text.splitlines()
    assert "# TYPE compactor_stage_seconds histogram" in lines
    assert "compactor_snapshots_evaluated_total 3" in lines
    buckets = [line for line in lines if line.startswith("compactor_stage_seconds_bucket")]
    values = [float(line.rsplit(" ", 1)[1]) for line in buckets]
    assert values == sorted(values)  # cumulative
    assert 'compactor_stage_seconds_bucket{stage="evaluate",le="0.005"} 1' in lines
    assert 'compactor_stage_seconds_bucket{stage="evaluate",le="0.25"} 3' in lines
    assert 'compactor_stage_seconds_bucket{stage="evaluate",le="60"} 3' in lines
    assert 'compactor_stage_seconds_bucket{stage="evaluate",le="+Inf"} 4' in lines
    assert 'compactor_stage_seconds_count{stage="evaluate"} 4' in lines
    assert 'compactor_stage_seconds_sum{stage="evaluate"} 400.403' in lines
    assert "# TYPE compactor_stage_seconds_count counter" not in lines


def test_config_show_masks_the_endpoint_credentials() -> None:
    settings = load_settings(
        environ={"COMPACTOR_OTEL_ENDPOINT": "https://user:s3cret@127.0.0.1:4318"}
    )
    shown = shown_settings(settings)["otel"]
    assert shown["endpoint"] == "https://user:***@127.0.0.1:4318"
    assert "s3cret" not in json.dumps(shown_settings(settings))
