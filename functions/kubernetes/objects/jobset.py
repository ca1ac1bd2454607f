"""Pure builders and readings for a scale-out job on Kubernetes: one JobSet per job.

``jobset(...)`` gives the ``jobset.x-k8s.io/v1alpha2`` JobSet and ``coordinator_service``
the headless Service its pods resolve each other through. One replicated Job (one replica)
runs ``hosts`` pods: ``parallelism = completions = hosts``, ``completionMode: Indexed``, so
each pod's completion index is its host (worker) id. On a TPU profile every pod lands on
the slice's TPU nodes (``cloud.google.com/gke-tpu-accelerator`` / ``gke-tpu-topology``),
asks for its chips as ``google.com/tpu``, and gets the environment JAX reads on TPU
(``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES``); a CPU or GPU profile gives plain pods with
the profile's CPU, memory (and ``nvidia.com/gpu``), node selector and tolerations. Every
pod gets ``JAX_COORDINATOR_ADDRESS`` / ``JAX_PROCESS_ID`` / ``JAX_NUM_PROCESSES`` for
``jax.distributed.initialize()`` and ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` /
``MASTER_PORT`` for ``torch.distributed``. Hosts run as a non-root user with no service
account token, as the ``restricted`` Pod Security level of team namespaces requires (GKE's
metadata server serves Workload Identity without one). A host that fails fails the JobSet (no
restarts: a collective cannot continue without it); the JobSet is deleted
``ttl_seconds`` after it ends if nobody deleted it before (the job watcher does, once it
reported the end), which releases the slice.

The pods run ``python -m runtime.kubernetes.job_host`` in the job's image (the workspace's
environment: what the notebook imports is there). Stasis itself can come from another
image (``source_image``: the agent image, whose ``/opt/stasis`` an init container copies
into the pod), so an environment image needs only the packages a notebook already needs
for jobs (cloudpickle, google-cloud-storage).

Readings (:func:`outcome`, :func:`ending`, :func:`start_failure`) turn what the cluster
and the hosts report into the job's end, for the watcher (``runtime.kubernetes.job_watch``).
The objects a job keeps in Cloud Storage, under ``jobs/<team>/<job id>/`` of the snapshot
bucket, are named here too (:func:`job_prefix` and below): the notebook, the hosts and the
watcher all read or write them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from functions.domain.catalog import AcceleratorKind, Profile
from functions.kubernetes.objects.hardware import (
    GKE_NODEPOOL,
    GKE_TPU,
    GKE_TPU_TOPOLOGY,
    container_resources,
)
from functions.kubernetes.objects.kinds import JOBSET_GROUP, JOBSET_VERSION
from functions.kubernetes.objects.meta import (
    ANN_SUBMITTED_AT,
    LABEL_JOB,
    LABEL_PROFILE,
    LABEL_TEAM,
    MANAGED_BY,
    STASIS,
    as_int,
    meta,
)
from functions.kubernetes.objects.security import restricted_container, restricted_pod
from functions.kubernetes.objects.status import pod_failure, timestamp_ms

API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
REPLICATED_JOB = "workers"
COORDINATOR_PORT = 8476  # JAX's default coordinator port
TORCH_PORT = 29500
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX = f"metadata.annotations['{COMPLETION_INDEX_KEY}']"
SOURCE_VOLUME = "stasis-source"
SOURCE_MOUNT = "/opt/stasis-job"
HOST_COMMAND = ("python", "-u", "-m", "runtime.kubernetes.job_host")
#: Names: ``<job>-workers-0-<index>`` must stay a DNS label, so a job id is at most this.
MAX_JOB_ID = 63 - len(f"-{REPLICATED_JOB}-0-1023")

# -- the objects of a job in Cloud Storage -------------------------------------------------

PAYLOAD = "payload.pkl"
#: What the hosts need besides the payload (JSON: ``framework``), written with it.
JOB_SETTINGS = "job.json"
RESULT = "result.pkl"


def job_prefix(team: str, job_id: str) -> str:
    """Where a job's objects live in the bucket: ``jobs/<team>/<job id>``."""
    return f"jobs/{team}/{job_id}"


