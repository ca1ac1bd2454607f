"""The one place that picks concrete adapters, lazily, from the environment.

Nothing here runs at import time: the first delivery or request builds the clients (cold
start), and they are reused by later ones in the same instance; a host that starts its
instances ahead of their first delivery calls :func:`warm` in each (the local stack's
function host does, ``stack.host``). ``deliver`` and ``serve`` only look the function up
in ``functions/routes.py`` and hand its handler what it needs:
the control plane's ``Deps`` (event functions, and HTTP functions by default), or the
front door's dependencies its HTTP route names (:data:`_PROVIDERS`).

Environment: GOOGLE_CLOUD_PROJECT / STASIS_PROJECT, STASIS_SNAPSHOT_BUCKET,
STASIS_RUNTIME (``local``, the default, ``kubernetes`` with ``STASIS_K8S_*``, or ``null``
for control-plane tests and benchmarks), STASIS_NULL_RUNTIME_MATCH (benchmarks: the
workspace ids matching this pattern run on the null runtime beside that one),
STASIS_NODE_AGENT_URL and STASIS_NODE_AGENT_TOKEN (local runtime: the agent answers only
that credential), and the emulator hosts on the local stack.
STASIS_IDE_PROXY_URL (a running workspace's url is its IDE there, ``/w/<id>/``).
Chat: STASIS_SLACK_SIGNING_SECRET, STASIS_SLACK_BOT_TOKEN, STASIS_SLACK_API_URL
(``functions/adapters/slack.py``). The Alertmanager webhook: STASIS_ALERTMANAGER_TOKEN.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from functions.delivery import deliver as _deliver
from functions.delivery import deliver_raw as _deliver_raw
from functions.handlers.deps import Deps
from functions.origin import current, enter
from functions.routes import HTTP_FUNCTIONS, PUBLISHERS, ROUTES, Raw, Route

if TYPE_CHECKING:  # the front doors' modules are imported on their first request
    from functions.chatops.web import ChatFront
    from functions.dashboard.web import WebDeps
    from functions.handlers.monitoring import Relay
    from functions.portal.ports import PortalDeps
    from functions.proxy.wiring import Wiring

CATALOG_TTL_SECONDS = 10.0
#: The least time between two reads that a handler asks for (``_CatalogCache.refresh``).
CATALOG_REFRESH_SECONDS = 1.0


def deliver(function: str, cloud_event: Any) -> None:
    """Run the event function ``function`` on one delivery, under the delivery guard (which
    takes the event only from a component that may send it), as ``function``: the origin
    of what it publishes."""
    route = ROUTES[function]
    enter(function)
    if isinstance(route, Raw):
        _deliver_raw(cloud_event, route.function, route.handler, deps())
        return
    _deliver(cloud_event, route.function, route.event, route.handler, deps(),
             senders=PUBLISHERS.get(route.event, frozenset()))


def serve(function: str, request: Any) -> Any:
    """Answer one request of the HTTP function ``function``, as ``function`` (its streamed
    body too, which runs after this returns: ``functions.origin``)."""
    route = HTTP_FUNCTIONS[function]
    enter(function)
    return route.load()(request, _PROVIDERS[route.deps]())


def project() -> str:
    return os.environ.get("STASIS_PROJECT") or os.environ.get("GOOGLE_CLOUD_PROJECT") or \
        "stasis-local"


def database() -> Any:
    """The project's Firestore client (the functions' and the IDE proxy's)."""
    from google.cloud import firestore

    return firestore.Client(project=project())


@cache
def deps() -> Deps:
    from functions.adapters.firestore_store import FirestoreStore
    from functions.adapters.pubsub_bus import PubSubBus
    from functions.adapters.snapshots import SnapshotStore, storage_client

    db = database()
    bus = PubSubBus(project(), origin=current)  # shared by the functions one host serves
    bucket = os.environ.get("STASIS_SNAPSHOT_BUCKET", "stasis-snapshots")
    catalogs = _CatalogCache(db)
    return Deps(
        store=FirestoreStore(db),
        bus=bus,
        runtime=runtime_for(bus),
        snapshots=SnapshotStore(db, storage_client(project()), bucket),
        catalog=catalogs.get,
        refresh_catalog=catalogs.refresh,
        clock=lambda: datetime.now(UTC),
        snapshot_bucket=bucket,
        dead_letters=bus,
        fleet=_fleet(db),
        chat=_chat_deps(db, bus),
        sandboxes=_sandbox_deps(db, bus),
        jobs=_job_store(db),
        job_runtime=_job_runtime(),
        ide_proxy_url=os.environ.get("STASIS_IDE_PROXY_URL") or None,
        workspace_tokens=_workspace_tokens(),
        consumers={name: route.handler for name, route in ROUTES.items()
                   if isinstance(route, Route)},
    )


def warm() -> None:
    """Build this instance's clients and open its Firestore channel now, before its first
    delivery (the first workspace after a start reached RUNNING about 0.2 s sooner with
    it on this machine). Best effort: a read that fails is logged, and the first delivery
    meets it again with its reason."""
    import logging

    control = deps()
    try:
        control.catalog()
    except Exception as exc:  # a warm-up must not stop the instance starting
        logging.getLogger(__name__).warning("warm-up: the catalog read failed: %s", exc)


