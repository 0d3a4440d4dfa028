"""Writes the sample snapshots in examples/ (our own, synthetic but realistic).

Run it to regenerate them: ``.venv/bin/python examples/make_examples.py``. The output is
deterministic, so the committed files only change when this script does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def _source_file(name: str, lines: int) -> str:
    body = [f'"""{name}: rate limiting for the public API."""', "", "import time", ""]
    for i in range(lines):
        body.append(f"def bucket_{i}(tokens: int, refill_per_s: float) -> float:")
        body.append(f"    # bucket {i} refills continuously; see docs/limits.md#bucket-{i}")
        body.append(f"    return min(tokens, refill_per_s * time.monotonic() % {i + 7})")
        body.append("")
    return "\n".join(f"{n + 1:6}\t{line}" for n, line in enumerate(body))


def _grep_output(pattern: str, files: list[str]) -> str:
    out = []
    for f in files:
        for line in (12, 48, 97, 130):
            out.append(f"{f}:{line}:    if {pattern}(request) > limits.burst:  # enforce")
    return "\n".join(out)


def _pytest_output(failing: bool) -> str:
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.7, pytest-8.3.2",
        "collected 48 items",
        "",
    ]
    lines += [f"tests/test_limits.py::test_bucket_{i} PASSED" for i in range(44)]
    if failing:
        lines += [
            "tests/test_limits.py::test_burst_window FAILED",
            "",
            "=================================== FAILURES ===================================",
            "    def test_burst_window():",
            ">       assert limiter.allow('k', now=10.0) is False",
            "E       AssertionError: assert True is False",
            "src/api/limits.py:131: AssertionError",
            "========================= 1 failed, 47 passed in 2.31s =========================",
        ]
    else:
        lines += ["========================= 48 passed in 2.05s ========================="]
    return "\n".join(lines)


def _openai_call(mid: str, cid: str, name: str, args: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "id": mid,
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ],
    }


def coding_session() -> dict[str, Any]:
    files = ["src/api/limits.py", "src/api/middleware.py", "src/api/routes/upload.py"]
    steps: list[tuple[str, dict[str, Any], str, str]] = [
        (
            "grep",
            {"pattern": "burst", "path": "src/"},
            _grep_output("burst_count", files),
            "Let me find where the burst limit is enforced.",
        ),
        (
            "read_file",
            {"path": "src/api/limits.py"},
            _source_file("limits.py", 60),
            "The check lives in limits.py; reading it.",
        ),
        (
            "bash",
            {"command": "pytest tests/test_limits.py -q"},
            _pytest_output(True),
            "Running the limiter tests to reproduce.",
        ),
        (
            "read_file",
            {"path": "src/api/middleware.py"},
            _source_file("middleware.py", 45),
            "The window is computed in middleware; checking how it passes `now`.",
        ),
        (
            "edit_file",
            {
                "path": "src/api/limits.py",
                "old": "refill_per_s * time.monotonic()",
                "new": "refill_per_s * now",
            },
            '{"status": "success"}',
            "The limiter reads the clock itself instead of the injected `now`; fixing that.",
        ),
        (
            "bash",
            {"command": "pytest tests/test_limits.py -q"},
            _pytest_output(False),
            "Re-running the tests.",
        ),
        (
            "grep",
            {"pattern": "time.monotonic", "path": "src/"},
            _grep_output("time.monotonic", files[1:]),
            "Checking for other direct clock reads.",
        ),
        (
            "read_file",
            {"path": "src/api/routes/upload.py"},
            _source_file("upload.py", 50),
            "upload.py also reads the clock; looking at its use.",
        ),
    ]
    messages: list[dict[str, Any]] = [
        {"id": "m1", "role": "system", "content": "You are a careful coding agent. Use tools."},
        {
            "id": "m2",
            "role": "user",
            "content": "The burst limiter in src/api/limits.py lets a "
            "client exceed its burst when requests arrive at the window edge. Fix it and make "
            "tests/test_limits.py pass. Don't change the public API.",
        },
    ]
    for k, (tool, args, output, text) in enumerate(steps):
        cid = f"call_{k + 1:03d}"
        messages.append(_openai_call(f"m{len(messages) + 1}", cid, tool, args, text))
        messages.append(
            {"id": f"m{len(messages) + 1}", "role": "tool", "tool_call_id": cid, "content": output}
        )
    messages.append(
        {
            "id": f"m{len(messages) + 1}",
            "role": "user",
            "content": "Good. Also make upload.py take `now` from the request context.",
        }
    )
    messages.append(
        _openai_call(
            f"m{len(messages) + 1}",
            "call_100",
            "read_file",
            {"path": "src/api/context.py"},
            "Reading the request context first.",
        )
    )
    # The last call has no result yet: the agent is mid-turn. It stays in the protected tail.
    return {
        "conversation_id": "demo-coding-1",
        "revision": len(messages),
        "model": {"name": "gpt-4.1", "context_window": 12000},
        "format": "openai",
        "messages": messages,
        "tools": {"edit_file": {"compaction": "keep"}},
    }


def delegating_session() -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "Audit the repository for unused imports and fix them, "
                    "one package at a time.",
                }
            ],
        },
    ]
    for k, pkg in enumerate(["internal/llm", "internal/tools", "internal/store", "cmd/agent"]):
        cid = f"toolu_{k:02d}"
        findings = [
            {"file": f"/home/dev/proj/{pkg}/file_{i}.go", "issue": "unused import", "line": 3 + i}
            for i in range(25)
        ]
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": f"Delegate the audit of {pkg}.",
                        "signature": "s",
                    },
                    {"type": "text", "text": f"Delegating {pkg}."},
                    {
                        "type": "tool_use",
                        "id": cid,
                        "name": "delegate_task",
                        "input": {"task": f"find unused imports in {pkg}"},
                    },
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": cid,
                        "content": json.dumps({"status": "success", "findings": findings}),
                    }
                ],
            }
        )
        fix = f"fix_{k:02d}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": fix,
                        "name": "bash",
                        "input": {"command": f"goimports -w ./{pkg}/ && go build ./..."},
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": fix,
                        "content": "\n".join(
                            f"/home/dev/proj/{pkg}/file_{i}.go" for i in range(25)
                        ),
                    },
                    {"type": "text", "text": "Looks good, continue."},
                ],
            }
        )
    return {
        "conversation_id": "demo-delegation-1",
        "revision": len(messages),
        "model": {"name": "claude-sonnet-4", "context_window": 2400},
        "format": "anthropic",
        "system": "You are an agent that delegates audits to sub-agents.",
        "messages": messages,
    }


def responses_session() -> dict[str, Any]:
    """The coding session as OpenAI Responses API input items (the Agents SDK's history):
    reasoning before each call, a web search, API item ids on what the model produced."""
    coding = coding_session()
    items: list[dict[str, Any]] = []
    for n, m in enumerate(coding["messages"]):
        if m["role"] == "system":
            items.append({"type": "message", "role": "developer", "content": m["content"]})
        elif m["role"] == "user":
            items.append(
                {"role": "user", "content": [{"type": "input_text", "text": m["content"]}]}
            )
        elif m["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
        else:
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{n:03d}",
                    "summary": [{"type": "summary_text", "text": m["content"]}],
                    "encrypted_content": "gAAAAB" + "x" * 40,
                }
            )
            for call in m["tool_calls"]:
                items.append(
                    {
                        "type": "function_call",
                        "id": f"fc_{n:03d}",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                        "status": "completed",
                    }
                )
        if n == 5:
            items.append(
                {
                    "type": "web_search_call",
                    "id": "ws_001",
                    "status": "completed",
                    "action": {"type": "search", "query": "token bucket burst window edge"},
                }
            )
    return coding | {
        "conversation_id": "demo-responses-1",
        "revision": len(items),
        "format": "responses",
        "messages": items,
    }


def short_session() -> dict[str, Any]:
    return {
        "conversation_id": "demo-short-1",
        "revision": 2,
        "model": {"name": "gpt-4o", "context_window": 128000},
        "messages": [
            {"role": "user", "content": "What does HTTP 429 mean?"},
            {"role": "assistant", "content": "Too Many Requests: slow down."},
        ],
    }


def main() -> None:
    for name, snapshot in [
        ("coding-session.json", coding_session()),
        ("delegating-session.json", delegating_session()),
        ("responses-session.json", responses_session()),
        ("short-session.json", short_session()),
    ]:
        (HERE / name).write_text(json.dumps(snapshot, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
