"""Where sandboxes run: the local node agent, or nowhere (the null runtime).

``LocalSandboxRuntime`` is the control plane's client of the node agent's sandbox
endpoints (``runtime.local.sandboxes``), with the error semantics of the Runtime port: the
agent unreachable, busy or failing raises ``RuntimeUnavailable`` (the event is retried); a
refusal (400, 404, 409) raises ``RuntimeRefused`` with the agent's message.

The Kubernetes side (a Pod under gVisor, a default-deny NetworkPolicy, no service-account
token) has its manifests in ``functions.kubernetes.objects.sandbox``; applying them is the
Kubernetes runtime adapter's job and is not done here.
"""

from __future__ import annotations

from typing import Any

import requests

from events import SandboxFinished, new_event
from functions.adapters.local_runtime import DEFAULT_TIMEOUT, _message, agent_session
from functions.domain.sandboxes import RunSpec
from functions.ports import Bus, RuntimeRefused, RuntimeUnavailable


class LocalSandboxRuntime:
    name = "local"

    def __init__(self, base_url: str, *, timeout: tuple[float, float] = DEFAULT_TIMEOUT,
                 session: requests.Session | None = None, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = agent_session(token, session)

    def start(self, spec: RunSpec) -> None:
        self._call("PUT", f"/sandboxes/{spec.sandbox_id}", json=spec.to_json())

    def resume(self, spec: RunSpec) -> None:
        self._call("POST", f"/sandboxes/{spec.sandbox_id}/resume")

    def cancel(self, sandbox_id: str) -> None:
        self._call("DELETE", f"/sandboxes/{sandbox_id}")

    def cleanup(self, sandbox_id: str, *, team: str) -> None:
        return None  # the monitor exits with the task; the working copy stays for `show`

    def release(self, sandbox_id: str, *, team: str) -> None:
        return None  # a frozen task already gave its CPU back; its memory stays resident

    def suspend(self, sandbox_id: str, *, team: str, sequence: int, idle_seconds: int) -> None:
        # The node agent's monitor measures idleness and freezes the task itself, so
        # nothing local reports sandbox.idle_detected; a command that reaches this runtime
        # anyway is refused (and logged) rather than silently taken for done.
        raise RuntimeRefused(f"the local runtime suspends idle sandboxes by itself; "
                             f"sandbox {sandbox_id} was not suspended on command")

    def status(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = self._call("GET", f"/sandboxes/{sandbox_id}")
        except RuntimeRefused:
            return None
        return result

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._session.request(method, f"{self.base_url}{path}",
                                             timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise RuntimeUnavailable(
                f"node agent at {self.base_url} unreachable: {method} {path}: {exc}") from exc
        if response.status_code in (400, 404, 409):
            raise RuntimeRefused(_message(response))
        if response.status_code >= 400:
            raise RuntimeUnavailable(f"node agent: {method} {path} answered "
                                     f"{response.status_code}: {_message(response)}")
        try:
            return response.json()
        except ValueError:
            raise RuntimeUnavailable(f"node agent: {method} {path} answered non-JSON: "
                                     f"{response.text[:200]}") from None


class NullSandboxRuntime:
    """Runs nothing: every admitted sandbox is reported as failed to start, saying why
    (control-plane tests and benchmarks run without a node agent)."""

    name = "null"

    def __init__(self, bus: Bus,
                 reason: str = "the null runtime runs no sandboxes (STASIS_RUNTIME=null)"
                 ) -> None:
        self.bus = bus
        self.reason = reason

    def start(self, spec: RunSpec) -> None:
        self.bus.publish(new_event(
            SandboxFinished(spec.sandbox_id, False, termination="failed_to_start",
                            error=self.reason, network="none: nothing ran"),
            source="//stasis/runtime/null", requestid=spec.requestid))

    def resume(self, spec: RunSpec) -> None:
        """Nothing runs here, so nothing can be resumed: answered like ``start``."""
        self.start(spec)

    def cancel(self, sandbox_id: str) -> None:
        return None

    def cleanup(self, sandbox_id: str, *, team: str) -> None:
        return None

    def release(self, sandbox_id: str, *, team: str) -> None:
        return None

    def suspend(self, sandbox_id: str, *, team: str, sequence: int, idle_seconds: int) -> None:
        raise RuntimeRefused(f"{self.reason}: nothing to suspend")
