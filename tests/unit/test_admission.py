"""Admission: what each lifecycle transition does to a team's usage counters, and whether a
request may run at all (membership, environment, hardware). Against the example catalog.

The quota arithmetic itself is tested in test_quota.py; here the point is the glue: which
transitions take or give back a slot and accelerators, and that a refusal leaves the
counters exactly as they were.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from events import SnapshotFinished, WorkspaceRequested
from functions.domain.admission import (
    RequestCheck,
    charge,
    check_request,
    environment_of,
    profile_of,
    snapshot_record,
)
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import State, Workspace

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stasis.yaml"
CONFIG = yaml.safe_load(EXAMPLE.read_text())
CATALOG = Catalog.from_config(CONFIG)  # ml-a: 10 ws, 4 GPUs, 8 TPU chips; ml-b: 4 ws, 1 GPU
NOW = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)
LOCAL_NO_GPU = {"ides": ["jupyterlab"], "accelerators": {}}
WS_LIST = "see `stasis ws list`"


def _ws(state: State, team: str = "ml-a", profile: str = "gpu-small",
        name: str = "ws") -> Workspace:
    return Workspace(id=f"{team}--{name}", team=team, owner="alice", name=name,
                     profile=profile, state=state)


def _usage(workspaces: int = 0, gpus: int = 0, tpus: int = 0,
           snapshot_bytes: int = 0) -> dict[str, int]:
    return {"workspaces": workspaces, "gpus": gpus, "tpus": tpus,
            "snapshot_bytes": snapshot_bytes}


def _move(previous: State | None, new: State, usage: dict[str, Any], *, team: str = "ml-a",
          profile: str = "gpu-small", new_profile: str | None = None) -> str | None:
    old = _ws(previous, team, profile) if previous is not None else None
    return charge(CATALOG, previous, old, _ws(new, team, new_profile or profile), usage)


# -- charge: the lifecycle of a gpu-small workspace -----------------------------------------


def test_create_takes_a_slot_and_a_gpu() -> None:
    usage: dict[str, Any] = {}
    assert _move(None, State.PROVISIONING, usage) is None
    assert usage == _usage(workspaces=1, gpus=1)


def test_create_on_a_cpu_profile_takes_only_a_slot() -> None:
    usage = _usage(workspaces=2, gpus=1)
    assert _move(None, State.PROVISIONING, usage, profile="cpu-small") is None
    assert usage == _usage(workspaces=3, gpus=1)


def test_create_on_a_tpu_profile_takes_its_chips() -> None:
    usage: dict[str, Any] = {}
    assert _move(None, State.PROVISIONING, usage, profile="tpu-v5e-8") is None
    assert usage == _usage(workspaces=1, tpus=8)


@pytest.mark.parametrize(("previous", "new"), [
    (State.PROVISIONING, State.RUNNING),
    (State.RUNNING, State.PAUSING),
    (State.PAUSING, State.RUNNING),  # a failed snapshot: still running, still holding
    (State.RESUMING, State.RUNNING),
])
def test_transitions_that_hold_the_same(previous: State, new: State) -> None:
    usage = _usage(workspaces=1, gpus=1)
    assert _move(previous, new, usage) is None
    assert usage == _usage(workspaces=1, gpus=1)


def test_pause_gives_the_gpu_back_and_keeps_the_slot() -> None:
    usage = _usage(workspaces=1, gpus=1)
    assert _move(State.PAUSING, State.PAUSED, usage) is None
    assert usage == _usage(workspaces=1, gpus=0)


def test_resume_takes_the_gpu_again() -> None:
    usage = _usage(workspaces=1, gpus=0)
    assert _move(State.PAUSED, State.RESUMING, usage) is None
    assert usage == _usage(workspaces=1, gpus=1)


def test_resume_is_refused_when_the_teams_gpus_are_used_up() -> None:
    # ml-b has one GPU, held by another running workspace; this one is paused.
    usage = _usage(workspaces=2, gpus=1, snapshot_bytes=123)
    before = copy.deepcopy(usage)
    refusal = _move(State.PAUSED, State.RESUMING, usage, team="ml-b")
    assert refusal == f"team ml-b uses 1/1 GPUs: pause or delete one, {WS_LIST}"
    assert usage == before


def test_resume_on_another_profile_takes_that_profiles_accelerators() -> None:
    usage = _usage(workspaces=1)
    assert _move(State.PAUSED, State.RESUMING, usage, profile="cpu-small",
                 new_profile="gpu-small") is None
    assert usage == _usage(workspaces=1, gpus=1)
    refusal = _move(State.PAUSED, State.RESUMING, _usage(workspaces=1), team="ml-b",
                    profile="cpu-small", new_profile="tpu-v5e-8")
    assert refusal is not None and refusal.startswith("team ml-b has no TPU quota")


def test_a_resume_needs_no_new_slot() -> None:
    """A team at its workspace quota may still resume one of its paused workspaces."""
    usage = _usage(workspaces=4, gpus=0)
    assert _move(State.PAUSED, State.RESUMING, usage, team="ml-b") is None
    assert usage == _usage(workspaces=4, gpus=1)


def test_create_is_refused_over_the_workspace_quota_and_usage_is_untouched() -> None:
    usage = _usage(workspaces=4)
    refusal = _move(None, State.PROVISIONING, usage, team="ml-b", profile="cpu-small")
    assert refusal == ("team ml-b has 4/4 workspaces (paused ones count too): delete one, "
                       f"{WS_LIST}")
    assert usage == _usage(workspaces=4)


def test_delete_of_a_running_workspace_frees_the_gpu_then_the_slot() -> None:
    usage = _usage(workspaces=1, gpus=1)
    assert _move(State.RUNNING, State.DELETING, usage) is None
    assert usage == _usage(workspaces=1, gpus=0)
    assert _move(State.DELETING, State.DELETED, usage) is None
    assert usage == _usage()


def test_delete_frees_the_slot_of_a_paused_workspace() -> None:
    usage = _usage(workspaces=3, gpus=2, snapshot_bytes=10)
    assert _move(State.PAUSED, State.DELETING, usage) is None
    assert _move(State.DELETING, State.DELETED, usage) is None
    assert usage == _usage(workspaces=2, gpus=2, snapshot_bytes=10)


@pytest.mark.parametrize("previous", [State.PROVISIONING, State.RESUMING])
def test_a_failure_gives_back_slot_and_gpu(previous: State) -> None:
    usage = _usage(workspaces=2, gpus=2)
    assert _move(previous, State.FAILED, usage) is None
    assert usage == _usage(workspaces=1, gpus=1)


def test_a_resume_from_failed_takes_slot_and_gpu_again() -> None:
    usage = _usage()
    assert _move(State.FAILED, State.RESUMING, usage) is None
    assert usage == _usage(workspaces=1, gpus=1)


def test_releases_never_go_below_zero() -> None:
    """A redelivered pause, or counters that drifted."""
    usage = _usage(workspaces=0, gpus=0)
    assert _move(State.PAUSING, State.PAUSED, usage) is None
    assert _move(State.DELETING, State.DELETED, usage) is None
    assert usage == _usage()


def test_a_full_life_ends_where_it_started() -> None:
    usage = _usage(workspaces=1, gpus=1, snapshot_bytes=5)
    path = [None, State.PROVISIONING, State.RUNNING, State.PAUSING, State.PAUSED,
            State.RESUMING, State.RUNNING, State.PAUSING, State.RUNNING, State.DELETING,
            State.DELETED]
    for previous, new in itertools.pairwise(path):
        assert new is not None
        assert _move(previous, new, usage) is None
    assert usage == _usage(workspaces=1, gpus=1, snapshot_bytes=5)


def test_a_profile_removed_from_the_catalog_still_accounts_for_the_slot() -> None:
    usage = _usage(workspaces=1)
    assert _move(State.RUNNING, State.DELETING, usage, profile="retired-gpu") is None
    assert usage == _usage(workspaces=1)
    assert _move(State.DELETING, State.DELETED, usage, profile="retired-gpu") is None
    assert usage == _usage()


# -- check_request -------------------------------------------------------------------------


def _request(owner: str = "bob", team: str = "ml-a", profile: str = "cpu-small",
             **kwargs: Any) -> WorkspaceRequested:
    return WorkspaceRequested(team, owner, "ws", profile, **kwargs)


def test_a_member_with_a_plain_request_is_accepted() -> None:
    assert check_request(CATALOG, _request(), LOCAL_NO_GPU) == RequestCheck(
        None, "python-3-11", ())


@pytest.mark.parametrize(("team", "contact"), [
    ("ml-a", "alice, or #ml-a-infra on Slack"),
    ("ml-b", "carol"),
])
def test_a_non_member_is_refused_naming_whom_to_ask(team: str, contact: str) -> None:
    check = check_request(CATALOG, _request("mallory", team), LOCAL_NO_GPU)
    assert check.refusal == f"mallory is not a member of team {team}; ask {contact} to add you"
    assert (check.environment, check.notices) == (None, ())


def test_without_a_contact_the_admins_are_named() -> None:
    config = copy.deepcopy(CONFIG)
    del config["teams"][0]["contact"]
    check = check_request(Catalog.from_config(config), _request("mallory"), LOCAL_NO_GPU)
    assert check.refusal == ("mallory is not a member of team ml-a; ask a team admin "
                             "(alice, dev) to add you")


def test_a_viewer_is_refused() -> None:
    config = copy.deepcopy(CONFIG)
    config["teams"][0]["members"].append({"user": "victor", "role": "viewer"})
    check = check_request(Catalog.from_config(config), _request("victor"), LOCAL_NO_GPU)
    assert check.refusal == ("victor is a viewer of team ml-a and cannot create workspaces; "
                             "ask alice, or #ml-a-infra on Slack")


def test_a_redirected_environment_resolves_to_its_successor_with_a_notice() -> None:
    check = check_request(CATALOG, _request(environment="python-3-9"), LOCAL_NO_GPU)
    assert check.refusal is None
    assert check.environment == "python-3-11"
    assert check.notices == ("python-3-9 was replaced by python-3-11: Python 3.9 is "
                             "end-of-life.",)


def test_a_deprecated_environment_warns() -> None:
    check = check_request(CATALOG, _request(environment="python-3-10"), LOCAL_NO_GPU)
    assert check.refusal is None
    assert check.environment == "python-3-10"
    assert check.notices == ("python-3-10 is deprecated: Python 3.10 leaves support on "
                             "2025-06-30; move to python-3-11.",)


def test_a_hidden_environment_is_refused() -> None:
    check = check_request(CATALOG, _request(environment="legacy-tf1"), LOCAL_NO_GPU)
    assert check.refusal is not None
    assert check.refusal.startswith("environment legacy-tf1 is no longer offered")


def test_a_gpu_profile_on_a_host_without_gpus_is_refused() -> None:
    check = check_request(CATALOG, _request(profile="gpu-small"), LOCAL_NO_GPU)
    assert check.refusal == ("profile gpu-small needs 1 x nvidia-l4 but this host has no GPU: "
                             "choose a profile without GPUs here, or use a cluster that has "
                             "nvidia-l4")


@pytest.mark.parametrize("capabilities", [
    {"ides": ["jupyterlab"], "accelerators": {"nvidia-l4": 1}},
    {"ides": ["jupyterlab"]},  # a runtime that does not report accelerators (a cluster)
])
def test_a_gpu_profile_where_the_gpu_is_or_may_be(capabilities: dict[str, Any]) -> None:
    check = check_request(CATALOG, _request(profile="gpu-small"), capabilities)
    assert check == RequestCheck(None, "python-3-11", ())


def test_an_ide_the_runtime_lacks_is_refused() -> None:
    check = check_request(CATALOG, _request(ide="vscode"), LOCAL_NO_GPU)
    assert check.refusal == ("vscode is not available on this runtime (code-server not "
                             "installed); use jupyterlab")
    ok = check_request(CATALOG, _request(ide="vscode"), {"ides": ["jupyterlab", "vscode"]})
    assert ok.refusal is None


def test_a_profile_the_team_may_not_use_is_refused() -> None:
    check = check_request(CATALOG, _request("carol", "ml-b", "tpu-v5e-8"), LOCAL_NO_GPU)
    assert check.refusal is not None
    assert check.refusal.startswith("profile tpu-v5e-8 is not available to team ml-b")


# -- records -------------------------------------------------------------------------------


@pytest.mark.parametrize(("team", "days"), [("ml-a", 14), ("ml-b", 7)])
def test_snapshot_record_expires_by_the_teams_retention(team: str, days: int) -> None:
    ws = dataclasses.replace(_ws(State.PAUSED, team), current_snapshot=f"{team}--ws-v3")
    finished = SnapshotFinished(ws.id, f"{team}--ws-v3", True, method="pod", uri="gs://b/x",
                                bytes=42, duration_ms=7, accelerator="nvidia-l4",
                                accelerator_count=1, captured=["model"],
                                skipped=[{"name": "db"}])
    record = snapshot_record(CATALOG, ws, finished, NOW)
    assert record["expires_at"] == NOW + timedelta(days=days)
    assert (record["workspace"], record["team"], record["bytes"], record["status"]) == (
        ws.id, team, 42, "ready")
    assert (record["captured"], record["skipped"]) == (["model"], [{"name": "db"}])


def test_environment_and_profile_views() -> None:
    assert environment_of(CATALOG, "python-3-11")["image"].endswith("python:3.11")
    assert environment_of(CATALOG, "gone") == {"id": "gone", "python": "default"}
    gpu = profile_of(CATALOG, "gpu-small")
    assert gpu["accelerator"] == {"type": "nvidia-l4", "count": 1, "topology": None}
    assert gpu["snapshot_method"] == "pod"
    assert profile_of(CATALOG, "cpu-small")["accelerator"] is None
    assert profile_of(CATALOG, "gone") == {"id": "gone"}
