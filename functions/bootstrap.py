"""The one place that picks concrete adapters, lazily, from the environment.

Nothing here runs at import time: the first delivery builds the clients (cold start), and
they are reused by later deliveries in the same instance.

Environment: GOOGLE_CLOUD_PROJECT / STASIS_PROJECT, STASIS_SNAPSHOT_BUCKET,
STASIS_RUNTIME (``local``, the default, or ``null`` for control-plane tests and benchmarks),
STASIS_NODE_AGENT_URL (local runtime), and the emulator hosts on the local stack.
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

    return {"repairs": summary(run(deps(), fix=request.args.get("dry_run") is None))}


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
    )


def _runtime(bus: Any) -> Any:
    kind = os.environ.get("STASIS_RUNTIME", "local")
    if kind == "null":
        from functions.adapters.null_runtime import NullRuntime

        return NullRuntime(bus)
    if kind == "local":
        from functions.adapters.local_runtime import LocalRuntime

        return LocalRuntime(os.environ.get("STASIS_NODE_AGENT_URL", "http://127.0.0.1:8714"))
    raise ValueError(f"unknown STASIS_RUNTIME {kind!r} (expected local or null)")


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
