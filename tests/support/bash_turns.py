"""An agent's bash calls and their results as the pipeline's messages, for the digest's tests:
the shape of the corpus's trajectories (``<returncode>`` and ``<output>`` around what ran)."""

from __future__ import annotations

import json

from worker.wire.models import Message, ToolCall


def bash_call(cid: str, command: str, text: str = "") -> Message:
    """The agent's message ``a<cid>``: ``text`` and one bash call ``cid`` running ``command``."""
    call = ToolCall(id=cid, name="bash", arguments=json.dumps({"command": command}))
    return Message(id=f"a{cid}", role="assistant", content=text, tool_calls=(call,), source_index=0)


def bash_result(cid: str, output: str, rc: int = 0) -> Message:
    """The result ``r<cid>`` of bash call ``cid``: ``output``, exit status ``rc``."""
    return Message(
        id=f"r{cid}",
        role="tool",
        tool_call_id=cid,
        tool_name="bash",
        content=f"<returncode>{rc}</returncode>\n<output>\n{output}</output>",
        source_index=0,
    )
