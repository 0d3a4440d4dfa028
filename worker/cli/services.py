"""The commands that run the service: worker, beat, serve, and up (everything on one
machine, supervised)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from worker.backend.embedded import port_in_use, port_taken
from worker.cli.common import (
    EXIT_INTERRUPTED,
    auth_in_use,
    say_start,
    settings_of,
    stderr_json,
)
from worker.cli.demo import conversation_totals, describe_event
from worker.config import (
    Settings,
    mask_url,
    redis_url,
    with_redis_url,
)
from worker.errors import (
    CompactorError,
    InvalidSnapshot,
    UsageError,
)
from worker.runtime.fleet import wait_for_workers
from worker.runtime.supervisor import celery_command, child_env, running_services
from worker.wire.events import OUTCOME_TYPES


def cmd_worker(args: argparse.Namespace) -> int:
    settings = settings_of(args)  # fail early, with a clear message, on a bad configuration
    say_start("worker", settings)
    cmd = celery_command(
        "worker",
        args.config,
        queues=args.queues,
        pool=args.pool,
        concurrency=args.concurrency,
        name=args.name,
    )
    os.execve(sys.executable, cmd, child_env(args.config, None))
    return 0  # pragma: no cover - exec does not return


def cmd_beat(args: argparse.Namespace) -> int:
    say_start("beat", settings_of(args))
    os.execve(sys.executable, celery_command("beat", args.config), child_env(args.config, None))
    return 0  # pragma: no cover


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from worker.api.server import serve
    except ImportError as exc:  # the optional extra is not installed
        raise UsageError(
            f"compactor serve needs the http extra (pip install 'compaction-worker[http]'): {exc}"
        ) from None
    settings = settings_of(args)
    say_start("serve", settings, **auth_in_use(settings))
    return serve(settings, host=args.host, port=args.port)


class StopRequest:
    """SIGTERM (systemd, docker stop, kill) or Ctrl-C, noted for ``up``'s main thread to act on
    at its next step, where it shuts down in order: workers, then Redis. Raising
    KeyboardInterrupt from the handler instead would land wherever the main thread is: inside
    a library's ``__del__`` (where Python swallows it) or its ``except BaseException``, leaving
    ``up`` running or dying half cleaned up. A second signal changes nothing: the shutdown is
    not cut short (children get SIGKILL after their grace period anyway)."""

    def __init__(self) -> None:
        self.requested = False
        self.signal: int | None = None  # the first signal that asked

    def __call__(self) -> bool:
        """Whether a stop was requested."""
        return self.requested

    def _note(self, signum: int, frame: Any) -> None:
        self.requested = True
        self.signal = self.signal or signum

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._note)
        signal.signal(signal.SIGINT, self._note)

    def sleep(self, *, alive: Callable[[], bool] = lambda: True, every_s: float = 1.0) -> bool:
        """Until a stop is requested (True), or ``alive()`` said False twice in a row, checked
        every ``every_s`` (False)."""
        missed, next_check = 0, time.monotonic() + every_s
        while not self.requested:
            if time.monotonic() >= next_check:
                missed = 0 if alive() else missed + 1
                if missed >= 2:
                    return False
                next_check = time.monotonic() + every_s
            time.sleep(0.2)
        return True

    def reason(self) -> str:
        """What asked to stop, for a person: Ctrl-C or the signal's name."""
        if self.signal == signal.SIGINT:
            return "Ctrl-C (SIGINT)"
        return signal.Signals(self.signal).name if self.signal else "a stop request"


def cmd_up(args: argparse.Namespace) -> int:
    stop = StopRequest()
    stop.install()
    settings = settings_of(args)
    embedded = redis_url(settings) is None
    # Everything that would make it fail is refused before anything starts.
    auth = {} if args.http_port is None else auth_in_use(settings)
    if args.http_port and port_in_use(settings.http.host, args.http_port):
        raise port_taken(settings.http.host, args.http_port, what=f"--http-port {args.http_port}")
    if embedded and args.redis_port and port_in_use("127.0.0.1", args.redis_port):
        raise port_taken("127.0.0.1", args.redis_port, what=f"--redis-port {args.redis_port}")
    snapshots = [_snapshot_to_submit(path, settings) for path in args.submit or []]
    ending = Ending(stop)
    try:
        with (
            _workdir(args.workdir) as workdir,
            running_services(
                settings,
                args.config,
                workdir=workdir,
                redis_port=args.redis_port,
                http_port=args.http_port,
                http_no_auth=args.no_auth,
            ) as url,
        ):
            ending.started(embedded, http=args.http_port is not None, temporary=not args.workdir)
            used = with_redis_url(settings, url, origin="embedded") if embedded else settings
            say_start("up", used, **auth)
            where = {"redis": mask_url(url), "logs": str(workdir / "logs")}
            print(json.dumps(where | {"removed_at_exit": args.workdir is None}), flush=True)
            return _run_until_stopped(args, settings, url, snapshots, stop, ending, embedded)
    except CompactorError as exc:
        ending.failed(exc)
        raise
    finally:
        ending.say()


