"""Run the API on uvicorn (``compactor serve``)."""

from __future__ import annotations

import json
import socket
import sys

import uvicorn

from worker.api.app import create_app
from worker.config import Settings


class _Server(uvicorn.Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                print(json.dumps({"http": f"http://{host}:{port}"}), flush=True)


def serve(settings: Settings, *, host: str | None = None, port: int | None = None) -> int:
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host or settings.http.host,
        port=settings.http.port if port is None else port,
        timeout_keep_alive=int(settings.http.keep_alive_timeout_s),
        log_level="warning",
        access_log=False,
        lifespan="on",
        server_header=False,
    )
    server = _Server(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
