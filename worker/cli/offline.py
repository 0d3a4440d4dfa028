"""The commands that need no Redis, broker or worker: compact, compress, decompress, config
show, prune, transcripts list and migrate. They never import Celery."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from worker.cli.common import EXIT_FAILED, EXIT_OK, read_input, settings_of, stderr_json
from worker.config import (
    shown_settings,
)
from worker.errors import (
    InvalidInput,
)


def _read_value(path: str, *, as_json: bool) -> Any:
    """A tool output file: its text, or with ``as_json`` the JSON value it holds."""
    raw = read_input(path, 1 << 30)
    try:
        text = raw.decode("utf-8")
        return json.loads(text) if as_json else text
    except ValueError as exc:  # UnicodeDecodeError, json.JSONDecodeError
        raise InvalidInput(f"{path}: {exc}") from None


def cmd_compact(args: argparse.Namespace) -> int:
    from worker.pipeline import Adapters, Pipeline
    from worker.summarize.factory import llm_summarizer
    from worker.transcripts import open_store

    settings = settings_of(args)
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
        stderr_json(
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
    sys.stdout.write(json.dumps(shown_settings(settings_of(args)), indent=2, default=str) + "\n")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    from worker.transcripts import open_store, prune_by_settings

    settings = settings_of(args)
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

    store = open_store(args.url if args.url else settings_of(args))
    try:
        for t in store.stored(args.conversation):
            line = {"uri": t.uri, "conversation_id": t.conversation_id, "revision": t.revision}
            sys.stdout.write(json.dumps(line | {"bytes": t.bytes, "created": t.created}) + "\n")
    finally:
        store.close()
    return EXIT_OK


def cmd_transcripts_migrate(args: argparse.Namespace) -> int:
    from worker.transcripts import open_store
    from worker.transcripts.migrate import migrate

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
