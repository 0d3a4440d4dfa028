"""``compactor mcp``: the service as tools for an agent host, a Model Context Protocol server on
stdin and stdout (docs/mcp.md).

It talks to ``compactor serve`` over HTTP as one tenant: the base URL (``--url``, else
``COMPACTOR_URL``, else ``http://127.0.0.1:8080``), the tenant's API key from the environment
(``COMPACTOR_API_KEY``, or the variable ``--key-env`` names; never an argument, which other
users of the machine could read), and the conversation the tools act on by default
(``--conversation``, else ``COMPACTOR_CONVERSATION``; without one, every call names its own).
Stdout is the protocol's: the start line and any error go to stderr as JSON lines. The SDK
(the ``mcp`` extra) is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from worker.cli.common import stderr_json
from worker.config import mask_url
from worker.errors import UsageError
from worker.wire.models import CONVERSATION_ID_PATTERN

DEFAULT_URL = "http://127.0.0.1:8080"
URL_VARIABLE = "COMPACTOR_URL"
KEY_VARIABLE = "COMPACTOR_API_KEY"
CONVERSATION_VARIABLE = "COMPACTOR_CONVERSATION"


def add_mcp_command(sub: Any) -> None:
    p = sub.add_parser(
        "mcp",
        help="a Model Context Protocol server on stdio: recall, list, show, compact, status "
        "as tools for an agent host (talks to compactor serve)",
    )
    p.add_argument(
        "--url",
        help=f"compactor serve's base URL (default ${URL_VARIABLE}, then {DEFAULT_URL})",
    )
    p.add_argument(
        "--conversation",
        help=f"the conversation the tools act on when a call names none "
        f"(default ${CONVERSATION_VARIABLE})",
    )
    p.add_argument(
        "--key-env",
        default=KEY_VARIABLE,
        metavar="NAME",
        help=f"the environment variable holding the tenant's API key (default {KEY_VARIABLE})",
    )
    p.add_argument(
        "--no-auth",
        action="store_true",
        help="send no API key (a compactor serve --no-auth); without a key and without this, "
        "the server does not start",
    )
    p.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from worker.cli.mcp_server import Options, run
    except ImportError as exc:  # the optional extra is not installed
        raise UsageError(
            f"compactor mcp needs the mcp extra (pip install -e '.[mcp]'): {exc}"
        ) from None
    url, conversation, key = options_of(args, os.environ)
    auth = "none (--no-auth)" if key is None else f"api_key (${args.key_env})"
    stderr_json(
        {"command": "mcp", "url": mask_url(url), "conversation": conversation, "auth": auth}
    )
    return run(Options(url=url, api_key=key, conversation=conversation))


def options_of(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[str, str | None, str | None]:
    """The base URL, the default conversation and the key, checked: a UsageError names the
    option or variable that is wrong (never a key's value)."""
    url = args.url or environ.get(URL_VARIABLE) or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url ({URL_VARIABLE}): an http:// or https:// URL with a host")
    conversation = args.conversation or environ.get(CONVERSATION_VARIABLE) or None
    if conversation is not None and not re.fullmatch(CONVERSATION_ID_PATTERN, conversation):
        raise UsageError(
            f"--conversation ({CONVERSATION_VARIABLE}): not a conversation id "
            "(1-128 of A-Z a-z 0-9 _ . : -, not starting with . or -)"
        )
    key = environ.get(args.key_env, "").strip() or None
    if args.no_auth and key is not None:
        raise UsageError(f"--no-auth and ${args.key_env} together: say which (unset the key)")
    if not args.no_auth and key is None:
        raise UsageError(
            f"no API key: set ${args.key_env} to the tenant's key of compactor serve "
            "(or --no-auth for a compactor serve --no-auth)"
        )
    return url, conversation, key
