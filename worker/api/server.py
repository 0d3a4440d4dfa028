"""Run the API on uvicorn (``compactor serve``)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from worker.api.app import create_app
from worker.config import Settings
from worker.ops.logs import configure_logging, level_from_env


def _header_timeout_protocol(timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers have not all arrived
    within ``timeout_s`` of its opening (or of its previous response): uvicorn's keep-alive
    timer stops at the first byte, so a client trickling headers would hold it forever."""

    class HeaderTimeoutProtocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _armed_cycle: Any = None

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._armed_cycle = self.cycle
            self._deadline = self.loop.call_later(timeout_s, self._headers_late)

        def _headers_late(self) -> None:
            if self.cycle is self._armed_cycle and not self.transport.is_closing():
                self.transport.close()  # no new request's headers in time

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


class _Server(uvicorn.Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                print(json.dumps({"http": f"http://{host}:{port}"}), flush=True)


def serve(settings: Settings, *, host: str | None = None, port: int | None = None) -> int:
    # Our log format ([worker] log_format: JSON lines unless "text") for our loggers and
    # uvicorn's alike: uvicorn configures none of its own (log_config=None), its records reach
    # the root handler. COMPACTOR_LOG_LEVEL, else INFO as the workers log.
    level = level_from_env("INFO")
    configure_logging(level, fmt=settings.worker.log_format)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host or settings.http.host,
        port=settings.http.port if port is None else port,
        timeout_keep_alive=int(settings.http.keep_alive_timeout_s),
        http=_header_timeout_protocol(settings.http.header_timeout_s),
        log_config=None,
        log_level=level,
        access_log=False,
        lifespan="on",
        server_header=False,
    )
    server = _Server(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
