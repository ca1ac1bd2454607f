"""Kubernetes objects for one agent sandbox, as pure builders (a run spec in, dicts out),
and the pure reading of what a finished sandbox Pod says.

``functions.kubernetes.sandboxes`` applies these objects (after uploading
the git bundle and minting the signed URLs); ``runtime.kubernetes.sandbox_watch`` turns
the Pod's end into sandbox.finished with :func:`pod_outcome`. Nothing here talks to a
cluster. What the objects promise:

- **Pod** (:func:`sandbox_pod`) in the team's namespace (Pod Security ``restricted``):
  ``runtimeClassName: gvisor`` (a user-space kernel between the task and the node), no
  service-account token (``automountServiceAccountToken: false``), no service links, non-root
  with no capabilities, no privilege escalation, the RuntimeDefault seccomp profile, a
  read-only root filesystem, ``restartPolicy: Never`` and ``activeDeadlineSeconds`` (the
  wall clock plus the time to fetch and collect). Containers share ``/work`` and
  ``/results`` (emptyDirs with size limits); ``/private`` is mounted in checkout and
  collector only:

  1. ``checkout`` (init): fetches a git bundle of the base ref through a signed URL,
     checks the base commit out, and keeps a copy of the repository's config in
     ``/private``;
  2. ``task``: runs the command under ``ulimit -t`` (CPU seconds, per process) and, where
     the image has ``timeout``, the wall clock (so a task that runs too long still gets
     its patch collected); the memory limit is its container limit. ``exit_status`` gets
     ``"<status> <exited|wall_clock_exceeded>"``. It gets no URL, no token, no credential;
  3. ``collector``: waits for the exit status, restores the repository's config from
     ``/private`` and runs git without hooks, fsmonitor, external diff or textconv (the
     task may have planted any of them to run with the collector's URLs), takes
     ``git add -A`` + ``git diff --binary`` against the base commit, and uploads patch,
     log and exit status (last: it marks the results complete) through signed URLs.

  The signed URLs (capabilities for single objects, expiring) come from a Secret
  (:func:`sandbox_secret`) referenced only by ``checkout`` and ``collector``. Cloud
  Storage is reached without DNS: ``hostAliases`` maps its host name to the Private
  Google Access addresses (``transfer_host_aliases``), the only egress the policy opens.
- **NetworkPolicy** (:func:`sandbox_network_policy`): default deny, ingress and egress.
  Egress is opened only to the transfer endpoints (``transfer_cidrs``, e.g. Private Google
  Access 199.36.153.8/30 on 443, which the checkout and collector need) and to the allowed
  destinations that are addresses or CIDRs. A NetworkPolicy selects pods, not containers:
  the task can reach the transfer endpoints too, without credentials; a VPC Service
  Controls perimeter keeps it from other projects' buckets.
- **FQDNNetworkPolicy** (:func:`sandbox_fqdn_policy`, GKE Dataplane V2) for allowed
  destinations that are host names, plus DNS to kube-dns; none when there are none.

Objects in Cloud Storage, under the sandbox's ``result_prefix``: ``base.bundle`` (the
checkout's input, deleted with the sandbox's Kubernetes objects), ``patch.diff``,
``log.txt`` and ``exit_status`` (the collector's output).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from functions.domain.catalog import format_quantity
from functions.domain.sandboxes import RunSpec
from functions.domain.sandboxes import Termination as T
from functions.kubernetes.objects.hardware import guaranteed
from functions.kubernetes.objects.meta import (
    ANN_BASE_SHA,
    ANN_BUCKET,
    ANN_IDLE_SECONDS,
    ANN_MEMORY,
    ANN_NETWORK,
    ANN_PREFIX,
    ANN_REQUESTID,
    ANN_SANDBOX_ID,
    ANN_SEQUENCE,
    ANN_TEAM_ID,
    COMPONENT,
    LABEL_METHOD,
    LABEL_SANDBOX,
    MANAGED_SELECTOR,
    annotations_of,
    is_managed,
    labels_of,
    meta,
    team_labels,
)
from functions.kubernetes.objects.names import name, slug
from functions.kubernetes.objects.podsnapshot import PODSNAPSHOT_API, PS_NAME_ANNOTATION
from functions.kubernetes.objects.reports import event_id
from functions.kubernetes.objects.security import restricted_container, restricted_pod
from functions.kubernetes.objects.settings import SandboxClusterSettings
from functions.kubernetes.objects.status import terminated, waiting_failure
from functions.kubernetes.objects.team import team_namespace_name

SECRET_KEYS = ("bundle-url", "patch-url", "log-url", "status-url")
#: Object names under the sandbox's result prefix.
BUNDLE_OBJECT = "base.bundle"
PATCH_OBJECT = "patch.diff"
LOG_OBJECT = "log.txt"
STATUS_OBJECT = "exit_status"
#: Which object each signed URL is for, with its method and content type (the signature
#: of a PUT covers the content type, so the collector must send exactly this one).
URL_OBJECTS: dict[str, tuple[str, str, str | None]] = {
    "bundle-url": (BUNDLE_OBJECT, "GET", None),
    "patch-url": (PATCH_OBJECT, "PUT", "text/x-diff"),
    "log-url": (LOG_OBJECT, "PUT", "text/plain"),
    "status-url": (STATUS_OBJECT, "PUT", "text/plain"),
}
TASK_CONTAINER = "task"
CHECKOUT_CONTAINER = "checkout"
UID = 65532
_FETCH_AND_COLLECT_SECONDS = 600


def object_name(sandbox_id: str) -> str:
    return name("sandbox-", sandbox_id)


def dns_policy_name(sandbox_id: str) -> str:
    return name("sandbox-dns-", sandbox_id)


def sandbox_labels_selector(sandbox_id: str | None = None) -> str:
    """The label selector of sandbox objects (of one sandbox, or of all)."""
    selector = f"{MANAGED_SELECTOR},{COMPONENT}=sandbox"
    return f"{selector},{LABEL_SANDBOX}={slug(sandbox_id)}" if sandbox_id else selector


def is_sandbox(obj: Mapping[str, Any]) -> bool:
    return is_managed(obj) and labels_of(obj).get(COMPONENT) == "sandbox"


def _metadata(spec: RunSpec, settings: SandboxClusterSettings,
              annotations: Mapping[str, str] | None = None, *,
              obj_name: str | None = None) -> dict[str, Any]:
    return meta(obj_name or object_name(spec.sandbox_id),
                team_namespace_name(spec.team, settings), labels=_labels(spec),
                annotations=annotations)


def _labels(spec: RunSpec) -> dict[str, str]:
    return {COMPONENT: "sandbox", **team_labels(spec.team), LABEL_SANDBOX: slug(spec.sandbox_id)}


def _selector(spec: RunSpec) -> dict[str, Any]:
    return {"matchLabels": {LABEL_SANDBOX: slug(spec.sandbox_id)}}


def sandbox_secret(spec: RunSpec, urls: Mapping[str, str],
                   settings: SandboxClusterSettings = SandboxClusterSettings()) -> dict[str, Any]:
    """The signed URLs of one sandbox (``SECRET_KEYS``), for checkout and collector only."""
    missing = [k for k in SECRET_KEYS if k not in urls]
    if missing:
        raise ValueError(f"signed URLs missing: {', '.join(missing)}")
    # Where its objects are, for whoever removes the sandbox once the Pod is gone.
    annotations = {ANN_SANDBOX_ID: spec.sandbox_id, ANN_BUCKET: spec.bucket,
                   ANN_PREFIX: spec.prefix}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _metadata(spec, settings, annotations),
            "stringData": {k: urls[k] for k in SECRET_KEYS}}


_CHECKOUT = """set -eu
curl -fsS --retry 3 -o /private/base.bundle "$BUNDLE_URL"
git clone --quiet --no-checkout /private/base.bundle /work/repo
git -C /work/repo checkout --quiet --detach "$BASE_SHA"
git -C /work/repo remote remove origin
rm /private/base.bundle
cp /work/repo/.git/config /private/config
"""

# The wall clock is also the pod's deadline (plus fetch and collect time); enforcing it
# here lets the collector still return the patch of a task that ran out of time.
_TASK = """ulimit -t "$CPU_SECONDS"
cd /work/repo
began=$(date +%s)
if command -v timeout >/dev/null 2>&1; then
  timeout -k 5 "$WALL_SECONDS" /bin/sh -c "$TASK" >/results/log.txt 2>&1
