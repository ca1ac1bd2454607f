"""The one place that picks concrete adapters, lazily, from the environment.

Nothing here runs at import time: the first delivery builds the clients (cold start), and
they are reused by later deliveries in the same instance.

Environment: GOOGLE_CLOUD_PROJECT / STASIS_PROJECT, STASIS_SNAPSHOT_BUCKET,
STASIS_RUNTIME (``local``, the default, ``kubernetes`` with ``STASIS_K8S_*``, or ``null``
for control-plane tests and benchmarks),
STASIS_NODE_AGENT_URL (local runtime), and the emulator hosts on the local stack.
Chat: STASIS_SLACK_SIGNING_SECRET, STASIS_SLACK_BOT_TOKEN, STASIS_SLACK_API_URL
(``functions/adapters/slack.py``).
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from functools import cache
from typing import Any

from functions.delivery import deliver as _deliver
from functions.handlers.deps import Deps
from functions.routes import ROUTES

CATALOG_TTL_SECONDS = 10.0


def deliver(function: str, cloud_event: Any) -> None:
    route = ROUTES[function]
    _deliver(cloud_event, route.function, route.event, route.handler, deps())


def reconcile(request: Any) -> Any:
    """Scheduled repair of stuck transitions; answers the plan it carried out as JSON."""
    from functions.handlers.reconciler import reconcile as run
    from functions.handlers.reconciler import summary
    from functions.ports import RuntimeUnavailable

    try:
        return {"repairs": summary(run(deps(), fix=request.args.get("dry_run") is None))}
    except RuntimeUnavailable as exc:  # the next scheduled run tries again
        return {"error": f"the runtime did not answer: {exc}"}, 503


def project() -> str:
    return os.environ.get("STASIS_PROJECT") or os.environ.get("GOOGLE_CLOUD_PROJECT") or \
        "stasis-local"


@cache
def deps() -> Deps:
    from google.cloud import firestore

    from functions.adapters.firestore_store import FirestoreStore
    from functions.adapters.pubsub_bus import PubSubBus
    from functions.adapters.snapshots import SnapshotStore, storage_client

    db = firestore.Client(project=project())
    bus = PubSubBus(project())
    bucket = os.environ.get("STASIS_SNAPSHOT_BUCKET", "stasis-snapshots")
    return Deps(
        store=FirestoreStore(db),
        bus=bus,
        runtime=_runtime(bus),
        snapshots=SnapshotStore(db, storage_client(project()), bucket),
        catalog=_CatalogCache(db).get,
        clock=lambda: datetime.now(UTC),
        snapshot_bucket=bucket,
        dead_letters=bus,
        fleet=_fleet(db),
        chat=_chat_deps(db, bus),
        sandboxes=_sandbox_deps(db, bus),
        jobs=_job_store(db),
        job_runtime=_job_runtime(),
    )


def _job_store(db: Any) -> Any:
    from functions.adapters.job_store import FirestoreJobStore

    return FirestoreJobStore(db)


def _job_runtime() -> Any:
    """Where the control plane starts jobs: a JobSet per job on the Kubernetes runtime;
    none elsewhere (a local job is the submitting kernel's own children)."""
    if os.environ.get("STASIS_RUNTIME", "local") != "kubernetes":
        return None
    from functions.adapters.kubernetes_job_runtime import KubernetesJobRuntime

    # The catalog through deps(), called later (not while deps() is being built).
    return KubernetesJobRuntime.from_environment(catalog=lambda: deps().catalog())


def _sandbox_deps(db: Any, bus: Any) -> Any:
    """Agent sandboxes: their Firestore store and where they run (the node agent locally,
    Pods under gVisor on the Kubernetes runtime)."""
    from functions.adapters.sandbox_runtime import LocalSandboxRuntime, NullSandboxRuntime
    from functions.adapters.sandbox_store import FirestoreSandboxStore
    from functions.handlers.sandbox_ports import SandboxDeps

    kind = os.environ.get("STASIS_RUNTIME", "local")
    runtime: Any = NullSandboxRuntime(bus)
    if kind == "local":
        runtime = LocalSandboxRuntime(
            os.environ.get("STASIS_NODE_AGENT_URL", "http://127.0.0.1:8714"))
    elif kind == "kubernetes":
        from functions.adapters.kubernetes_sandbox_runtime import KubernetesSandboxRuntime

        runtime = KubernetesSandboxRuntime.from_environment(bus=bus, project=project())
    return SandboxDeps(store=FirestoreSandboxStore(db), runtime=runtime)


def _runtime(bus: Any) -> Any:
    kind = os.environ.get("STASIS_RUNTIME", "local")
    if kind == "null":
        from functions.adapters.null_runtime import NullRuntime

        return NullRuntime(bus)
    if kind == "local":
        from functions.adapters.local_runtime import LocalRuntime

        return LocalRuntime(os.environ.get("STASIS_NODE_AGENT_URL", "http://127.0.0.1:8714"))
    if kind == "kubernetes":
        from functions.adapters.kubernetes_runtime import KubernetesRuntime

        # The catalog through deps(), called later (not while deps() is being built).
        return KubernetesRuntime.from_environment(catalog=lambda: deps().catalog())
    raise ValueError(f"unknown STASIS_RUNTIME {kind!r} (expected local, kubernetes or null)")


class _CatalogCache:
    """The applied catalog (``catalog/current``), re-read at most every few seconds."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.lock = threading.Lock()
        self.value: Any = None
        self.read_at = 0.0

    def get(self) -> Any:
        from functions.domain.catalog import Catalog

        with self.lock:
            if self.value is None or time.monotonic() - self.read_at > CATALOG_TTL_SECONDS:
                snap = self.db.collection("catalog").document("current").get()
                self.value = (Catalog.from_config(snap.to_dict() or {}) if snap.exists
                              else Catalog(ides={}, environments={}, profiles={}, teams={}))
                self.read_at = time.monotonic()
            return self.value


# --- the chat front door ------------------------------------------------------------------
def chat(request: Any) -> Any:
    """The Slack ``/ws`` command (HTTP). Refuses to serve (503) without a signing secret.

    ``GET`` builds the app and its clients and makes one Firestore read, then answers 200:
    a warm-up (`stasis up`, a scheduler or min-instance probe) so that the first slash
    command after a cold start still acks within Slack's 3 seconds.
    """
    from functions.adapters.slack import ChatNotConfigured

    try:
        function = _chat_function()
    except ChatNotConfigured as exc:
        return {"error": str(exc)}, 503
    if request.method == "GET":
        deps().chat.records.recall("warm-up")
        return {"ok": True}
    return function.handle(request)


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
    return ChatDeps(reads=store, records=store, notifier=SlackNotifier(SlackSettings.from_env()),
                    bus=bus, catalog=_CatalogCache(db).get, clock=lambda: datetime.now(UTC))


# --- agent links: the access proxy and the link issuer (functions/proxy) -------------------
def proxy(request: Any) -> Any:
    """The access proxy for agent links (``functions/proxy/access.py``)."""
    return _links().proxy(request)


def links(request: Any) -> Any:
    """Create, list and revoke agent links (``functions/proxy/issuer.py``)."""
    return _links().issuer(request)


@cache
def _links() -> Any:
    from functions.proxy.wiring import build

    return build(deps())


# --- idle auto-pause, the janitor, the cost rollup (Cloud Scheduler; stasis idle/janitor/cost)
def idle_sweep(request: Any) -> Any:
    """Pause idle workspaces (``?dry_run=1``: only say which)."""
    from functions.handlers.idle import sweep

    return sweep(deps(), dry_run=request.args.get("dry_run") is not None)


def janitor(request: Any) -> Any:
    """Snapshot retention and orphans; ``?mode=report|policy|fix`` (default policy)."""
    from functions.handlers.janitor import MODES, run

    mode = request.args.get("mode", "policy")
    if mode not in MODES:
        return {"error": f"unknown mode {mode!r}: one of {', '.join(MODES)}"}, 400
    return run(deps(), mode=mode)


def cost_rollup(request: Any) -> Any:
    """Per-team cost rollups (``?team=T``; ``?dry_run=1``: computed, not written)."""
    from functions.handlers.cost import rollup

    try:
        return {"teams": rollup(deps(), team=request.args.get("team") or None,
                                write=request.args.get("dry_run") is None)}
    except ValueError as exc:
        return {"error": str(exc)}, 400


def _fleet(db: Any) -> Any:
    from functions.adapters.fleet_store import FleetStore

    return FleetStore(db)


# --- the admin dashboard (functions/dashboard): read-only, its own Firestore reads ----------
def dashboard(request: Any) -> Any:
    """The admin dashboard (HTML). Identity and admins: ``functions/dashboard/access.py``."""
    from functions.dashboard.web import handle

    return handle(request, _dashboard_deps(project()))


@cache
def _dashboard_deps(project_id: str) -> Any:
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
