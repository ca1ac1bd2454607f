"""A Kubernetes API for tests: kmock's ``KubernetesEmulator`` on a free loopback port,
driven over HTTP by the official ``kubernetes`` client.

kmock is asyncio; the client is synchronous. The emulator runs in its own thread with its
own event loop, and the tests talk to it like to any API server. The emulator is a JSON
store (create, merge-patch, delete, list, watch); it ignores label selectors and
resourceVersions and sets no uid or status, which is why the runtime and the monitor
check labels themselves and the tests play the kubelet and GKE's snapshot controller by
patching status.

One kmock 0.8 limitation is worked around here: its URL parser reads ``/api/v1/namespaces``
and ``/api/v1/namespaces/<name>`` as a namespace prefix rather than the Namespace resource,
so the core API's namespace calls are re-parsed (see ``_parse_path``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

RESOURCES = (
    "v1/namespaces", "v1/pods", "v1/services", "v1/secrets", "v1/configmaps",
    "v1/persistentvolumeclaims", "v1/serviceaccounts", "v1/resourcequotas",
    "networking.k8s.io/v1/networkpolicies", "rbac.authorization.k8s.io/v1/rolebindings",
    "podsnapshot.gke.io/v1/podsnapshotstorageconfigs", "podsnapshot.gke.io/v1/podsnapshotpolicies",
    "podsnapshot.gke.io/v1/podsnapshotmanualtriggers", "podsnapshot.gke.io/v1/podsnapshots",
    "jobset.x-k8s.io/v1alpha2/jobsets",
    # Kueue: the runtime's LocalQueues; Workloads a test writes as Kueue would
    "kueue.x-k8s.io/v1beta2/localqueues", "kueue.x-k8s.io/v1beta2/workloads",
    "networking.gke.io/v1alpha1/fqdnnetworkpolicies",
    # metrics-server's PodMetrics: a test plays metrics-server by writing them
    "metrics.k8s.io/v1beta1/pods",
)


def _install_namespace_fix() -> None:
    from kmock._internal import parsing

    if getattr(parsing.parse_path, "_stasis_fixed", False):
        return
    original = parsing.parse_path

    def _parse_path(path: str) -> Any:
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and (
                len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))):
            return parsing.ParsedPath(group="", version="v1", plural="namespaces",
                                      namespace=None,
                                      name=parts[3] if len(parts) > 3 else None,
                                      subresource=parts[4] if len(parts) > 4 else None)
        return original(path)

    _parse_path._stasis_fixed = True  # type: ignore[attr-defined]
    parsing.parse_path = _parse_path


class EmulatedCluster:
    """A running emulator: ``api_client`` for the official client, ``url``, ``emulator``."""

    def __init__(self) -> None:
        self.url = ""
        self.emulator: Any = None
        self.api_client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)

    def start(self) -> EmulatedCluster:
        _install_namespace_fix()
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the Kubernetes emulator did not start within 30 s")
        if self._error is not None:
            raise self._error
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        self.api_client = client.ApiClient(configuration)
        return self

    def stop(self) -> None:
        if self.api_client is not None:
            self.api_client.close()
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        import kmock

        async def serve() -> None:
            async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
                for resource in RESOURCES:
                    emulator.resources[resource] = {}
                self.emulator = emulator
                self.url = str(server.url).rstrip("/")
                self._stop = asyncio.Event()
                self._ready.set()
                await self._stop.wait()

        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()


@contextmanager
def emulated_cluster() -> Iterator[EmulatedCluster]:
    cluster = EmulatedCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()