else
  /bin/sh -c "$TASK" >/results/log.txt 2>&1
fi
status=$?
why=exited
if [ "$status" -ge 124 ] && [ $(( $(date +%s) - began )) -ge "$WALL_SECONDS" ]; then
  why=wall_clock_exceeded
fi
echo "$status $why" >/results/exit_status.tmp && mv /results/exit_status.tmp /results/exit_status
"""

_COLLECT = """set -u
until [ -f /results/exit_status ]; do sleep 1; done
cp /results/exit_status /private/exit_status
touch /results/log.txt
cd /work/repo
cp /private/config .git/config && rm -rf .git/hooks
safe_git() {
  git -c core.hooksPath=/dev/null -c core.fsmonitor=false "$@"
}
if safe_git add -A && safe_git diff --cached --binary --no-ext-diff --no-textconv "$BASE_SHA" \
    >/private/patch.diff; then
  curl -fsS --retry 3 -o /dev/null -X PUT -H 'Content-Type: text/x-diff' \
    --upload-file /private/patch.diff "$PATCH_URL"
fi
curl -fsS --retry 3 -o /dev/null -X PUT -H 'Content-Type: text/plain' \
  --upload-file /results/log.txt "$LOG_URL"
curl -fsS --retry 3 -o /dev/null -X PUT -H 'Content-Type: text/plain' \
  --upload-file /private/exit_status "$STATUS_URL"
