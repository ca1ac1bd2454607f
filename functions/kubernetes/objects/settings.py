"""How Stasis uses one cluster: set by the deployment (``STASIS_K8S_*``), not by the catalog.

:meth:`ClusterSettings.from_env` and :meth:`SandboxClusterSettings.from_env` are the one
place that says which variable sets which field (the README's Kubernetes section lists
them); they read a mapping they are given, so they stay pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

SYSTEM_NAMESPACE = "stasis-system"


@dataclass(frozen=True)
class ClusterSettings:
    """How Stasis uses one cluster; set by the deployment, not by the catalog."""

    #: Team namespaces are ``<prefix><team slug>``; also names the storage configs.
    namespace_prefix: str = "stasis-"
    #: Where the monitor (and the access proxy) run; workspaces accept traffic from it.
    system_namespace: str = SYSTEM_NAMESPACE
    #: A profile without ``disk.storage_class`` gets this one: CMEK-encrypted by default
    #: (see ``workspace.encrypted_storage_class``).
    storage_class: str = "standard-rwo-cmek"
    home_size: str = "10Gi"
    #: The snapshot agent's image: Stasis under ``agent_source_root`` (sidecar + monitor).
    agent_image: str = "us-docker.pkg.dev/example-project/stasis/agent:latest"
    agent_source_root: str = "/opt/stasis"
    #: Whether the cluster has GKE Pod Snapshots; without them method ``pod`` falls back to
    #: ``kernel`` (the same agent as on the local runtime).
    pod_snapshots: bool = True
    runtime_class: str = "gvisor"
    jupyter_port: int = 8888
    agent_port: int = 8890
    uid: int = 1000
    gid: int = 100
    #: Where the control plane and the IDE proxy reach a workspace's IDE server (users
    #: reach it through the IDE proxy): ``{service}``, ``{namespace}``, ``{port}``,
    #: ``{workspace}`` (the slug) and ``{path}`` (the server's base path) are filled in.
    url_template: str = "http://{service}.{namespace}.svc.cluster.local:{port}{path}"
    #: Optional: Pod Snapshots GKE deletes when not restored for this long ("30d").
    pod_snapshot_retention: str | None = None
    #: Extra environment of the snapshot agent (e.g. ``STORAGE_EMULATOR_HOST`` on a test
    #: cluster; the agent hands it to the kernels it snapshots).
    agent_env: Mapping[str, str] = field(default_factory=dict)
    #: Extra environment of the IDE container and so of its kernels: ``STASIS_PROJECT`` and
    #: ``STASIS_SNAPSHOT_BUCKET``, which ``stasis.jobs`` needs to submit a job from a notebook.
    workspace_env: Mapping[str, str] = field(default_factory=dict)
    #: Where deployed functions' Direct VPC egress comes from (the subnet's primary
    #: range): the links proxy reaches the IDE port from there.
    function_cidrs: tuple[str, ...] = ()
    #: Kueue admits workspace pods and JobSets (``objects.kueue``): they carry its queue
    #: labels and a workspace waits QUEUED, its pod gated, until its Workload is admitted.
    kueue: bool = False
    #: Kueue's ProvisioningRequest admission check (GKE's Dynamic Workload Scheduler,
    #: ``queued-provisioning.gke.io``) on the accelerator flavors.
    kueue_provisioning: bool = False
    #: With Kueue: how long a pod Kueue preempts stays up (its containers' preStop hold it)
    #: for the control plane to pause it with its state before it is gone.
    preemption_grace_seconds: int = 120
    #: The audience of the token projected into every IDE container (its workspace
    #: identity, checked by ``workspace_api``): a token for this audience is good for
    #: nothing else, not even the API server.
    workspace_audience: str = "stasis-workspace"
    #: The ``workspace_api`` function's URL, the kernels' ``STASIS_WORKSPACE_URL`` ("":
    #: not deployed, so the variable is not set).
    workspace_api_url: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ClusterSettings:
        """Settings from ``STASIS_K8S_*`` in ``env`` (the defaults for what is unset)."""
        defaults = cls()
        return cls(
            namespace_prefix=env.get("STASIS_K8S_NAMESPACE_PREFIX", defaults.namespace_prefix),
            system_namespace=env.get("STASIS_K8S_SYSTEM_NAMESPACE", defaults.system_namespace),
            storage_class=env.get("STASIS_K8S_STORAGE_CLASS", defaults.storage_class),
            home_size=env.get("STASIS_K8S_HOME_SIZE", defaults.home_size),
            agent_image=env.get("STASIS_K8S_AGENT_IMAGE", defaults.agent_image),
            pod_snapshots=env.get("STASIS_K8S_POD_SNAPSHOTS", "1").lower()
            in ("1", "true", "yes"),
            url_template=env.get("STASIS_K8S_URL_TEMPLATE", defaults.url_template),
            pod_snapshot_retention=env.get("STASIS_K8S_POD_SNAPSHOT_RETENTION") or None,
            function_cidrs=tuple(c.strip() for c in env.get("STASIS_K8S_FUNCTION_CIDRS", "")
                                 .split(",") if c.strip()),
            kueue=_flag(env.get("STASIS_K8S_KUEUE", "0")),
            kueue_provisioning=_flag(env.get("STASIS_K8S_KUEUE_PROVISIONING", "0")),
            preemption_grace_seconds=int(env.get("STASIS_K8S_PREEMPTION_GRACE_SECONDS")
                                         or defaults.preemption_grace_seconds),
            workspace_audience=env.get("STASIS_K8S_WORKSPACE_AUDIENCE")
            or defaults.workspace_audience,
            workspace_api_url=env.get("STASIS_K8S_WORKSPACE_API_URL", ""),
            # what a notebook needs to submit scale-out jobs (stasis.jobs)
            workspace_env={k: v for k, v in {
                "STASIS_PROJECT": env.get("STASIS_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT")
                or "",
                "STASIS_SNAPSHOT_BUCKET": env.get("STASIS_SNAPSHOT_BUCKET") or ""}.items() if v},
        )


@dataclass(frozen=True)
class SandboxClusterSettings:
    """How sandboxes use a cluster; set by the deployment."""

    namespace_prefix: str = "stasis-"
    #: The Pod's RuntimeClass (None: the node's default, for clusters without gVisor).
    runtime_class: str | None = "gvisor"
    #: Image of the task: the team's environment image (tools of the task's own).
    task_image: str = "us-docker.pkg.dev/example-project/stasis/python:3.11"
    #: Image with git and curl for checkout and collector.
    tools_image: str = "us-docker.pkg.dev/example-project/stasis/sandbox-tools:1"
    cpu: str = "1"
    work_size: str = "10Gi"
    #: Where the checkout and collector reach Cloud Storage (Private Google Access).
    transfer_cidrs: tuple[str, ...] = ("199.36.153.8/30",)
    transfer_port: int = 443
    #: /etc/hosts entries that send the signed URLs' host to the transfer endpoints, so
    #: the pod needs no DNS (which would be a way out of it); empty on a cluster where
    #: the URLs point elsewhere (a test cluster's fake-gcs-server).
    transfer_host_aliases: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("199.36.153.8", ("storage.googleapis.com",)),)
    kube_dns_namespace: str = "kube-system"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SandboxClusterSettings:
        """Settings from ``STASIS_K8S_*`` in ``env``; host aliases are written
        ``ip=host,host;ip=host``."""
        defaults = cls()
        cidrs = env.get("STASIS_K8S_SANDBOX_TRANSFER_CIDRS")
        aliases = env.get("STASIS_K8S_SANDBOX_HOST_ALIASES")
        return cls(
            namespace_prefix=env.get("STASIS_K8S_NAMESPACE_PREFIX", defaults.namespace_prefix),
            runtime_class=env.get("STASIS_K8S_SANDBOX_RUNTIME_CLASS", defaults.runtime_class),
            task_image=env.get("STASIS_K8S_SANDBOX_IMAGE", defaults.task_image),
            tools_image=env.get("STASIS_K8S_SANDBOX_TOOLS_IMAGE", defaults.tools_image),
            transfer_cidrs=tuple(c for c in cidrs.split(",") if c) if cidrs is not None
            else defaults.transfer_cidrs,
            transfer_host_aliases=_aliases(aliases) if aliases is not None
            else defaults.transfer_host_aliases,
        )


class NamespacePrefix(Protocol):
    """Either settings: both name team namespaces."""

    @property
    def namespace_prefix(self) -> str: ...


def _flag(value: str) -> bool:
    return value.lower() in ("1", "true", "yes")


def _aliases(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    out = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        ip, _, hosts = entry.partition("=")
        out.append((ip.strip(), tuple(h.strip() for h in hosts.split(",") if h.strip())))
    return tuple(out)
