"""Who may do what in the cluster: the control plane's rights, verb by verb (no wildcards).

Two kinds of function subjects. The *managers* (the lifecycle, sandbox and job handlers,
the reconciler, the janitor) get :func:`workspace_manager_rules` inside each team namespace
through a RoleBinding (:func:`team_role_binding`); the *readers* (the link proxy, the idle
sweep and idle policy) only read a workspace's pod and token Secret there
(:func:`workspace_reader_rules`, :func:`team_reader_binding`). Cluster-wide, the managers
may only read namespaces and keep the PodSnapshot storage configs (:func:`control_plane_rbac`).
No function creates a RoleBinding, binds a role or patches a namespace: the install step
(Terraform, ``deploy/cluster.py``) creates each team's namespace and bindings. The monitor's
and the IDE proxy's read-only rights are with their Deployments (``monitor``,
``ide_proxy``); :func:`verbs_by_subject` is the table of every verb per subject that
``tests/data/rbac_verbs.json`` pins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from functions.kubernetes.objects.kinds import JOBSET_GROUP, PODSNAPSHOT_GROUP, RBAC_GROUP
from functions.kubernetes.objects.meta import meta, team_labels
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.team import team_namespace_name

RBAC_API = RBAC_GROUP
WORKSPACE_MANAGER_ROLE = "stasis-workspace-manager"
WORKSPACE_READER_ROLE = "stasis-workspace-reader"
CONTROL_PLANE_ROLE = "stasis-control-plane"
READER_BINDING = "stasis-readers"


def user_subject(user: str) -> dict[str, str]:
    """An RBAC subject for a user: on GKE, a Google identity such as the functions'
    ``fn@PROJECT.iam.gserviceaccount.com``."""
    return {"kind": "User", "name": user, "apiGroup": RBAC_API}


def rule(group: str, resources: Sequence[str], verbs: Sequence[str],
         resource_names: Sequence[str] = ()) -> dict[str, Any]:
    found: dict[str, Any] = {"apiGroups": [group], "resources": list(resources),
                             "verbs": list(verbs)}
    if resource_names:
        found["resourceNames"] = list(resource_names)
    return found


def workspace_manager_rules() -> list[dict[str, Any]]:
    """What the control plane does inside a team namespace, verb by verb (no wildcards)."""
    return [
        rule("", ["pods"], ["get", "list", "create", "delete", "patch"]),
        rule("", ["services", "secrets", "persistentvolumeclaims"],
             ["get", "list", "create", "delete"]),
        rule("", ["configmaps"], ["get", "list", "create", "delete"]),
        # the team's KSA (patched) and one per workspace (created and deleted with it)
        rule("", ["serviceaccounts"], ["get", "list", "create", "patch", "delete"]),
        rule("", ["resourcequotas"], ["get", "create", "patch"]),
        rule("networking.k8s.io", ["networkpolicies"], ["get", "list", "create", "delete"]),
        rule(PODSNAPSHOT_GROUP, ["podsnapshotpolicies"], ["get", "create", "patch"]),
        rule(PODSNAPSHOT_GROUP, ["podsnapshotmanualtriggers"],
             ["get", "list", "create", "delete"]),
        rule(PODSNAPSHOT_GROUP, ["podsnapshots"], ["get", "list", "delete"]),
        # scale-out jobs: a JobSet and its headless Service per job (functions.kubernetes.jobs)
        rule(JOBSET_GROUP, ["jobsets"], ["get", "create", "delete"]),
        # agent sandboxes: host names a sandbox may reach (functions.kubernetes.sandboxes)
        rule("networking.gke.io", ["fqdnnetworkpolicies"], ["get", "list", "create", "delete"]),
    ]


def workspace_reader_rules() -> list[dict[str, Any]]:
    """What a reader does inside a team namespace: read a workspace's pod and its token
    Secret by name (``KubernetesRuntime.status``: the link proxy's upstream). Get only: the
    names come from the workspace id."""
    return [rule("", ["pods", "secrets"], ["get"])]


def team_reader_binding(team: str, subject: Mapping[str, str],
                        settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """Grants the readers :func:`workspace_reader_rules` in this namespace only."""
    binding = team_role_binding(team, subject, settings)
    binding["metadata"]["name"] = READER_BINDING
    binding["roleRef"]["name"] = WORKSPACE_READER_ROLE
    return binding


def team_role_binding(team: str, subject: Mapping[str, str],
                      settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """Grants the control plane the workspace manager's rights in this namespace only (a
    RoleBinding to a ClusterRole is namespaced)."""
    return {"apiVersion": f"{RBAC_API}/v1", "kind": "RoleBinding",
            "metadata": meta(CONTROL_PLANE_ROLE, team_namespace_name(team, settings),
                             labels=team_labels(team)),
            "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole",
                        "name": WORKSPACE_MANAGER_ROLE},
            "subjects": [dict(subject)]}


def control_plane_rbac(subject: Mapping[str, str]) -> list[dict[str, Any]]:
    """The ClusterRoles the team bindings name, and the managers' narrow cluster-wide role.

    Cluster-wide a manager may read namespaces (to list its workspaces) and keep the
    PodSnapshot storage configs (cluster-scoped, one per team); nothing that grants rights:
    no RoleBinding, no ``bind``, no namespace create or patch. ``subject`` is the managers'
    identity, e.g. :func:`user_subject` of ``fn@PROJECT.iam.gserviceaccount.com`` on GKE.
    """
    manager = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
               "metadata": meta(WORKSPACE_MANAGER_ROLE), "rules": workspace_manager_rules()}
    reader = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
              "metadata": meta(WORKSPACE_READER_ROLE), "rules": workspace_reader_rules()}
    cluster = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
               "metadata": meta(CONTROL_PLANE_ROLE),
               "rules": [
                   rule("", ["namespaces"], ["get", "list"]),
                   rule(PODSNAPSHOT_GROUP, ["podsnapshotstorageconfigs"],
                        ["get", "create", "patch"]),
               ]}
    binding = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRoleBinding",
               "metadata": meta(CONTROL_PLANE_ROLE),
               "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole",
                           "name": CONTROL_PLANE_ROLE},
               "subjects": [dict(subject)]}
    return [manager, reader, cluster, binding]


def verbs_by_subject(objects: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every verb each subject of ``objects`` (ClusterRoles, Roles and their bindings) may
    use: subject name -> ``{"cluster": {...}, "namespaces": {namespace: {...}}}``, each
    ``"group/resource" -> sorted verbs`` (``"[names]"`` appended where a rule names its
    objects). A binding to a role that is not among ``objects`` is an error: nothing is
    granted that the table does not show."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("ClusterRole", "Role")}
    table: dict[str, dict[str, Any]] = {}
    for obj in objects:
        if obj["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        ref = obj["roleRef"]
        namespace = obj["metadata"].get("namespace")
        role = roles.get((ref["kind"], namespace if ref["kind"] == "Role" else None,
                          ref["name"]))
        if role is None:
            raise ValueError(f"{obj['kind']} {obj['metadata']['name']} binds "
                             f"{ref['kind']} {ref['name']}, which is not among the objects")
        for subject in obj["subjects"]:
            name = subject if isinstance(subject, str) else _subject_name(subject)
            entry = table.setdefault(name, {"cluster": {}, "namespaces": {}})
            scope = entry["cluster"] if obj["kind"] == "ClusterRoleBinding" else \
                entry["namespaces"].setdefault(namespace, {})
            for found in role["rules"]:
                for group in found["apiGroups"]:
                    for resource in found["resources"]:
                        key = f"{group or 'core'}/{resource}"
                        if found.get("resourceNames"):
                            key += "[" + ",".join(found["resourceNames"]) + "]"
                        scope[key] = sorted(set(scope.get(key, [])) | set(found["verbs"]))
    return {name: table[name] for name in sorted(table)}


def _subject_name(subject: Mapping[str, str]) -> str:
    """``User:fn@...``, ``ServiceAccount:ns/name``."""
    where = f"{subject['namespace']}/" if subject.get("namespace") else ""
    return f"{subject['kind']}:{where}{subject['name']}"
