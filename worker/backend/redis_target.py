"""What a ``[redis] url`` names: a standalone Redis, a Redis Cluster or a Sentinel-managed master.

Pure: parsing only; :func:`worker.backend.connection.connect` builds the client. The forms
(docs/configuration.md#redis):

- ``redis://``, ``rediss://``, ``unix://``: one Redis, as redis-py reads the URL;
- ``redis+cluster://[[user]:password@]host:port[,host:port...]``: a Redis Cluster, found from
  any of the nodes listed (``rediss+cluster://`` with TLS);
- ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``: the master that
  the Sentinels listed know as ``service`` (``rediss+sentinel://`` with TLS, to both). The
  credentials are the master's; the Sentinels are asked without any.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict

from worker.errors import ConfigError

__all__ = [
    "CLUSTER_SCHEMES",
    "DEFAULT_REDIS_URL",
    "SENTINEL_SCHEMES",
    "RedisTarget",
    "is_shared_state_only",
    "parse_redis_url",
]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")

Kind = Literal["standalone", "cluster", "sentinel"]


class RedisTarget(BaseModel):
    """A parsed ``[redis] url`` (for the cluster and Sentinel forms; a standalone URL is only
    classified, redis-py reads it itself)."""

    model_config = ConfigDict(frozen=True)

    kind: Kind
    nodes: list[tuple[str, int]] = []  # cluster: startup nodes; sentinel: the Sentinels
    service: str = ""  # sentinel: the master's name
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False

    def auth(self) -> dict[str, Any]:
        """The keyword arguments of every connection to a data node (not to a Sentinel)."""
        out: dict[str, Any] = {}
        if self.username:
            out["username"] = self.username
        if self.password:
            out["password"] = self.password
        if self.tls:
            out["ssl"] = True
        return out


def is_shared_state_only(url: str) -> bool:
    """Whether the URL names a Redis that cannot be the Celery broker (kombu speaks neither the
    cluster protocol nor this Sentinel form): a separate ``[broker] url`` is needed."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES + SENTINEL_SCHEMES


def parse_redis_url(url: str) -> RedisTarget:
    """The target of ``url``; ConfigError (key ``redis.url``) for a malformed one. Never
    echoes the URL: it may hold a password."""
    if "://" not in url:
        raise ConfigError("redis.url", "not a URL (redis://, redis+cluster://, redis+sentinel://)")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme not in CLUSTER_SCHEMES + SENTINEL_SCHEMES:
        return RedisTarget(kind="standalone")
    rest = rest.split("?", 1)[0].split("#", 1)[0]
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        creds, netloc = netloc.rsplit("@", 1)
        user, _, secret = creds.partition(":")
        username, password = unquote(user) or None, unquote(secret) or None
    nodes = [_host_port(part) for part in netloc.split(",") if part]
    if not nodes:
        raise ConfigError("redis.url", f"{scheme}:// needs at least one host:port")
    tls = scheme.startswith("rediss")
    parts = [p for p in path.split("/") if p]
    if scheme in CLUSTER_SCHEMES:
        if parts not in ([], ["0"]):
            raise ConfigError("redis.url", "a Redis Cluster has only database 0: no path")
        return RedisTarget(
            kind="cluster", nodes=nodes, username=username, password=password, tls=tls
        )
    if not parts or len(parts) > 2:
        raise ConfigError("redis.url", f"{scheme}:// needs /service_name[/db] after the hosts")
    if len(parts) == 2 and not parts[1].isdigit():
        raise ConfigError("redis.url", "the database after the service name is a number")
    return RedisTarget(
        kind="sentinel",
        nodes=nodes,
        service=unquote(parts[0]),
        db=int(parts[1]) if len(parts) == 2 else 0,
        username=username,
        password=password,
        tls=tls,
    )


def _host_port(text: str) -> tuple[str, int]:
    match = _HOST_PORT.fullmatch(text)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ConfigError("redis.url", "each node is host:port (e.g. 10.0.0.1:6379)")
    return match.group(1).strip("[]"), int(match.group(2))
