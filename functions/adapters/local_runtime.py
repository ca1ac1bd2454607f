"""The local runtime: the control plane's client of the node agent (``runtime.local``).

Implements the Runtime port over the agent's HTTP API with ``requests``. Error semantics
follow the port: the agent unreachable, timing out, busy (503) or failing (5xx) raises
``RuntimeUnavailable`` (temporary: the event is redelivered); a refusal (409, e.g. a GPU
profile on a host without one) or a request the agent calls malformed (400) raises
``RuntimeRefused`` with the agent's message (permanent: retrying cannot help). Every call
carries the control plane's credential (``token``, STASIS_NODE_AGENT_TOKEN): the agent
answers nobody else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

from functions.ports import RuntimeRefused, RuntimeStatus, RuntimeUnavailable, WorkspaceSpec

DEFAULT_TIMEOUT = (3.05, 30.0)  # connect, read
# release and destroy stop a server and its kernels synchronously (grace period + kill).
STOP_TIMEOUT = (3.05, 90.0)


def spec_to_json(spec: WorkspaceSpec) -> dict[str, Any]:
    """The WorkspaceSpec as the agent's JSON body (mappings become plain dicts)."""
    return {
        "workspace_id": spec.workspace_id,
        "team": spec.team,
        "owner": spec.owner,
        "name": spec.name,
        "ide": spec.ide,
        "environment": _plain(spec.environment),
        "profile": _plain(spec.profile),
        "snapshot_bucket": spec.snapshot_bucket,
        "snapshot_prefix": spec.snapshot_prefix,
        "requestid": spec.requestid,
        "extra": _plain(spec.extra),
    }


def agent_session(token: str | None, session: requests.Session | None = None
                  ) -> requests.Session:
    """A session for the node agent: its credential on every request, no proxy (the agent
    is on loopback: a proxy from the environment must not intercept it)."""
    session = session or requests.Session()
    session.trust_env = False
    if token:
        session.headers["Authorization"] = f"Bearer {token}"
    return session


class LocalRuntime:
    name = "local"

    def __init__(
        self,
        base_url: str,
        *,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        stop_timeout: tuple[float, float] = STOP_TIMEOUT,
        session: requests.Session | None = None,
        token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.stop_timeout = stop_timeout
        self._session = agent_session(token, session)

    def capabilities(self) -> Mapping[str, Any]:
        result: Mapping[str, Any] = self._call("GET", "/capabilities")
        return result

    def provision(self, spec: WorkspaceSpec) -> None:
        self._call("PUT", f"/workspaces/{spec.workspace_id}", json=spec_to_json(spec))

    def snapshot(self, spec: WorkspaceSpec, snapshot_id: str, *, base: str | None = None,
                 base_manifest_sha256: str | None = None) -> None:
        body: dict[str, Any] = {
            "snapshot_id": snapshot_id,
            "bucket": spec.snapshot_bucket,
            "prefix": spec.snapshot_path(snapshot_id),
            "requestid": spec.requestid,
        }
        if base is not None:
            body["base"] = {"snapshot_id": base, "prefix": spec.snapshot_path(base),
                            "manifest_sha256": base_manifest_sha256}
        self._call("POST", f"/workspaces/{spec.workspace_id}/snapshot", json=body)

    def restore(self, spec: WorkspaceSpec, snapshot_id: str, *,
                manifest_sha256: str | None = None,
                device_arrays_to_cpu: bool = False) -> None:
        self._call(
            "POST",
            f"/workspaces/{spec.workspace_id}/restore",
            json={
                "snapshot_id": snapshot_id,
                "bucket": spec.snapshot_bucket,
                "prefix": spec.snapshot_path(snapshot_id),
                "manifest_sha256": manifest_sha256,
                "device_arrays_to_cpu": device_arrays_to_cpu,
                "spec": spec_to_json(spec),
                "requestid": spec.requestid,
            },
        )

    def release(self, workspace_id: str) -> None:
        self._call("POST", f"/workspaces/{workspace_id}/release", timeout=self.stop_timeout)

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None:
        self._call(
            "DELETE",
            f"/workspaces/{workspace_id}",
            params={"keep_home": "true" if keep_home else "false"},
            timeout=self.stop_timeout,
        )

    def status(self, workspace_id: str) -> RuntimeStatus | None:
        data = self._call("GET", f"/workspaces/{workspace_id}", missing_ok=True)
        return None if data is None else _status(data)

    def list(self) -> list[RuntimeStatus]:
        data = self._call("GET", "/workspaces")
        return [_status(item) for item in data.get("workspaces", [])]

    def progress(self, workspace_id: str) -> Mapping[str, Any] | None:
        """The node agent's report on the operation in flight (``GET
        /workspaces/<id>/progress``); None when it knows no such workspace or nothing is in
        flight."""
        result: Mapping[str, Any] | None = self._call(
            "GET", f"/workspaces/{workspace_id}/progress", missing_ok=True)
        return result if result and result.get("phase") else None

    def activity(self, workspace_id: str) -> Mapping[str, Any] | None:
        """Activity signals of a running workspace (not part of the port; for the idle
        policy): last_activity, busy_kernels, connections. None if it is not running."""
        try:
            result: Mapping[str, Any] | None = self._call(
                "GET", f"/workspaces/{workspace_id}/activity", missing_ok=True
            )
        except RuntimeRefused:
            return None
        return result

    def _call(
        self,
        method: str,
        path: str,
        *,
        missing_ok: bool = False,
        timeout: tuple[float, float] | None = None,
        **kwargs: Any,
    ) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = self._session.request(method, url, timeout=timeout or self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise RuntimeUnavailable(
                f"node agent at {self.base_url} unreachable: {method} {path}: {exc}"
            ) from exc
        if missing_ok and response.status_code == 404:
            return None
        if response.status_code in (400, 404, 409):
            raise RuntimeRefused(_message(response))
        if response.status_code >= 400:
            raise RuntimeUnavailable(
                f"node agent: {method} {path} answered {response.status_code}: {_message(response)}"
            )
        try:
            return response.json()
        except ValueError:
            raise RuntimeUnavailable(
                f"node agent: {method} {path} answered non-JSON: {response.text[:200]}"
            ) from None


def _status(data: Mapping[str, Any]) -> RuntimeStatus:
    keys = ("workspace_id", "running", "operation", "url", "token")
    return RuntimeStatus(
        workspace_id=str(data["workspace_id"]),
        running=bool(data.get("running")),
        operation=data.get("operation"),
        url=data.get("url"),
        token=data.get("token"),
        detail={k: v for k, v in data.items() if k not in keys},
    )


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or f"HTTP {response.status_code}"
    if isinstance(body, Mapping) and body.get("error"):
        return str(body["error"])
    return str(body)[:500]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
