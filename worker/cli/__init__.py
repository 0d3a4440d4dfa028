"""``compactor``: the command line.

Exit codes: 0 done; 1 the work failed (a ``compaction.failed`` event, Redis unavailable, an
unexpected error); 2 the input was rejected (a bad snapshot, bad configuration or credentials, a
bad argument or unreadable file). :func:`exit_code` is the one mapping from the error tree
(worker/errors.py) to these, for every command; the README's *Exit codes and errors* lists it.
Errors go to stderr as one JSON line, never as a traceback (set ``COMPACTOR_DEBUG=1`` to see
one).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from worker.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_REJECTED, stderr_json
from worker.cli.mcp import add_mcp_command
from worker.cli.offline import (
    _positive_int,
    cmd_compact,
    cmd_compress,
    cmd_config_show,
    cmd_decompress,
    cmd_prune,
    cmd_transcripts_list,
    cmd_transcripts_migrate,
)
from worker.cli.redis_commands import (
    cmd_compact_now,
    cmd_events,
    cmd_metrics,
    cmd_status,
    cmd_submit,
)
from worker.cli.services import cmd_beat, cmd_serve, cmd_up, cmd_worker
from worker.cli.show import cmd_show
from worker.errors import CompactorError, RejectedInput
from worker.ops.logs import configure_logging, level_from_env

log = logging.getLogger("worker.cli")


def exit_code(exc: CompactorError) -> int:
    """The exit code of a command that ended with ``exc``: rejected input (usage, configuration
    and credentials, snapshot, compressed form) 2; anything else (Redis unavailable, storage) 1."""
    return EXIT_REJECTED if isinstance(exc, RejectedInput) else EXIT_FAILED


# --- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compactor", description=__doc__.split("\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        help="TOML file (default: $COMPACTOR_CONFIG, then "
        "config/compactor.toml, then built-in defaults)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    _add_offline_commands(sub, common)
    _add_client_commands(sub, common)
    _add_run_commands(sub, common)
    add_mcp_command(sub)
    return parser


def _add_offline_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The commands that need no Redis, broker or worker."""
    p = sub.add_parser("compact", parents=[common], help="run the whole pipeline in-process")
    p.add_argument("snapshot", help="snapshot JSON file, or - for stdin")
    p.set_defaults(func=cmd_compact)

    p = sub.add_parser("compress", parents=[common], help="losslessly compress a tool output")
    p.add_argument("tool")
    p.add_argument("output", help="the tool's output file (text, or JSON with --json)")
    p.add_argument("--json", action="store_true", help="the file holds a JSON value")
    p.add_argument("--stats", action="store_true", help="print tokens before/after to stderr")
    p.set_defaults(func=cmd_compress)

    p = sub.add_parser("decompress", parents=[common], help="exact inverse of compress")
    p.add_argument("tool")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="the file holds a JSON value")
    p.set_defaults(func=cmd_decompress)

    p = sub.add_parser("config", parents=[common], help="configuration")
    config_sub = p.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", parents=[common], help="resolved config, secrets masked")
    show.set_defaults(func=cmd_config_show)

    p = sub.add_parser("prune", parents=[common], help="apply transcript retention now")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("transcripts", parents=[common], help="the transcript store")
    transcripts_sub = p.add_subparsers(dest="transcripts_command", required=True)
    listing = transcripts_sub.add_parser(
        "list", parents=[common], help="kept transcripts, one JSON line each"
    )
    listing.add_argument("--conversation", help="only this conversation's")
    listing.add_argument("--url", help="this store instead of the configured one")
    listing.set_defaults(func=cmd_transcripts_list)
    moving = transcripts_sub.add_parser(
        "migrate",
        parents=[common],
        help="copy every kept transcript to another store (verified; run again to resume)",
    )
    moving.add_argument("source", metavar="FROM", help="the store URL to copy from")
    moving.add_argument("target", metavar="TO", help="the store URL to copy to")
    moving.add_argument(
        "--progress-every",
        type=_positive_int,
        default=None,
        help="without a terminal: a JSON progress line every N transcripts (default: 5 %%)",
    )
    moving.set_defaults(func=cmd_transcripts_migrate)


