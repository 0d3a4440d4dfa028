"""The OpenAI Agents SDK with CompactingAgentSession, offline: an embedded Redis and workers
(as ``make demo`` starts them), a scripted model instead of an LLM, a SQLiteSession as the
history store.

    .venv/bin/pip install -e '.[openai-agents]'
    .venv/bin/python examples/openai_agents_example.py

Each run prints how many items the model was given and how many the SQLiteSession holds: the
first stays bounded once compactions land, the second keeps growing.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from worker.client import Client
from worker.integrations.openai_agents import CompactingAgentSession
from worker.local import local_stack


class ScriptedModel(Model):
    """Reads one file per run, then answers; records the size of each input."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        items = [input] if isinstance(input, str) else list(input)
        self.sizes.append(len(items))
        n = len(self.sizes)
        if items[-1].get("type") == "function_call_output":
            text = ResponseOutputText(type="output_text", text=f"Fixed ({n}).", annotations=[])
            out: list[Any] = [
                ResponseOutputMessage(
                    id=f"msg{n}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[text],
                )
            ]
        else:
            args = json.dumps({"path": f"src/module_{n}.py"})
            out = [
                ResponseFunctionToolCall(
                    id=f"fc{n}",
                    call_id=f"call{n}",
                    type="function_call",
                    name="read_file",
                    arguments=args,
                )
            ]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


@function_tool
def read_file(path: str) -> str:
    """Read a file."""
    return "\n".join(
        f"{path}:{i}: def handler_{i}(request): return limits.check(request)" for i in range(40)
    )


async def main(client: Client) -> None:
    set_tracing_disabled(True)
    model = ScriptedModel()
    agent = Agent(name="coder", instructions="You fix code.", model=model, tools=[read_file])
    store = SQLiteSession("example-agents")  # the full history, as the SDK keeps it
    session = CompactingAgentSession(store, client=client, model="gpt-4.1", context_window=4000)
    try:
        for run in range(10):
            await Runner.run(agent, f"Fix module {run}.", session=session)
            stored = len(await store.get_items())
            print(
                f"run {run}: model given {model.sizes[-2]:3} items; SQLiteSession holds {stored:3}"
            )
            # a real model takes seconds; here, wait until the service answered the run
            await asyncio.to_thread(session.compacting.wait_settled, 30)
        print(f"compactions applied: {len(session.compacting.compactions)}")
    finally:
        session.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="compactor-example-") as tmp:
        config = Path(tmp) / "compactor.toml"
        config.write_text(f'[compaction]\ntranscript_dir = "{tmp}/transcripts"\n')
        with local_stack(config) as stack:  # Redis, the workers and the scheduler, ready
            client = Client(stack.settings)
            try:
                asyncio.run(main(client))
            finally:
                client.close()
