"""Microsoft Agent Framework with CompactingContextProvider, offline: an embedded Redis and
workers (as ``make demo`` starts them), a scripted chat client instead of an LLM, the
framework's InMemoryHistoryProvider as the history store.

    .venv/bin/pip install -e '.[agent-framework]'
    .venv/bin/python examples/agent_framework_example.py

Each run prints how many messages the model was sent and how many the history provider
holds: the first stays bounded once compactions land, the second keeps growing.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_framework import (
    Agent,
    BaseChatClient,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    InMemoryHistoryProvider,
    Message,
    tool,
)

from worker.client import Client
from worker.integrations.agent_framework import CompactingContextProvider
from worker.local import local_stack


class ScriptedClient(FunctionInvocationLayer[Any], BaseChatClient[Any]):
    """Reads one file per run, then answers; records the size of each request."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    async def _answer(self, messages: Sequence[Message]) -> ChatResponse[Any]:
        self.sizes.append(len(messages))
        n = len(self.sizes)
        if any(c.type == "function_result" for c in messages[-1].contents):
            return ChatResponse(messages=[Message("assistant", [f"Fixed ({n})."])])
        call = Content.from_function_call(
            call_id=f"call{n}", name="read_file", arguments=json.dumps({"path": f"src/m{n}.py"})
        )
        return ChatResponse(messages=[Message("assistant", [call])])

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Any, **kwargs: Any
    ) -> Any:
        return self._answer(messages)


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return "\n".join(
        f"{path}:{i}: def handler_{i}(request): return limits.check(request)" for i in range(40)
    )


async def main(client: Client) -> None:
    chat = ScriptedClient()
    history = InMemoryHistoryProvider()  # the full history, as the framework keeps it
    compactor = CompactingContextProvider(
        client=client, history_source_id=history.source_id, model="gpt-4.1", context_window=4000
    )
    agent = Agent(
        client=chat,
        name="coder",
        instructions="You fix code.",
        tools=[read_file],
        context_providers=[history, compactor],  # where CompactionProvider would go
    )
    session = agent.create_session()
    try:
        for run in range(10):
            await agent.run(f"Fix module {run}.", session=session)
            stored = len(session.state[history.source_id]["messages"])
            print(f"run {run}: model sent {chat.sizes[-2]:3} messages; history holds {stored:3}")
            compacting = compactor.compacting_session(session)
            # a real model takes seconds; here, wait until the service answered the run
            await asyncio.to_thread(compacting.wait_settled, 30)
        print(f"compactions applied: {len(compactor.compacting_session(session).compactions)}")
    finally:
        compactor.close()


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
