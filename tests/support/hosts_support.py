"""Several "hosts" on one machine: a network namespace per host, joined by a bridge in this
namespace whose address is where the shared servers (Redis, the object store) listen.

A process started with :meth:`Network.run_prefix` sees only its namespace's interfaces: it
reaches the shared servers over the bridge and nothing on this namespace's loopback, so a test
can show that what two hosts share is only what they reach over that network. Each host also
gets its own working directory, so nothing on disk is shared either.

Needs root and ``ip`` (iproute2); :func:`network_or_skip` says why it cannot run otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _free_subnet() -> ipaddress.IPv4Network:
    routes = _ip("-4", "route", "show").stdout
    for _ in range(50):
        net = ipaddress.IPv4Network(
            f"10.{secrets.randbelow(50) + 200}.{secrets.randbelow(250)}.0/24"
        )
        if str(net.network_address)[:-1] not in routes:
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test hosts")


@dataclass
class Network:
    """``hosts`` namespaces on a private /24; the bridge (this namespace) has ``.1``."""

    hosts: list[str]
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: ipaddress.IPv4Network = field(default_factory=_free_subnet)
    namespaces: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)

    @property
    def gateway(self) -> str:
        """The address the shared servers bind to, as every host reaches it."""
        return str(self.subnet.network_address + 1)

    @property
    def bridge(self) -> str:
        return f"cwb{self.tag}"

    def up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, host in enumerate(self.hosts):
            ns, outside, inside = f"cw{self.tag}{host}", f"cw{self.tag}{i}h", f"cw{self.tag}{i}n"
            address = str(self.subnet.network_address + 2 + i)
            _ip("netns", "add", ns)
            self.namespaces[host] = ns
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            for args in (
                ("addr", "add", f"{address}/24", "dev", inside),
                ("link", "set", inside, "up"),
                ("link", "set", "lo", "up"),
            ):
                _ip("netns", "exec", ns, "ip", *args)
            self.addresses[host] = address

    def down(self) -> None:
        for ns in self.namespaces.values():
            _ip("netns", "del", ns, check=False)  # removes its veth end, and so the pair
        _ip("link", "del", self.bridge, check=False)

    def run_prefix(self, host: str) -> list[str]:
        """Prepend to a command to run it on ``host``."""
        return ["ip", "netns", "exec", self.namespaces[host]]


@functools.cache
def loopback_namespace_unavailable() -> str | None:
    """Why a process cannot get a network namespace of its own (only loopback) here, through
    ``unshare --user --net``; None when it can. Unlike :func:`network_or_skip` it needs no root."""
    try:
        subprocess.run(
            ["unshare", "--user", "--map-root-user", "--net", "true"],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare --user --net is not available: {exc}"
    return None


def network_or_skip() -> None:
    """Skip (saying why) where network namespaces cannot be made: not root, or no iproute2."""
    if shutil.which("ip") is None:
        pytest.skip("several-hosts tests need iproute2's `ip` (network namespaces)")
    probe = f"cwprobe{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make network namespaces here: {made.stderr.strip()}")
    _ip("netns", "del", probe, check=False)


@contextlib.contextmanager
def network(hosts: list[str]) -> Iterator[Network]:
    network_or_skip()
    net = Network(hosts)
    try:
        net.up()
        yield net
    finally:
        net.down()
