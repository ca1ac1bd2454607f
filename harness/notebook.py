"""Drive a workspace's JupyterLab the way a browser does: REST for sessions, the kernel
websocket for code. Only the URL and the token are needed (no access to the host).

Used by the demo, the benchmarks and the end-to-end tests. The Jupyter messaging protocol
over the websocket is plain JSON (``/api/kernels/<id>/channels``); websocket-client carries it.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import requests
import websocket


class CellError(RuntimeError):
    """A cell raised; the message is the kernel's ``ename: evalue``."""


@dataclass
class CellResult:
    status: str
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    outputs: list[dict[str, Any]] = field(default_factory=list)


class Notebook:
    def __init__(self, base_url: str, token: str) -> None:
        self.base = base_url.rstrip("/").removesuffix("/lab")
        self.token = token
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {token}"

    def open(self, path: str, kernel: str = "python3") -> str:
        """Open (or re-attach to) the notebook's session, as JupyterLab does; the kernel id."""
        for session in self.sessions():
            if session["path"] == path:
                return str(session["kernel"]["id"])
        response = self.http.post(f"{self.base}/api/sessions", timeout=60, json={
            "path": path, "name": path, "type": "notebook", "kernel": {"name": kernel}})
        response.raise_for_status()
        return str(response.json()["kernel"]["id"])

    def sessions(self) -> list[dict[str, Any]]:
        response = self.http.get(f"{self.base}/api/sessions", timeout=30)
        response.raise_for_status()
        return list(response.json())

    def run(self, kernel_id: str, code: str, *, timeout: float = 600) -> CellResult:
        """Execute ``code`` in the kernel; raises CellError if the cell fails."""
        ws_url = self.base.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
        conn = websocket.create_connection(
            f"{ws_url}?session_id={uuid.uuid4().hex}",
            header=[f"Authorization: token {self.token}"], timeout=timeout)
        msg_id = uuid.uuid4().hex
        started = time.monotonic()
        try:
            conn.send(json.dumps({
                "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "stasis",
                           "session": uuid.uuid4().hex, "version": "5.3"},
                "parent_header": {}, "metadata": {}, "channel": "shell",
                "content": {"code": code, "silent": False, "store_history": True,
                            "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
            }))
            result = CellResult(status="unknown")
            reply, idle = False, False
            while not (reply and idle):
                message = json.loads(conn.recv())
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = message["msg_type"], message["content"]
                if kind == "stream":
                    if content["name"] == "stdout":
                        result.stdout += content["text"]
                    else:
                        result.stderr += content["text"]
                elif kind in ("execute_result", "display_data", "error"):
                    result.outputs.append(content)
                elif kind == "execute_reply":
                    result.status = content["status"]
                    reply = True
                    if content["status"] == "error":
                        raise CellError(f"{content['ename']}: {content['evalue']}")
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
        finally:
            conn.close()
        result.seconds = time.monotonic() - started
        return result
