"""Every Kubernetes object Stasis builds, for the example catalog, compared whole against
``tests/data/k8s_objects.json``: a change to any builder's output is a deliberate one.

The file was written from the builders as they were before the Kubernetes code moved into
one package (``functions/kubernetes``), so the move is checked to change no object. A
change meant to alter objects rewrites it (``python tests/unit/test_k8s_golden.py``) and
shows the difference in review.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from functions.domain import admission
from functions.domain.catalog import Catalog
from functions.domain.sandboxes import DEFAULT_LIMITS, RunSpec
from functions.kubernetes.jobs import KubernetesJobRuntime
from functions.kubernetes.objects import jobset as js
from functions.kubernetes.objects import kueue
from functions.kubernetes.objects import sandbox as sm
from functions.kubernetes.objects.meta import ANN_REQUESTID
from functions.kubernetes.objects.monitor import monitor_manifests
from functions.kubernetes.objects.names import team_of
from functions.kubernetes.objects.podsnapshot import snapshot_policy, snapshot_storage_config
from functions.kubernetes.objects.rbac import control_plane_rbac, team_role_binding
from functions.kubernetes.objects.settings import ClusterSettings, SandboxClusterSettings
from functions.kubernetes.objects.snapshot import (
    manual_trigger,
    snapshot_object_name,
    snapshot_record,
    snapshot_request_patch,
)
from functions.kubernetes.objects.team import (
    resource_quota,
    team_namespace,
    team_service_account,
)
from functions.kubernetes.objects.workspace import (
    Restore,
    WorkspaceShape,
    encrypted_storage_class,
    home_pvc,
    network_policy,
    shape_of,
    token_secret,
    workspace_names,
    workspace_pod,
    workspace_service,
    workspace_service_account,
    workspace_url,
)
from functions.ports import JobRun

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests/data/k8s_objects.json"
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples/stasis.yaml").read_text()))
SUBJECT = {"kind": "User", "name": "fn@example-project.iam.gserviceaccount.com",
           "apiGroup": "rbac.authorization.k8s.io"}
#: Cluster settings that change what the builders write: the defaults, a cluster without
#: Pod Snapshots, and every optional field set.
SETTINGS = {
    "default": ClusterSettings(),
    "kernel-only": ClusterSettings(pod_snapshots=False),
    "custom": ClusterSettings(
        namespace_prefix="team-", system_namespace="ops", storage_class="fast",
        home_size="5Gi", agent_image="agent:2", agent_source_root="/srv/stasis",
        runtime_class="runsc", jupyter_port=9999, agent_port=9998, uid=2000, gid=200,
        url_template="https://{workspace}.example.org/", pod_snapshot_retention="30d",
        agent_env={"STORAGE_EMULATOR_HOST": "http://gcs:4443"},
        workspace_env={"STASIS_PROJECT": "p", "STASIS_SNAPSHOT_BUCKET": "b"},
        function_cidrs=("10.10.0.0/20", "10.20.0.0/20")),
    "kueue": ClusterSettings(kueue=True, kueue_provisioning=True,
                             preemption_grace_seconds=90),
}
SANDBOX = RunSpec("sbx-20250610-01", "ml-a", "https://example.org/r.git", "main", "pytest -q",
                  DEFAULT_LIMITS, ("pypi.org", "*.pythonhosted.org", "10.20.0.0/16"), "req-1",
                  "stasis-snapshots", "sandboxes/ml-a/sbx-20250610-01")
SANDBOX_SETTINGS = {
    "default": SandboxClusterSettings(),
    "plain": SandboxClusterSettings(runtime_class=None, transfer_cidrs=(),
                                    transfer_host_aliases=(), cpu="2", work_size="1Gi"),
}
URLS = {key: f"https://storage.googleapis.com/signed/{key}" for key in sm.SECRET_KEYS}


def _shape(profile: str, ide: str, settings: ClusterSettings,
           workspace: str = "ml-a--nb") -> WorkspaceShape:
    entry, disk = CATALOG.ides[ide], CATALOG.profiles[profile].disk
    return shape_of(workspace_id=workspace, team=team_of(workspace), owner="alice",
                    ide=ide, environment=admission.environment_of(CATALOG, "python-3-11"),
                    profile=admission.profile_of(CATALOG, profile), settings=settings,
                    ide_kind=str(entry.kind), ide_image=entry.image,
                    disk={"size": disk.size, "storage_class": disk.storage_class},
                    incarnation="inc-1")


def _team_objects() -> Iterator[tuple[str, Any]]:
    for label, settings in SETTINGS.items():
        for team, entry in CATALOG.teams.items():
            at = f"team {team} {label}"
            yield f"{at} namespace", team_namespace(team, settings)
            yield f"{at} service account", team_service_account(team, settings)
            yield f"{at} service account gsa", team_service_account(
                team, settings, gcp_service_account="ws@p.iam.gserviceaccount.com")
            yield f"{at} quota", resource_quota(team, entry.quotas, settings)
            yield f"{at} role binding", team_role_binding(team, SUBJECT, settings)
            yield f"{at} storage config", snapshot_storage_config(
                team, "stasis-snapshots", team_prefix=f"snapshots/{team}/", settings=settings)
            yield f"{at} policy", snapshot_policy(team, settings)
        yield f"monitor {label}", monitor_manifests(project="example-project",
                                                    settings=settings)
        yield f"monitor {label} image gsa", monitor_manifests(
            project="p", image="agent:9", settings=settings, gcp_service_account="mon@p.iam",
            idle_interval_s=15)
    yield "storage class", encrypted_storage_class("standard-rwo-cmek", "projects/p/k")
    yield "storage class ssd", encrypted_storage_class("premium-rwo-cmek", "projects/p/k",
                                                       disk_type="pd-ssd")
    yield "control plane rbac", control_plane_rbac(SUBJECT)
    yield "kueue cluster objects", kueue.cluster_objects(CATALOG, SETTINGS["kueue"])
    yield "kueue local queue", kueue.local_queue("ml-a", SETTINGS["kueue"])


def _workspace_objects() -> Iterator[tuple[str, Any]]:
    for label, settings in SETTINGS.items():
        # every profile and IDE with the defaults; the custom settings on two profiles
        profiles = (CATALOG.profiles if label not in ("custom", "kueue")
                    else ("cpu-small", "gpu-small"))
        for profile in profiles:
            for ide in CATALOG.ides:
                s = _shape(profile, ide, settings)
                at = f"workspace {profile} {ide} {label}"
                yield f"{at} shape", dataclasses.asdict(s)
                yield f"{at} names", dataclasses.asdict(
                    workspace_names(s.team, s.workspace_id, settings))
                yield f"{at} pvc", home_pvc(s, settings)
                yield f"{at} service account", workspace_service_account(s, settings)
                yield f"{at} service account gsa", workspace_service_account(
                    s, settings, gcp_service_account="ws@p.iam.gserviceaccount.com")
                yield f"{at} secret", token_secret(s, "t0k3n", settings)
                yield f"{at} pod", workspace_pod(s, settings, requestid="r1",
                                                 requested_at_ms=1)
                for method in ("pod", "kernel"):
                    restore = Restore("snap-1", method, ps_name="ps-123", bucket="b",
                                      prefix="snapshots/ml-a/ml-a--nb/snap-1")
                    yield f"{at} restored pod {method}", workspace_pod(
                        s, settings, requestid="r2", requested_at_ms=2, restore=restore)
                yield f"{at} service", workspace_service(s, settings)
                yield f"{at} network policy", network_policy(s, settings)
                yield f"{at} url", workspace_url(s, settings)
                yield f"{at} trigger", manual_trigger(s, "snap-1", requestid="r3",
                                                      requested_at_ms=3, settings=settings)
                yield f"{at} record", snapshot_record(s, "snap-1", requested_at_ms=3,
                                                      settings=settings)
    yield "snapshot request patch", snapshot_request_patch(
        "snap-1", bucket="b", prefix="snapshots/ml-a/ml-a--nb/snap-1", requestid="r4",
        requested_at_ms=4)
    odd = "Ünïcode_Team.x--" + "y" * 80
    yield "names of an odd workspace id", dataclasses.asdict(
        workspace_names(odd, f"{odd}--nb"))
    yield "snapshot object name", snapshot_object_name("snap_20260101.a")


def _sandbox_objects() -> Iterator[tuple[str, Any]]:
    specs = {
        "mixed": SANDBOX,
        "no network": dataclasses.replace(SANDBOX, allowed_network=()),
        "addresses": dataclasses.replace(SANDBOX, allowed_network=("10.0.0.1", "fd00::/8")),
        "never idle": dataclasses.replace(
            SANDBOX, limits=dataclasses.replace(DEFAULT_LIMITS, idle_seconds=0)),
    }
    for label, settings in SANDBOX_SETTINGS.items():
        for what, spec in specs.items():
            at = f"sandbox {what} {label}"
            yield f"{at} objects", sm.sandbox_manifests(spec, "a" * 40, URLS, settings)
            yield f"{at} restored pod", sm.restored_pod(spec, "a" * 40, "ps-9", settings)
            yield f"{at} network", sm.network_description(spec, settings)
    pod = sm.sandbox_pod(SANDBOX, "a" * 40)
    yield "sandbox snapshot trigger", sm.sandbox_snapshot_trigger(pod, sequence=2,
                                                                  idle_seconds=600)
    yield "sandbox selector", [sm.sandbox_labels_selector(), sm.sandbox_labels_selector("s.1")]


def _job_objects() -> Iterator[tuple[str, Any]]:
    variants: dict[str, dict[str, Any]] = {
        "plain": {},
        "source": {"source_image": "agent:1", "service_account": "stasis-workspace",
                   "annotations": {ANN_REQUESTID: "r-1"}, "env": {"B": "2", "A": "1"},
                   "ttl_seconds": 60, "uid": 2000, "gid": 200},
    }
    for profile_id, profile in CATALOG.profiles.items():
        tpu = js.is_tpu(profile)
        for hosts, topology in ([(1, None), (2, "4x4")] if tpu else [(1, None), (4, None)]):
            for label, extra in variants.items():
                spec = js.JobSpec(job_id="job-20261201-a1b2c3", team="ml-a",
                                  namespace="stasis-ml-a", image="python:3.11",
                                  command=js.HOST_COMMAND, profile=profile, hosts=hosts,
                                  topology=topology, **extra)
                at = f"job {profile_id} {hosts} hosts {label}"
                yield f"{at} jobset", js.jobset(spec)
                yield f"{at} service", js.coordinator_service(spec)
    runtime = KubernetesJobRuntime(catalog=lambda: CATALOG, bucket="stasis-snapshots",
                                   source_image="agent:1", env={"STORAGE_EMULATOR_HOST": "x"},
                                   clock=lambda: 1_796_126_400.0)
    run = JobRun("job-1", "ml-a", "alice", "cpu-small", 2,
                 "gs://stasis-snapshots/jobs/ml-a/job-1/payload.pkl", "req-7")
    yield "job runtime objects", runtime.objects(run)


def every_object() -> dict[str, Any]:
    """Every builder's output, by a readable key, as JSON values."""
    found: dict[str, Any] = {}
    for family in (_team_objects, _workspace_objects, _sandbox_objects, _job_objects):
        for key, value in family():
            assert key not in found, key
            found[key] = value
    return json.loads(json.dumps(found, sort_keys=True))


def test_every_object_is_what_it_was() -> None:
    want = json.loads(GOLDEN.read_text())
    have = every_object()
    assert sorted(have) == sorted(want), "a builder's output was added or removed"
    changed = [key for key in want if have[key] != want[key]]
    if changed:
        key = changed[0]
        diff = "\n".join(difflib.unified_diff(
            json.dumps(want[key], indent=1, sort_keys=True).splitlines(),
            json.dumps(have[key], indent=1, sort_keys=True).splitlines(), "before", "now",
            lineterm=""))
        pytest.fail(f"{len(changed)} objects changed, first {key!r}:\n{diff}")


def test_the_golden_file_covers_every_family() -> None:
    keys = json.loads(GOLDEN.read_text())
    for family in ("team ", "monitor ", "workspace ", "sandbox ", "job "):
        assert sum(k.startswith(family) for k in keys) >= 2, family


if __name__ == "__main__":
    objects = every_object()
    # one object a line: a change shows as the lines of the objects it changed
    lines = (f"{json.dumps(key)}: {json.dumps(value, sort_keys=True, separators=(',', ':'))}"
             for key, value in sorted(objects.items()))
    GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {GOLDEN} ({len(objects)} objects)", file=sys.stderr)
