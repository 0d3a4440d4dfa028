"""The LLM path against a real model: SmolLM2-135M-Instruct on loopback, served by
``tests/llm_server/server.mjs`` (node-llama-cpp's prebuilt llama.cpp, installed by the test
itself: see ``real_llm_support.py``), or by llama.cpp's ``llama-server`` when ``$LLAMA_VENV``
(or ``$LLAMA_SERVER`` and ``$LLAMA_MODEL``) names one (bench/real_llm.py's docstring). Skipped,
with the reason, only where Node.js, npm or the package registries are out of reach.

What must hold with a real model, whatever it writes: the pipeline completes with the model's
summary within both bounds, none of our prompt's wrapper tags in it, the server's own token
counts recorded, ``truncated`` set exactly when the server cut an answer or our bound did, and
under ``prefer_remote`` the gate decides on the model's own text (the digest, with the reason,
whenever that text scores under ``min_summary_fidelity``). A server killed while it writes a
summary leaves the digest, saying why; a session compacted three times in a row, each event
applied before the history grows again, is gated and bounded each time; and our server, once
installed, runs and answers in a network namespace with nothing but loopback (it downloads
nothing when it runs)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.real_llm_support import (
    Unavailable,
    log_size,
    node_llm_server,
    prepare,
    requests_seen,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from real_llm import LOCAL_LLM, llama_server, locate

from worker.config import CompactionConfig, LLMConfig, Settings
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.summarize import SUMMARY_MARKER
from worker.summarize.factory import llm_summarizer
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent, Summary
from worker.wire.history import apply_compaction

SERVER, MODEL = locate()  # llama-server, when the environment names one
pytestmark = pytest.mark.slow
# Small bounds: every token costs CPU seconds on cores the rest of the suite keeps busy.
BOUND = 150  # summary_max_output_tokens
INPUT_CHARS = 2000  # summary_max_input_chars: a few parts, so the chunk and merge path too
SUCCESSIVE_CHARS = 4000  # the same in the successive compactions: a call or two each
ONE_CALL_CHARS = 12_000  # where the range takes one call
TURNS = 8  # tool exchanges in the first history
GROWTH = 4  # tool exchanges added after each compaction
MIN_FIDELITY = CompactionConfig().min_summary_fidelity
TAGS = re.compile(r"</?(?:conversation|part|summary-so-far|must-keep)>")
WAIT_S = 600.0  # for a request to reach the model: generous, the cores may be busy


@dataclass(frozen=True)
class Served:
    """A model server for the module: its base URL and, for ours, its request log."""

    url: str
    log: Path | None


@pytest.fixture(scope="module")
def node_server_parts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, system_scenario: None
) -> tuple[Path, Path]:
    """The installed server and the model file (kept in .pytest_cache/d/real-llm)."""
    cache = getattr(request.config, "cache", None)  # none under -p no:cacheprovider
    work = cache.mkdir("real-llm") if cache is not None else tmp_path_factory.mktemp("real-llm")
    try:
        return prepare(Path(work))
    except Unavailable as reason:
        pytest.skip(str(reason))


@pytest.fixture(scope="module")
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, system_scenario: None
) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("real-llm-server") / "server.log"
    if SERVER is not None and MODEL is not None:
        with llama_server(SERVER, MODEL, log=log) as url:
            yield Served(url, None)  # its log is llama.cpp's own, not one line per request
        return
    server_dir, model = request.getfixturevalue("node_server_parts")
    with node_llm_server(server_dir, model, log=log) as server:
        yield Served(server.url, log)


def turns(first: int, count: int) -> list[dict[str, Any]]:
    """``count`` tool exchanges of a coding session, numbered from ``first``."""
    messages: list[dict[str, Any]] = []
    for k in range(first, first + count):
        messages += [
            {
                "id": f"a{k}",
                "role": "assistant",
                "content": f"I will look at src/pkg/mod_{k}.py next.",
                "tool_calls": [
                    {
                        "id": f"c{k}",
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": f'{{"command": "cat src/pkg/mod_{k}.py"}}',
                        },
                    }
                ],
            },
            {
                "id": f"r{k}",
                "role": "tool",
                "tool_call_id": f"c{k}",
                "content": f"def parse_{k}(text):\n    return text.split()  # helper {k}\n" * 6,
            },
        ]
    return messages


def snapshot(messages: list[dict[str, Any]], revision: int = 1) -> dict[str, Any]:
    return {
        "conversation_id": "real-llm",
        "revision": revision,
        "model": {"name": ""},
        "messages": messages,
    }


def first_history() -> list[dict[str, Any]]:
    task = {"id": "u0", "role": "user", "content": "Fix the failing test in src/pkg/parser.py."}
    end = {"id": "end", "role": "assistant", "content": "The parser fails on tabs."}
    return [task, *turns(0, TURNS), end]


def compact(
    url: str,
    tmp_path: Path,
    mode: str,
    *,
    snap: dict[str, Any] | None = None,
    input_chars: int = INPUT_CHARS,
    reuse: Reuse | None = None,
) -> CompletedEvent:
    """One compaction of ``snap`` (the first history by default) just over its threshold."""
    snap = snap or snapshot(first_history())
    store, reuse = FileStore(tmp_path), reuse or Reuse()
    probe = Pipeline(Settings(), Adapters(store=store), reuse)
    threshold = probe.evaluate(probe.parse(snap)).evaluation.projected_tokens - 1
    settings = Settings(
        compaction=CompactionConfig(
            mode=mode,
            auto_compact_threshold_tokens=threshold,
            summary_max_output_tokens=BOUND,
            summary_max_input_chars=input_chars,
        ),
        llm=LLMConfig.model_validate(LOCAL_LLM | {"base_url": url}),
    )
    llm = llm_summarizer(settings)
    try:
        pipeline = Pipeline(settings, Adapters(store=store, llm=llm), reuse)
        event = pipeline.run(pipeline.parse(snap))[-1]
    finally:
        assert llm is not None
        llm.close()
    assert isinstance(event, CompletedEvent), event
    return event


def assert_gated(summary: Summary) -> None:
    """``prefer_remote``: the model's text when it keeps enough facts, else the digest saying so."""
    assert summary.fidelity is not None
    if summary.source == "digest":
        assert (summary.fallback_reason or "").startswith("summary_fidelity"), summary
    else:
        assert summary.source == "llm" and summary.fidelity.score >= MIN_FIDELITY, summary


