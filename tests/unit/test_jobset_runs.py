"""A scale-out job on Kubernetes, the pure part: JobSets for CPU and GPU hosts (validated
against the JobSet CRD and Kubernetes), the objects' names in the bucket, and the readings
the job watcher decides with (a JobSet's outcome, the host that failed first, a host that
cannot start, the job's end), plus the job host's small helpers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from crd_schemas import jobset_schema

from functions.domain.catalog import Catalog
from functions.kubernetes.objects import jobset as js
from functions.kubernetes.objects.meta import ANN_REQUESTID, ANN_SUBMITTED_AT
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.workspace import shape_of, workspace_pod
from runtime.kubernetes.job_host import host_index, split_uri, traceback_of
from stasis.jobs import _chunk_order

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples/stasis.yaml").read_text()))
T = "2026-12-01T12:00:{:02d}Z"
MS = 1_796_126_400_000  # 2026-12-01T12:00:00Z


def spec(profile: str = "cpu-small", hosts: int = 4, **extra: Any) -> js.JobSpec:
    return js.JobSpec(job_id="job-20261201-a1b2c3", team="ml-a", namespace="stasis-ml-a",
                      image="us-docker.pkg.dev/p/stasis/python:3.11", command=js.HOST_COMMAND,
                      profile=CATALOG.profiles[profile], hosts=hosts,
                      env={"STASIS_JOB_URI": "gs://b/jobs/ml-a/job-20261201-a1b2c3"}, **extra)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]  # type: ignore


@pytest.mark.parametrize(("profile", "source_image"), [
    ("cpu-small", None), ("gpu-small", None), ("cpu-large", "stasis-agent:1"),
])
def test_cpu_and_gpu_jobsets_validate(profile: str, source_image: str | None) -> None:
    obj = js.jobset(spec(profile, source_image=source_image,
                         annotations={ANN_REQUESTID: "r-1"}))
    jsonschema.validate(obj, jobset_schema())
    job = obj["spec"]["replicatedJobs"][0]["template"]  # type: ignore[index]
    kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job",
                                  "metadata": {"name": "x", **job["metadata"]},
                                  "spec": job["spec"]}, "1.35", strict=True)
    pod = pod_spec(obj)
    container = pod["containers"][0]
    # team namespaces enforce the restricted Pod Security level
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for c in [container, *pod.get("initContainers", [])]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    names = {e["name"] for e in container["env"]}
    assert not names & {"TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES"}
    assert {"RANK", "WORLD_SIZE", "MASTER_ADDR", "JAX_COORDINATOR_ADDRESS"} <= names
    p = CATALOG.profiles[profile]
    assert container["resources"]["requests"] == {"cpu": f"{p.cpu_millis}m",
                                                  "memory": p.memory}
    assert ("nvidia.com/gpu" in container["resources"]["limits"]) == (profile == "gpu-small")
    assert pod.get("nodeSelector", {}) == dict(p.node_selector)
    # no slice: no exclusive node-pool placement
    assert "alpha.jobset.sigs.k8s.io/exclusive-topology" not in obj["metadata"][
        "annotations"]  # type: ignore[index]
    if source_image:
        (init,) = pod["initContainers"]
        assert init["image"] == source_image and init["command"][-1] == js.SOURCE_MOUNT
        assert {"name": "PYTHONPATH", "value": js.SOURCE_MOUNT} in container["env"]
        assert container["volumeMounts"][0]["readOnly"] is True
    else:
        assert "initContainers" not in pod and "volumes" not in pod


def test_a_topology_needs_tpu_hosts() -> None:
    with pytest.raises(ValueError, match="no TPU"):
        js.jobset(spec("cpu-small", topology="2x2"))


def test_object_names_sort_in_order() -> None:
    assert js.job_prefix("ml-a", "job-1") == "jobs/ml-a/job-1"
    names = [js.log_chunk(2, seq) for seq in (0, 9, 10, 123)]
    assert sorted(names) == names
    assert [_chunk_order(f"jobs/t/j/{n}") for n in names] == [(2, 0), (2, 9), (2, 10),
                                                                (2, 123)]
    assert js.exit_record(3) == "hosts/host-3/exit.json"


def jobset_with(status: dict[str, Any], submitted_ms: int | None = MS) -> dict[str, Any]:
    annotations = {ANN_SUBMITTED_AT: str(submitted_ms)} if submitted_ms else {}
    return {"metadata": {"name": "job-1", "annotations": annotations}, "status": status}


@pytest.mark.parametrize(("status", "expected"), [
    ({}, "running"),
    ({"terminalState": "Completed"}, "succeeded"),
    ({"terminalState": "Failed"}, "failed"),
    ({"conditions": [{"type": "Completed", "status": "True"}]}, "succeeded"),
    ({"conditions": [{"type": "Failed", "status": "True"}]}, "failed"),
    ({"conditions": [{"type": "Failed", "status": "False"},
                     {"type": "StartupPolicyCompleted", "status": "True"}]}, "running"),
    ({"conditions": [{"type": "Suspended", "status": "True"}]}, "running"),
])
def test_outcome(status: dict[str, Any], expected: str) -> None:
    assert js.outcome(jobset_with(status)) == expected


def pod(host: int | None, phase: str = "Failed", code: int | None = None, at: int = 0,
        reason: str = "Error", waiting: str | None = None, where: str = "annotations",
        job: str = "job-1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"job-1-workers-0-{host}", "labels": {
        js.JOBSET_NAME_LABEL: job}, "annotations": {}}
    if host is not None:
        meta[where][js.COMPLETION_INDEX_KEY] = str(host)
    statuses = []
    if code is not None:
        statuses.append({"name": "worker", "state": {"terminated": {
            "exitCode": code, "reason": reason, "finishedAt": T.format(at)}}})
    if waiting:
        statuses.append({"name": "worker", "state": {"waiting": {"reason": waiting}}})
    return {"metadata": meta, "status": {"phase": phase, "containerStatuses": statuses}}


def test_host_of_reads_the_annotation_or_the_label() -> None:
    assert js.host_of(pod(3)) == 3
    assert js.host_of(pod(2, where="labels")) == 2
    assert js.host_of(pod(None)) is None
    assert [js.host_of(p) for p in js.pods_of("job-1", [pod(0), pod(1, job="other")])] == [0]


def test_first_failure_prefers_the_hosts_own_records() -> None:
    records = [js.HostExit(0, 0, MS + 9000), js.HostExit(2, 1, MS + 5100),
               js.HostExit(1, 1, MS + 5200)]
    # host 3 died at :05 without a record (killed): second precision, but it was first
    pods = js.pod_exits([pod(3, code=137, at=5, reason="OOMKilled"), pod(2, code=1, at=5)])
    first = js.first_failure(records, pods)
    assert first is not None and (first.host, first.exit_status) == (3, 137)
    assert first.reason == "OOMKilled"
    # without it, the records decide at millisecond precision
    assert js.first_failure(records, []) == js.HostExit(2, 1, MS + 5100)
    # a tie goes to the lower host; no failure at all is None
    assert js.first_failure([js.HostExit(5, 1, MS), js.HostExit(4, 2, MS)], []).host == 4
    assert js.first_failure([js.HostExit(0, 0, MS)], []) is None


def test_ending() -> None:
    done = js.ending(jobset_with({"terminalState": "Completed"}), [], [], MS + 61_000)
    assert done == js.Ending(True, "exited", 0, None, "succeeded", 61_000)
    failed = js.ending(jobset_with({"terminalState": "Failed"}),
                       [js.HostExit(1, 3, MS + 2000)], [pod(0, code=137, at=9)], MS + 10_000)
    assert failed is not None and (failed.failed_host, failed.exit_status) == (1, 3)
    assert failed.termination == "host_failed" and failed.message == \
        "host 1 exited with status 3"
    oom = js.ending(jobset_with({"terminalState": "Failed"}), [],
                    [pod(2, code=137, at=1, reason="OOMKilled")], MS)
    assert oom is not None and oom.message == "host 2 exited with status 137 (OOMKilled)"
    unknown = js.ending(jobset_with({"conditions": [{"type": "Failed", "status": "True",
                                                     "message": "reached max restarts"}]},
                                    submitted_ms=None), [], [], MS)
    assert unknown == js.Ending(False, "host_failed", None, None, "reached max restarts", 0)
    assert js.ending(jobset_with({}), [], [], MS) is None


def test_start_failure() -> None:
    assert js.start_failure([pod(0, "Running"), pod(1, "Pending",
                                                    waiting="ImagePullBackOff")]) == (
        1, "container worker cannot start: ImagePullBackOff")
    # a pod that ran and failed is the JobSet's failure, not a start failure
    assert js.start_failure([pod(0, "Failed", code=1)]) is None
    assert js.start_failure([pod(0, "Pending", waiting="ContainerCreating")]) is None


def test_job_host_helpers() -> None:
    assert split_uri("gs://bucket/jobs/ml-a/job-1/") == ("bucket", "jobs/ml-a/job-1")
    with pytest.raises(ValueError):
        split_uri("s3://bucket/x")
    assert host_index({"RANK": "3"}) == 3
    assert host_index({"JAX_PROCESS_ID": "2"}) == 2
    with pytest.raises(KeyError):
        host_index({})
    lines = ["step 1", "Traceback (most recent call last):", "  old", "ValueError: a",
             "retrying", "Traceback (most recent call last):", '  File "x"', "KeyError: b"]
    assert traceback_of(lines) == "\n".join(lines[5:])
    assert traceback_of([f"line {i}" for i in range(100)]).splitlines()[0] == "line 60"


def test_tpu_jobset_keeps_the_slice_annotation() -> None:
    tpu = replace(CATALOG.profiles["tpu-v5e-8"])
    obj = js.jobset(js.JobSpec("job-1", "ml-a", "stasis-ml-a", "img", js.HOST_COMMAND, tpu, 1))
    assert obj["metadata"]["annotations"] == {  # type: ignore[index]
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}


def test_a_workspace_pod_tells_its_kernels_how_to_submit_jobs() -> None:
    """``stasis.jobs`` in a workspace on the cluster picks the kubernetes path and finds
    the control plane and the bucket in the kernel's environment."""
    from functions.domain import admission

    settings = ClusterSettings(workspace_env={"STASIS_PROJECT": "p",
                                                "STASIS_SNAPSHOT_BUCKET": "b"})
    entry = CATALOG.ides["jupyterlab"]
    shape = shape_of(workspace_id="ml-a--nb", team="ml-a", owner="alice", ide="jupyterlab",
                     environment=admission.environment_of(CATALOG, "python-3-11"),
                     profile=admission.profile_of(CATALOG, "cpu-small"), settings=settings,
                     ide_kind=str(entry.kind), ide_image=entry.image,
                     disk={"size": "10Gi", "storage_class": "standard-rwo-cmek"})
    pod = workspace_pod(shape, settings, requestid="r", requested_at_ms=1)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert (env["STASIS_RUNTIME"], env["STASIS_PROJECT"], env["STASIS_SNAPSHOT_BUCKET"]) == (
        "kubernetes", "p", "b")
    kubernetes_validate.validate(pod, "1.35", strict=True)


def test_the_reconciler_ends_cluster_jobs_without_a_jobset() -> None:
    from datetime import UTC, datetime, timedelta

    from functions.domain.jobs import Job, JobState
    from functions.domain.reconcile import CLUSTER_JOB_GRACE, lost_cluster_jobs

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    old = now - CLUSTER_JOB_GRACE - timedelta(seconds=1)

    def job(job_id: str, *, runtime: str = "kubernetes", state: JobState = JobState.RUNNING,
            started: datetime = old) -> Job:
        return Job(job_id, "ml-a", "alice", "tpu-v5e-8", 2, state, tpus=16, runtime=runtime,
                   started_at=started)

    jobs = [job("gone"), job("has-jobset"), job("young", started=now - timedelta(seconds=30)),
            job("local", runtime="local"), job("ended", state=JobState.SUCCEEDED)]
    (repair,) = lost_cluster_jobs(jobs, {"has-jobset"}, now)
    assert repair.job_id == "gone" and repair.event.termination == "runtime_lost"
    assert "without a JobSet" in (repair.event.error or "")
    assert repair.event_id == "reconcile-gone-no-jobset"  # the same on every run
    assert lost_cluster_jobs(jobs, {"gone", "has-jobset"}, now) == []