def _add_client_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The commands that talk to a running service: one request (or a stream) each."""
    one_shot = argparse.ArgumentParser(add_help=False, parents=[common])
    one_shot.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say on stderr which Redis and broker are used (always on a terminal)",
    )
    p = sub.add_parser("submit", parents=[one_shot], help="enqueue snapshots and return at once")
    p.add_argument("snapshots", nargs="+", help="snapshot JSON files (- for stdin)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "compact-now",
        parents=[one_shot],
        help="compact a conversation's newest snapshot now, whatever the threshold says",
    )
    p.add_argument("conversation_id")
    p.add_argument(
        "--instructions", help="what the summary should focus on (at most 2,000 characters)"
    )
    p.add_argument(
        "--config-json", help="[compaction] overrides as a JSON object, as a snapshot's config"
    )
    p.add_argument("--tools-json", help="per-tool hints as a JSON object, as a snapshot's tools")
    p.add_argument(
        "--wait",
        type=float,
        nargs="?",
        const=120.0,
        metavar="SECONDS",
        help="also wait for the outcome event and print it (default 120 s)",
    )
    p.set_defaults(func=cmd_compact_now)

    p = sub.add_parser("events", parents=[one_shot], help="a conversation's events as JSON lines")
    p.add_argument("conversation_id")
    p.add_argument("--after", default="0", help="resume after this stream id")
    p.add_argument("--follow", action="store_true", help="wait for new events")
    p.set_defaults(func=cmd_events)

    p = sub.add_parser(
        "show",
        parents=[one_shot],
        help="a compaction in the terminal: the replaced messages beside what replaced them",
    )
    p.add_argument("conversation_id")
    p.add_argument(
        "--revision", type=int, help="the outcome of this revision (default: newest compaction)"
    )
    p.add_argument("--full", action="store_true", help="every line of every message")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "status",
        parents=[one_shot],
        help="queues, workers (per kind), counters, events; exit 1 when a worker kind is missing",
    )
    p.add_argument("--recent", type=int, default=10)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("metrics", parents=[one_shot], help="Prometheus metrics (print or serve)")
    p.add_argument("--serve", type=int, metavar="PORT", help="serve /metrics on HOST:PORT")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind with --serve (default 127.0.0.1; 0.0.0.0 in a container)",
    )
    p.set_defaults(func=cmd_metrics)


def _add_run_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The commands that run the service, or part of it, in the foreground."""
    no_auth = argparse.ArgumentParser(add_help=False)
    no_auth.add_argument(
        "--no-auth",
        action="store_true",
        help="serve /v1 without API keys, every request as one tenant (loudly said at start); "
        "without keys and without this, serving is refused",
    )

    p = sub.add_parser("worker", parents=[common], help="run a worker (celery -A worker worker)")
    p.add_argument("--queues", help="comma-separated (default: all three)")
    p.add_argument("--pool", choices=["prefork", "threads", "solo"])
    p.add_argument("--concurrency", type=int)
    p.add_argument("--name", help="node name (default compactor@%%h)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("beat", parents=[common], help="run the scheduler (prune, reconcile)")
    p.set_defaults(func=cmd_beat)

    p = sub.add_parser(
        "up",
        parents=[common, no_auth],
        help="Redis (embedded if none configured), workers and the scheduler on this machine",
    )
    p.add_argument("--submit", nargs="*", help="snapshot files to submit once ready")
    p.add_argument(
        "--until-done",
        action="store_true",
        help="exit when every submitted snapshot has its outcome",
    )
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument(
        "--workdir",
        help="where the embedded Redis and the logs live, kept after exit (default: a "
        "temporary directory, removed on exit)",
    )
    p.add_argument(
        "--redis-port",
        type=int,
        help="the embedded Redis' loopback port (default: a free one; printed at start); "
        "refused when something listens on it already",
    )
    p.add_argument(
        "--http-port",
        type=int,
        help="also run `compactor serve` on this port (bound to [http] host), supervised; "
        "needs API keys or --no-auth",
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser(
        "serve", parents=[common, no_auth], help="the HTTP API and the proxy (uvicorn)"
    )
    p.add_argument("--host", help="address to bind (default [http] host: 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default [http] port: 8080; 0: a free one)")
    p.set_defaults(func=cmd_serve)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        # JSON lines on stderr, like the errors (and the workers' logs).
        configure_logging(level_from_env("WARNING"), fmt="json")
        return func(args)
    except CompactorError as exc:  # third-party errors were converted where they entered
        stderr_json(exc.to_dict())
        return exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED  # Ctrl-C, or SIGTERM for `up`: cleaned up on the way out
    except Exception as exc:  # the last line of defence: one JSON line, no traceback
        if os.environ.get("COMPACTOR_DEBUG"):
            raise
        log.debug("unexpected error", exc_info=True)
        stderr_json({"error": "internal", "message": f"{type(exc).__name__}: {exc}"})
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
