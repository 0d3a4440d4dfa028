"""A LangChain agent whose history is compacted in the background, offline.

Run it: ``.venv/bin/python examples/langchain_example.py`` (needs the ``langchain`` extra, which
``.[dev]`` includes). Like ``make demo``, it starts a private Redis (the embedded
``redis-server``, unless ``COMPACTOR_REDIS_URL`` names one), the workers and the scheduler
(``worker.local.local_stack``), and stops them at the end; no network, no LLM. The model is
scripted: it reads twelve files, then answers. With a real one, pass e.g.
``init_chat_model("openai:gpt-4.1")`` to ``create_agent`` instead.

Each line it prints is one model call: how many messages the agent's state held, how many the
model was given (a compaction summary replaces the older ones once it has arrived) and their
size.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from worker.client import Client
from worker.integrations.langchain import CompactingMiddleware, to_wire
from worker.local import local_stack
from worker.session import CompactingSession

WINDOW = 4_000  # a small context window, so that twelve files overflow it
FILES = 12


class ScriptedModel(BaseChatModel):
    """Stands in for an LLM: asks for one file per call, then answers."""

    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        k, self.calls = self.calls, self.calls + 1
        chars = len(json.dumps(to_wire(messages)))
        summaries = sum("[compaction-worker summary]" in str(m.content) for m in messages)
        print(
            f"model call {k:2}: given {len(messages):2} messages, {chars:6} characters"
            + ("  (compacted)" if summaries else "")
        )
        if k < FILES:
            path = f"src/pkg/mod_{k}.py"
            message = AIMessage(
                f"Reading {path}.",
                tool_calls=[{"name": "read_file", "args": {"path": path}, "id": f"call{k}"}],
            )
        else:
            message = AIMessage("The bug is in src/pkg/mod_3.py: an off-by-one in bucket_3.")
        return ChatResult(generations=[ChatGeneration(message=message)])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="compactor-langchain-") as tmp:
        config = Path(tmp) / "compactor.toml"
        config.write_text(
            f'[compaction]\nmode = "local_only"\ntranscript_dir = "{tmp}/transcripts"\n'
            "summary_max_output_tokens = 300\n"
        )
        with local_stack(config) as stack:  # Redis, the workers and the scheduler, ready
            run(Client(stack.settings))


def run(client: Client) -> None:
    session = CompactingSession(
        "langchain-example", client=client, model="gpt-4.1", context_window=WINDOW
    )

    @tool
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        # A real model takes seconds per call, and the compaction arrives meanwhile. Here the
        # tool waits (up to a minute) until the service has answered the newest turn.
        session.wait_settled(timeout_s=60)
        return " ".join(f"{path}:{i}: def bucket_{i}(tokens): ..." for i in range(60))

    agent = create_agent(
        ScriptedModel(),
        tools=[read_file],
        system_prompt="You are a coding agent.",
        middleware=[CompactingMiddleware(session)],
    )
    try:
        result = agent.invoke(
            {"messages": [HumanMessage("Find the bug in src/pkg.")]},
            {"recursion_limit": 100},
        )
        print(
            f"the agent's state holds all {len(result['messages'])} messages; "
            f"{len(session.compactions)} compaction(s) applied to what the model was given"
        )
    finally:
        session.close()
        client.close()


if __name__ == "__main__":
    main()
