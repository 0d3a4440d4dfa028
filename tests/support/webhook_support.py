"""A webhook receiver on loopback, for the tests of webhook delivery."""

from __future__ import annotations

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Listens on 127.0.0.1 (TLS with ``tls``) and records every POST: its headers (names in
    lower case) and body. Answers the first ``fail_first`` with 500, every other one with 204;
    ``server_names``: the names TLS clients asked for in the handshake (SNI)."""

    def __init__(self, *, fail_first: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.server_names: list[str | None] = []
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                failing = len(outer.received) <= outer.fail_first
                self.send_response(500 if failing else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                del format, args

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:

            def server_name(_sock: Any, name: str | None, _ctx: Any) -> None:
                self.server_names.append(name)

            tls.sni_callback = server_name
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def bodies(self) -> list[Any]:
        """The bodies received so far, decoded from JSON."""
        return [json.loads(body) for _headers, body in self.received]

    def hosts_and_bodies(self) -> list[tuple[str, bytes]]:
        """(Host header, body) of each POST received so far."""
        return [(headers["host"], body) for headers, body in self.received]

    def wait(self, count: int, timeout_s: float = 30) -> list[tuple[dict[str, str], bytes]]:
        """Every POST received, once there are at least ``count``."""
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.received) >= count, self.received
        return self.received

    def events(self, type_: str, count: int, timeout_s: float = 60) -> list[tuple[str, Any]]:
        """(Host header, event) of the received events of ``type_``, waited for until there
        are ``count``."""
        deadline = time.monotonic() + timeout_s
        found: list[tuple[str, Any]] = []
        while time.monotonic() < deadline:
            received = [(h["host"], json.loads(b)) for h, b in self.received]
            found = [(host, e) for host, e in received if e["type"] == type_]
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{count} {type_} not delivered: {found}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
