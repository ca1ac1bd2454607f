"""REST clients for one workspace's server: status, kernels and sessions.

``JupyterClient`` makes the few calls the agent needs of a Jupyter server, with the
server's token, timeouts, and no proxy (loopback never goes through one).
``CodeServerClient`` answers the same questions for a code-server workspace, which runs no
Jupyter kernels the agent can see: its snapshots are empty (the home directory is what
persists) and its activity comes from code-server's ``/healthz`` heartbeat. Every failure
is a ``JupyterError`` that says which call failed and what the server answered.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

DEFAULT_TIMEOUT = 30.0
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
    """Block until a newly started kernel answers ``kernel_info`` on its connection file.

    A kernel announces ``execution_state: starting`` on iopub when it comes up; a driver
    that connects before that would take it for a restart, so restores wait for this.
    """
    from jupyter_client.blocking.client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(connection_file))
    try:
        client.load_connection_file()
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        client.wait_for_ready(timeout=timeout)
    except RuntimeError as exc:
        raise JupyterError(f"the kernel of {connection_file} did not become ready: {exc}") from exc
    finally:
        client.stop_channels()


def connection_file(runtime_dir: Path, kernel_id: str) -> Path:
    """Where the server wrote a kernel's connection file (JUPYTER_RUNTIME_DIR)."""
    return Path(runtime_dir) / f"kernel-{kernel_id}.json"
