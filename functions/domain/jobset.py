"""Pure builders for a scale-out job on GKE: one JobSet per multi-host TPU slice.

``jobset(...)`` gives the ``jobset.x-k8s.io/v1alpha2`` JobSet and ``coordinator_service``
the headless Service its pods resolve each other through. One replicated Job (one replica)
runs ``hosts`` pods: ``parallelism = completions = hosts``, ``completionMode: Indexed``, so
each pod's completion index is its host (worker) id. Every pod lands on the slice's TPU
nodes (``cloud.google.com/gke-tpu-accelerator`` / ``gke-tpu-topology``), asks for its chips
as ``google.com/tpu``, and gets the environment JAX reads on TPU (``TPU_WORKER_ID``,
``TPU_WORKER_HOSTNAMES``) plus explicit ``JAX_COORDINATOR_ADDRESS`` / ``JAX_PROCESS_ID`` /
``JAX_NUM_PROCESSES`` for ``jax.distributed.initialize()`` (and ``RANK`` / ``WORLD_SIZE`` /
``MASTER_ADDR`` / ``MASTER_PORT`` for ``torch.distributed``). A host that fails fails the
JobSet (no restarts: a collective cannot continue without it); the JobSet is deleted
``ttl_seconds`` after it ends, which releases the slice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from functions.domain.catalog import AcceleratorKind, Profile

API_VERSION = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "workers"
COORDINATOR_PORT = 8476  # JAX's default coordinator port
TORCH_PORT = 29500
TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
#: Names: ``<job>-workers-0-<index>`` must stay a DNS label, so a job id is at most this.
MAX_JOB_ID = 63 - len(f"-{REPLICATED_JOB}-0-1023")


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
    return {"app.kubernetes.io/managed-by": "stasis", "stasis.dev/team": spec.team,
            "stasis.dev/job": spec.job_id, "stasis.dev/profile": spec.profile.id}


def coordinator_service(spec: JobSpec) -> dict[str, object]:
    """The headless Service (no cluster IP) that gives every host, and host 0 the
    coordinator, a stable DNS name, published before the pods are ready."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service_name(spec.job_id), "namespace": spec.namespace,
                     "labels": _labels(spec)},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {JOBSET_NAME_LABEL: spec.job_id},
                 "ports": [{"name": "coordinator", "port": COORDINATOR_PORT},
                           {"name": "torch", "port": TORCH_PORT}]},
    }


def jobset(spec: JobSpec) -> dict[str, object]:
    """The JobSet of one multi-host slice (see the module docstring)."""
    if not 1 <= len(spec.job_id) <= MAX_JOB_ID:
        raise ValueError(f"job id {spec.job_id!r} must be 1 to {MAX_JOB_ID} characters")
    topology = slice_topology(spec.profile, spec.hosts, spec.topology)
    acc = spec.profile.accelerator
    assert acc is not None
    names = hostnames(spec.job_id, spec.hosts)
    coordinator = names[0]
    worker_id = {"valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}
    env: list[dict[str, object]] = [
        {"name": "TPU_WORKER_ID", **worker_id},
        {"name": "TPU_WORKER_HOSTNAMES", "value": ",".join(names)},
        {"name": "JAX_PROCESS_ID", **worker_id},
        {"name": "JAX_NUM_PROCESSES", "value": str(spec.hosts)},
        {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{coordinator}:{COORDINATOR_PORT}"},
        {"name": "RANK", **worker_id},
        {"name": "WORLD_SIZE", "value": str(spec.hosts)},
        {"name": "MASTER_ADDR", "value": coordinator},
        {"name": "MASTER_PORT", "value": str(TORCH_PORT)},
        {"name": "STASIS_JOB_ID", "value": spec.job_id},
    ]
    env.extend({"name": k, "value": v} for k, v in sorted(spec.env.items()))
    chips = str(acc.count)
    pod_spec: dict[str, object] = {
        "restartPolicy": "Never",
        "nodeSelector": {**dict(spec.profile.node_selector), TPU_ACCELERATOR: acc.type,
                         TPU_TOPOLOGY: topology},
        "containers": [{
            "name": "worker", "image": spec.image, "command": list(spec.command), "env": env,
            "ports": [{"containerPort": COORDINATOR_PORT, "name": "coordinator"}],
            "resources": {"requests": {TPU_RESOURCE: chips}, "limits": {TPU_RESOURCE: chips}},
        }],
    }
    tolerations = [t.to_k8s() for t in spec.profile.tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    labels = _labels(spec)
    return {
        "apiVersion": API_VERSION, "kind": "JobSet",
        "metadata": {"name": spec.job_id, "namespace": spec.namespace, "labels": labels,
                     # one slice per JobSet: its pods never share a node pool with another
                     "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology":
                                     "cloud.google.com/gke-nodepool"}},
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
