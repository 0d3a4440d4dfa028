"""A LangChain agent whose history is compacted in the background, offline.

Run it: ``.venv/bin/python examples/langchain_example.py`` (needs the ``langchain`` extra, which
``.[dev]`` includes). Like ``make demo``, it starts a private Redis (the embedded
``redis-server``), the workers and the scheduler, and stops them at the end; no network, no
LLM. The model is scripted: it reads twelve files, then answers. With a real one, pass e.g.
``init_chat_model("openai:gpt-4.1")`` to ``create_agent`` instead.

Each line it prints is one model call: how many messages the agent's state held, how many the
model was given (a compaction summary replaces the older ones once it has arrived) and their
exact tokens.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from worker import formats
from worker.cli_service import running_services, wait_for_workers
from worker.client import Client
from worker.config import load_settings, with_redis_url
from worker.integrations.langchain import CompactionMiddleware, to_wire
from worker.projection import count_request_tokens
from worker.session import CompactingSession
from worker.tokens import tokenizer_for

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
        tokens = count_request_tokens(
            formats.to_messages("openai", to_wire(messages)), tokenizer_for("gpt-4.1")
        )
        summaries = sum("[compaction-worker summary]" in str(m.content) for m in messages)
        print(
            f"model call {k:2}: given {len(messages):2} messages, {tokens:5} tokens"
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
    workdir = Path(tempfile.mkdtemp(prefix="compactor-langchain-"))
    config = workdir / "compactor.toml"
    config.write_text(
        f'[compaction]\nmode = "local_only"\ntranscript_dir = "{workdir / "transcripts"}"\n'
        "summary_max_output_tokens = 300\n"
    )
    settings = load_settings(config, environ={})  # no COMPACTOR_REDIS_URL: an embedded Redis
    with running_services(settings, str(config), workdir=workdir) as url:
        if not wait_for_workers(url, settings, expected=2, timeout_s=60):
            raise SystemExit(f"the workers did not start; see {workdir / 'logs'}")
        client = Client(with_redis_url(settings, url))
        session = CompactingSession(
            "langchain-example", client=client, model="gpt-4.1", context_window=WINDOW
        )

        @tool
        def read_file(path: str) -> str:
            """Read a file of the repository."""
            # A real model takes seconds per call; the compaction arrives meanwhile. Here the
            # tool waits (up to a minute) for the service to have seen the newest turn.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                s = session.status
                if (
                    s.pending_submits == 0
                    and s.last_submitted_revision is not None
                    and s.last_outcome_revision is not None
                    and s.last_outcome_revision >= s.last_submitted_revision
                ):
                    break
                time.sleep(0.02)
            return " ".join(f"{path}:{i}: def bucket_{i}(tokens): ..." for i in range(60))

        agent = create_agent(
            ScriptedModel(),
            tools=[read_file],
            system_prompt="You are a coding agent.",
            middleware=[CompactionMiddleware(session)],
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
