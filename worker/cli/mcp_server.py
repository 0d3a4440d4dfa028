"""The Model Context Protocol server of ``compactor mcp`` (the official ``mcp`` SDK's
``MCPServer`` over stdio): the service as tools an agent host (Claude Code, Codex, Cursor, any
MCP client) gives its model.

Five tools, each a thin step: the conversation (the call's ``conversation_id``, else the one the
server was started with), one or two requests to ``compactor serve`` (:mod:`mcp_service`), and
the answer shaped by :mod:`mcp_views`, as text for the model and as structured content with its
schema. A refused call is a tool error (``is_error``) that names the argument or the API's error
code, never a traceback; an argument a tool does not take is refused too, so that a misspelled
``conversation_id`` never silently means the default conversation.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server import MCPServer
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from worker.cli import mcp_views as views
from worker.cli.mcp_service import Service, ServiceError
from worker.errors import InvalidRequest
from worker.wire.models import CONVERSATION_ID_PATTERN, MAX_REVISION

DEFAULT_WAIT_S = 45.0  # under Codex's default 60 s per tool call
MAX_WAIT_S = 600.0  # the longest a worker spends on one compaction (summarize_time_limit_s)
MAX_MESSAGE_ID = 256  # as the recall route takes
MAX_INSTRUCTIONS = 2000  # as the compact route takes

_Answer = TypeVar("_Answer", bound=BaseModel)


@dataclass(frozen=True)
class Options:
    """What ``compactor mcp`` was started with: the service's base URL, the tenant's key
    (None: a ``compactor serve --no-auth``) and the default conversation (None: every call
    names one)."""

    url: str
    api_key: str | None
    conversation: str | None


# --- arguments --------------------------------------------------------------------------------

ConversationArg = Annotated[
    str | None,
    Field(
        description="The conversation; leave it out for the one this server was started for.",
        pattern=CONVERSATION_ID_PATTERN,
    ),
]
CursorArg = Annotated[
    str | None,
    Field(description="`more` of the previous answer, to read its next page.", max_length=200),
]
MessageIdArg = Annotated[
    str,
    Field(
        description="The id of a replaced message (show_compaction lists them).",
        min_length=1,
        max_length=MAX_MESSAGE_ID,
    ),
]
EventIdArg = Annotated[
    str | None,
    Field(
        description="A compaction's event_id (list_compactions); default: the newest.",
        pattern=r"^[0-9a-f]{32}$",
    ),
]
RevisionArg = Annotated[
    int | None,
    Field(
        description="The revision a compaction compacted, instead of event_id.",
        ge=0,
        le=MAX_REVISION,
    ),
]
LimitArg = Annotated[int, Field(description="Compactions per page.", ge=1, le=views.MAX_ROWS)]
InstructionsArg = Annotated[
    str | None,
    Field(
        description="What the summary should keep or focus on (reaches only the summarizer).",
        max_length=MAX_INSTRUCTIONS,
    ),
]
WaitArg = Annotated[
    float,
    Field(
        description="Seconds to wait for the outcome (0: return at once; pending if not done).",
        ge=0,
        le=MAX_WAIT_S,
    ),
]


# --- the tools --------------------------------------------------------------------------------


class Tools:
    """The tools, over one :class:`Service` and the default conversation."""

    def __init__(self, service: Service, conversation: str | None) -> None:
        self.service = service
        self.conversation = conversation

    async def recall_message(
        self,
        message_id: MessageIdArg,
        conversation_id: ConversationArg = None,
        cursor: CursorArg = None,
    ) -> Annotated[CallToolResult, views.RecalledMessage]:
        with tool_errors():
            conversation = self.conversation_of(conversation_id)
            found = await self.service.recall(conversation, message_id)
            return answer(views.recalled(found, cursor), views.render_recalled)

    async def list_compactions(
        self,
        conversation_id: ConversationArg = None,
        cursor: CursorArg = None,
        limit: LimitArg = 10,
    ) -> Annotated[CallToolResult, views.CompactionList]:
        with tool_errors():
            conversation = self.conversation_of(conversation_id)
            entries = await self.service.events(conversation)
            page = views.compaction_list(conversation, entries, cursor, limit)
            return answer(page, views.render_list)

    async def show_compaction(
        self,
        event_id: EventIdArg = None,
        revision: RevisionArg = None,
        conversation_id: ConversationArg = None,
        cursor: CursorArg = None,
    ) -> Annotated[CallToolResult, views.CompactionPage]:
        with tool_errors():
            conversation = self.conversation_of(conversation_id)
            paged, offset = views.show_cursor(cursor)
            if paged is not None and event_id not in (None, paged):
                raise InvalidRequest("cursor", "it pages another compaction than event_id names")
            events = views.parsed(await self.service.events(conversation))
            event = views.chosen(events, paged or event_id, revision)
            if event is None:
                raise no_such_compaction(event_id or paged, revision)
            original, problem = await self.replaced_messages(conversation, event.revision)
            reverted = event.event_id in views.reverted_ids(events)
            page = views.compaction_page(conversation, event, reverted, original, problem, offset)
            return answer(page, views.render_page)

    async def compact_now(
        self,
        instructions: InstructionsArg = None,
        conversation_id: ConversationArg = None,
        wait_s: WaitArg = DEFAULT_WAIT_S,
    ) -> Annotated[CallToolResult, views.Outcome]:
        with tool_errors():
            conversation = self.conversation_of(conversation_id)
            requested = await self.service.compact(conversation, instructions)
            request_id = str(requested.get("request_id", ""))
            found = None
            with anyio.move_on_after(wait_s):
                found = await self.outcome_of(conversation, request_id, wait_s)
            return answer(views.outcome(conversation, requested, found), views.render_outcome)

    async def compaction_status(
        self, conversation_id: ConversationArg = None
    ) -> Annotated[CallToolResult, views.Status]:
        with tool_errors():
            ready, problem = None, None
            try:
                ready = await self.service.readiness()
            except ServiceError as exc:
                problem = f"{exc.code}: {exc.message}"
            conversation = conversation_id or self.conversation
            state = None
            if conversation is not None:
                entries = await self.service.events(conversation)
                state = views.conversation_status(conversation, entries)
            service = views.service_status(self.service.url, ready, problem)
            return answer(views.Status(service=service, conversation=state), views.render_status)

    # --- steps ---

    def conversation_of(self, given: str | None) -> str:
        conversation = given or self.conversation
        if conversation is None:
            raise InvalidRequest(
                "conversation_id",
                "required: this server was started without a conversation "
                "(compactor mcp --conversation ID, or COMPACTOR_CONVERSATION)",
            )
        return conversation

    async def replaced_messages(
        self, conversation: str, revision: int
    ) -> tuple[list[dict[str, Any]] | None, str | None]:
        """The messages of the compaction's transcript, or None and why it cannot be read."""
        try:
            doc = await self.service.transcript(conversation, revision)
        except ServiceError as exc:
            if exc.status not in (404, 410):
                raise
            return None, "its transcript is no longer kept (transcript retention removed it)"
        messages = doc.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return None, "its transcript holds no list of messages"
        return messages, None

    async def outcome_of(
        self, conversation: str, request_id: str, wait_s: float
    ) -> dict[str, Any] | None:
        """The event answering ``request_id``: among the events so far, else the first to come
        (followed from the newest seen, so none published meanwhile is missed)."""
        entries = await self.service.events(conversation)
        for _stream_id, doc in entries:
            if views.is_outcome_of(request_id, doc):
                return doc
        after = entries[-1][0] if entries else "0"
        return await self.service.wait_for(
            conversation, after, lambda doc: views.is_outcome_of(request_id, doc), wait_s
        )


