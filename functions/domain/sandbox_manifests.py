"""Kubernetes objects for one agent sandbox, as pure builders: a run spec in, dicts out.

The Kubernetes runtime would apply these (that adapter, the signed URLs it mints and the
watch that turns the Pod's end into sandbox.finished are not built yet); nothing here talks
to a cluster. What they promise:

- **Pod** (:func:`sandbox_pod`) in the team's namespace (Pod Security ``restricted``):
  ``runtimeClassName: gvisor`` (a user-space kernel between the task and the node), no
  service-account token (``automountServiceAccountToken: false``), no service links, non-root
  with no capabilities, no privilege escalation, the RuntimeDefault seccomp profile, a
  read-only root filesystem, ``restartPolicy: Never`` and ``activeDeadlineSeconds`` (the
  wall clock plus the time to fetch and collect). Three containers share ``/work`` and
  ``/results`` (emptyDirs with size limits):

  1. ``checkout`` (init): fetches a git bundle of the base ref through a signed URL and
     checks the base commit out;
  2. ``task``: runs the command under ``ulimit -t`` (CPU seconds) with the memory limit as
     its container limit; its exit status goes to ``/results/exit_status``. It gets no
     URL, no token, no credential of any kind;
  3. ``collector``: waits for the exit status, takes ``git add -A`` + ``git diff --binary``
     against the base commit, and uploads patch, log and exit status through signed URLs.

  The signed URLs (capabilities for single objects, expiring) come from a Secret
  (:func:`sandbox_secret`) referenced only by ``checkout`` and ``collector``.
- **NetworkPolicy** (:func:`sandbox_network_policy`): default deny, ingress and egress.
  Egress is opened only to the transfer endpoints (``transfer_cidrs``, e.g. Private Google
  Access 199.36.153.8/30 on 443, which the checkout and collector need) and to the allowed
  destinations that are addresses or CIDRs. A NetworkPolicy selects pods, not containers:
  the task can reach the transfer endpoints too, without credentials; a VPC Service
  Controls perimeter keeps it from other projects' buckets.
- **FQDNNetworkPolicy** (:func:`sandbox_fqdn_policy`, GKE Dataplane V2) for allowed
  destinations that are host names, plus DNS to kube-dns; none when there are none.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from functions.domain.catalog import format_quantity
from functions.domain.sandboxes import RunSpec
from functions.domain.slugs import name, slug

MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT = "app.kubernetes.io/component"
LABEL_TEAM = "stasis.dev/team"
LABEL_SANDBOX = "stasis.dev/sandbox"
ANN_SANDBOX_ID = "stasis.dev/sandbox-id"
ANN_REQUESTID = "stasis.dev/requestid"
SECRET_KEYS = ("bundle-url", "patch-url", "log-url", "status-url")
UID = 65532
_FETCH_AND_COLLECT_SECONDS = 600


@dataclass(frozen=True)
class SandboxClusterSettings:
    """How sandboxes use a cluster; set by the deployment."""

    namespace_prefix: str = "stasis-"
    runtime_class: str = "gvisor"
    #: Image of the task: the team's environment image (tools of the task's own).
    task_image: str = "us-docker.pkg.dev/example-project/stasis/python:3.11"
    #: Image with git and curl for checkout and collector.
    tools_image: str = "us-docker.pkg.dev/example-project/stasis/sandbox-tools:1"
    cpu: str = "1"
    work_size: str = "10Gi"
    #: Where the checkout and collector reach Cloud Storage (Private Google Access).
    transfer_cidrs: tuple[str, ...] = ("199.36.153.8/30",)
    kube_dns_namespace: str = "kube-system"


def namespace_of(team: str, settings: SandboxClusterSettings) -> str:
    return name(settings.namespace_prefix, team)


def object_name(sandbox_id: str) -> str:
    return name("sandbox-", sandbox_id)


def _meta(spec: RunSpec, settings: SandboxClusterSettings,
          annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": object_name(spec.sandbox_id),
        "namespace": namespace_of(spec.team, settings),
        "labels": _labels(spec),
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _labels(spec: RunSpec) -> dict[str, str]:
    return {MANAGED_BY: "stasis", COMPONENT: "sandbox", LABEL_TEAM: slug(spec.team),
            LABEL_SANDBOX: slug(spec.sandbox_id)}


def _selector(spec: RunSpec) -> dict[str, Any]:
    return {"matchLabels": {LABEL_SANDBOX: slug(spec.sandbox_id)}}


def sandbox_secret(spec: RunSpec, urls: Mapping[str, str],
                   settings: SandboxClusterSettings = SandboxClusterSettings()) -> dict[str, Any]:
    """The signed URLs of one sandbox (``SECRET_KEYS``), for checkout and collector only."""
    missing = [k for k in SECRET_KEYS if k not in urls]
    if missing:
        raise ValueError(f"signed URLs missing: {', '.join(missing)}")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(spec, settings),
            "stringData": {k: urls[k] for k in SECRET_KEYS}}


_CHECKOUT = """set -eu
curl -fsS --retry 3 -o /results/base.bundle "$BUNDLE_URL"
git clone --quiet /results/base.bundle /work/repo
git -C /work/repo checkout --quiet --detach "$BASE_SHA"
git -C /work/repo remote remove origin
rm /results/base.bundle
"""

_TASK = """ulimit -t "$CPU_SECONDS"
cd /work/repo
/bin/sh -c "$TASK" >/results/log.txt 2>&1
echo $? >/results/exit_status.tmp && mv /results/exit_status.tmp /results/exit_status
"""

_COLLECT = """set -u
until [ -f /results/exit_status ]; do sleep 1; done
cd /work/repo
git add -A && git diff --cached --binary "$BASE_SHA" >/results/patch.diff
curl -fsS --retry 3 -X PUT -H 'Content-Type: text/x-diff' --upload-file /results/patch.diff \
  "$PATCH_URL"
