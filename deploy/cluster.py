"""The cluster objects Terraform applies (``terraform/modules/kubernetes``), built by the same
builders the Kubernetes runtime applies (``functions.kubernetes.objects``), for the teams and
storage classes of the admin configuration.

Values only Terraform knows are placeholders it fills in (:data:`PLACEHOLDERS`); the
managers' RBAC bindings' subjects become the ``@@RUNTIME_SUBJECTS@@`` list, the readers'
``@@READER_SUBJECTS@@``, where Terraform puts each function's own identity. This is the
install step: each team's namespace, service account and both bindings exist before any
function acts there (no function may create a binding or patch a namespace).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Placeholders Terraform fills in (modules/kubernetes): values only it knows.
PLACEHOLDERS = (
    "@@PROJECT@@",
    "@@BUCKET@@",
    "@@AGENT_IMAGE@@",
    "@@MONITOR_GSA@@",
    "@@DISK_KMS_KEY@@",
    "@@IDE_HOST@@",
    "@@IDE_ADDRESS@@",
    "@@IDE_CERTIFICATE@@",
    "@@IDE_OAUTH_CLIENT_ID@@",
    "@@IDE_IAP_AUDIENCE@@",
    "@@IDE_GSA@@",
    "@@EMAIL_DOMAIN@@",
)
SUBJECTS = "@@RUNTIME_SUBJECTS@@"
READERS = "@@READER_SUBJECTS@@"


def kubernetes_objects(teams: Iterable[str], storage_classes: dict[str, str],
                       catalog: Any = None) -> dict[str, Any]:
    """What Terraform applies in the cluster, as JSON by tier and key, and the names the IAM
    bindings need. The managers' per-team binding is named ``<role>-functions`` (the name
    it had when the runtime created one of its own), the readers' ``stasis-readers``. With
    the admin file's ``catalog``, the ``kueue`` tier holds Kueue's objects
    (``objects.kueue``), which Terraform applies only with ``kueue = true``."""
    from functions.kubernetes.objects import (
        ide_proxy,
        monitor,
        podsnapshot,
        rbac,
        team,
        workspace,
    )
    from functions.kubernetes.objects.settings import SYSTEM_NAMESPACE

    subject = rbac.user_subject(SUBJECTS)
    readers = rbac.user_subject(READERS)
    objects: list[dict[str, Any]] = [*rbac.control_plane_rbac(subject)]
    objects += monitor.monitor_manifests(
        project="@@PROJECT@@", image="@@AGENT_IMAGE@@", gcp_service_account="@@MONITOR_GSA@@"
    )
    objects += ide_proxy.ide_proxy_manifests(ide_proxy.IdeProxyDeployment(
        project="@@PROJECT@@", host="@@IDE_HOST@@", address="@@IDE_ADDRESS@@",
        certificate="@@IDE_CERTIFICATE@@", oauth_client_id="@@IDE_OAUTH_CLIENT_ID@@",
        iap_audience="@@IDE_IAP_AUDIENCE@@", image="@@AGENT_IMAGE@@",
        gcp_service_account="@@IDE_GSA@@", email_domain="@@EMAIL_DOMAIN@@"))
    team_info: dict[str, dict[str, str]] = {}
    for team_id in sorted(set(teams)):
        binding = rbac.team_role_binding(team_id, subject)
        binding["metadata"]["name"] += "-functions"
        objects += [
            team.team_namespace(team_id),
            team.team_service_account(team_id),
            binding,
            rbac.team_reader_binding(team_id, readers),
            *podsnapshot.team_pod_snapshots(team_id, "@@BUCKET@@"),
        ]
        team_info[team_id] = {
            "namespace": team.team_namespace_name(team_id),
            "snapshot_prefix": f"snapshots/{team_id}/",
        }
    for name, disk_type in sorted(storage_classes.items()):
        objects.append(
            workspace.encrypted_storage_class(name, "@@DISK_KMS_KEY@@", disk_type=disk_type)
        )

    tiers: dict[str, dict[str, str]] = {"namespaces": {}, "cluster": {}, "namespaced": {},
                                        "kueue": {}}
    queued: list[dict[str, Any]] = []
    if catalog is not None:
        from functions.kubernetes.objects import kueue
        from functions.kubernetes.objects.settings import ClusterSettings

        queued = [*kueue.cluster_objects(catalog, ClusterSettings(kueue=True)),
                  *(kueue.local_queue(t) for t in sorted(set(teams)))]
    for obj in objects + queued:
        named = {s.get("name") for s in obj.get("subjects", ())}
        for placeholder in (SUBJECTS, READERS):
            if placeholder in named:
                obj["subjects"] = [placeholder]
        meta = obj["metadata"]
        tier = (
            "kueue"
            if obj["apiVersion"].startswith("kueue.x-k8s.io/")
            else "namespaces"
            if obj["kind"] == "Namespace"
            else "namespaced"
            if meta.get("namespace")
            else "cluster"
        )
        key = "/".join((obj["kind"], meta.get("namespace", "_"), meta["name"])).lower()
        if key in tiers[tier]:
            raise ValueError(f"two cluster objects named {key}")
        tiers[tier][key] = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return {
        "manifests": tiers,
        "teams": team_info,
        "monitor": {"namespace": SYSTEM_NAMESPACE, "service_account": monitor.MONITOR},
        "ide_proxy": {"namespace": SYSTEM_NAMESPACE, "service_account": ide_proxy.IDE_PROXY,
                      "oauth_secret": ide_proxy.IdeProxyDeployment.oauth_secret,
                      "oauth_secret_key": ide_proxy.IAP_SECRET_KEY},
        "workspace_service_account": team.WORKSPACE_SA,
    }


def admin_catalog(config: Path) -> Any:
    """The admin file's catalog (for Kueue's objects)."""
    import yaml

    from functions.domain.catalog import Catalog

    return Catalog.from_config(yaml.safe_load(config.read_text()) or {})


def teams_and_classes(config: Path) -> tuple[list[str], dict[str, str]]:
    """The teams of the admin configuration, and every storage class its profiles (and the
    runtime's default) name -> its disk type (``premium`` in the name: SSD)."""
    import yaml

    from functions.kubernetes.objects.settings import ClusterSettings

    data = yaml.safe_load(config.read_text()) or {}
    teams = [str(t["id"]) for t in data.get("teams") or []]
    names = {ClusterSettings().storage_class}
    names |= {
        str((p.get("disk") or {}).get("storage_class"))
        for p in data.get("profiles") or []
        if (p.get("disk") or {}).get("storage_class")
    }
    return teams, {n: "pd-ssd" if "premium" in n else "pd-balanced" for n in names}