def assert_requests_bounded(served: Served, since: int, input_chars: int = INPUT_CHARS) -> None:
    """What the server received since byte ``since`` of its log: the conversation's text
    within ``input_chars`` (summary_max_input_chars) per request, and no more than BOUND
    tokens asked for."""
    if served.log is None:
        return  # llama-server's own log: not read here
    generated = [e for e in requests_seen(served.log, since) if e["event"] == "generating"]
    assert generated, "no request reached the model"
    for entry in generated:
        assert entry["roles"] == ["system", "user"], entry
        chars = entry["chars"]
        assert isinstance(chars, list) and chars[1] <= input_chars, entry
        max_tokens = entry["max_tokens"]
        assert isinstance(max_tokens, int) and 0 < max_tokens <= BOUND, entry


def test_a_real_model_summarizes_within_the_bounds(served: Served, tmp_path: Path) -> None:
    since = log_size(served.log) if served.log else 0
    summary = compact(served.url, tmp_path, "remote_only").compaction.summary
    assert summary.source == "llm" and summary.model == LOCAL_LLM["model"]
    assert summary.tokens <= BOUND
    assert not TAGS.search(summary.text), summary.text
    assert summary.usage is not None and summary.usage.calls >= 1
    assert summary.usage.output_tokens is not None and summary.usage.output_tokens > 0
    assert summary.fidelity is not None and 0.0 <= summary.fidelity.score <= 1.0
    assert_requests_bounded(served, since)
    if served.log is not None:  # the server's own counts, and a cut answer is said to be one
        answered = [e for e in requests_seen(served.log, since) if e["event"] == "answered"]
        assert len(answered) == summary.usage.calls
        assert summary.usage.output_tokens == sum(e["completion_tokens"] for e in answered)
        if any(e["finish_reason"] == "length" for e in answered):
            assert summary.truncated