def _workspace_tokens() -> Any:
    """The cluster's token verifier where workspaces run on Kubernetes
    (``STASIS_WORKSPACE_ISSUER``: the cluster's OIDC issuer)."""
    issuer = os.environ.get("STASIS_WORKSPACE_ISSUER")
    if not issuer:
        return None
    from functions.adapters.kubernetes_tokens import KubernetesTokens

    return KubernetesTokens(issuer, os.environ.get("STASIS_K8S_WORKSPACE_AUDIENCE")
                            or "stasis-workspace",
                            jwks_url=os.environ.get("STASIS_WORKSPACE_JWKS_URL") or None)


def _fleet(db: Any) -> Any:
    from functions.adapters.fleet_store import FleetStore

    return FleetStore(db)


def _job_store(db: Any) -> Any:
    from functions.adapters.job_store import FirestoreJobStore

    return FirestoreJobStore(db)


def _job_runtime() -> Any:
    """Where the control plane starts jobs: a JobSet per job on the Kubernetes runtime;
    none elsewhere (a local job is the submitting kernel's own children)."""
    if os.environ.get("STASIS_RUNTIME", "local") != "kubernetes":
        return None
    from functions.kubernetes.jobs import KubernetesJobRuntime

    # The catalog through deps(), called later (not while deps() is being built).
    return KubernetesJobRuntime.from_environment(catalog=lambda: deps().catalog())


def _sandbox_deps(db: Any, bus: Any) -> Any:
    """Agent sandboxes: their Firestore store and where they run (the node agent locally,
    Pods under gVisor on the Kubernetes runtime)."""
    from functions.adapters.sandbox_runtime import LocalSandboxRuntime, NullSandboxRuntime
    from functions.adapters.sandbox_store import FirestoreSandboxStore
    from functions.handlers.sandbox_ports import SandboxDeps

    kind = os.environ.get("STASIS_RUNTIME", "local")
    runtime: Any = NullSandboxRuntime(_null_runtime_bus())
    if kind == "local":
        runtime = LocalSandboxRuntime(**_node_agent())
    elif kind == "kubernetes":
        from functions.kubernetes.sandboxes import KubernetesSandboxRuntime

        runtime = KubernetesSandboxRuntime.from_environment(bus=bus, project=project())
    return SandboxDeps(store=FirestoreSandboxStore(db), runtime=runtime)


def _node_agent() -> dict[str, Any]:
    """The node agent's URL and the control plane's credential for it."""
    return {"base_url": os.environ.get("STASIS_NODE_AGENT_URL", "http://127.0.0.1:8714"),
            "token": os.environ.get("STASIS_NODE_AGENT_TOKEN") or None}


@cache
def _null_runtime_bus() -> Any:
    """The null runtime stands in for a runtime: what it reports is a runtime's outcome,
    published as its own component (``functions.domain.publishers.NULL_RUNTIME``), not as
    the function that asked it."""
    from functions.adapters.pubsub_bus import PubSubBus
    from functions.domain.publishers import NULL_RUNTIME

    return PubSubBus(project(), origin=NULL_RUNTIME)


def runtime_for(bus: Any) -> Any:
    """The runtime of ``STASIS_RUNTIME`` (the functions and the IDE proxy use it); with
    ``STASIS_NULL_RUNTIME_MATCH`` (benchmarks), the workspaces whose id matches that
    pattern run on the null runtime beside it (``functions.adapters.split_runtime``)."""
    kind = os.environ.get("STASIS_RUNTIME", "local")
    match = os.environ.get("STASIS_NULL_RUNTIME_MATCH")
    if match and kind != "null":
        from functions.adapters.split_runtime import SplitRuntime

        return SplitRuntime(_runtime_of(kind), _null_runtime(), match)
    return _runtime_of(kind)


def _null_runtime() -> Any:
    from functions.adapters.null_runtime import NullRuntime

    # Every instance of the function host sees the same (pretend) node.
    data_dir = os.environ.get("STASIS_DATA_DIR")
    return NullRuntime(_null_runtime_bus(), state_file=Path(data_dir) / "null-runtime.sqlite"
                       if data_dir else None)


def _runtime_of(kind: str) -> Any:
    if kind == "null":
        return _null_runtime()
    if kind == "local":
        from functions.adapters.local_runtime import LocalRuntime

        return LocalRuntime(**_node_agent())
    if kind == "kubernetes":
        from functions.kubernetes.workspaces import KubernetesRuntime

        # The catalog through deps(), called later (not while deps() is being built).
        return KubernetesRuntime.from_environment(catalog=lambda: deps().catalog())
    raise ValueError(f"unknown STASIS_RUNTIME {kind!r} (expected local, kubernetes or null)")


