"""The commands that talk to a running service through Redis: submit, compact-now, events,
status, metrics."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from worker.cli.common import (
    say_start,
    say_start_if_asked,
    settings_of,
    stderr_json,
    unset_redis_url,
    where_from,
)
from worker.config import (
    mask_url,
)
from worker.runtime.fleet import active_queues, classify_workers


def cmd_submit(args: argparse.Namespace) -> int:
    from worker.cli.common import read_input
    from worker.client import Client

    settings = settings_of(args)
    say_start_if_asked("submit", settings, args)
    client = Client(settings)
    try:
        for path in args.snapshots:
            data = read_input(path, settings.compaction.max_snapshot_bytes)
            result = client.submit(data)
            print(
                json.dumps({"snapshot": path, "status": result.status, "revision": result.revision})
            )
    finally:
        client.close()
    return 0


def cmd_compact_now(args: argparse.Namespace) -> int:
    """Ask for a compaction of the conversation's newest snapshot now; with ``--wait``, print
    its outcome event too (exit 1 if it failed)."""
    from worker.client import Client
    from worker.errors import CompactorError, InvalidRequest
    from worker.wire.events import CompletedEvent

    settings = settings_of(args)
    say_start_if_asked("compact-now", settings, args)
    overrides = {}
    for name in ("config", "tools"):
        raw = getattr(args, f"{name}_json")
        if raw is None:
            continue
        try:
            overrides[name] = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(name, f"not JSON: {exc.msg}") from None
    client = Client(settings)
    try:
        result = client.compact_now(args.conversation_id, args.instructions, **overrides)
        print(
            json.dumps(
                {
                    "status": "requested",
                    "request_id": result.request_id,
                    "revision": result.revision,
                    "replaced": result.replaced,
                }
            ),
            flush=True,
        )
        if args.wait is None:
            return 0
        try:
            event = client.wait_for(
                args.conversation_id,
                revision=result.revision,
                request_id=result.request_id,
                timeout_s=args.wait,
            )
        except TimeoutError as exc:  # asked, not answered yet: its event comes later
            raise CompactorError(str(exc), code="timeout") from None
        print(event.to_json(), flush=True)
        done = event if isinstance(event, CompletedEvent) else None
        note = done.compaction.summary.instructions_note if done is not None else None
        if note:  # said where a person reads it, not only inside the event
            print(json.dumps({"warning": "instructions_not_followed", "message": note}),
                  file=sys.stderr, flush=True)  # fmt: skip
        return 1 if event.type in ("compaction.failed", "compaction.rejected") else 0
    finally:
        client.close()


def cmd_events(args: argparse.Namespace) -> int:
    from worker.client import Client

    settings = settings_of(args)
    say_start_if_asked("events", settings, args)
    client = Client(settings)
    try:
        for entry_id, event in client.events(
            args.conversation_id, after=args.after, follow=args.follow
        ):
            line = json.loads(event.to_json())
            line["stream_id"] = entry_id
            print(json.dumps(line, ensure_ascii=False), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from worker.backend.connection import connect, state_url
    from worker.backend.queues import broker_kind, broker_url, queue_lengths
    from worker.backend.redis_state import RedisState
    from worker.runtime.celery_app import QUEUES, make_app

    settings = settings_of(args)
    say_start_if_asked("status", settings, args)
    unset = unset_redis_url(settings, args.config)
    if unset is not None:  # before anything it finds (or fails to reach) there
        stderr_json(unset)
    state = RedisState(connect(state_url(settings)), settings.redis)
    app = make_app(settings)
    try:
        counters = state.counters()  # first: Redis' refusal of a password names redis.url
        queues = queue_lengths(broker_url(settings))
        active = active_queues(app, timeout_s=1.0)
        kinds = classify_workers(active)
        consumed = {
            q.get("name") for qs in active.values() for q in qs or [] if isinstance(q, dict)
        }
        missing = sorted(kind for kind, nodes in kinds.items() if not nodes)
        doc = {
            "redis": mask_url(state_url(settings)),
            "redis_from": where_from(settings, "redis.url"),
            "broker": mask_url(broker_url(settings)),
            "broker_kind": broker_kind(broker_url(settings)),
            "queues": queues,
            "workers": sorted(active),
            "kinds": kinds,
            "missing_kinds": missing,
            "queues_without_consumer": [q for q in QUEUES if q not in consumed],
            "counters": counters,
            "cost": cost_totals(counters),
            "recent_events": [
                {k: e.get(k) for k in ("type", "conversation_id", "revision", "created_at")}
                for e in state.recent_events(args.recent)
            ],
        }
        print(json.dumps(doc, indent=2))
        if missing:
            print(
                json.dumps({"error": "no worker answers for: " + ", ".join(missing)}),
                file=sys.stderr,
            )
            return 1
        return 0
    finally:
        app.close()
        state.client.close()


def cost_totals(counters: dict[str, float]) -> dict[str, Any]:
    """What compactions spent and are expected to save, in total and per tenant (docs/cost.md)."""
    from worker.ops.metrics import TENANT_SEPARATOR

    names = {
        "cost_spent_usd_total": "spent_usd",
        "cost_saved_usd_total": "saved_usd",
        "cost_saved_tokens_total": "saved_tokens_per_turn",
        "cost_unpriced_total": "unpriced_compactions",
    }
    totals: dict[str, Any] = {shown: counters.get(name, 0.0) for name, shown in names.items()}
    tenants: dict[str, dict[str, float]] = {}
    for key, value in counters.items():
        name, sep, tenant = key.partition(TENANT_SEPARATOR)
        if sep and name in names:
            tenants.setdefault(tenant, {})[names[name]] = value
    totals["per_tenant"] = dict(sorted(tenants.items()))
    return totals


def cmd_metrics(args: argparse.Namespace) -> int:
    from worker.backend.connection import connect, state_url
    from worker.backend.queues import broker_url, queue_lengths
    from worker.backend.redis_state import RedisState
    from worker.ops.metrics import render_prometheus, serve

    settings = settings_of(args)
    if args.serve is None:
        say_start_if_asked("metrics", settings, args)
    else:
        say_start("metrics", settings)
    state = RedisState(connect(state_url(settings)), settings.redis)

    def render() -> str:
        return render_prometheus(state.counters(), queue_lengths(broker_url(settings)))

    if args.serve is None:
        sys.stdout.write(render())
        return 0
    serve(render, port=args.serve, host=args.host)
    return 0
