"""Pod Snapshots governed like any snapshot, against kmock (the Kubernetes API) and
fake-gcs-server seeded in the layout GKE documents: the team's PodSnapshotStorageConfig
points GKE at ``snapshots/<team>/pod``, and each PodSnapshot's objects are under its own
directory there, its ``status.storageStatus.gcs.observedGCSPath`` (the file names inside
are GKE's own and not documented; only the directory is).

The monitor reports the pause with the bytes of those objects; the record points at them;
the janitor's view of the bucket sees them as that record's (not as orphans of a workspace
named ``pod``), finds a directory nobody records, and expiring the record deletes its
objects and, through the API, the PodSnapshot and its trigger."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from google.cloud import storage
from k8s_emulator import EmulatedCluster, emulated_cluster
from store_fakes import MemoryDb, MemoryFleet, MemoryStore
from test_kubernetes_runtime import (
    CATALOG,
    FakeSidecars,
    custom,
    gke_completes_snapshot,
    kubelet_ready,
    read,
    spec_for,
)

from events import SnapshotExpired, new_event
from functions.adapters.snapshots import SnapshotStore, storage_client
from functions.domain import admission, retention
from functions.domain.lifecycle import State, Workspace
from functions.handlers import janitor
from functions.handlers.deps import Deps
from functions.kubernetes.objects.podsnapshot import snapshot_storage_config
from functions.kubernetes.objects.snapshot import snapshot_object_name
from functions.kubernetes.objects.workspace import workspace_names
from functions.kubernetes.workspaces import KubernetesRuntime
from runtime.kubernetes.cluster import KubeCluster
from runtime.kubernetes.monitor import Monitor
from runtime.local.publisher import RecordingPublisher
from runtime.snapshot.storage import ObjectStore
from stack import topology

GROUP, VERSION = "podsnapshot.gke.io", "v1"


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    with emulated_cluster() as running:
        yield running


def seed(gcs: storage.Client, bucket: str, prefix: str, sizes: dict[str, int]) -> int:
    for name, size in sizes.items():
        gcs.bucket(bucket).blob(prefix + name).upload_from_string(b"\0" * size)
    return sum(sizes.values())


def test_a_pod_snapshot_is_measured_recorded_kept_and_deleted_where_gke_wrote_it(
        cluster: EmulatedCluster, emulator_env: dict[str, str]) -> None:
    project, bucket = emulator_env["STASIS_PROJECT"], "stasis-snapshots"
    topology.ensure_bucket(project, bucket)
    gcs = storage_client(project)
    runtime = KubernetesRuntime(cluster.api_client, catalog=lambda: CATALOG,
                                token_factory=lambda: "t0k3n")
    spec = spec_for(f"nb{uuid.uuid4().hex[:6]}", "gpu-small")
    runtime.provision(spec)
    kubelet_ready(cluster, spec)
    snapshot_id = f"{spec.workspace_id}-v3"
    runtime.snapshot(spec, snapshot_id)
    # GKE writes under the storage config's path: snapshots/<team>/pod/<its directory>/
    config = snapshot_storage_config("ml-a", bucket, team_prefix="snapshots/ml-a")
    assert config["spec"]["snapshotStorageConfig"]["gcs"]["path"] == "snapshots/ml-a/pod"
    ps_name = gke_completes_snapshot(cluster, spec, snapshot_id)
    directory = f"snapshots/ml-a/pod/{ps_name}/"
    size = seed(gcs, bucket, directory, {"checkpoint/pages-0.img": 3000,
                                         "checkpoint/pages-1.img": 2000, "pod.json": 120})
    bus = RecordingPublisher()
    monitor = Monitor(KubeCluster(cluster.api_client), bus, FakeSidecars(),
                      objects=ObjectStore(emulator_host=emulator_env["STORAGE_EMULATOR_HOST"]))
    monitor.sync()
    [finished] = [e.payload for e in bus.events if e.name == "snapshot.finished"]
    assert (finished.succeeded, finished.method, finished.bytes) == (True, "pod", size)
    assert finished.uri == f"gs://{bucket}/{directory.rstrip('/')}"

    # the record, as the lifecycle writes it, points at GKE's objects
    now = datetime.now(UTC)
    ws = Workspace(id=spec.workspace_id, team="ml-a", owner="alice", name=spec.name,
                   profile="gpu-small", state=State.DELETED, current_snapshot=None)
    doc = admission.snapshot_record(CATALOG, ws, finished, now - timedelta(days=30))
    record = retention.SnapshotRecord.from_doc(snapshot_id, doc)
    assert (record.prefix, record.bytes) == (directory, size)

    # the janitor's view: these objects are the record's; an unrecorded directory is not
    stray = f"snapshots/ml-a/pod/{uuid.uuid4().hex}/"
    seed(gcs, bucket, stray, {"pod.json": 10})
    store = SnapshotStore(None, gcs, bucket)  # type: ignore[arg-type]
    stored = {s.prefix: s for s in store.stored()}
    assert stored[directory].bytes == size and stored[directory].objects == 3
    later = now + retention.ORPHAN_MIN_AGE + timedelta(minutes=1)
    orphans = retention.find_orphans([record], stored.values(), {}, later)
    assert [o.prefix for o in orphans.objects] == [stray]
    assert orphans.records == []

    # expired: its objects are deleted, and the PodSnapshot through the API with its trigger
    db = MemoryDb()
    db.put("snapshots", snapshot_id, doc)
    db.put("teams", "ml-a", {"usage": {"snapshot_bytes": size}})
    deps = Deps(store=MemoryStore(db), bus=bus, runtime=runtime,  # type: ignore[arg-type]
                snapshots=store, catalog=lambda: CATALOG, clock=lambda: now,
                snapshot_bucket=bucket, dead_letters=None,  # type: ignore[arg-type]
                fleet=MemoryFleet(db))
    event = new_event(SnapshotExpired(snapshot_id=snapshot_id, workspace_id=spec.workspace_id,
                                      team="ml-a", uri=finished.uri or "", bytes=size,
                                      reason="workspace_deleted"), source="//test")
    assert janitor.handle_expired(event, deps, "on_snapshot_expired") == size
    assert list(gcs.list_blobs(bucket, prefix=directory)) == []
    assert [b.name for b in gcs.list_blobs(bucket, prefix=stray)] == [stray + "pod.json"]
    names = workspace_names("ml-a", spec.workspace_id)
    assert read(custom(cluster).get_namespaced_custom_object, GROUP, VERSION,
                names.namespace, "podsnapshots", ps_name) is None
    assert read(custom(cluster).get_namespaced_custom_object, GROUP, VERSION,
                names.namespace, "podsnapshotmanualtriggers",
                snapshot_object_name(snapshot_id)) is None
    assert db.get("teams", "ml-a")["usage"]["snapshot_bytes"] == 0