def answer(value: _Answer, render: Callable[[_Answer], str]) -> CallToolResult:
    """A tool's result: the text the model reads, and the same as structured content."""
    return CallToolResult(
        content=[TextContent(type="text", text=render(value))],
        structured_content=value.model_dump(mode="json"),
    )


def no_such_compaction(event_id: str | None, revision: int | None) -> InvalidRequest:
    if event_id is not None:
        return InvalidRequest("event_id", f"the conversation has no compaction {event_id}")
    if revision is not None:
        return InvalidRequest("revision", f"no compaction compacted revision {revision}")
    return InvalidRequest("conversation_id", "the conversation has no compaction yet")


@contextlib.contextmanager
def tool_errors() -> Iterator[None]:
    """What the service refused, or an argument a tool refuses, as a tool error for the
    model: the field or the API's error code, and what to do about it."""
    try:
        yield
    except InvalidRequest as exc:
        raise ToolError(exc.message) from None
    except ServiceError as exc:
        raise ToolError(explained(exc)) from None


# What a model can do about an error code of the API.
_HINTS = {
    "unauthorized": "the service refused this server's API key: it names no tenant there "
    "(check COMPACTOR_API_KEY)",
    "not_found": "list_compactions and show_compaction name what the conversation has",
    "expired": "the original is gone; the summary is what remains of it",
    "no_snapshot": "the conversation's newest snapshot expired: nothing to compact until the "
    "agent's next turn submits one",
}


def explained(exc: ServiceError) -> str:
    hint = _HINTS.get(exc.code)
    message = exc.message or exc.code
    return f"{exc.code}: {message}" + (f" ({hint})" if hint else "")


# --- the server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    description: str
    read_only: bool = True