def log_chunk(host: int, seq: int) -> str:
    """One chunk of a host's log (zero-padded: names sort in order)."""
    return f"logs/host-{host}/{seq:06d}.txt"


def exit_record(host: int) -> str:
    """A host's exit status and when it exited (JSON), written as it ends."""
    return f"hosts/host-{host}/exit.json"


def traceback_object(host: int) -> str:
    """The traceback of a host that failed."""
    return f"hosts/host-{host}/traceback.txt"


# -- the JobSet ----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    team: str
    namespace: str
    image: str
    command: tuple[str, ...]
    profile: Profile
    hosts: int
    #: The slice's topology (``4x4``); for one host the profile's own is used.
    topology: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    ttl_seconds: int = 600
    service_account: str | None = None
    #: An image with Stasis under ``source_root``, copied into the pod (None: the job's
    #: image has it on its path already).
    source_image: str | None = None
    source_root: str = "/opt/stasis"
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: Extra labels of the JobSet (Kueue's queue and priority class: ``kueue.queue_labels``;
    #: Kueue's JobSet integration suspends it until admitted).
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Who the hosts run as (team namespaces enforce the ``restricted`` Pod Security level).
    uid: int = 1000
    gid: int = 100


def is_tpu(profile: Profile) -> bool:
    return profile.accelerator is not None and profile.accelerator.kind == AcceleratorKind.TPU


def slice_topology(profile: Profile, hosts: int, topology: str | None = None) -> str:
    """The topology of the slice: chips in it must be ``chips per host x hosts``."""
    acc = profile.accelerator
    if acc is None or acc.kind != AcceleratorKind.TPU:
        raise ValueError(f"profile {profile.id} has no TPU: a JobSet slice needs TPU hosts")
    chosen = topology or (acc.topology if hosts == 1 else None)
    if not chosen:
        raise ValueError(f"{hosts} hosts of {profile.id}: name the slice topology "
                         f"({acc.count * hosts} chips)")
    try:
        chips = math.prod(int(d) for d in chosen.split("x"))
    except ValueError:
        raise ValueError(f"topology {chosen!r} is not like 4x4") from None
    if chips != acc.count * hosts:
        raise ValueError(f"topology {chosen} has {chips} chips, but {hosts} hosts of "
                         f"{profile.id} have {acc.count * hosts}")
    return chosen


def service_name(job_id: str) -> str:
    return job_id


def hostnames(job_id: str, hosts: int) -> list[str]:
    """The pods' DNS names (``enableDNSHostnames``): ``<job>-workers-0-<i>.<service>``."""
    return [f"{job_id}-{REPLICATED_JOB}-0-{i}.{service_name(job_id)}" for i in range(hosts)]


def _labels(spec: JobSpec) -> dict[str, str]:
    """The labels of the job's objects and pods (its ids as they are: the catalog's ids are
    label values already, and the watcher reads the job id back from them)."""
    return {MANAGED_BY: STASIS, LABEL_TEAM: spec.team, LABEL_JOB: spec.job_id,
            LABEL_PROFILE: spec.profile.id}


def coordinator_service(spec: JobSpec) -> dict[str, object]:
    """The headless Service (no cluster IP) that gives every host, and host 0 the
    coordinator, a stable DNS name, published before the pods are ready."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(service_name(spec.job_id), spec.namespace, labels=_labels(spec)),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {JOBSET_NAME_LABEL: spec.job_id},
                 "ports": [{"name": "coordinator", "port": COORDINATOR_PORT},
                           {"name": "torch", "port": TORCH_PORT}]},
    }


def _resources(profile: Profile) -> dict[str, object]:
    acc = profile.accelerator
    # TPU nodes are whole hosts: the chips are the request
    return container_resources(profile.cpu_millis, profile.memory,
                               acc.kind if acc is not None else None,
                               acc.count if acc is not None else 0, chips_only=True)


def jobset(spec: JobSpec) -> dict[str, object]:
    """The JobSet of one job (see the module docstring)."""
    if not 1 <= len(spec.job_id) <= MAX_JOB_ID:
        raise ValueError(f"job id {spec.job_id!r} must be 1 to {MAX_JOB_ID} characters")
    tpu = is_tpu(spec.profile)
    if not tpu and spec.topology:
        raise ValueError(f"profile {spec.profile.id} has no TPU: a slice topology needs "
                         "TPU hosts")
    names = hostnames(spec.job_id, spec.hosts)
    coordinator = names[0]
    worker_id = {"valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}
    env: list[dict[str, object]] = []
    node_selector = dict(spec.profile.node_selector)
    if tpu:
        topology = slice_topology(spec.profile, spec.hosts, spec.topology)
        acc = spec.profile.accelerator
        assert acc is not None
        node_selector.update({GKE_TPU: acc.type, GKE_TPU_TOPOLOGY: topology})
        env += [{"name": "TPU_WORKER_ID", **worker_id},
                {"name": "TPU_WORKER_HOSTNAMES", "value": ",".join(names)}]
    env += [
        {"name": "JAX_PROCESS_ID", **worker_id},
        {"name": "JAX_NUM_PROCESSES", "value": str(spec.hosts)},
        {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{coordinator}:{COORDINATOR_PORT}"},
        {"name": "RANK", **worker_id},
        {"name": "WORLD_SIZE", "value": str(spec.hosts)},
        {"name": "MASTER_ADDR", "value": coordinator},
        {"name": "MASTER_PORT", "value": str(TORCH_PORT)},
        {"name": "STASIS_JOB_ID", "value": spec.job_id},
    ]
    if spec.source_image:
        env.append({"name": "PYTHONPATH", "value": SOURCE_MOUNT})
    env.extend({"name": k, "value": v} for k, v in sorted(spec.env.items()))
    container: dict[str, object] = {
        "name": "worker", "image": spec.image, "command": list(spec.command), "env": env,
        "ports": [{"containerPort": COORDINATOR_PORT, "name": "coordinator"}],
        "resources": _resources(spec.profile), "securityContext": restricted_container(),
    }
    pod_spec: dict[str, object] = {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": restricted_pod(spec.uid, spec.gid, fs_group=spec.gid),
        "containers": [container],
    }
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if spec.source_image:
        mount = {"name": SOURCE_VOLUME, "mountPath": SOURCE_MOUNT}
        container["volumeMounts"] = [{**mount, "readOnly": True}]
        pod_spec["initContainers"] = [{
            "name": "stasis-source", "image": spec.source_image,
            "command": ["cp", "-R", f"{spec.source_root.rstrip('/')}/.", SOURCE_MOUNT],
            "volumeMounts": [mount], "securityContext": restricted_container(),
        }]
        pod_spec["volumes"] = [{"name": SOURCE_VOLUME, "emptyDir": {}}]
    tolerations = [t.to_k8s() for t in spec.profile.tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    labels = _labels(spec)
    annotations = dict(spec.annotations)
    if tpu:
        # one slice per JobSet: its pods never share a node pool with another
        annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"] = GKE_NODEPOOL
    return {
        "apiVersion": API_VERSION, "kind": "JobSet",
        "metadata": meta(spec.job_id, spec.namespace, labels={**labels, **spec.labels},
                         annotations=annotations),
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True,
                        "subdomain": service_name(spec.job_id)},
            "coordinator": {"replicatedJob": REPLICATED_JOB, "jobIndex": 0, "podIndex": 0},
            "failurePolicy": {"maxRestarts": 0},
            "successPolicy": {"operator": "All"},
            "ttlSecondsAfterFinished": spec.ttl_seconds,
            "replicatedJobs": [{
                "name": REPLICATED_JOB, "replicas": 1,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "parallelism": spec.hosts, "completions": spec.hosts,
                        "completionMode": "Indexed", "backoffLimit": 0,
                        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
                    },
                },
            }],
        },
    }


# -- what the cluster and the hosts report -------------------------------------------------


@dataclass(frozen=True)
class HostExit:
    """One host's end: from its own exit record (ms precision) or from its pod."""

    host: int
    exit_status: int
    finished_ms: int
    reason: str = ""


@dataclass(frozen=True)
class Ending:
    """How a job ended, as job.finished reports it."""

    succeeded: bool
    termination: str
    exit_status: int | None
    failed_host: int | None
    message: str
    duration_ms: int


def outcome(obj: Mapping[str, Any]) -> str:
    """A JobSet's state: ``running``, ``succeeded`` or ``failed`` (``status.terminalState``
    where the controller sets it, else the ``Completed`` / ``Failed`` conditions)."""
    status = obj.get("status") or {}
    terminal = status.get("terminalState")
    if terminal == "Completed":
        return "succeeded"
    if terminal == "Failed":
        return "failed"
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("status") == "True":
            if c.get("type") == "Completed":
                return "succeeded"
            if c.get("type") == "Failed":
                return "failed"
    return "running"


def _condition_message(obj: Mapping[str, Any]) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Failed" and c.get("status") == "True":
            return str(c.get("message") or c.get("reason") or "")
    return ""


def host_of(pod: Mapping[str, Any]) -> int | None:
    """A pod's host (its completion index: an annotation, and a label on newer clusters)."""
    meta = pod.get("metadata") or {}
    for where in ("annotations", "labels"):
        value = (meta.get(where) or {}).get(COMPLETION_INDEX_KEY)
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


def pods_of(job_id: str, pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The job's pods among ``pods`` (the JobSet controller's label, checked here)."""
    return [p for p in pods
            if ((p.get("metadata") or {}).get("labels") or {}).get(JOBSET_NAME_LABEL) == job_id]


def pod_exits(pods: Iterable[Mapping[str, Any]]) -> list[HostExit]:
    """The hosts whose worker container terminated, from their pods."""
    found = []
    for pod in pods:
        host = host_of(pod)
        if host is None:
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated") or {}
            if status.get("name") == "worker" and terminated:
                found.append(HostExit(host, int(terminated.get("exitCode") or 0),
                                      timestamp_ms(terminated.get("finishedAt")),
                                      str(terminated.get("reason") or "")))
    return found


def start_failure(pods: Iterable[Mapping[str, Any]]) -> tuple[int, str] | None:
    """A host whose pod will never start (an image that cannot be pulled, a bad config):
    (host, why), or None."""
    for pod in sorted(pods, key=lambda p: host_of(p) or 0):
        if (pod.get("status") or {}).get("phase") == "Failed":
            continue  # it ran and ended: the JobSet's own failure says so
        why = pod_failure(pod)
        if why:
            return host_of(pod) or 0, why
    return None


def first_failure(records: Iterable[HostExit], pods: Iterable[HostExit]) -> HostExit | None:
    """The host that failed first. The hosts' own records come first (millisecond
    precision, written as they exit); a pod that died without writing one (OOMKilled,
    evicted) counts from its container's ``finishedAt``. Peers that lost a failed host
    exit too, a moment later: the earliest failure is the cause, ties go to the lower host."""
    by_host = {r.host: r for r in records}
    for p in pods:
        by_host.setdefault(p.host, p)
    failed = [e for e in by_host.values() if e.exit_status != 0]
    if not failed:
        return None
    return min(failed, key=lambda e: (e.finished_ms or 2**62, e.host))


def ending(obj: Mapping[str, Any], records: Iterable[HostExit],
           pods: Iterable[Mapping[str, Any]], now_ms: int) -> Ending | None:
    """How the job of JobSet ``obj`` ended (None: it has not)."""
    state = outcome(obj)
    if state == "running":
        return None
    started = as_int((((obj.get("metadata") or {}).get("annotations")) or {}).get(
        ANN_SUBMITTED_AT))
    duration = max(0, now_ms - started) if started else 0
    if state == "succeeded":
        return Ending(True, "exited", 0, None, "succeeded", duration)
    first = first_failure(list(records), pod_exits(pods))
    if first is None:
        message = _condition_message(obj) or "the JobSet failed"
        return Ending(False, "host_failed", None, None, message, duration)
    why = f" ({first.reason})" if first.reason and first.reason not in ("Error",
                                                                          "Completed") else ""
    message = f"host {first.host} exited with status {first.exit_status}{why}"
    return Ending(False, "host_failed", first.exit_status, first.host, message, duration)