def test_three_successive_compactions_are_each_gated_and_bounded(
    served: Served, tmp_path: Path
) -> None:
    """One session under ``prefer_remote``: compacted, the event applied, the history grown,
    and compacted again, three times. The first round is the gate on the model's own text over
    a fresh history; the next ones summarize over the summary before them."""
    history, reuse = first_history(), Reuse()
    previous_summary_id: str | None = None
    for revision in (1, 2, 3):
        since = log_size(served.log) if served.log else 0
        snap = snapshot(history, revision)
        event = compact(
            served.url,
            tmp_path / str(revision),
            "prefer_remote",
            snap=snap,
            reuse=reuse,
            input_chars=SUCCESSIVE_CHARS,
        )
        c = event.compaction
        assert_gated(c.summary)
        assert c.summary.tokens <= BOUND and c.summary.text.count(SUMMARY_MARKER) == 1
        if c.summary.source == "llm":
            assert not TAGS.search(c.summary.text), c.summary.text
        assert_requests_bounded(served, since, SUCCESSIVE_CHARS)
        assert c.tokens_after < c.tokens_before
        ids = [m.get("id") for m in history]
        if previous_summary_id is not None:  # the earlier summary is summarized over, not kept
            assert ids.index(c.first_id) <= ids.index(previous_summary_id) <= ids.index(c.last_id)
        history = apply_compaction(history, event)  # refused unless it is this history's edit
        summaries = [m for m in history if SUMMARY_MARKER in str(m.get("content"))]
        assert len(summaries) == 1, summaries
        previous_summary_id = summaries[0].get("id")
        assert previous_summary_id is not None
        end = {"id": f"end{revision}", "role": "assistant", "content": "Next, the lexer."}
        history = [*history, *turns(TURNS + GROWTH * (revision - 1), GROWTH), end]


def test_a_server_killed_mid_request_falls_back_to_the_digest(
    node_server_parts: tuple[Path, Path], tmp_path: Path
) -> None:
    """Our own server, killed (SIGKILL) once its log says it is writing the summary: the
    request in flight fails, the retry finds nothing listening, and ``prefer_remote`` publishes
    the digest with the connection error as the reason."""
    server_dir, model = node_server_parts
    log = tmp_path / "server.log"
    with node_llm_server(server_dir, model, log=log) as server, ThreadPoolExecutor(1) as pool:
        # one call (the range fits the input bound), so the one in flight is the summary
        pending = pool.submit(
            compact, server.url, tmp_path, "prefer_remote", input_chars=ONE_CALL_CHARS
        )
        wait_until_generating(log, pending)
        server.process.kill()
        server.process.wait()
        summary = pending.result(timeout=WAIT_S).compaction.summary
    assert summary.source == "digest"
    assert (summary.fallback_reason or "").startswith("llm_connection_error:"), summary
    assert summary.usage is None
    assert [e["event"] for e in requests_seen(log)] == ["generating"]  # killed before answering


def wait_until_generating(log: Path, pending: Future[CompletedEvent]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not any(e["event"] == "generating" for e in requests_seen(log)):
        assert not pending.done(), f"the compaction ended first: {pending.result()}"
        assert time.monotonic() < deadline, "no request reached the model"
        time.sleep(0.02)


# Run in a network namespace of its own (only loopback up): the server, a request, the answer.
NO_NETWORK_SCRIPT = """
import json, sys, urllib.request
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from support.docs_runner import loopback_up
from support.real_llm_support import node_llm_server
loopback_up()
server_dir, model, log = map(Path, sys.argv[2:5])
with node_llm_server(server_dir, model, log=log) as server:
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    request = urllib.request.Request(server.url + "/chat/completions", json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=600) as answer:
        print(answer.read().decode())
"""


def test_the_server_downloads_nothing_when_it_runs(
    node_server_parts: tuple[Path, Path], tmp_path: Path
) -> None:
    unshare = ["unshare", "--user", "--map-root-user", "--net"]
    try:
        subprocess.run([*unshare, "true"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"unshare --user --net is not available: {exc}")
    server_dir, model = node_server_parts
    tests = Path(__file__).resolve().parent.parent
    argv = [str(tests), str(server_dir), str(model), str(tmp_path / "server.log")]
    done = subprocess.run(
        [*unshare, sys.executable, "-c", NO_NETWORK_SCRIPT, *argv],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["choices"][0]["message"]["content"]
    assert answer["usage"]["completion_tokens"] <= 8
