"""The service on this machine for a script: what ``compactor up`` runs, as a context manager.

::

    from worker.client import Client
    from worker.local import local_stack

    with local_stack() as stack:              # Redis, the workers and the scheduler, ready
        client = Client(stack.settings)
        ...

For examples, demos and scripts that need the whole service for a while and nothing left
running afterwards; a deployment runs ``compactor up`` or its parts instead (README.md).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from worker.config import Settings, load_settings, with_redis_url
from worker.errors import CompactorError

__all__ = ["LocalStack", "local_stack"]


@dataclass(frozen=True)
class LocalStack:
    """A running :func:`local_stack`: where its parts are."""

    redis_url: str  # the state's (and the queues') Redis
    settings: Settings  # the resolved configuration with that Redis: ``Client(stack.settings)``
    workdir: Path  # the embedded Redis' data, the beat schedule, the logs
    http_url: str | None  # ``compactor serve``'s base URL, when ``http_port`` was given

    @property
    def logs(self) -> Path:
        """One log file per worker, the scheduler and the HTTP server."""
        return self.workdir / "logs"


@contextlib.contextmanager
def local_stack(
    config: str | Path | None = None,
    *,
    workdir: str | Path | None = None,
    redis_port: int | None = None,
    http_port: int | None = None,
    timeout_s: float = 120.0,
) -> Iterator[LocalStack]:
    """Redis (the configured one, else an embedded ``redis-server`` on a free loopback port or
    ``redis_port``), an evaluate and a summarize worker and the scheduler, supervised as
    ``compactor up`` runs them, plus ``compactor serve`` on ``http_port`` when given. The block
    starts once every worker answers (and the HTTP server, if any); everything stops when it
    ends. ``config``: a TOML file, as ``--config`` (else ``$COMPACTOR_CONFIG``, ...);
    ``workdir``: as ``compactor up --workdir`` (default: a temporary directory, removed
    at the end).
    A :class:`~worker.errors.CompactorError` when the parts are not ready in ``timeout_s``."""
    with contextlib.ExitStack() as cleanup:
        if workdir is None:  # a private one, removed at the end (the AOF holds snapshots)
            workdir = cleanup.enter_context(
                tempfile.TemporaryDirectory(prefix="compactor-local-", ignore_cleanup_errors=True)
            )
        yield cleanup.enter_context(
            _running(config, Path(workdir), redis_port, http_port, timeout_s)
        )


@contextlib.contextmanager
def _running(
    config: str | Path | None,
    workdir: Path,
    redis_port: int | None,
    http_port: int | None,
    timeout_s: float,
) -> Iterator[LocalStack]:
    from worker.api.auth import serving_keys
    from worker.runtime.fleet import wait_for_workers
    from worker.runtime.supervisor import running_services

    settings = load_settings(config)
    if http_port is not None:
        serving_keys(settings, os.environ)  # no keys: refused before anything starts
    with running_services(
        settings,
        str(config) if config else None,
        workdir=workdir,
        redis_port=redis_port,
        http_port=http_port,
    ) as url:
        stack = LocalStack(
            redis_url=url,
            settings=with_redis_url(settings, url),
            workdir=workdir,
            http_url=f"http://{settings.http.host}:{http_port}" if http_port else None,
        )
        deadline = time.monotonic() + timeout_s
        if not wait_for_workers(url, settings, expected=2, timeout_s=timeout_s):
            raise _not_ready(f"the workers did not answer within {timeout_s:g} s", stack.logs)
        if http_port is not None:
            _wait_for_http(settings.http.host, http_port, deadline, stack.logs)
        yield stack


def _wait_for_http(host: str, port: int, deadline: float, logs: Path) -> None:
    """Until ``GET /healthz`` answers 200 (the server starts after the workers)."""
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection(host, port, timeout=5)
        try:
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.1)  # not listening yet: the child is still importing
    raise _not_ready(f"compactor serve did not answer on {host}:{port}", logs)


def _not_ready(what: str, logs: Path) -> CompactorError:
    """The error, with the end of each log (the directory may be removed with the block)."""
    tails = [
        f"--- {path.name}:\n{path.read_text(errors='replace')[-2000:]}"
        for path in sorted(logs.glob("*.log"))
    ]
    return CompactorError("\n".join([what, *tails]), code="local_stack_unavailable")