def _run_until_stopped(
    args: argparse.Namespace,
    settings: Settings,
    url: str,
    snapshots: list[tuple[str, str, bytes]],
    stop: StopRequest,
    ending: Ending,
    embedded: bool,
) -> int:
    """Wait for the workers, submit ``--submit``'s snapshots, and wait for what ends ``up``:
    a stop request, ``--until-done``, or (embedded) its Redis gone. ``ending`` notes which."""
    ready = wait_for_workers(url, settings, expected=2, timeout_s=60, stop=stop)
    if stop():
        return ending.signalled()
    if not ready:
        print(json.dumps({"error": "workers did not start; see the logs"}), file=sys.stderr)
        return ending.because("workers_not_ready", "the workers did not answer within 60 s", 1)
    print(json.dumps({"status": "workers ready"}), flush=True)
    if snapshots:
        code = _submit_and_follow(settings, url, snapshots, timeout_s=args.timeout, stop=stop)
        if stop():
            return ending.signalled()
        if args.until_done:
            if code == 0:
                return ending.because(
                    "until_done", "--until-done: every submitted snapshot has its outcome", 0
                )
            return ending.because(
                "until_done", f"--until-done: not every outcome came within {args.timeout:g} s", 1
            )
    if stop.sleep(alive=_listening(url) if embedded else lambda: True):
        return ending.signalled(0)
    return ending.because(
        "redis_exited", "its embedded Redis exited (nothing answers on its port)", 1
    )


def _listening(url: str) -> Callable[[], bool]:
    """Whether something still listens on the port of ``url`` (the embedded Redis)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    return lambda: port_in_use(host, port)


class Ending:
    """Why ``up`` ends, said in one JSON line on stderr once everything it started is stopped
    (:meth:`say`): the stop request (Ctrl-C, SIGTERM), ``--until-done``, its embedded Redis
    gone, workers that never answered, or an error."""

    def __init__(self, stop: StopRequest) -> None:
        self.stop = stop
        self.what: list[str] | None = None  # what was started; None: nothing was
        self.removed: str | None = None
        self.reason, self.message, self.code = "error", "an error (the line after this)", 1

    def started(self, embedded: bool, *, http: bool, temporary: bool) -> None:
        self.what = ["the evaluate and summarize workers", "the scheduler"]
        if http:
            self.what.append("compactor serve")
        if embedded:
            self.what.append("the embedded Redis")
        if temporary:
            self.removed = "its temporary directory"

    def because(self, reason: str, message: str, code: int) -> int:
        self.reason, self.message, self.code = reason, message, code
        return code

    def signalled(self, code: int = EXIT_INTERRUPTED) -> int:
        """Stopped by a signal: 130 (interrupted) while starting or following ``--submit``,
        ``code`` once it was running (0: the way a service is stopped)."""
        return self.because("signal", self.stop.reason(), code)

    def failed(self, exc: CompactorError) -> None:
        self.because("error", f"{exc.code}: {exc.message}", 1)

    def say(self) -> None:
        if self.what is None:
            return  # refused before anything started: the error line says why
        stopped = ", ".join(self.what[:-1]) + " and " + self.what[-1]
        if self.removed:
            stopped += f"; {self.removed} is removed"
        doc = {"stopped": "compactor up", "reason": self.reason, "exit_code": self.code}
        stderr_json(doc | {"message": f"{self.message}: stopped {stopped}"})


def _snapshot_to_submit(path: str, settings: Settings) -> tuple[str, str, bytes]:
    """(path, conversation id, bytes) of a file for ``--submit``, read before anything starts:
    UsageError for a file that cannot be read, InvalidSnapshot without a conversation id."""
    from worker.cli.common import read_input

    data = read_input(path, settings.compaction.max_snapshot_bytes)
    try:
        conversation_id = json.loads(data)["conversation_id"]
    except (ValueError, KeyError, TypeError):
        raise InvalidSnapshot("conversation_id", f"{path}: no conversation_id") from None
    if not isinstance(conversation_id, str):
        raise InvalidSnapshot("conversation_id", f"{path}: not a string")
    return path, conversation_id, data


@contextmanager
def _workdir(given: str | None) -> Iterator[Path]:
    """``--workdir``, kept; else a temporary directory, removed when ``up`` ends however it
    ends (after its children and Redis stopped: see :func:`running_services`)."""
    if given:
        yield Path(given)
        return
    made = Path(tempfile.mkdtemp(prefix="compactor-up-"))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def _submit_and_follow(
    settings: Settings,
    url: str,
    snapshots: list[tuple[str, str, bytes]],
    *,
    timeout_s: float,
    stop: StopRequest,
) -> int:
    """Submit ``snapshots`` (path, conversation id, bytes), print each of their events readably
    (:func:`describe_event`) until each has its outcome, then a line per conversation
    (:func:`conversation_totals`)."""
    from worker.client import Client

    client = Client(with_redis_url(settings, url))
    seen: list[Any] = []
    try:
        pending: dict[str, str] = {}
        for path, conversation_id, data in snapshots:
            result = client.submit(data)
            print(
                json.dumps(
                    {"submitted": path, "conversation_id": conversation_id, "status": result.status}
                ),
                flush=True,
            )
            pending[conversation_id] = "0"
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline and not stop():
            for conversation_id in list(pending):
                for entry_id, event in client.events(
                    conversation_id, after=pending[conversation_id]
                ):
                    pending[conversation_id] = entry_id
                    seen.append(event)
                    print("\n" + describe_event(event), flush=True)
                    if event.type in OUTCOME_TYPES:
                        pending.pop(conversation_id, None)
            time.sleep(0.2)
        print("\n" + "\n".join(conversation_totals(seen)), flush=True)
        if stop():
            return EXIT_INTERRUPTED
        if pending:
            print(
                json.dumps({"error": "no outcome in time", "conversations": sorted(pending)}),
                file=sys.stderr,
            )
            return 1
        return 0
    finally:
        client.close()
