"""What every ``compactor`` command shares: its settings, the start line that says which
Redis and broker it uses and where each came from, and reading an input file.

Each command says at start, in one JSON line on stderr, which Redis (and broker) it uses
(:func:`redis_in_use`): always the long-running ones (``serve``, ``worker``, ``beat``, ``up``,
``metrics --serve``), the one-shot ones (``submit``, ``events``, ``status``, ``metrics``) with
``--verbose`` or when stderr is a terminal, so a script reading their output sees it
unchanged."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from worker.config import (
    DEFAULT_CONFIG_PATH,
    Settings,
    config_path,
    configured_broker_url,
    load_settings,
    mask_url,
    redis_url,
)
from worker.errors import (
    InvalidSnapshot,
    UsageError,
)

# Exit codes (README, "Exit codes and errors").
EXIT_OK, EXIT_FAILED, EXIT_REJECTED = 0, 1, 2
EXIT_INTERRUPTED = 130


def settings_of(args: argparse.Namespace) -> Settings:
    settings = load_settings(args.config)
    if getattr(args, "no_auth", False):
        http = settings.http.model_copy(update={"allow_unauthenticated": True})
        settings = settings.model_copy(update={"http": http})
        settings = settings.with_origin("http.allow_unauthenticated", "--no-auth")
    return settings


def where_from(settings: Settings, key: str) -> str:
    origin = settings.origin_of(key)
    return "built-in default" if origin == "default" else origin


def redis_in_use(settings: Settings) -> dict[str, Any]:
    """Which Redis holds the state and where the task messages travel, passwords masked, and
    where each URL came from (``COMPACTOR_REDIS_URL``, the config file, the built-in default,
    the embedded Redis of ``up``)."""
    from worker.backend.connection import state_url
    from worker.backend.queues import broker_url

    doc: dict[str, Any] = {"redis": mask_url(state_url(settings))}
    doc["redis_from"] = where_from(settings, "redis.url")
    doc["broker"] = mask_url(broker_url(settings))
    if configured_broker_url(settings) is None:
        doc["broker_from"] = "redis (no [broker] url)"
    else:
        doc["broker_from"] = where_from(settings, "broker.url")
    return doc


def unset_redis_url(settings: Settings, config: str | None) -> dict[str, Any] | None:
    """When no Redis URL is set (``COMPACTOR_REDIS_URL`` nor ``[redis] url``), a warning that
    says so, where it looked, and which Redis is used instead; None when one is set. A command
    that finds no worker or no Redis then says why before it says what it found."""
    from worker.backend.redis_target import DEFAULT_REDIS_URL

    if redis_url(settings) is not None:
        return None
    variable = os.environ.get("COMPACTOR_REDIS_URL")
    looked = [f"COMPACTOR_REDIS_URL is {'set to ' + repr(variable) if variable else 'not set'}"]
    file = config_path(config, os.environ)
    if file is None:
        looked.append(
            f"no config file: no --config, COMPACTOR_CONFIG is not set and there is no "
            f"{DEFAULT_CONFIG_PATH} in {Path.cwd()}"
        )
    else:
        looked.append(f"{file.absolute()} sets no [redis] url")
    return {
        "warning": "redis_url_unset",
        "message": f"no Redis URL is set ({'; '.join(looked)}): using the built-in default "
        f"{DEFAULT_REDIS_URL}. Set COMPACTOR_REDIS_URL to the Redis `compactor up` printed",
        "looked_at": looked,
    }


def stderr_json(doc: dict[str, Any]) -> None:
    """One JSON line on stderr: an error, a start line, a progress line."""
    sys.stderr.write(json.dumps(doc, ensure_ascii=False) + "\n")
    sys.stderr.flush()


def say_start(command: str, settings: Settings, **more: Any) -> None:
    """The start line: the command, its Redis and broker (:func:`redis_in_use`), and ``more``."""
    stderr_json({"command": command} | redis_in_use(settings) | more)


def say_start_if_asked(command: str, settings: Settings, args: argparse.Namespace) -> None:
    """The start line of a one-shot command: with ``--verbose``, or on a terminal."""
    if args.verbose or sys.stderr.isatty():
        say_start(command, settings)


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


def auth_in_use(settings: Settings) -> dict[str, Any]:
    """How ``serve`` authenticates, for its start line: the number of API keys, or a warning
    that authentication is off. ConfigError when there are no keys and it is not explicitly
    off (:func:`worker.api.auth.serving_keys`)."""
    from worker.api.auth import OPEN_TENANT, serving_keys

    keys = serving_keys(settings, os.environ)
    if keys.open_to is None:
        return {"auth": "api_keys", "api_keys": len(keys)}
    how = where_from(settings, "http.allow_unauthenticated")
    return {
        "auth": "OFF",
        "warning": f"AUTHENTICATION IS OFF ({how}): every /v1 request, with or without a key, "
        f"acts as tenant {OPEN_TENANT!r}; anyone who can reach this port can read and write "
        "its conversations",
    }
