"""REST clients for one workspace's server: status, kernels and sessions.

``JupyterClient`` makes the few calls the agent needs of a Jupyter server, with the
server's token, timeouts, and no proxy (loopback never goes through one).
``CodeServerClient`` answers the same questions for a code-server workspace, which runs no
Jupyter kernels the agent can see: its snapshots are empty (the home directory is what
persists) and its activity comes from code-server's ``/healthz`` heartbeat. Every failure
is a ``JupyterError`` that says which call failed and what the server answered.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

DEFAULT_TIMEOUT = 30.0
#: How long ``wait_kernel_ready`` waits for iopub after a ``kernel_info`` reply.
_IOPUB_PROBE = 0.05
#: jupyter-server counts every authenticated API request as the user's activity (its
#: ``last_activity``), except those asking ``no_track_activity``: the agent's own reads
#: must not make an idle workspace look active to the idle policy.
_UNTRACKED = {"no_track_activity": "1"}


class JupyterError(RuntimeError):
    """A call to a workspace's server failed."""


class JupyterClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()
        self._session.trust_env = False
        self._session.headers["Authorization"] = f"token {token}"

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> JupyterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> dict[str, Any]:
        """{"started", "last_activity", "connections", "kernels"}."""
        result: dict[str, Any] = self._call("GET", "/api/status")
        return result

    def kernels(self) -> list[dict[str, Any]]:
        """Running kernels: id, name (the kernelspec), execution_state, connections."""
        result: list[dict[str, Any]] = self._call("GET", "/api/kernels", params=_UNTRACKED)
        return result

    def sessions(self) -> list[dict[str, Any]]:
        """Sessions: id, path, name, type, kernel {id, name, ...}."""
        result: list[dict[str, Any]] = self._call("GET", "/api/sessions", params=_UNTRACKED)
        return result

    def start_kernel(self, kernelspec: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/kernels", json={"name": kernelspec})
        return result

    def create_session(self, *, path: str, name: str, type: str, kernel_id: str) -> dict[str, Any]:
        """A session for a notebook (or console, file) attached to an existing kernel, so a
        browser that reopens the notebook finds that kernel."""
        body = {"path": path, "name": name, "type": type, "kernel": {"id": kernel_id}}
        result: dict[str, Any] = self._call("POST", "/api/sessions", json=body)
        return result

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = self._session.request(method, url, timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise JupyterError(f"{method} {path} on the workspace's server failed: {exc}") from exc
        if response.status_code >= 400:
            raise JupyterError(
                f"{method} {path} on the workspace's server answered "
                f"{response.status_code}: {response.text[:500]}"
            )
        try:
            return response.json()
        except ValueError:
            raise JupyterError(
                f"{method} {path} answered non-JSON: {response.text[:200]}"
            ) from None


class CodeServerClient:
    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()
        self._session.trust_env = False

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> CodeServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> dict[str, Any]:
        """{"last_activity"} from code-server's last heartbeat (a browser tab sends them)."""
        try:
            response = self._session.get(f"{self.base_url}/healthz", timeout=self.timeout)
            response.raise_for_status()
            health = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise JupyterError(
                f"GET /healthz on the workspace's code-server failed: {exc}"
            ) from exc
        beat = health.get("lastHeartbeat")
        last = (
            datetime.fromtimestamp(beat / 1000, UTC).isoformat()
            if isinstance(beat, int | float) and beat > 0
            else None
        )
        return {"last_activity": last, "connections": 0, "status": health.get("status")}

    def kernels(self) -> list[dict[str, Any]]:
        return []

    def sessions(self) -> list[dict[str, Any]]:
        return []

    def start_kernel(self, kernelspec: str) -> dict[str, Any]:
        raise JupyterError("a vscode workspace runs no Jupyter server to start kernels in")

    def create_session(self, *, path: str, name: str, type: str, kernel_id: str) -> dict[str, Any]:
        raise JupyterError("a vscode workspace runs no Jupyter server to hold sessions")


def wait_kernel_ready(connection_file: Path, timeout: float) -> None:
    """Block until a newly started kernel answers ``kernel_info`` on its connection file,
    its iopub reaching this client too.

    A kernel announces ``execution_state: starting`` on iopub when it comes up; a driver
    that connects before that would take it for a restart, so restores wait for this.
    It is jupyter_client's ``wait_for_ready`` loop (``kernel_info`` until a reply comes
    and an iopub message follows) without its last step, which drains iopub until 0.2 s
    pass without a message: at least 0.2 s of every resume, for a client that is closed
    right after (the driver connects its own). The iopub probe waits ``_IOPUB_PROBE``, not
    0.2 s: the reply's busy/idle follow it within milliseconds once iopub is connected,
    and a kernel whose iopub is not yet connected is asked again sooner.
    """
    from queue import Empty

    import zmq
    from jupyter_client.blocking.client import BlockingKernelClient

    # Its sockets retry a refused connection every 10 ms, not zmq's 100 ms: the kernel
    # binds tens of milliseconds after it was started, and each retry it missed cost 0.1 s
    # more (0.39 s from a warm kernel's claim to ready, 0.05 s with this).
    context = zmq.Context()
    context.setsockopt(zmq.RECONNECT_IVL, 10)
    context.setsockopt(zmq.LINGER, 0)
    client = BlockingKernelClient(connection_file=str(connection_file), context=context)
    until = time.monotonic() + timeout
    try:
        client.load_connection_file()
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        while True:
            client.kernel_info()
            try:
                reply = client.get_shell_msg(timeout=1)
            except Empty:
                reply = None
            if reply is not None and reply["msg_type"] == "kernel_info_reply":
                try:
                    client.get_iopub_msg(timeout=_IOPUB_PROBE)
                    return
                except Empty:
                    pass  # iopub not connected yet: ask again
            if time.monotonic() > until:
                raise JupyterError(f"the kernel of {connection_file} did not become ready "
                                   f"within {timeout:g}s")
    finally:
        client.stop_channels()
        context.term()


def connection_file(runtime_dir: Path, kernel_id: str) -> Path:
    """Where the server wrote a kernel's connection file (JUPYTER_RUNTIME_DIR)."""
    return Path(runtime_dir) / f"kernel-{kernel_id}.json"