curl -fsS --retry 3 -X PUT -H 'Content-Type: text/plain' --upload-file /results/log.txt \
  "$LOG_URL"
curl -fsS --retry 3 -X PUT -H 'Content-Type: text/plain' --upload-file /results/exit_status \
  "$STATUS_URL"
"""


def _secret_env(spec: RunSpec, names: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"name": env, "valueFrom": {"secretKeyRef": {
        "name": object_name(spec.sandbox_id), "key": key}}} for env, key in names]


def _security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _mounts() -> list[dict[str, Any]]:
    return [{"name": "work", "mountPath": "/work"}, {"name": "results", "mountPath": "/results"},
            {"name": "tmp", "mountPath": "/tmp"}]


def _tool_resources() -> dict[str, Any]:
    amounts = {"cpu": "250m", "memory": "256Mi"}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def sandbox_pod(spec: RunSpec, base_sha: str,
                settings: SandboxClusterSettings = SandboxClusterSettings()) -> dict[str, Any]:
    """The sandbox's Pod (see the module docstring)."""
    memory = format_quantity(spec.limits.memory_bytes)
    common_env = [{"name": "BASE_SHA", "value": base_sha}, {"name": "HOME", "value": "/tmp"}]
    task_env = [
        {"name": "TASK", "value": spec.command},
        {"name": "CPU_SECONDS", "value": str(spec.limits.cpu_seconds)},
        {"name": "HOME", "value": "/tmp"},
        {"name": "STASIS_SANDBOX_ID", "value": spec.sandbox_id},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    annotations = {ANN_SANDBOX_ID: spec.sandbox_id, ANN_REQUESTID: spec.requestid}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": _meta(spec, settings, annotations),
        "spec": {
            "runtimeClassName": settings.runtime_class,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": spec.limits.wall_clock_seconds
            + _FETCH_AND_COLLECT_SECONDS,
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                                "fsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [
                {"name": "work", "emptyDir": {"sizeLimit": settings.work_size}},
                {"name": "results", "emptyDir": {"sizeLimit": "2Gi"}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            ],
            "initContainers": [{
                "name": "checkout", "image": settings.tools_image,
                "command": ["/bin/sh", "-c", _CHECKOUT],
                "env": [*common_env, *_secret_env(spec, [("BUNDLE_URL", "bundle-url")])],
                "volumeMounts": _mounts(), "securityContext": _security(),
                "resources": _tool_resources(),
            }],
            "containers": [
                {
                    "name": "task", "image": settings.task_image,
                    "command": ["/bin/sh", "-c", _TASK], "env": task_env,
                    "workingDir": "/work",
                    "volumeMounts": _mounts(), "securityContext": _security(),
                    "resources": {"requests": {"cpu": settings.cpu, "memory": memory},
                                  "limits": {"cpu": settings.cpu, "memory": memory}},
                },
                {
                    "name": "collector", "image": settings.tools_image,
                    "command": ["/bin/sh", "-c", _COLLECT],
                    "env": [*common_env, *_secret_env(spec, [
                        ("PATCH_URL", "patch-url"), ("LOG_URL", "log-url"),
                        ("STATUS_URL", "status-url")])],
                    "volumeMounts": _mounts(), "securityContext": _security(),
                    "resources": _tool_resources(),
                },
            ],
        },
    }


