"""The embedded Redis' ports: chosen where no outgoing connection can take them while the
server is down, so a restart on the same port (a crash under ``compactor up``, a fault test's
SIGKILL, a Redis Cluster node and its bus port) finds them free."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from worker.backend.embedded import (
    DEFAULT_EPHEMERAL_PORTS,
    ephemeral_ports,
    restartable_port,
)


def test_the_ephemeral_range_is_read_from_the_kernel_and_defaults_when_unreadable(
    tmp_path: Path,
) -> None:
    source = tmp_path / "ip_local_port_range"
    source.write_text("40000\t50000\n")
    assert ephemeral_ports(source) == range(40000, 50001)
    source.write_text("garbage")
    low, high = DEFAULT_EPHEMERAL_PORTS
    assert ephemeral_ports(source) == range(low, high + 1)
    assert ephemeral_ports(tmp_path / "missing") == range(low, high + 1)


@pytest.mark.parametrize("offset", [0, 10000])
def test_a_restartable_port_and_its_offset_are_free_and_outside_the_ephemeral_range(
    offset: int,
) -> None:
    ephemeral = ephemeral_ports()
    for _ in range(50):
        port = restartable_port(also_offset=offset)
        for chosen in {port, port + offset}:
            assert chosen not in ephemeral and 1024 <= chosen <= 65535
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind(("127.0.0.1", chosen))  # free: nothing listens there
