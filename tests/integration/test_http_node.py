"""The proxy, driven by the official ``openai`` npm package run with this machine's Node.js,
against the stand-in provider on loopback, through a real ``compactor serve``, Redis and
worker (the stack of ``test_http_proxy.py``): once a compaction has arrived, the upstream
receives fewer tokens than the agent sent, tool-call pairs intact, and the agent's SDK sees
ordinary responses, streamed or not.

The package is installed by the test itself (``npm install`` of ``tests/node/package.json``
into pytest's cache directory, reused while ``package.json`` is unchanged). Node or npm being
absent, or the registry being out of reach, skips this test only, with the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.http_support import KEY_A, Stack, proxy_config
from support.pairs_support import openai_pairs_intact
from test_http_proxy import tokens

from worker.testing.standin_llm import StandinLLM

pytestmark = pytest.mark.slow

NODE_DIR = Path(__file__).resolve().parent.parent / "node"
AGENT_KEY = "sk-agent-node-key-0123456789"
# npm's messages when the registry cannot be reached (no network, no proxy, DNS failure)
_OFFLINE = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ECONNRESET",
    "ETIMEDOUT",
    "ENETUNREACH",
    "EHOSTUNREACH",
    "network",
    "offline",
    "E403",
    "E407",
)


@pytest.fixture(scope="module")
def node_sdk(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with ``conversation.mjs`` and ``node_modules/openai`` installed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(f"Node.js not found on PATH (node: {node}, npm: {npm})")
    spec = (NODE_DIR / "package.json").read_text()
    cache = getattr(request.config, "cache", None)  # none under -p no:cacheprovider
    if cache is not None:
        work = cache.mkdir("node-openai")  # .pytest_cache/d/node-openai
    else:
        work = tmp_path_factory.mktemp("node-openai")
    installed = work / "package.json"
    fresh = (work / "node_modules" / "openai" / "package.json").exists()
    if not fresh or installed.read_text() != spec:
        shutil.rmtree(work / "node_modules", ignore_errors=True)
        (work / "package-lock.json").unlink(missing_ok=True)
        installed.write_text(spec)
        try:
            done = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--no-progress"],
                cwd=work,
                capture_output=True,
                text=True,
                timeout=300,
            )
        except subprocess.TimeoutExpired:
            pytest.skip("npm install of the openai package took over 300 s (registry unreachable?)")
        if done.returncode != 0:
            installed.unlink()
            out = (done.stdout + done.stderr)[-1500:]
            if any(word in out for word in _OFFLINE):
                pytest.skip(f"npm install failed, no access to the registry: {out}")
            raise AssertionError(f"npm install failed: {out}")
    shutil.copy(NODE_DIR / "conversation.mjs", work / "conversation.mjs")
    return work


LLM_KEY = AGENT_KEY  # the stand-in demands the agent's own key


def stack_config(llm: StandinLLM) -> str:
    return proxy_config(llm)


def run_node(work: Path, stack: Stack, conversation_id: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "COMPACTOR_"))}
    env |= {
        "COMPACTOR_BASE": stack.base,
        "AGENT_KEY": AGENT_KEY,
        "COMPACTOR_KEY": KEY_A,
        "CONVERSATION": conversation_id,
        "TURNS": "12",
    }
    done = subprocess.run(
        ["node", "conversation.mjs"], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_node_openai_sdk_conversation_is_compacted(
    node_sdk: Path, stack: Stack, llm: StandinLLM
) -> None:
    before = len(llm.requests)
    result = run_node(node_sdk, stack, "node-oa")
    calls = result["calls"]
    received = [r for r in llm.requests[before:] if r.auth_valid]  # the agent's, not the worker's
    assert len(calls) == 4 and len(received) == 4
    assert [c["stream"] for c in calls] == [False, False, False, True]
    assert [bool(r.body.get("stream")) for r in received] == [False, False, False, True]
    for call, upstream in zip(calls, received, strict=True):
        assert "x-compactor-key" not in upstream.headers
        assert call["content"].startswith("## Goal")  # the stand-in's answer, as it came
        assert call["finish_reason"] == "stop"
    for call in calls[:3]:
        assert call["object"] == "chat.completion" and call["id"]
    assert calls[3]["object"] == "chat.completion.chunk" and calls[3]["chunks"] > 1

    # the first turn: nothing to apply yet, the history goes upstream as it came
    assert received[0].body["messages"] == calls[0]["sent"]
    assert result["completed_revision"] == 1
    # once the compaction has arrived: fewer tokens upstream, pairs intact, the new turn kept
    for call, upstream in zip(calls[1:], received[1:], strict=True):
        sent, forwarded = call["sent"], upstream.body["messages"]
        assert tokens(forwarded) < tokens(sent) / 2, (tokens(forwarded), tokens(sent))
        assert forwarded[0] == sent[0] and forwarded[-1] == sent[-1]
        openai_pairs_intact(sent)
        openai_pairs_intact(forwarded)
    assert result["replacement_last"] in received[1].body["messages"]
