"""A Slack stand-in for the local stack: the parts of Slack the chat functions talk to.

It answers the Web API the way Slack does (``POST /api/<method>``, a bearer token, ``{"ok":
...}`` bodies with Slack's error names) for the methods Stasis uses (``chat.postMessage``,
``auth.test``), and plays the response_urls that ``stasis chat`` hands out
(``POST /response/<id>``: 200 ``ok``, at most five messages each, then 404 ``used_url``,
as Slack). Every message is recorded; ``GET /messages`` lists them (filters: ``after``
sequence number, ``response_id``, ``channel``, ``requestid`` from the message metadata),
which is how ``stasis chat`` and the tests see the notifications. Loopback only.

    python -m stack.slack_sink --port 8715 --token xoxb-stasis-local [--log FILE]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from stack.settings import HOST

RESPONSE_URL_USES = 5
BOT_USER = "U0STASISBOT"
BOT_ID = "B0STASIS"
TEAM = "T0STASIS"


class Sink:
    """The recorded conversation, shared by the server's threads."""

    def __init__(self, token: str | None, log_path: Path | None = None) -> None:
        self.token = token
        self.log_path = log_path
        self.lock = threading.Lock()
        self.messages: list[dict[str, Any]] = []
        self.response_uses: dict[str, int] = {}

    def record(self, entry: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            entry = {"seq": len(self.messages) + 1, "received_at": time.time(), **entry}
            self.messages.append(entry)
            if self.log_path is not None:
                with self.log_path.open("a") as log:
                    log.write(json.dumps(entry) + "\n")
            return entry

    def use_response(self, response_id: str) -> bool:
        with self.lock:
            uses = self.response_uses.get(response_id, 0)
            if uses >= RESPONSE_URL_USES:
                return False
            self.response_uses[response_id] = uses + 1
            return True

    def query(self, params: Mapping[str, str]) -> list[dict[str, Any]]:
        after = int(params.get("after") or 0)
        with self.lock:
            rows = [m for m in self.messages if m["seq"] > after]
        for key in ("response_id", "channel", "requestid", "kind"):
            if params.get(key):
                rows = [m for m in rows if str(m.get(key) or "") == params[key]]
        return rows

    def clear(self) -> None:
        with self.lock:
            self.messages.clear()
            self.response_uses.clear()


def _requestid(metadata: Any) -> str | None:
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return None
    if isinstance(metadata, dict) and isinstance(metadata.get("event_payload"), dict):
        value = metadata["event_payload"].get("requestid")
        return str(value) if value else None
    return None


class _Handler(BaseHTTPRequestHandler):
    sink: Sink
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing --------------------------------------------------------------------------
    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else (
            json.dumps(body).encode() if content_type == "application/json" else
            str(body).encode())
        self.send_response(status)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        if "json" in (self.headers.get("Content-Type") or ""):
            try:
                parsed = json.loads(raw or "{}")
            except ValueError:
                return {}
            return parsed if isinstance(parsed, dict) else {}
        return {k: v[-1] for k, v in parse_qs(raw).items()}

    # -- routes ----------------------------------------------------------------------------
    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            self._send(200, "ok\n", "text/plain")
        elif url.path == "/messages":
            params = {k: v[-1] for k, v in parse_qs(url.query).items()}
            rows = self.sink.query(params)
            self._send(200, {"messages": rows, "last": rows[-1]["seq"] if rows else
                             int(params.get("after") or 0)})
        else:
            self._send(404, {"error": "not_found"})

    def do_DELETE(self) -> None:
        if urlsplit(self.path).path == "/messages":
            self.sink.clear()
            self._send(200, {"ok": True})
        else:
            self._send(404, {"error": "not_found"})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        body = self._body()
        if path.startswith("/api/"):
            self._send(200, self._api(path.removeprefix("/api/"), body))
        elif path.startswith("/response/"):
            self._response(path.removeprefix("/response/"), body)
        else:
            self._send(404, {"error": "not_found"})

    def _api(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        auth = self.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else (
            str(body.get("token") or ""))
        if not token:
            return {"ok": False, "error": "not_authed"}
        if self.sink.token and token != self.sink.token:
            return {"ok": False, "error": "invalid_auth"}
        if method == "auth.test":
            return {"ok": True, "url": "http://stasis.local/", "team": "stasis-local",
                    "user": "stasis", "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID}
        if method == "chat.postMessage":
            channel = str(body.get("channel") or "")
            if not channel:
                return {"ok": False, "error": "channel_not_found"}
            if not body.get("text") and not body.get("blocks"):
                return {"ok": False, "error": "no_text"}
            metadata = body.get("metadata")
            entry = self.sink.record({
                "kind": "chat.postMessage", "channel": channel, "text": body.get("text", ""),
                "metadata": metadata, "requestid": _requestid(metadata)})
            ts = f"{entry['received_at']:.6f}"
            return {"ok": True, "channel": channel, "ts": ts,
                    "message": {"type": "message", "text": entry["text"], "bot_id": BOT_ID,
                                "ts": ts}}
        return {"ok": False, "error": "unknown_method"}

    def _response(self, response_id: str, body: dict[str, Any]) -> None:
        if not response_id or not self.sink.use_response(response_id):
            self._send(404, "used_url", "text/plain")
            return
        if not body.get("text") and not body.get("blocks"):
            self._send(400, "no_text", "text/plain")
            return
        metadata = body.get("metadata")
        self.sink.record({
            "kind": "response_url", "response_id": response_id, "text": body.get("text", ""),
            "response_type": body.get("response_type", "ephemeral"), "metadata": metadata,
            "requestid": _requestid(metadata)})
        self._send(200, "ok", "text/plain")


def serve(port: int, token: str | None, log_path: Path | None = None) -> ThreadingHTTPServer:
    """A sink server bound to 127.0.0.1:``port`` (0: any free port); call serve_forever."""
    sink = Sink(token, log_path)
    handler = type("SinkHandler", (_Handler,), {"sink": sink})
    server = ThreadingHTTPServer((HOST, port), handler)
    server.daemon_threads = True
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", default=None, help="The bot token to accept.")
    parser.add_argument("--log", type=Path, default=None, help="Append messages (JSON lines).")
    args = parser.parse_args()
    if args.log:
        args.log.parent.mkdir(parents=True, exist_ok=True)
    serve(args.port, args.token, args.log).serve_forever()


if __name__ == "__main__":
    main()