"""


def _secret_env(spec: RunSpec, names: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"name": env, "valueFrom": {"secretKeyRef": {
        "name": object_name(spec.sandbox_id), "key": key}}} for env, key in names]


def _security() -> dict[str, Any]:
    return restricted_container(read_only_root=True, user=UID, group=UID, seccomp=True)


def _mounts(*, private: bool = False) -> list[dict[str, Any]]:
    mounts = [{"name": "work", "mountPath": "/work"},
              {"name": "results", "mountPath": "/results"}, {"name": "tmp", "mountPath": "/tmp"}]
    return [*mounts, {"name": "private", "mountPath": "/private"}] if private else mounts


def network_description(spec: RunSpec,
                        settings: SandboxClusterSettings = SandboxClusterSettings()) -> str:
    """What the sandbox can reach, as the policies enforce it (sandbox.finished says so)."""
    transfer = (f"; Cloud Storage transfer endpoints {', '.join(settings.transfer_cidrs)} "
                f"on {settings.transfer_port} (for checkout and collector)"
                if settings.transfer_cidrs else "")
    if not spec.allowed_network:
        return f"none: default-deny NetworkPolicy{transfer}"
    return (f"only {', '.join(spec.allowed_network)}: NetworkPolicy (addresses) and "
            f"FQDNNetworkPolicy (host names), default deny otherwise{transfer}")


def _tool_resources() -> dict[str, Any]:
    return guaranteed("250m", "256Mi")


def sandbox_pod(spec: RunSpec, base_sha: str,
                settings: SandboxClusterSettings = SandboxClusterSettings()) -> dict[str, Any]:
    """The sandbox's Pod (see the module docstring)."""
    memory = format_quantity(spec.limits.memory_bytes)
    common_env = [{"name": "BASE_SHA", "value": base_sha}, {"name": "HOME", "value": "/tmp"}]
    task_env = [
        {"name": "TASK", "value": spec.command},
        {"name": "CPU_SECONDS", "value": str(spec.limits.cpu_seconds)},
        {"name": "WALL_SECONDS", "value": str(spec.limits.wall_clock_seconds)},
        {"name": "HOME", "value": "/tmp"},
        {"name": "STASIS_SANDBOX_ID", "value": spec.sandbox_id},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    annotations = {ANN_SANDBOX_ID: spec.sandbox_id, ANN_REQUESTID: spec.requestid,
                   ANN_TEAM_ID: spec.team, ANN_BUCKET: spec.bucket, ANN_PREFIX: spec.prefix,
                   ANN_BASE_SHA: base_sha, ANN_MEMORY: memory,
                   ANN_NETWORK: network_description(spec, settings),
                   # the cluster monitor reports it idle after this long (0: never)
                   ANN_IDLE_SECONDS: str(spec.limits.idle_seconds)}
    aliases = [{"ip": ip, "hostnames": list(hosts)}
               for ip, hosts in settings.transfer_host_aliases]
    metadata = _metadata(spec, settings, annotations)
    # Selected by the team's PodSnapshotPolicy (manual triggers only): an idle sandbox can
    # be snapshotted and its Pod released (:func:`sandbox_snapshot_trigger`).
    metadata["labels"][LABEL_METHOD] = "pod"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": metadata,
        "spec": {
            **({"runtimeClassName": settings.runtime_class} if settings.runtime_class else {}),
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": spec.limits.wall_clock_seconds
            + _FETCH_AND_COLLECT_SECONDS,
            "terminationGracePeriodSeconds": 5,
            **({"hostAliases": aliases} if aliases else {}),
            "securityContext": restricted_pod(UID, UID, fs_group=UID),
            "volumes": [
                {"name": "work", "emptyDir": {"sizeLimit": settings.work_size}},
                {"name": "results", "emptyDir": {"sizeLimit": "2Gi"}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "private", "emptyDir": {"sizeLimit": "2Gi"}},
            ],
            "initContainers": [{
                "name": CHECKOUT_CONTAINER, "image": settings.tools_image,
                "command": ["/bin/sh", "-c", _CHECKOUT],
                "env": [*common_env, *_secret_env(spec, [("BUNDLE_URL", "bundle-url")])],
                "volumeMounts": _mounts(private=True), "securityContext": _security(),
                "resources": _tool_resources(),
            }],
            "containers": [
                {
                    "name": TASK_CONTAINER, "image": settings.task_image,
                    "command": ["/bin/sh", "-c", _TASK], "env": task_env,
                    "workingDir": "/work",
                    "volumeMounts": _mounts(), "securityContext": _security(),
                    "resources": guaranteed(settings.cpu, memory),
                },
                {
                    "name": "collector", "image": settings.tools_image,
                    "command": ["/bin/sh", "-c", _COLLECT],
                    "env": [*common_env, *_secret_env(spec, [
                        ("PATCH_URL", "patch-url"), ("LOG_URL", "log-url"),
                        ("STATUS_URL", "status-url")])],
                    "volumeMounts": _mounts(private=True), "securityContext": _security(),
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
        "ports": [{"protocol": "TCP", "port": settings.transfer_port}],
    }] if settings.transfer_cidrs else []
    addresses = [d for d in spec.allowed_network if _is_address(d)]
    if addresses:
        egress.append({"to": [{"ipBlock": {"cidr": str(ipaddress.ip_network(d, strict=False))}}
                              for d in addresses]})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _metadata(spec, settings),
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
        "metadata": _metadata(spec, settings),
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
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _metadata(spec, settings, obj_name=dns_policy_name(spec.sandbox_id)),
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


# --------------------------------------------------------------------------------------------
# What a sandbox Pod says when it ends (read by runtime.kubernetes.sandbox_watch)
# --------------------------------------------------------------------------------------------

#: ``ulimit -t`` ends a process with SIGXCPU (24); the shell reports 128 + 24.
SIGXCPU_EXIT = 128 + 24
_CHECKOUT_FAILED = "the checkout failed"


@dataclass(frozen=True)
class PodOutcome:
    """How a sandbox ended, in sandbox.finished's terms (``termination`` is a
    :class:`~functions.domain.sandboxes.Termination` value)."""

    termination: str
    exit_status: int | None = None
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.termination == T.EXITED and self.exit_status == 0

    @property
    def checkout_failed(self) -> bool:
        """The checkout never produced a working copy (its log says why)."""
        return self.termination == T.FAILED_TO_START and bool(self.error) and \
            str(self.error).startswith(_CHECKOUT_FAILED)


def _task_env(pod: Mapping[str, Any], key: str) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == TASK_CONTAINER:
            for env in container.get("env") or []:
                if env.get("name") == key:
                    return str(env.get("value") or "")
    return ""


def pod_ended(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") in ("Succeeded", "Failed") or \
        status.get("reason") == "DeadlineExceeded"


def parse_exit_status(text: str) -> tuple[int | None, str]:
    """The task script's ``"<status> <why>"`` (an older ``"<status>"`` alone: exited)."""
    parts = text.split()
    try:
        code = int(parts[0]) if parts else None
    except ValueError:
        code = None
    return code, parts[1] if len(parts) > 1 else "exited"


def pod_outcome(pod: Mapping[str, Any], exit_status: str | None) -> PodOutcome | None:
    """How the sandbox ended, from its Pod and the collector's ``exit_status`` object (None:
    not uploaded); None while it has not ended. An early-return ladder, most specific
    first."""
    cannot_start = waiting_failure(pod)
    if cannot_start:
        # The image or the config is wrong: waiting longer changes nothing.
        return PodOutcome(T.FAILED_TO_START, error=cannot_start)
    task = terminated(pod, TASK_CONTAINER)
    if task is not None and task.get("reason") == "OOMKilled":
        # The whole task container is killed (cgroup v2 OOM group): it writes no exit
        # status, and the collector would wait for one until the deadline.
        memory = annotations_of(pod).get(ANN_MEMORY) or "its limit"
        return PodOutcome(T.MEMORY_LIMIT_EXCEEDED, _int_or_none(task.get("exitCode")),
                          f"the task used more memory than its limit ({memory}) and was "
                          "killed")
    if task is not None and task.get("exitCode") not in (0, None):
        # The task script ends with 0 once it wrote the exit status: anything else means
        # it never did, and the collector would wait for it until the deadline.
        code, reason = _int_or_none(task.get("exitCode")), task.get("reason") or "Error"
        if reason in ("StartError", "ContainerCannotRun") or code in (126, 127):
            return PodOutcome(T.FAILED_TO_START, error=(
                f"the task container could not run its command ({reason}, exit {code})"))
        return PodOutcome(T.KILLED, code, (f"the task container was stopped ({reason}, exit "
                                           f"{code}) before it wrote an exit status"))
    if not pod_ended(pod):
        return None
    if exit_status is not None:
        return _from_exit_status(pod, exit_status)
    status = pod.get("status") or {}
    if status.get("reason") == "DeadlineExceeded":
        deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
        return PodOutcome(T.WALL_CLOCK_EXCEEDED, error=(
            f"the pod passed its deadline of {deadline} s (the wall clock plus the time to "
            "fetch and collect); no patch was collected"))
    checkout = terminated(pod, CHECKOUT_CONTAINER)
    if checkout is not None and checkout.get("exitCode") not in (0, None):
        return PodOutcome(T.FAILED_TO_START, error=(
            f"{_CHECKOUT_FAILED} (exit {checkout.get('exitCode')}"
            f"{', ' + str(checkout['reason']) if checkout.get('reason') else ''})"))
    return PodOutcome(T.RUNTIME_LOST, error=(
        f"the pod ended (phase {status.get('phase')}) without an exit status from the "
        "collector"))


def _from_exit_status(pod: Mapping[str, Any], text: str) -> PodOutcome:
    code, why = parse_exit_status(text)
    if code is None:
        return PodOutcome(T.RUNTIME_LOST, error=f"unreadable exit status {text.strip()!r}")
    if why == T.WALL_CLOCK_EXCEEDED:
        return PodOutcome(T.WALL_CLOCK_EXCEEDED, code,
                          f"the task ran past its wall clock of {_task_env(pod, 'WALL_SECONDS')}"
                          " s and was stopped")
    if code == SIGXCPU_EXIT:
        return PodOutcome(T.CPU_TIME_EXCEEDED, code,
                          f"the task used more than {_task_env(pod, 'CPU_SECONDS')} CPU "
                          "seconds (SIGXCPU)")
    if 128 < code < 128 + 65:
        signal = code - 128
        hint = " (SIGKILL: the memory limit kills this way too)" if signal == 9 else ""
        return PodOutcome(T.KILLED, code, f"the task was killed by signal {signal}{hint}")
    return PodOutcome(T.EXITED, code, None if code == 0 else f"exit status {code}")


def task_duration_ms(pod: Mapping[str, Any]) -> int:
    """How long the task container ran (0 when the pod does not say)."""
    task = terminated(pod, TASK_CONTAINER) or {}
    try:
        began = datetime.fromisoformat(str(task["startedAt"]).replace("Z", "+00:00"))
        ended = datetime.fromisoformat(str(task["finishedAt"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return 0
    return max(0, int((ended - began).total_seconds() * 1000))


def files_in_patch(patch: str) -> list[str]:
    """The paths a ``git diff --binary`` patch changes (the new name of a rename), in
    order. Git quotes unusual names C-style; those are unquoted."""
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            files.append(_header_path(line[len("diff --git "):]))
        elif files and line.startswith(("rename to ", "copy to ")):
            files[-1] = _unquote(line.split(" to ", 1)[1])
    return files


def _header_path(rest: str) -> str:
    """``b/<path>`` of ``a/<path> b/<path>`` (equal for anything but a rename or copy, whose
    ``rename to`` line follows)."""
    if rest.endswith('"'):
        start = rest.rfind(' "b/')
        return _unquote(rest[start + 1:])[2:] if start >= 0 else rest
    if (len(rest) - 5) % 2 == 0 and rest.startswith("a/"):
        size = (len(rest) - 5) // 2
        if rest[2 + size:5 + size] == " b/":
            return rest[5 + size:]
    return rest.split(" b/", 1)[-1]


def _unquote(text: str) -> str:
    if not (len(text) >= 2 and text[0] == '"' and text[-1] == '"'):
        return text
    escapes = {"n": b"\n", "t": b"\t", '"': b'"', "\\": b"\\", "a": b"\a", "b": b"\b",
               "f": b"\f", "r": b"\r", "v": b"\v"}
    out = bytearray()
    body, i = text[1:-1], 0
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "0123" and i + 4 <= len(body):
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out += escapes.get(nxt, nxt.encode())
            i += 2
            continue
        out += char.encode()
        i += 1
    return out.decode("utf-8", "replace")


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------------------------
# Idle suspension with GKE Pod Snapshots
# --------------------------------------------------------------------------------------------


def snapshot_trigger_name(sandbox_id: str, sequence: int) -> str:
    return name("sandbox-", f"{sandbox_id}.{sequence}")


def sandbox_snapshot_trigger(pod: Mapping[str, Any], *, sequence: int,
                             idle_seconds: int) -> dict[str, Any]:
    """Checkpoint an idle sandbox's Pod (its ``sequence``-th suspension). The Pod keeps
    running after the checkpoint (the team's policy: ``postCheckpoint: resume``) until it
    is released, so a failed snapshot never loses the sandbox."""
    pod_meta = pod.get("metadata") or {}
    annotations = annotations_of(pod)
    labels = {k: v for k, v in labels_of(pod).items() if k != LABEL_METHOD}
    return {"apiVersion": PODSNAPSHOT_API, "kind": "PodSnapshotManualTrigger",
            "metadata": {
                "name": snapshot_trigger_name(str(annotations.get(ANN_SANDBOX_ID)), sequence),
                "namespace": pod_meta.get("namespace"), "labels": labels,
                "annotations": {ANN_SANDBOX_ID: str(annotations.get(ANN_SANDBOX_ID)),
                                ANN_REQUESTID: str(annotations.get(ANN_REQUESTID) or ""),
                                ANN_SEQUENCE: str(sequence),
                                ANN_IDLE_SECONDS: str(idle_seconds)}},
            "spec": {"targetPod": pod_meta.get("name")}}


def suspension_requestid(requestid: str, sequence: int) -> str:
    """The requestid of a sandbox's n-th sandbox.suspended (one ledger entry each)."""
    return f"{requestid}.suspend-{sequence}"


def idle_requestid(requestid: str, sequence: int) -> str:
    """The requestid of the idle report before a sandbox's n-th suspension."""
    return f"{requestid}.idle-{sequence}"


def finished_event_id(sandbox_id: str, requestid: str) -> str:
    """The one id of a sandbox's sandbox.finished (or of its n-th sandbox.suspended, with
    :func:`suspension_requestid`), whoever reports it: the watch or a cancel."""
    return event_id("k8s-sandbox", sandbox_id, requestid)


def idle_event_id(sandbox_id: str, requestid: str, sequence: int) -> str:
    """One id per idle period: a restarted watch reporting it again is a duplicate."""
    return event_id("k8s-sandbox-idle", sandbox_id, requestid, str(sequence))


def restored_pod(spec: RunSpec, base_sha: str, ps_name: str,
                 settings: SandboxClusterSettings = SandboxClusterSettings()) -> dict[str, Any]:
    """The sandbox's Pod again, identical but for ``podsnapshot.gke.io/ps-name``: GKE
    restores it from that PodSnapshot (memory, root file system and emptyDirs) instead of
    starting it fresh."""
    pod = sandbox_pod(spec, base_sha, settings)
    pod["metadata"]["annotations"][PS_NAME_ANNOTATION] = ps_name
    return pod
