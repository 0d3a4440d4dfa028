"""The LLM path against a real model server (bench/real_llm.py): llama.cpp's ``llama-server``
with SmolLM2-135M-Instruct on loopback. Runs when both are installed (``$LLAMA_VENV``, or
``$LLAMA_SERVER`` and ``$LLAMA_MODEL``: see the script's docstring); CI does not install them
(a C++ build of 35-50 minutes), so there it skips and says why.

What must hold with a real model, whatever it writes: the pipeline completes with the model's
summary within both bounds, none of our prompt's wrapper tags in it, the server's own token
counts recorded, ``truncated`` set exactly when the server cut an answer or our bound did, and
under ``prefer_remote`` the gate decides on the model's own text (the digest, with the reason,
whenever that text scores under ``min_summary_fidelity``)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from real_llm import LOCAL_LLM, llama_server, locate

from worker.config import CompactionConfig, LLMConfig, Settings
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.summarize.factory import llm_summarizer
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent

SERVER, MODEL = locate()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        SERVER is None or MODEL is None,
        reason="no llama-server and model: set LLAMA_VENV (or LLAMA_SERVER and LLAMA_MODEL), "
        "see bench/real_llm.py; CI does not build them",
    ),
]
BOUND = 300
TAGS = re.compile(r"</?(?:conversation|part|summary-so-far|must-keep)>")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert SERVER is not None and MODEL is not None
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with llama_server(SERVER, MODEL, log=log) as url:
        yield url


def snapshot(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"id": "u0", "role": "user", "content": "Fix the failing test in src/pkg/parser.py."}
    ]
    for k in range(turns):
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
    messages.append({"id": "end", "role": "assistant", "content": "The parser fails on tabs."})
    return {
        "conversation_id": "real-llm",
        "revision": 1,
        "model": {"name": ""},
        "messages": messages,
    }


def compact(base_url: str, tmp_path: Path, mode: str) -> CompletedEvent:
    snap = snapshot(12)
    store, reuse = FileStore(tmp_path), Reuse()
    probe = Pipeline(Settings(), Adapters(store=store), reuse)
    threshold = probe.evaluate(probe.parse(snap)).evaluation.projected_tokens - 1
    settings = Settings(
        compaction=CompactionConfig(
            mode=mode,
            auto_compact_threshold_tokens=threshold,
            summary_max_output_tokens=BOUND,
            summary_max_input_chars=3000,  # a few parts: the chunk and merge path too
        ),
        llm=LLMConfig.model_validate(LOCAL_LLM | {"base_url": base_url}),
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


def test_a_real_model_summarizes_within_the_bounds(base_url: str, tmp_path: Path) -> None:
    summary = compact(base_url, tmp_path, "remote_only").compaction.summary
    assert summary.source == "llm" and summary.model == LOCAL_LLM["model"]
    assert summary.tokens <= BOUND
    assert not TAGS.search(summary.text), summary.text
    assert summary.usage is not None and summary.usage.calls >= 1
    assert summary.usage.output_tokens is not None and summary.usage.output_tokens > 0
    assert summary.fidelity is not None and 0.0 <= summary.fidelity.score <= 1.0


def test_the_gate_decides_on_the_real_models_own_text(base_url: str, tmp_path: Path) -> None:
    summary = compact(base_url, tmp_path, "prefer_remote").compaction.summary
    if summary.source == "digest":
        assert (summary.fallback_reason or "").startswith("summary_fidelity"), summary
    else:
        assert summary.fidelity is not None and summary.fidelity.score >= 0.5
