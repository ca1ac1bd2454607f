"""A JSON document served on 127.0.0.1 for as long as a test needs it (the signing keys an
identity check fetches: IAP's, a cluster's JWKS). Importable from any test module
(``tests/`` is on sys.path)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def serving_json(body: bytes) -> Iterator[str]:
    """``body`` as ``application/json`` at every path; yields the base URL."""

    class Document(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Document)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
