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
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from worker.config import Settings, load_settings, shown_settings
from worker.errors import (
    CompactorError,
    InvalidInput,
    InvalidSnapshot,
    RejectedInput,
    UsageError,
)
from worker.logs import configure_logging, level_from_env

EXIT_OK, EXIT_FAILED, EXIT_REJECTED = 0, 1, 2
EXIT_INTERRUPTED = 130
log = logging.getLogger("worker.cli")


def exit_code(exc: CompactorError) -> int:
    """The exit code of a command that ended with ``exc``: rejected input (usage, configuration
    and credentials, snapshot, compressed form) 2; anything else (Redis unavailable, storage) 1."""
    return EXIT_REJECTED if isinstance(exc, RejectedInput) else EXIT_FAILED


def _print_error(error: dict[str, Any]) -> None:
    sys.stderr.write(json.dumps(error, ensure_ascii=False) + "\n")


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config)


def read_input(path: str, max_bytes: int) -> bytes:
    """A file (or ``-`` for stdin), refusing oversize input before reading all of it."""
    if path == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
    else:
        try:
            size = os.stat(path).st_size
            if size > max_bytes:
                raise InvalidSnapshot("", f"snapshot is {size} bytes; the limit is {max_bytes}")
            data = Path(path).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InvalidSnapshot("", f"snapshot is over the limit of {max_bytes} bytes")
    return data


def _read_value(path: str, *, as_json: bool) -> Any:
    """A tool output file: its text, or with ``as_json`` the JSON value it holds."""
    raw = read_input(path, 1 << 30)
    try:
        text = raw.decode("utf-8")
        return json.loads(text) if as_json else text
    except ValueError as exc:  # UnicodeDecodeError, json.JSONDecodeError
        raise InvalidInput(f"{path}: {exc}") from None


# --- commands -------------------------------------------------------------------------------


def cmd_compact(args: argparse.Namespace) -> int:
    from worker.pipeline import Adapters, Pipeline
    from worker.summarize_factory import llm_summarizer
    from worker.transcripts import open_store

    settings = _settings(args)
    payload = read_input(args.snapshot, settings.compaction.max_snapshot_bytes)
    llm = llm_summarizer(settings)  # the operator's choice, as in the worker
    store = open_store(settings)
    try:
        pipeline = Pipeline(settings, Adapters(store=store, llm=llm))
        events = pipeline.run(pipeline.parse(payload))
    finally:
        store.close()
        if llm is not None:
            llm.close()
    for event in events:
        sys.stdout.write(event.to_json() + "\n")
    return EXIT_FAILED if events[-1].type == "compaction.failed" else EXIT_OK


def cmd_compress(args: argparse.Namespace) -> int:
    from worker.compress import compress_with_stats

    outcome = compress_with_stats(args.tool, _read_value(args.output, as_json=args.json))
    out = outcome.output
    sys.stdout.write(out if isinstance(out, str) else json.dumps(out, ensure_ascii=False))
    if args.stats:
        saved = outcome.tokens_before - outcome.tokens_after
        share = saved / outcome.tokens_before if outcome.tokens_before else 0.0
        _print_error(
            {
                "codec": outcome.codec,
                "compressed": outcome.compressed,
                "tokens_before": outcome.tokens_before,
                "tokens_after": outcome.tokens_after,
                "saved": f"{share:.1%}",
            }
        )
    return EXIT_OK


def cmd_decompress(args: argparse.Namespace) -> int:
    from worker.compress import decompress_tool_result

    out = decompress_tool_result(args.tool, _read_value(args.file, as_json=args.json))
    sys.stdout.write(out if isinstance(out, str) else json.dumps(out, ensure_ascii=False))
    return EXIT_OK


def cmd_config_show(args: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(shown_settings(_settings(args)), indent=2, default=str) + "\n")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    from worker.transcripts import open_store, prune_by_settings

    settings = _settings(args)
    store = open_store(settings)
    try:
        removed = prune_by_settings(store, settings, dry_run=args.dry_run)
    finally:
        store.close()
    key = "would_remove" if args.dry_run else "removed"
    sys.stdout.write(json.dumps({key: removed}) + "\n")
    return EXIT_OK


def cmd_transcripts_list(args: argparse.Namespace) -> int:
    from worker.transcripts import open_store

    store = open_store(args.url if args.url else _settings(args))
    try:
        for t in store.stored(args.conversation):
            line = {"uri": t.uri, "conversation_id": t.conversation_id, "revision": t.revision}
            sys.stdout.write(json.dumps(line | {"bytes": t.bytes, "created": t.created}) + "\n")
    finally:
        store.close()
    return EXIT_OK


def cmd_transcripts_migrate(args: argparse.Namespace) -> int:
    from worker.migrate import migrate
    from worker.transcripts import open_store

    source = open_store(args.source)
    try:
        target = open_store(args.target)
        try:
            with _MigrationProgress(every=args.progress_every) as progress:
                result = migrate(source, target, progress=progress)
        finally:
            target.close()
    finally:
        source.close()
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    return EXIT_FAILED if result.conflicts else EXIT_OK


class _MigrationProgress:
    """On a terminal, a progress bar (tqdm) on stderr; otherwise a JSON line on stderr every
    ``every`` transcripts (default: every 5 %) and at the end, for logs and scripts."""

    def __init__(self, every: int | None) -> None:
        self.every = every
        self.bar: Any = None
        self.tty = sys.stderr.isatty()

    def __enter__(self) -> _MigrationProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def __call__(self, state: Any) -> None:
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=state.total, unit="transcript", file=sys.stderr)
            self.bar.update(state.done - self.bar.n)
            return
        every = self.every or max(1, state.total // 20)
        if state.done % every == 0 or state.done == state.total:
            line = {"done": state.done, "total": state.total, "copied": state.copied}
            line |= {"skipped": state.skipped, "conflicts": len(state.conflicts)}
            sys.stderr.write(json.dumps(line | {"bytes": state.bytes}) + "\n")
            sys.stderr.flush()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


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

    from worker.cli_service import add_commands

    add_commands(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        # JSON lines on stderr, like the errors (and the workers' logs).
        configure_logging(level_from_env("WARNING"), fmt="json")
        return func(args)
    except CompactorError as exc:  # third-party errors were converted where they entered
        _print_error(exc.to_dict())
        return exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED  # Ctrl-C, or SIGTERM for `up`: cleaned up on the way out
    except Exception as exc:  # the last line of defence: one JSON line, no traceback
        if os.environ.get("COMPACTOR_DEBUG"):
            raise
        log.debug("unexpected error", exc_info=True)
        _print_error({"error": "internal", "message": f"{type(exc).__name__}: {exc}"})
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
