"""Sandboxes on Kubernetes, the pure parts: what a sandbox Pod's end means
(``objects.sandbox.pod_outcome``), the files of a patch, which repositories a cluster
can fetch, and what the Pod keeps from the task."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from functions.domain.sandboxes import DEFAULT_LIMITS, RunSpec
from functions.kubernetes.objects import sandbox as sm
from functions.kubernetes.objects.meta import ANN_SEQUENCE
from functions.kubernetes.objects.settings import SandboxClusterSettings
from functions.kubernetes.sandboxes import git_url_problem

SPEC = RunSpec("sbx-7", "ml-a", "https://example.org/r.git", "main", "make test",
               DEFAULT_LIMITS, (), "req-7", "stasis-snapshots", "sandboxes/ml-a/sbx-7")
POD = sm.sandbox_pod(SPEC, "b" * 40)


def pod(status: dict[str, Any]) -> dict[str, Any]:
    return {**POD, "status": status}


def term(name: str, code: int, reason: str = "Completed") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": reason}}}


OUTCOMES: list[tuple[str, dict[str, Any], str | None, sm.PodOutcome | None]] = [
    ("running", {"phase": "Running"}, None, None),
    ("running, status early", {"phase": "Running"}, "0 exited", None),
    ("succeeded", {"phase": "Succeeded"}, "0 exited", sm.PodOutcome("exited", 0)),
    ("old format", {"phase": "Succeeded"}, "3\n", sm.PodOutcome("exited", 3, "exit status 3")),
    ("cpu", {"phase": "Succeeded"}, "152 exited",
     sm.PodOutcome("cpu_time_exceeded", 152, "the task used more than 600 CPU seconds (SIGXCPU)")),
    ("killed", {"phase": "Succeeded"}, "137 exited", sm.PodOutcome(
        "killed", 137, "the task was killed by signal 9 (SIGKILL: the memory limit kills this "
                       "way too)")),
    ("timeout", {"phase": "Succeeded"}, "124 wall_clock_exceeded", sm.PodOutcome(
        "wall_clock_exceeded", 124, "the task ran past its wall clock of 900 s and was stopped")),
    ("deadline, status uploaded", {"phase": "Failed", "reason": "DeadlineExceeded"},
     "0 exited", sm.PodOutcome("exited", 0)),
    ("deadline", {"phase": "Failed", "reason": "DeadlineExceeded"}, None, sm.PodOutcome(
        "wall_clock_exceeded", None, "the pod passed its deadline of 1500 s (the wall clock "
                                     "plus the time to fetch and collect); no patch was "
                                     "collected")),
    ("oom while the collector waits", {"phase": "Running", "containerStatuses": [
        term("task", 137, "OOMKilled")]}, None, sm.PodOutcome(
        "memory_limit_exceeded", 137, "the task used more memory than its limit (2Gi) and was "
                                      "killed")),
    ("image", {"phase": "Pending", "initContainerStatuses": [{"name": "checkout", "state": {
        "waiting": {"reason": "ErrImagePull"}}}]}, None,
     sm.PodOutcome("failed_to_start", None, "container checkout cannot start: ErrImagePull")),
    ("checkout failed", {"phase": "Failed", "initContainerStatuses": [term("checkout", 22,
                                                                           "Error")]},
     None, sm.PodOutcome("failed_to_start", None, "the checkout failed (exit 22, Error)")),
    ("task could not run", {"phase": "Failed", "containerStatuses": [term("task", 127, "Error"),
                                                                     term("collector", 0)]},
     None, sm.PodOutcome("failed_to_start", None,
                         "the task container could not run its command (Error, exit 127)")),
    ("task stopped while the collector waits", {"phase": "Running", "containerStatuses": [
        term("task", 143, "Error"), {"name": "collector", "state": {"running": {}}}]}, None,
     sm.PodOutcome("killed", 143, "the task container was stopped (Error, exit 143) before it "
                                  "wrote an exit status")),
    ("collector failed", {"phase": "Failed", "containerStatuses": [term("task", 0),
                                                                   term("collector", 22)]},
     None, sm.PodOutcome("runtime_lost", None, "the pod ended (phase Failed) without an exit "
                                               "status from the collector")),
    ("garbage status", {"phase": "Succeeded"}, "oops",
     sm.PodOutcome("runtime_lost", None, "unreadable exit status 'oops'")),
]


@pytest.mark.parametrize(("status", "exit_status", "want"), [o[1:] for o in OUTCOMES],
                         ids=[o[0] for o in OUTCOMES])
def test_pod_outcome(status: dict[str, Any], exit_status: str | None,
                     want: sm.PodOutcome | None) -> None:
    assert sm.pod_outcome(pod(status), exit_status) == want


def test_files_in_patch() -> None:
    patch = "\n".join([
        "diff --git a/src/app.py b/src/app.py", "index 1..2 100644", "--- a/src/app.py",
        "+++ b/src/app.py", "@@ -1 +1 @@", "-a", "+b",
        "diff --git a/with space.txt b/with space.txt", "new file mode 100644",
        'diff --git "a/caf\\303\\251 \\"q\\".txt" "b/caf\\303\\251 \\"q\\".txt"',
        "new file mode 100644",
        "diff --git a/old.txt b/new name.txt", "similarity index 100%",
        "rename from old.txt", "rename to new name.txt",
        "diff --git a/img.png b/img.png", "new file mode 100644", "GIT binary patch",
        "literal 4", "zcmZ", "",
    ])
    assert sm.files_in_patch(patch) == ["src/app.py", "with space.txt", 'café "q".txt',
                                        "new name.txt", "img.png"]
    assert sm.files_in_patch("") == []


@pytest.mark.parametrize(("repository", "usable"), [
    ("https://github.com/org/repo.git", True), ("http://127.0.0.1:8000/r.git", True),
    ("ssh://git@host/org/repo.git", True), ("git@github.com:org/repo.git", True),
    ("git://host/repo", True), ("/home/alice/repo", False), ("./repo", False),
    ("repo", False), ("file:///srv/repo.git", False), ("ext::sh -c touch% /tmp/x", False),
    ("C:\\src\\repo", False),
])
def test_which_repositories_a_cluster_fetches(repository: str, usable: bool) -> None:
    problem = git_url_problem(repository)
    assert (problem is None) is usable, problem


def test_the_pod_keeps_its_private_volume_and_dns_from_the_task() -> None:
    spec = POD["spec"]
    mounts = {c["name"]: {m["name"] for m in c["volumeMounts"]}
              for c in [*spec["initContainers"], *spec["containers"]]}
    assert "private" in mounts["checkout"] and "private" in mounts["collector"]
    assert "private" not in mounts["task"]
    assert spec["hostAliases"] == [{"ip": "199.36.153.8", "hostnames": ["storage.googleapis.com"]}]
    assert sm.sandbox_dns_policy(SPEC) is None  # nothing resolves names: no DNS egress
    bare = sm.sandbox_pod(SPEC, "b" * 40, dataclasses.replace(
        SandboxClusterSettings(), runtime_class=None, transfer_host_aliases=()))
    assert "runtimeClassName" not in bare["spec"] and "hostAliases" not in bare["spec"]
    assert sm.network_description(SPEC).startswith("none: default-deny NetworkPolicy")


def test_a_suspension_snapshots_the_pod_and_the_restored_pod_is_identical() -> None:
    trigger = sm.sandbox_snapshot_trigger({**POD, "metadata": {**POD["metadata"]}},
                                          sequence=2, idle_seconds=600)
    assert trigger["kind"] == "PodSnapshotManualTrigger"
    assert trigger["spec"] == {"targetPod": sm.object_name("sbx-7")}
    assert trigger["metadata"]["name"] != sm.snapshot_trigger_name("sbx-7", 1)
    assert trigger["metadata"]["annotations"][ANN_SEQUENCE] == "2"
    assert sm.suspension_requestid("req-7", 2) == "req-7.suspend-2"
    restored = sm.restored_pod(SPEC, "b" * 40, "ps-1")
    assert restored["metadata"]["annotations"].pop("podsnapshot.gke.io/ps-name") == "ps-1"
    assert restored == POD
