"""A Jupyter server's kernels and REST API, reached with its URL and token only.

Runtime-neutral: a local jupyter-server and one in a GKE pod look the same from here (the
runtime's ``status`` says where the server is). Code runs over the Jupyter messaging
protocol on the kernel websocket (``/api/kernels/<id>/channels``, JSON frames), as
JupyterLab does: one ``execute_request`` on the shell channel, then the iopub messages
whose parent is that request (stream, execute_result, display_data, error, status) and
the ``execute_reply``. :class:`KernelExecution` hands them out one at a time with a
timeout, so the caller can re-check its authorization between messages and interrupt the
cell when it must stop. ``harness/notebook.py`` speaks the same protocol for the demo; the
message helpers here (:func:`execute_request`, :func:`normalize`) are the reusable part.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import requests
import websocket

from functions.ports import RuntimeStatus
from functions.proxy.ports import Forwarded, GatewayError, KernelChoice, Server

AGENT_NOTEBOOK = "stasis-agent.ipynb"
_TIMEOUT = (3.05, 60.0)
_SERVER_CACHE_SECONDS = 30.0


def execute_request(code: str, msg_id: str, session: str) -> dict[str, Any]:
    """The shell-channel message that runs ``code`` (protocol 5.3)."""
    return {
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "stasis",
                   "session": session, "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }


def normalize(message: Mapping[str, Any], msg_id: str) -> dict[str, Any] | None:
    """A kernel message as the proxy streams it, or None if it is not for this request or
    says nothing to the caller. ``reply`` and ``idle`` are bookkeeping for the execution."""
    if (message.get("parent_header") or {}).get("msg_id") != msg_id:
        return None
    kind, content = message.get("msg_type"), message.get("content") or {}
    if kind == "stream":
        return {"type": "stream", "name": content.get("name", "stdout"),
                "text": content.get("text", "")}
    if kind in ("execute_result", "display_data"):
        data = content.get("data") or {}
        return {"type": "result", "text": data.get("text/plain", ""),
                "mimetypes": sorted(data)}
    if kind == "error":
        return {"type": "error", "ename": content.get("ename", ""),
                "evalue": content.get("evalue", ""),
                "traceback": list(content.get("traceback") or [])}
    if kind == "execute_reply":
        return {"type": "reply", "status": content.get("status", "error"),
                "execution_count": content.get("execution_count")}
    if kind == "status" and content.get("execution_state") == "idle":
        return {"type": "idle"}
    return None


class KernelExecution:
    """One cell running in a kernel; :meth:`next` gives its output message by message."""

    def __init__(self, server: Server, kernel_id: str, code: str, *,
                 http: requests.Session) -> None:
        self.server = server
        self.kernel_id = kernel_id
        self.http = http
        self.msg_id = uuid.uuid4().hex
        self.reply: dict[str, Any] | None = None
        self.idle = False
        self.finished = False
        url = server.base_url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
        try:
            self.conn = websocket.create_connection(
                f"{url}?session_id={uuid.uuid4().hex}",
                header=[f"Authorization: token {server.token}"], timeout=10,
                enable_multithread=True)
            self.conn.send(json.dumps(execute_request(code, self.msg_id, uuid.uuid4().hex)))
        except (OSError, websocket.WebSocketException) as exc:
            raise GatewayError(f"cannot reach kernel {kernel_id}: {exc}") from exc

    def next(self, timeout: float) -> dict[str, Any] | None:
        if self.finished:
            raise GatewayError("the execution is over")
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.conn.settimeout(remaining)
            try:
                raw = self.conn.recv()
            except websocket.WebSocketTimeoutException:
                return None
            except (OSError, websocket.WebSocketException) as exc:
                raise GatewayError(f"lost the kernel connection: {exc}") from exc
            try:
                message = normalize(json.loads(raw), self.msg_id)
            except ValueError:
                continue
            if message is None:
                continue
            if message["type"] == "reply":
                self.reply = message
            elif message["type"] == "idle":
                self.idle = True
            else:
                return message
            if self.reply is not None and self.idle:
                self.finished = True
                return {"type": "done", "status": self.reply["status"],
                        "execution_count": self.reply.get("execution_count")}

    def interrupt(self) -> None:
        """Stop the running cell (SIGINT to the kernel), best effort."""
        with contextlib.suppress(requests.RequestException):
            self.http.post(f"{self.server.base_url}/api/kernels/{self.kernel_id}/interrupt",
                           headers=_auth(self.server), timeout=_TIMEOUT)

    def close(self) -> None:
        with contextlib.suppress(OSError, websocket.WebSocketException):
            self.conn.close()


class JupyterGateway:
    """The KernelGateway port over a runtime's ``status`` (where each server is)."""

    def __init__(self, status: Callable[[str], RuntimeStatus | None]) -> None:
        self.status = status
        self.http = requests.Session()
        # Workspace servers are reached directly; a proxy from the environment must not
        # see their tokens.
        self.http.trust_env = False
        self._servers: dict[tuple[str, int], tuple[Server | None, float]] = {}
        self._lock = threading.Lock()

    def server(self, workspace_id: str, version: int) -> Server | None:
        key = (workspace_id, version)
        with self._lock:
            cached = self._servers.get(key)
        if cached and time.monotonic() - cached[1] < _SERVER_CACHE_SECONDS and cached[0]:
            return cached[0]
        try:
            status = self.status(workspace_id)
        except Exception as exc:  # the runtime's own errors: unavailable, refused
            raise GatewayError(f"the runtime cannot say where {workspace_id} runs: "
                               f"{exc}") from exc
        found = None
        if status is not None and status.running and status.url and status.token:
            base = status.url.rstrip("/").removesuffix("/lab")
            found = Server(base, status.token)
        with self._lock:
            self._servers = {k: v for k, v in self._servers.items() if k[0] != workspace_id}
            self._servers[key] = (found, time.monotonic())
        return found

    def choose_kernel(self, server: Server, *, notebook: str | None,
                      kernel_id: str | None) -> KernelChoice:
        """The kernel asked for; else the notebook's; else the most recently active one of
        the open notebooks; else a new session for ``stasis-agent.ipynb``."""
        if kernel_id:
            kernels = self._get(server, "/api/kernels")
            if not any(k.get("id") == kernel_id for k in kernels):
                raise GatewayError(f"no kernel {kernel_id} in this workspace")
            return KernelChoice(kernel_id, None)
        sessions = [s for s in self._get(server, "/api/sessions") if s.get("kernel")]
        if notebook:
            for session in sessions:
                if session.get("path") == notebook:
                    return KernelChoice(str(session["kernel"]["id"]), notebook)
            return self._open(server, notebook)
        if sessions:
            latest = max(sessions, key=lambda s: str(s["kernel"].get("last_activity") or ""))
            return KernelChoice(str(latest["kernel"]["id"]), latest.get("path"))
        return self._open(server, AGENT_NOTEBOOK)

    def execute(self, server: Server, kernel_id: str, code: str) -> KernelExecution:
        return KernelExecution(server, kernel_id, code, http=self.http)

    def forward(self, server: Server, method: str, path: str, query: str, body: bytes,
                content_type: str | None) -> Forwarded:
        headers = _auth(server)
        if content_type:
            headers["Content-Type"] = content_type
        url = f"{server.base_url}/{path.lstrip('/')}" + (f"?{query}" if query else "")
        try:
            response = self.http.request(method, url, data=body or None, headers=headers,
                                         timeout=_TIMEOUT, allow_redirects=False)
        except requests.RequestException as exc:
            raise GatewayError(f"the workspace's server did not answer: {exc}") from exc
        return Forwarded(response.status_code,
                         response.headers.get("Content-Type", "application/octet-stream"),
                         response.content)

    def _open(self, server: Server, path: str) -> KernelChoice:
        try:
            response = self.http.post(f"{server.base_url}/api/sessions", headers=_auth(server),
                                      timeout=_TIMEOUT, json={
                                          "path": path, "name": path, "type": "notebook",
                                          "kernel": {"name": "python3"}})
            response.raise_for_status()
        except requests.RequestException as exc:
            raise GatewayError(f"cannot start a kernel for {path}: {exc}") from exc
        return KernelChoice(str(response.json()["kernel"]["id"]), path, created=True)

    def _get(self, server: Server, path: str) -> list[dict[str, Any]]:
        try:
            response = self.http.get(f"{server.base_url}{path}", headers=_auth(server),
                                     timeout=_TIMEOUT)
            response.raise_for_status()
        except requests.RequestException as exc:
            raise GatewayError(f"the workspace's server did not answer {path}: {exc}") from exc
        return list(response.json())


def _auth(server: Server) -> dict[str, str]:
    return {"Authorization": f"token {server.token}"}
