"""The OpenAPI 3.1 document of ``compactor serve``, written by hand; docs/openapi.json is this,
checked in (a test keeps them equal).

``python -m worker.api.spec`` rewrites docs/openapi.json; ``--check`` exits 1 if it differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from worker.api.responses_compact import IGNORED_FIELDS, MAX_MODEL_CHARS
from worker.wire.models import CONVERSATION_ID_PATTERN, MAX_REVISION
from worker.wire.requests import MAX_INSTRUCTIONS_CHARS

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "openapi.json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {
        400: "The body is not valid JSON.",
        401: "No API key, or not a valid one.",
        404: "No such conversation, transcript or message for this API key.",
        408: "The body did not arrive in time.",
        409: "The event does not describe these messages (apply), the compaction is not "
        "the conversation's newest or a worker is compacting it (restore), is no longer held "
        "or no longer applies (approve, reject), or the conversation has no snapshot to "
        "compact (compact).",
        410: "The compaction that replaced the message keeps no transcript any more "
        "(transcript retention removed it): expired.",
        413: "The body is over the limit.",
        422: "A path, query or header value, or the body, is not valid; the error names it.",
        503: "Redis (or the transcript store) is unavailable.",
    }
    return {str(s): _json(_ref("Error"), text[s]) for s in statuses}


_CONVERSATION = {
    "name": "conversation_id",
    "in": "path",
    "required": True,
    "description": "The conversation's id, as the agent names it (the tenant is the key's).",
    "schema": {"type": "string", "pattern": CONVERSATION_ID_PATTERN},
}
_SECURE: list[dict[str, list[str]]] = [{"bearer": []}]
_EVENT_ID = {
    "name": "event_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"},
}


def _decision(operation: str, summary: str, body: str, answer: str) -> dict[str, Any]:
    """A decision on a held compaction (review before apply)."""
    return {
        "post": {
            "operationId": operation,
            "summary": summary,
            "security": _SECURE,
            "parameters": [_CONVERSATION, _EVENT_ID],
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": _ref(body)}},
            },
            "responses": {
                "200": _json(_ref("Event"), answer),
                **_errors(400, 401, 404, 408, 409, 413, 422, 503),
            },
        }
    }


# A stream id: 0, $ (only what comes next) or ms[-seq] in ASCII digits, each part an unsigned
# 64-bit integer (a pattern cannot say that; the server answers a larger one 422).
_STREAM_ID = {"type": "string", "pattern": r"^(0|\$|[0-9]{1,20}(-[0-9]{1,20})?)$"}
_STREAM_ID_TEXT = "each part (ms-seq) at most 18446744073709551615"


# OpenAI's compact endpoint (worker/api/responses_compact.py, docs/http.md
# #openais-compact-endpoint): the body OpenAI's client sends, the object it parses.
_ACCEPTED_UNUSED = "Accepted and not used (an OpenAI parameter, or a setting Codex sends along)."
_RESPONSES_COMPACT_REQUEST: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["model"],
    "properties": {
        "model": {"type": ["string", "null"], "maxLength": MAX_MODEL_CHARS},
        "input": {
            "description": "The window: a string (one user message) or Responses input items. "
            "Required unless previous_response_id is given.",
            "oneOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": {"type": "object"}},
                {"type": "null"},
            ],
        },
        "instructions": {
            "type": ["string", "null"],
            "description": "Accepted; not part of the window (the client sends it itself).",
        },
        "previous_response_id": {
            "type": ["string", "null"],
            "description": "Refused unless X-Compactor-Conversation names a conversation, whose "
            "newest snapshot then stands for it (the input follows it).",
        },
        **{name: {"description": _ACCEPTED_UNUSED} for name in sorted(IGNORED_FIELDS)},
    },
}
_RESPONSE_COMPACTION: dict[str, Any] = {
    "type": "object",
    "description": "OpenAI's response.compaction: output is the window to send next (the "
    "kept head, the carried user turns, one readable summary message, the kept tail); usage "
    "the window's tokens before and after, as the service counts them.",
    "required": ["id", "object", "created_at", "output", "usage"],
    "properties": {
        "id": {"type": "string", "description": "The outcome event's event_id."},
        "object": {"const": "response.compaction"},
        "created_at": {"type": "integer"},
        "output": {"type": "array", "items": {"type": "object"}},
        "usage": {
            "type": "object",
            "required": ["input_tokens", "output_tokens", "total_tokens"],
            "properties": {
                "input_tokens": {"type": "integer", "minimum": 0},
                "input_tokens_details": {"type": "object"},
                "output_tokens": {"type": "integer", "minimum": 0},
                "output_tokens_details": {"type": "object"},
                "total_tokens": {"type": "integer", "minimum": 0},
            },
        },
    },
}
_RESPONSES_COMPACT: dict[str, Any] = {
    "post": {
        "operationId": "compactResponses",
        "summary": "OpenAI's compact endpoint: the window submitted as the conversation's next "
        "snapshot, compacted by the workers, answered with the compacted window (also under "
        "the proxy: /proxy/openai/v1/responses/compact, the tenant from X-Compactor-Key).",
        "security": _SECURE,
        "parameters": [
            {
                "name": "X-Compactor-Conversation",
                "in": "header",
                "description": "The conversation (as the proxy's header names it); else one "
                "derived from the window's opening items.",
                "schema": {"type": "string", "pattern": CONVERSATION_ID_PATTERN},
            }
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _ref("ResponsesCompactRequest")}},
        },
        "responses": {
            "200": _json(_ref("ResponseCompaction"), "The compacted window."),
            **_errors(400, 401, 408, 413, 422),
            "409": _json(
                _ref("Error"),
                "The named conversation has no snapshot for previous_response_id (or one of "
                "another format), or a newer snapshot arrived meanwhile.",
            ),
            "503": _json(
                _ref("Error"),
                "The compaction failed (its error code), no summarize worker answers "
                "(no_workers), or Redis is unavailable.",
            ),
            "504": _json(
                _ref("Error"),
                "No outcome within [worker] summarize_time_limit_s (timeout).",
            ),
        },
    }
}


def openapi() -> dict[str, Any]:
    conv = "/v1/conversations/{conversation_id}"
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "compaction-worker",
            "version": "1",
            "description": "Submit conversation snapshots, read compaction events, recall "
            "originals, apply compactions. See docs/http.md.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {"type": "string"},
                        "message": {"type": "string"},
                        "field": {"type": "string"},
                        "reason": {"type": "string"},
                    },
                },
                "Snapshot": {
                    "type": "object",
                    "description": "A snapshot (docs/snapshot.md, "
                    "docs/schemas/snapshot.schema.json); its conversation_id must be the "
                    "path's.",
                    "required": ["conversation_id", "revision", "messages"],
                    "properties": {
                        "conversation_id": {"type": "string"},
                        "revision": {"type": "integer", "minimum": 0},
                        "messages": {"type": "array", "items": {"type": "object"}},
                    },
                },
                "Accepted": {
                    "type": "object",
                    "required": ["status", "revision"],
                    "properties": {
                        "status": {"enum": ["queued", "coalesced", "superseded"]},
                        "revision": {"type": "integer"},
                    },
                },
                "Event": {
                    "type": "object",
                    "description": "An event (docs/events.md, docs/schemas/event.schema.json) "
                    "with its stream_id, as the tenant is shown it: its own conversation_id, "
                    "and compaction.transcript.uri the path of getTranscript.",
                    "required": ["type", "conversation_id", "revision", "stream_id"],
                    "properties": {
                        "type": {"type": "string"},
                        "conversation_id": {"type": "string"},
                        "revision": {"type": "integer"},
                        "stream_id": {"type": "string"},
                        "compaction": {
                            "type": "object",
                            "description": "compaction.completed only.",
                            "properties": {
                                "transcript": {
                                    "type": ["object", "null"],
                                    "properties": {
                                        "uri": {
                                            "type": "string",
                                            "description": "/v1/conversations/{conversation_"
                                            "id}/transcripts/{revision}: read it with the "
                                            "same key.",
                                        },
                                        "sha256": {"type": "string"},
                                        "bytes": {"type": "integer"},
                                    },
                                }
                            },
                        },
                    },
                },
                "Transcript": {
                    "type": "object",
                    "required": ["conversation_id", "revision", "messages"],
                    "properties": {
                        "conversation_id": {"type": "string"},
                        "revision": {"type": "integer"},
                        "messages": {"type": "array", "items": {"type": "object"}},
                    },
                },
                "Recalled": {
                    "type": "object",
                    "required": ["conversation_id", "message_id", "message", "revision"],
                    "properties": {
                        "conversation_id": {"type": "string"},
                        "message_id": {"type": "string"},
                        "message": {"type": "object"},
                        "revision": {"type": "integer"},
                        "event_id": {"type": "string"},
                        "stream_id": {"type": "string"},
                        "transcript_sha256": {"type": "string"},
                    },
                },
                "ApplyRequest": {
                    "type": "object",
                    "required": ["messages", "event"],
                    "properties": {
                        "messages": {"type": "array", "items": {"type": "object"}},
                        "event": {"type": "object"},
                        "conversation_id": {"type": "string"},
                    },
                },
                "CompactedRequest": {
                    "type": "object",
                    "required": ["messages"],
                    "properties": {
                        "messages": {"type": "array", "items": {"type": "object"}},
                        "format": {"enum": ["openai", "anthropic", "responses"]},
                    },
                },
                "Compacted": {
                    "type": "object",
                    "description": "The history to send, with the conversation's compactions "
                    "applied (all at once when the history is the full one); also in the "
                    "X-Compactor-* headers.",
                    "required": ["messages", "applied"],
                    "properties": {
                        "messages": {"type": "array", "items": {"type": "object"}},
                        "applied": {"type": "integer", "minimum": 0},
                        "event_id": {"type": ["string", "null"]},
                        "outcome": {"type": ["object", "null"]},
                        "warning": {"type": ["string", "null"]},
                    },
                },
                "WebhookRequest": {
                    "type": "object",
                    "required": ["url"],
                    "properties": {
                        "url": {"type": "string", "maxLength": 2048},
                        "conversation_id": {"type": "string"},
                        "types": {"type": "array", "items": {"type": "string"}},
                        "review_default": {
                            "type": "string",
                            "enum": ["approve", "reject"],
                            "description": "A review hook's (types naming compaction.proposed) "
                            "decision when it does not answer in time: [webhooks] "
                            "review_default unless set.",
                        },
                    },
                },
                "Webhook": {
                    "type": "object",
                    "description": "A registration; secret only in the answer to its creation.",
                    "required": ["id", "url"],
                    "properties": {
                        "id": {"type": "string"},
                        "url": {"type": "string"},
                        "conversation_id": {"type": ["string", "null"]},
                        "types": {"type": ["array", "null"], "items": {"type": "string"}},
                        "review_default": {"type": ["string", "null"]},
                        "secret": {"type": "string"},
                        "created_at": {"type": "integer"},
                    },
                },
                "ConversationList": {
                    "type": "object",
                    "description": "The tenant's conversations, newest activity first.",
                    "required": ["conversations", "next"],
                    "properties": {
                        "conversations": {
                            "type": "array",
                            "items": _ref("ConversationSummary"),
                        },
                        "next": {
                            "type": ["string", "null"],
                            "description": "The after of the next page; null on the last.",
                        },
                    },
                },
                "ConversationSummary": {
                    "type": "object",
                    "required": ["conversation_id", "last_activity", "events"],
                    "properties": {
                        "conversation_id": {"type": "string"},
                        "last_activity": {"type": "string", "format": "date-time"},
                        "revision": {
                            "type": ["integer", "null"],
                            "description": "The newest revision submitted (while kept).",
                        },
                        "events": {"type": "integer", "minimum": 0},
                        "tokens": {
                            "type": ["integer", "null"],
                            "description": "The request's tokens after the newest outcome.",
                        },
                        "threshold": {"type": ["integer", "null"]},
                        "last_outcome": {
                            "type": ["object", "null"],
                            "properties": {
                                "type": {"type": "string"},
                                "revision": {"type": "integer"},
                                "event_id": {"type": "string"},
                                "reason": {"type": ["string", "null"]},
                            },
                        },
                    },
                },
                "RestoreRequest": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"reason": {"type": "string", "maxLength": 1000}},
                },
                "CompactRequest": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "instructions": {
                            "type": "string",
                            "maxLength": MAX_INSTRUCTIONS_CHARS,
                            "description": "What the summary should focus on; reaches the "
                            "summarizer, and only its SHA-256 the event.",
                        },
                        "config": {
                            "type": "object",
                            "description": "[compaction] overrides, as a snapshot's config.",
                        },
                        "tools": {
                            "type": "object",
                            "description": "Per-tool hints, as a snapshot's tools.",
                        },
                    },
                },
                "CompactRequested": {
                    "type": "object",
                    "required": ["status", "request_id", "revision"],
                    "properties": {
                        "status": {"const": "requested"},
                        "request_id": {"type": "string"},
                        "revision": {"type": "integer"},
                        "replaced": {"type": ["string", "null"]},
                        "events": {"type": "string"},
                        "wait_for": {"type": "object"},
                    },
                },
                "ApproveRequest": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "summary": {
                            "type": "string",
                            "maxLength": 100_000,
                            "description": "An edited summary in place of the proposed one: "
                            "at most summary_max_output_tokens tokens, checked against the "
                            "range's must-keep facts (missing ones repaired).",
                        }
                    },
                },
                "Messages": {
                    "type": "object",
                    "required": ["messages"],
                    "properties": {"messages": {"type": "array", "items": {"type": "object"}}},
                },
                "ResponsesCompactRequest": _RESPONSES_COMPACT_REQUEST,
                "ResponseCompaction": _RESPONSE_COMPACTION,
            },
        },
        "paths": {
            f"{conv}/snapshots": {
                "post": {
                    "operationId": "submitSnapshot",
                    "summary": "Submit a snapshot; returns at once.",
                    "security": _SECURE,
                    "parameters": [_CONVERSATION],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("Snapshot")}},
                    },
                    "responses": {
                        "202": _json(_ref("Accepted"), "Stored; evaluated soon."),
                        **_errors(400, 401, 408, 413, 422, 503),
                    },
                }
            },
            f"{conv}/events": {
                "get": {
                    "operationId": "listEvents",
                    "summary": "The conversation's events after a stream id; with Accept: "
                    "text/event-stream, a live SSE stream (ids are stream ids; resumes "
                    "from Last-Event-ID).",
                    "security": _SECURE,
                    "parameters": [
                        _CONVERSATION,
                        {
                            "name": "after",
                            "in": "query",
                            "description": f"Events after this stream id; {_STREAM_ID_TEXT}.",
                            "schema": _STREAM_ID,
                        },
                        {
                            "name": "Last-Event-ID",
                            "in": "header",
                            "description": "An SSE client resuming: used instead of after; "
                            f"{_STREAM_ID_TEXT}.",
                            "schema": _STREAM_ID,
                        },
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "Events, oldest first (or an event stream).",
                            "content": {
                                "application/json": {
                                    "schema": {"type": "array", "items": _ref("Event")}
                                },
                                "text/event-stream": {"schema": {"type": "string"}},
                            },
                        },
                        **_errors(401, 404, 422, 503),
                    },
                }
            },
            f"{conv}/transcripts/{{revision}}": {
                "get": {
                    "operationId": "getTranscript",
                    "summary": "The full pre-compaction history kept for a revision.",
                    "security": _SECURE,
                    "parameters": [
                        _CONVERSATION,
                        {
                            "name": "revision",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_REVISION},
                        },
                    ],
                    "responses": {
                        "200": _json(_ref("Transcript"), "The transcript."),
                        **_errors(401, 404, 422, 503),
                    },
                }
            },
            f"{conv}/messages/{{message_id}}": {
                "get": {
                    "operationId": "recallMessage",
                    "summary": "The original of a message a compaction replaced.",
                    "security": _SECURE,
                    "parameters": [
                        _CONVERSATION,
                        {
                            "name": "message_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "minLength": 1, "maxLength": 256},
                        },
                    ],
                    "responses": {
                        "200": _json(_ref("Recalled"), "The message, sha256-checked."),
                        **_errors(401, 404, 410, 422, 503),
                    },
                }
            },
            f"{conv}/compacted": {
                "post": {
                    "operationId": "compactedHistory",
                    "summary": "The history to send next: the conversation's compactions "
                    "applied to the messages given (the full history, or one with some "
                    "compactions applied).",
                    "security": _SECURE,
                    "parameters": [_CONVERSATION],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("CompactedRequest")}},
                    },
                    "responses": {
                        "200": _json(_ref("Compacted"), "The compacted history."),
                        **_errors(400, 401, 408, 413, 422, 503),
                    },
                }
            },
            "/v1/conversations": {
                "get": {
                    "operationId": "listConversations",
                    "summary": "This tenant's conversations, newest activity first, with "
                    "their size and newest outcome.",
                    "security": _SECURE,
                    "parameters": [
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                        },
                        {
                            "name": "after",
                            "in": "query",
                            "description": "The next of the previous page.",
                            "schema": {"type": "string"},
                        },
                    ],
                    "responses": {
                        "200": _json(_ref("ConversationList"), "A page of conversations."),
                        **_errors(401, 422, 503),
                    },
                }
            },
            f"{conv}/compactions/{{event_id}}/restore": {
                "post": {
                    "operationId": "restoreCompaction",
                    "summary": "Restore (undo) the conversation's newest compaction: publishes "
                    "compaction.reverted; the next request holds what it had replaced.",
                    "security": _SECURE,
                    "parameters": [
                        _CONVERSATION,
                        {
                            "name": "event_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"},
                        },
                    ],
                    "requestBody": {
                        "required": False,
                        "content": {"application/json": {"schema": _ref("RestoreRequest")}},
                    },
                    "responses": {
                        "200": _json(_ref("Event"), "The compaction.reverted event."),
                        **_errors(400, 401, 404, 408, 409, 413, 422, 503),
                    },
                }
            },
            f"{conv}/compact": {
                "post": {
                    "operationId": "compactNow",
                    "summary": "Compact the conversation's newest snapshot now, whatever the "
                    "threshold says, optionally with instructions (its event's trigger.kind "
                    "is requested, with the request id and the instructions' SHA-256).",
                    "security": _SECURE,
                    "parameters": [_CONVERSATION],
                    "requestBody": {
                        "required": False,
                        "content": {"application/json": {"schema": _ref("CompactRequest")}},
                    },
                    "responses": {
                        "202": _json(_ref("CompactRequested"), "Requested: wait for its event."),
                        **_errors(400, 401, 404, 408, 409, 413, 422, 503),
                    },
                }
            },
            f"{conv}/compactions/{{event_id}}/approve": _decision(
                "approveCompaction",
                "Approve a compaction held for review (compaction.proposed), optionally with an "
                "edited summary: publishes compaction.completed.",
                "ApproveRequest",
                "The compaction.completed event.",
            ),
            f"{conv}/compactions/{{event_id}}/reject": _decision(
                "rejectCompaction",
                "Decline a compaction held for review: publishes compaction.declined; the next "
                "snapshot over the threshold proposes again.",
                "RestoreRequest",
                "The compaction.declined event.",
            ),
            "/v1/apply": {
                "post": {
                    "operationId": "applyCompaction",
                    "summary": "Apply a completed compaction to messages (pure).",
                    "security": _SECURE,
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("ApplyRequest")}},
                    },
                    "responses": {
                        "200": _json(_ref("Messages"), "The compacted messages."),
                        **_errors(400, 401, 408, 409, 413, 422),
                    },
                }
            },
            "/v1/responses/compact": _RESPONSES_COMPACT,
            "/v1/webhooks": {
                "post": {
                    "operationId": "createWebhook",
                    "summary": "Register a URL for this tenant's events (signed POSTs).",
                    "security": _SECURE,
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("WebhookRequest")}},
                    },
                    "responses": {
                        "201": _json(_ref("Webhook"), "Registered; keep the secret."),
                        **_errors(400, 401, 408, 413, 422, 503),
                    },
                },
                "get": {
                    "operationId": "listWebhooks",
                    "summary": "This tenant's webhooks (without secrets).",
                    "security": _SECURE,
                    "responses": {
                        "200": _json({"type": "array", "items": _ref("Webhook")}, "Webhooks."),
                        **_errors(401, 503),
                    },
                },
            },
            "/v1/webhooks/{webhook_id}": {
                "delete": {
                    "operationId": "deleteWebhook",
                    "summary": "Remove a webhook.",
                    "security": _SECURE,
                    "parameters": [
                        {
                            "name": "webhook_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "pattern": "^wh_[0-9a-f]{16}$"},
                        }
                    ],
                    "responses": {
                        "204": {"description": "Removed."},
                        **_errors(401, 404, 422, 503),
                    },
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "health",
                    "summary": "The process answers.",
                    "responses": {"200": _json({"type": "object"}, "Alive.")},
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "ready",
                    "summary": "Redis answers and a worker of each kind answers (cached).",
                    "responses": {
                        "200": _json({"type": "object"}, "Ready."),
                        "503": _json({"type": "object"}, "Not ready: what is missing."),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics.",
                    "responses": {
                        "200": {
                            "description": "Text exposition format 0.0.4.",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document.",
                    "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1.")},
                }
            },
        },
    }


def rendered() -> str:
    return json.dumps(openapi(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        same = DOC.is_file() and DOC.read_text(encoding="utf-8") == rendered()
        if not same:
            print(f"{DOC} differs: run python -m worker.api.spec", file=sys.stderr)
        return 0 if same else 1
    DOC.write_text(rendered(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
