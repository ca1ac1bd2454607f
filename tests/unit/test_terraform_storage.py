"""Storage listing is confined to the team's own prefix (issue 18 §7), checked over the parsed
HCL of ``terraform/modules/stasis/iam.tf``.

``storage.objects.list`` is authorised against the bucket, so any object role a team's
principal holds on the bucket (whatever its condition says about object names, once it
admits the bucket itself) lists every object name in it: other teams' workspace, snapshot
and sandbox ids. The team's object role is therefore granted on a managed folder, the team's
Pod Snapshot folder, and nothing that names a team principal grants an object role on the
bucket. Kernel snapshots are written with the monitor's downscoped tokens (issue 17 §5): no
pod identity holds a role on the team's snapshot folder. (checkov over the whole tree runs
in tests/unit/test_terraform.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hcl2  # python-hcl2, a test dependency
import pytest

IAM = Path(__file__).resolve().parents[2] / "terraform" / "modules" / "stasis" / "iam.tf"
#: Roles that carry storage.objects.list (or more) on what they are granted on.
OBJECT_ROLES = frozenset({"roles/storage.objectUser", "roles/storage.objectViewer",
                          "roles/storage.objectAdmin", "roles/storage.admin",
                          "roles/storage.legacyBucketReader", "roles/storage.legacyBucketOwner",
                          "roles/storage.legacyBucketWriter"})
TEAM_PRINCIPAL = "local.team_principal"


@pytest.fixture(scope="module")
def resources() -> dict[tuple[str, str], dict[str, Any]]:
    with IAM.open() as f:
        parsed = hcl2.load(f)
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for block in parsed.get("resource", []):
        for rtype, named in block.items():
            for name, body in named.items():
                if not _text(name).startswith("__"):
                    found[(_text(rtype), _text(name))] = {_text(k): v for k, v in body.items()}
    return found


def _text(value: Any) -> str:
    """A value as written, without the quotes python-hcl2 may keep around strings."""
    text = str(value)
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def test_no_team_principal_holds_an_object_role_on_the_bucket(
        resources: dict[tuple[str, str], dict[str, Any]]) -> None:
    bucket_grants = {key: body for key, body in resources.items()
                     if key[0] in ("google_storage_bucket_iam_member",
                                   "google_storage_bucket_iam_binding")}
    assert bucket_grants, "iam.tf grants nothing on the bucket: the test reads the wrong file"
    offending = [f"{rtype}.{name} ({_text(body['role'])})"
                 for (rtype, name), body in bucket_grants.items()
                 if TEAM_PRINCIPAL in _text(body.get("member") or body.get("members"))
                 and _text(body["role"]) in OBJECT_ROLES]
    assert not offending, ("a team principal may list every object name in the bucket: "
                           + ", ".join(offending))


def test_no_pod_identity_holds_a_role_on_a_teams_snapshot_folder(
        resources: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Issue 17 §5 on GKE: each workspace's identity may write only its own snapshot prefix.
    No grant names the team principal (every KSA of the namespace) on the team's snapshot
    folder; the monitor, whose downscoped tokens the sidecars use, holds the role there."""
    folder = resources[("google_storage_managed_folder", "team")]
    assert _text(folder["for_each"]) == "${var.kubernetes.teams}"
    assert _text(folder["name"]) == "${each.value.snapshot_prefix}"
    on_team_folder = {key: body for key, body in resources.items()
                      if key[0] == "google_storage_managed_folder_iam_member"
                      and "google_storage_managed_folder.team[" in _text(body["managed_folder"])}
    assert on_team_folder, "nothing is granted on the team's snapshot folder"
    members = {_text(body["member"]) for body in on_team_folder.values()}
    assert members == {"${google_service_account.monitor.member}"}, members
    grant = resources[("google_storage_managed_folder_iam_member", "monitor_snapshots")]
    assert _text(grant["for_each"]) == "${var.kubernetes.teams}"
    assert _text(grant["role"]) == "roles/storage.objectUser"


def test_the_team_principal_writes_only_its_pod_snapshots(
        resources: dict[tuple[str, str], dict[str, Any]]) -> None:
    """GKE writes Pod Snapshots as the pod's KSA (tokenSource podKSA): that grant stays, on
    the team's ``pod/`` folder only, which holds no workspace's kernel snapshots."""
    from functions.domain.retention import POD_DIR

    folder = resources[("google_storage_managed_folder", "team_pod")]
    assert _text(folder["name"]) == "${each.value.snapshot_prefix}" + POD_DIR + "/"
    team_grants = {key: body for key, body in resources.items()
                   if TEAM_PRINCIPAL in _text(body.get("member") or body.get("members"))}
    assert set(team_grants) == {
        ("google_storage_managed_folder_iam_member", "team_pod_snapshots"),
        ("google_storage_bucket_iam_member", "team_bucket")}, sorted(team_grants)
    pod_grant = team_grants[("google_storage_managed_folder_iam_member", "team_pod_snapshots")]
    assert _text(pod_grant["managed_folder"]) == \
        "${google_storage_managed_folder.team_pod[each.key].name}"
    assert _text(team_grants[("google_storage_bucket_iam_member", "team_bucket")]["role"]) == \
        "roles/storage.bucketViewer"


def test_the_token_exchange_api_is_enabled() -> None:
    """Downscoping goes through the Security Token Service."""
    services = (IAM.parents[1] / "project" / "variables.tf").read_text()
    assert '"sts.googleapis.com"' in services


def test_each_teams_prefix_is_a_folder_of_its_own() -> None:
    """A managed folder's name ends with ``/``, and no team's folder holds another's: the
    prefixes the generator gives Terraform (deploy/cluster.py) must say so."""
    from deploy import cluster

    teams = cluster.kubernetes_objects(["ml-a", "ml-ab"], {})["teams"]
    prefixes = {t: info["snapshot_prefix"] for t, info in teams.items()}
    assert prefixes == {"ml-a": "snapshots/ml-a/", "ml-ab": "snapshots/ml-ab/"}
    assert not prefixes["ml-ab"].startswith(prefixes["ml-a"])


def test_the_team_principal_is_every_ksa_of_the_teams_namespace() -> None:
    """Each workspace pod runs as its own KSA (issue 17 §3); GKE writes the team's Pod
    Snapshots as any of them, so that grant names the namespace's principalSet."""
    with IAM.open() as f:
        parsed = hcl2.load(f)
    principal = next(_text(b["team_principal"]) for b in parsed.get("locals", [])
                     if "team_principal" in b)
    assert "principalSet://iam.googleapis.com/projects/" in principal
    assert "/namespace/${t.namespace}" in principal and "/sa/" not in principal


def test_workspace_api_is_configured_for_the_clusters_tokens() -> None:
    main = (IAM.parent / "main.tf").read_text()
    assert ('STASIS_WORKSPACE_ISSUER       = '
            '"https://container.googleapis.com/v1/${module.gke.cluster_id}"') in main
    assert 'STASIS_K8S_WORKSPACE_AUDIENCE = "stasis-workspace"' in main
    assert 'var.http_functions["workspace_api"].deploy_name' in main