class _CatalogCache:
    """The applied catalog (``catalog/current``), re-read at most every few seconds; none
    applied yet is not kept (an instance warmed before the stack was seeded reads again).

    ``refresh`` reads it now for a handler whose cached copy lacks what an event names
    (``functions.ports.catalog_knowing``), but not more than once a second: a
    stream of requests for a profile that does not exist costs one read a second.
    """

    def __init__(self, db: Any) -> None:
        self.db = db
        self.lock = threading.Lock()
        self.value: Any = None
        self.read_at = 0.0

    def get(self) -> Any:
        return self._read_if_older(CATALOG_TTL_SECONDS)

    def refresh(self) -> Any:
        return self._read_if_older(CATALOG_REFRESH_SECONDS)

    def _read_if_older(self, seconds: float) -> Any:
        from functions.domain.catalog import Catalog

        with self.lock:
            if self.value is None or time.monotonic() - self.read_at > seconds:
                snap = self.db.collection("catalog").document("current").get()
                if not snap.exists:  # nothing applied yet (a stack being seeded): not kept
                    return Catalog(ides={}, environments={}, profiles={}, teams={})
                self.value = Catalog.from_config(snap.to_dict() or {})
                self.read_at = time.monotonic()
            return self.value


# --- the chat front door ------------------------------------------------------------------
def _chat() -> ChatFront:
    """The Slack app, or why there is none (built again on the next request: a secret set
    since is picked up)."""
    from functions.adapters.slack import ChatNotConfigured
    from functions.chatops.web import ChatFront

    def warm_up() -> Any:
        return deps().chat.records.recall("warm-up")

    try:
        return ChatFront(_chat_function().handle, warm_up)
    except ChatNotConfigured as exc:
        return ChatFront(None, warm_up, problem=str(exc))


@cache
def _chat_function() -> Any:
    from functions.adapters.slack import ChatFunction, SlackSettings
    from functions.chatops.service import answer

    chat_deps = deps().chat
    return ChatFunction(SlackSettings.from_env(), lambda req: answer(req, chat_deps))


def _chat_deps(db: Any, bus: Any) -> Any:
    """Chat's ports: its Firestore records and reads, Slack (SDKs imported on first use)."""
    from functions.adapters.chat_store import ChatStore
    from functions.adapters.slack import SlackNotifier, SlackSettings
    from functions.chatops.ports import ChatDeps

    store = ChatStore(db)
    catalogs = _CatalogCache(db)
    return ChatDeps(reads=store, records=store, notifier=SlackNotifier(SlackSettings.from_env()),
                    bus=bus, catalog=catalogs.get, refresh_catalog=catalogs.refresh,
                    clock=lambda: datetime.now(UTC))


# --- agent links: the access proxy and the link issuer (functions/proxy) -------------------
@cache
def _links() -> Wiring:
    from functions.proxy.wiring import build

    return build(deps())


# --- the admin dashboard (functions/dashboard): read-only, its own Firestore reads ----------
def _dashboard() -> WebDeps:
    return _dashboard_deps(project())


@cache
def _dashboard_deps(project_id: str) -> WebDeps:
    # Keyed by project: nothing but a Firestore client is built (no bus, no runtime).
    from google.cloud import firestore

    from functions.adapters.dashboard_reader import FirestoreReader
    from functions.adapters.iap import IapIdentity
    from functions.dashboard.web import WebDeps

    db = firestore.Client(project=project_id)

    @cache
    def iap(audience: str, certs_url: str) -> Any:
        return IapIdentity(audience, certs_url=certs_url)

    return WebDeps(reader=lambda: FirestoreReader(db), clock=lambda: datetime.now(UTC), iap=iap)


# --- the researcher's portal (functions/portal): the control plane's bus and runtime ------
@cache
def _portal() -> PortalDeps:
    from functions.adapters.portal_store import FirestorePortalStore
    from functions.adapters.snapshots import storage_client
    from functions.portal.ports import PortalDeps

    control = deps()
    iap = _dashboard_deps(project()).iap
    return PortalDeps(store=FirestorePortalStore(control.store.db,
                                                 lambda: storage_client(project())),
                      bus=control.bus, runtime=control.runtime, catalog=control.catalog,
                      refresh_catalog=control.refresh_catalog, clock=control.clock,
                      links=lambda: _links().issuer, iap=iap)


# --- the Alertmanager webhook (functions/handlers/monitoring.py): a token and the topic ----
@cache
def _monitoring_relay() -> Relay:
    from functions.adapters.pubsub_bus import PubSubBus
    from functions.handlers.monitoring import TOPIC, Relay

    # only a publisher (to the raw monitoring topic): no Firestore client, no runtime
    bus = PubSubBus(project(), origin=current)
    return Relay(os.environ.get("STASIS_ALERTMANAGER_TOKEN"),
                 lambda body: bus.publish_raw(TOPIC, body, {}))


#: What each HTTP function's handler is given, by the ``deps`` its route names.
_PROVIDERS: dict[str, Callable[[], Any]] = {
    "control_plane": deps,
    "chat": _chat,
    "links": _links,
    "dashboard": _dashboard,
    "portal": _portal,
    "monitoring_relay": _monitoring_relay,
}