def _is_address(destination: str) -> bool:
    try:
        ipaddress.ip_network(destination, strict=False)
    except ValueError:
        return False
    return True


def sandbox_network_policy(spec: RunSpec,
                           settings: SandboxClusterSettings = SandboxClusterSettings()
                           ) -> dict[str, Any]:
    """Default deny in and out; out only to the transfer endpoints (443) and to the
    allowed destinations that are addresses or CIDRs."""
    egress: list[dict[str, Any]] = [{
        "to": [{"ipBlock": {"cidr": cidr}} for cidr in settings.transfer_cidrs],
        "ports": [{"protocol": "TCP", "port": 443}],
    }] if settings.transfer_cidrs else []
    addresses = [d for d in spec.allowed_network if _is_address(d)]
    if addresses:
        egress.append({"to": [{"ipBlock": {"cidr": str(ipaddress.ip_network(d, strict=False))}}
                              for d in addresses]})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _meta(spec, settings),
        "spec": {"podSelector": _selector(spec), "policyTypes": ["Ingress", "Egress"],
                 "ingress": [], "egress": egress},
    }


def sandbox_fqdn_policy(spec: RunSpec, settings: SandboxClusterSettings = SandboxClusterSettings()
                        ) -> dict[str, Any] | None:
    """GKE's FQDNNetworkPolicy for allowed host names (None when none are allowed); host
    names also need DNS, which it opens to kube-dns only."""
    hosts = [d for d in spec.allowed_network if not _is_address(d)]
    if not hosts:
        return None
    matches = [{"pattern": h} if h.startswith("*.") else {"name": h} for h in hosts]
    return {
        "apiVersion": "networking.gke.io/v1alpha1", "kind": "FQDNNetworkPolicy",
        "metadata": _meta(spec, settings),
        "spec": {"podSelector": _selector(spec),
                 "egress": [{"matches": matches,
                             "ports": [{"protocol": "TCP", "port": 443},
                                       {"protocol": "TCP", "port": 80}]}]},
    }


def sandbox_dns_policy(spec: RunSpec, settings: SandboxClusterSettings = SandboxClusterSettings()
                       ) -> dict[str, Any] | None:
    """DNS to kube-dns, only for a sandbox allowed to reach host names."""
    if not any(not _is_address(d) for d in spec.allowed_network):
        return None
    meta = _meta(spec, settings)
    meta["name"] = name("sandbox-dns-", spec.sandbox_id)
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
        "spec": {"podSelector": _selector(spec), "policyTypes": ["Egress"],
                 "egress": [{
                     "to": [{"namespaceSelector": {"matchLabels": {
                         "kubernetes.io/metadata.name": settings.kube_dns_namespace}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                     "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                 }]},
    }


def sandbox_manifests(spec: RunSpec, base_sha: str, urls: Mapping[str, str],
                      settings: SandboxClusterSettings = SandboxClusterSettings()
                      ) -> list[dict[str, Any]]:
    """Everything one sandbox needs, in the order to apply: policies before the Pod, so the
    Pod never runs unconfined."""
    objects = [sandbox_network_policy(spec, settings), sandbox_dns_policy(spec, settings),
               sandbox_fqdn_policy(spec, settings), sandbox_secret(spec, urls, settings),
               sandbox_pod(spec, base_sha, settings)]
    return [o for o in objects if o is not None]
