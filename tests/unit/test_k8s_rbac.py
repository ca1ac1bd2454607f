"""Every verb each subject may use in the cluster, as the install step applies it
(``deploy/cluster.py``, the objects Terraform applies for the example configuration),
compared whole against ``tests/data/rbac_verbs.json``: a right added or widened is a
deliberate change (rewrite the file with ``python tests/unit/test_k8s_rbac.py`` and show
the difference in review).

And the rules the table keeps: the readers (the link proxy, the idle sweep, the monitor,
the IDE proxy) only read; nobody may grant rights (RoleBindings, ``bind``, ``escalate``,
impersonation) or create, patch or delete a namespace; no wildcard anywhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy import cluster
from deploy.tfvars import DEFAULT_CONFIG
from functions.kubernetes.objects import ide_proxy, monitor
from functions.kubernetes.objects.rbac import verbs_by_subject
from functions.kubernetes.objects.settings import SYSTEM_NAMESPACE

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests/data/rbac_verbs.json"
READ = {"get", "list", "watch"}
MANAGERS = cluster.SUBJECTS
READERS = {cluster.READERS, f"ServiceAccount:{SYSTEM_NAMESPACE}/{monitor.MONITOR}",
           f"ServiceAccount:{SYSTEM_NAMESPACE}/{ide_proxy.IDE_PROXY}"}
GRANTING = ("rolebindings", "clusterrolebindings", "roles", "clusterroles")


def table() -> dict[str, Any]:
    teams, classes = cluster.teams_and_classes(DEFAULT_CONFIG)
    found = cluster.kubernetes_objects(teams, classes)["manifests"]
    objects = [json.loads(text) for tier in found.values() for text in tier.values()]
    return verbs_by_subject(objects)


@pytest.fixture(scope="module")
def verbs() -> dict[str, Any]:
    return table()


def _scopes(entry: dict[str, Any]) -> list[dict[str, list[str]]]:
    return [entry["cluster"], *entry["namespaces"].values()]


def test_every_verb_of_every_subject_is_the_golden_table(verbs: dict[str, Any]) -> None:
    assert verbs == json.loads(GOLDEN.read_text())


def test_the_readers_only_read(verbs: dict[str, Any]) -> None:
    assert set(verbs) >= READERS
    for subject in READERS:
        for scope in _scopes(verbs[subject]):
            for resource, allowed in scope.items():
                assert set(allowed) <= READ, (subject, resource, allowed)


def test_the_function_readers_see_only_pods_and_secrets_in_team_namespaces(
        verbs: dict[str, Any]) -> None:
    readers = verbs[cluster.READERS]
    assert readers["cluster"] == {}
    assert readers["namespaces"]  # one binding per team
    for scope in readers["namespaces"].values():
        assert scope == {"core/pods": ["get"], "core/secrets": ["get"]}


def test_nobody_grants_rights_or_touches_namespaces(verbs: dict[str, Any]) -> None:
    for subject, entry in verbs.items():
        for scope in _scopes(entry):
            for resource, allowed in scope.items():
                group_resource = resource.split("[")[0]
                assert "*" not in group_resource and "*" not in allowed, subject
                assert not group_resource.endswith(GRANTING), (subject, resource)
                assert not {"bind", "escalate", "impersonate"} & set(allowed), subject
                if group_resource == "core/namespaces":
                    assert set(allowed) <= READ, (subject, allowed)


def test_the_managers_act_inside_team_namespaces_only(verbs: dict[str, Any]) -> None:
    managers = verbs[MANAGERS]
    assert set(managers["cluster"]) == {"core/namespaces",
                                        "podsnapshot.gke.io/podsnapshotstorageconfigs"}
    assert managers["namespaces"], "bound in every team namespace"
    for scope in managers["namespaces"].values():
        assert "create" in scope["core/pods"]


if __name__ == "__main__":  # rewrite the golden table from the builders
    GOLDEN.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote {GOLDEN.relative_to(ROOT)}\n")