SPECS = (
    Spec(
        "recall_message",
        "Recall a compacted message",
        "Fetch the full original of a message that a compaction replaced with a "
        "'[compaction-worker summary]': the expand of a compacted history. Give its message id "
        "(show_compaction lists the ids each compaction replaced). Returns the message as JSON "
        "with opaque values (signatures, encrypted content, inline images and files, provider "
        "ids) shown as size markers and secrets redacted. A long message comes in pages of "
        f"{views.PAGE_CHARS:,} characters: pass `more` back as `cursor` for the next.",
    ),
    Spec(
        "list_compactions",
        "List compactions",
        "List the conversation's compactions, newest first: the range of messages each "
        "replaced (first and last id), its tokens before and after, what triggered it and "
        "whether it was reverted. 10 a page by default (at most "
        f"{views.MAX_ROWS}): pass `more` back as `cursor` for older ones.",
    ),
    Spec(
        "show_compaction",
        "Show a compaction",
        "Show one compaction (the newest, unless event_id or revision names one): the summary "
        "that replaced the messages, then each replaced message's id, role and opening, and "
        "what was removed outright. Use it to find the id of a message to recall. Pages of "
        f"{views.PAGE_CHARS:,} characters: pass `more` back as `cursor` for the next.",
    ),
    Spec(
        "compact_now",
        "Compact now",
        "Compact the conversation now, whatever its threshold says, with optional instructions "
        "for the summary (what to keep, e.g. 'keep the failing test names'; at most "
        f"{MAX_INSTRUCTIONS:,} characters). Waits up to wait_s seconds (default "
        f"{DEFAULT_WAIT_S:.0f}) for the outcome: completed (messages replaced, tokens before "
        "and after), skipped, failed, held_for_review, or pending when it takes longer (it "
        "still lands; list_compactions shows it). The history the model is sent shortens at "
        "the agent's next request (the proxy and sessions apply it).",
        read_only=False,
    ),
    Spec(
        "compaction_status",
        "Compaction status",
        "The service's readiness (workers of each kind) and the conversation's state: its "
        "events, compactions applied and reverted, the newest outcome, the size of the next "
        "request in tokens and the threshold it compacts over.",
    ),
)


def build_server(service: Service, conversation: str | None) -> MCPServer[Any]:
    tools = Tools(service, conversation)
    functions = {spec.name: getattr(tools, spec.name) for spec in SPECS}
    server: MCPServer[Any] = MCPServer(
        "compaction-worker",
        title="compaction-worker",
        instructions=instructions(conversation),
        version=importlib.metadata.version("compaction-worker"),
        log_level="WARNING",
        middleware=[StrictArguments(parameters_of(functions))],
    )
    for spec in SPECS:
        server.add_tool(
            functions[spec.name],
            name=spec.name,
            title=spec.title,
            description=spec.description,
            annotations=ToolAnnotations(
                title=spec.title,
                read_only_hint=spec.read_only,
                destructive_hint=False,
                idempotent_hint=spec.read_only,
                open_world_hint=False,
            ),
        )
    return server


def instructions(conversation: str | None) -> str:
    which = (
        f"conversation {conversation!r} unless a call names another"
        if conversation
        else "the conversation each call names (conversation_id)"
    )
    return (
        "compaction-worker keeps an agent's conversation short by replacing older messages "
        "with a '[compaction-worker summary]', keeping the originals. These tools recall an "
        "original, list and show the compactions, compact now with instructions, and report "
        f"status; they act on {which}."
    )


def parameters_of(functions: Mapping[str, Callable[..., Any]]) -> dict[str, frozenset[str]]:
    return {name: frozenset(inspect.signature(f).parameters) for name, f in functions.items()}


class StrictArguments:
    """Middleware: a ``tools/call`` with an argument its tool does not take is answered with a
    tool error naming it, before the SDK (which ignores unknown arguments) runs the tool."""

    def __init__(self, parameters: Mapping[str, frozenset[str]]) -> None:
        self.parameters = parameters

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        params = ctx.params if ctx.method == "tools/call" else None
        if isinstance(params, Mapping):
            name, arguments = params.get("name"), params.get("arguments")
            known = self.parameters.get(name) if isinstance(name, str) else None
            unknown = (
                sorted(set(arguments) - known) if known and isinstance(arguments, Mapping) else []
            )
            if unknown:
                takes = ", ".join(sorted(known or ()))
                text = f"Error executing tool {name}: {unknown[0]}: unknown argument"
                text += f" (it takes {takes})"
                return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        return await call_next(ctx)


def run(options: Options) -> int:
    """Serve over stdin and stdout until the host closes them."""

    async def serve() -> None:
        service = Service(options.url, options.api_key)
        try:
            await build_server(service, options.conversation).run_stdio_async()
        finally:
            await service.aclose()

    anyio.run(serve)
    return 0
