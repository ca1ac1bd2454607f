"""Quota rules: what workspaces hold, admission with exact refusal messages, release."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.domain.catalog import Catalog, Quotas, Refusal, RefusalReason
from functions.domain.lifecycle import State
from functions.domain.quota import (
    Admitted,
    Usage,
    accelerators_of,
    admit,
    demand_of,
    held_by,
    release,
    snapshot_demand,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stasis.yaml"
CATALOG = Catalog.from_config(yaml.safe_load(EXAMPLE.read_text()))
PROFILES = CATALOG.profiles
ML_A = CATALOG.teams["ml-a"].quotas  # 10 workspaces, 4 GPUs, 8 TPU chips, 50Gi
ML_B = CATALOG.teams["ml-b"].quotas  # 4 workspaces, 1 GPU, 0 TPU chips, 20Gi
GI = 2**30
WS_LIST = "see `stasis ws list`"


@pytest.mark.parametrize(("profile", "demand", "accelerators"), [
    ("cpu-small", Usage(workspaces=1), Usage()),
    ("cpu-large", Usage(workspaces=1), Usage()),
    ("gpu-small", Usage(workspaces=1, gpus=1), Usage(gpus=1)),
    ("tpu-v5e-8", Usage(workspaces=1, tpus=8), Usage(tpus=8)),
])
def test_demand_of_a_profile(profile: str, demand: Usage, accelerators: Usage) -> None:
    assert demand_of(PROFILES[profile]) == demand
    assert accelerators_of(PROFILES[profile]) == accelerators


@pytest.mark.parametrize(("state", "held"), [
    (State.REQUESTED, Usage(workspaces=1)),
    (State.PROVISIONING, Usage(workspaces=1, gpus=1)),
    (State.RUNNING, Usage(workspaces=1, gpus=1)),
    (State.PAUSING, Usage(workspaces=1, gpus=1)),
    (State.PAUSED, Usage(workspaces=1)),
    (State.RESUMING, Usage(workspaces=1, gpus=1)),
    (State.DELETING, Usage(workspaces=1)),
    (State.DELETED, Usage()),
    (State.FAILED, Usage()),
])
def test_what_a_workspace_holds_in_each_state(state: State, held: Usage) -> None:
    assert held_by(state, PROFILES["gpu-small"]) == held


def _refused(reason: RefusalReason, message: str) -> Refusal:
    return Refusal(reason, message)


@pytest.mark.parametrize(("quotas", "team", "usage", "demand", "expected"), [
    # fits
    (ML_A, "ml-a", Usage(3, 2, 0, 0), demand_of(PROFILES["gpu-small"]), Usage(4, 3, 0, 0)),
    (ML_A, "ml-a", Usage(9, 0, 0, 0), demand_of(PROFILES["tpu-v5e-8"]), Usage(10, 0, 8, 0)),
    (ML_A, "ml-a", Usage(0, 0, 0, 48 * GI), snapshot_demand(2 * GI), Usage(0, 0, 0, 50 * GI)),
    # a resume needs no slot: a team at its workspace quota may still resume
    (ML_A, "ml-a", Usage(10, 3, 0, 0), accelerators_of(PROFILES["gpu-small"]),
     Usage(10, 4, 0, 0)),
    # an admin lowered the quota below usage: what the request does not need is not checked
    (ML_A, "ml-a", Usage(2, 6, 0, 0), demand_of(PROFILES["cpu-small"]), Usage(3, 6, 0, 0)),
    # refusals, with the message the user reads
    (ML_A, "ml-a", Usage(4, 4, 0, 0), demand_of(PROFILES["gpu-small"]), _refused(
        RefusalReason.GPU_QUOTA_EXCEEDED,
        f"team ml-a uses 4/4 GPUs: pause or delete one, {WS_LIST}")),
    (Quotas(10, 4, 8, 0), "ml-a", Usage(1, 3, 0, 0), Usage(1, 2, 0, 0), _refused(
        RefusalReason.GPU_QUOTA_EXCEEDED,
        f"team ml-a uses 3/4 GPUs and this workspace needs 2: pause or delete one, {WS_LIST}")),
    (ML_A, "ml-a", Usage(10, 0, 0, 0), demand_of(PROFILES["cpu-small"]), _refused(
        RefusalReason.WORKSPACE_QUOTA_EXCEEDED,
        f"team ml-a has 10/10 workspaces (paused ones count too): delete one, {WS_LIST}")),
    (ML_A, "ml-a", Usage(10, 4, 0, 0), demand_of(PROFILES["gpu-small"]), _refused(
        RefusalReason.WORKSPACE_QUOTA_EXCEEDED,
        f"team ml-a has 10/10 workspaces (paused ones count too): delete one, {WS_LIST}")),
    (ML_A, "ml-a", Usage(1, 0, 8, 0), demand_of(PROFILES["tpu-v5e-8"]), _refused(
        RefusalReason.TPU_QUOTA_EXCEEDED,
        f"team ml-a uses 8/8 TPU chips: pause or delete one, {WS_LIST}")),
    (ML_B, "ml-b", Usage(0, 0, 0, 0), demand_of(PROFILES["tpu-v5e-8"]), _refused(
        RefusalReason.TPU_QUOTA_EXCEEDED,
        "team ml-b has no TPU quota: choose a profile without TPU chips, or ask your team "
        "admin for TPU quota")),
    (Quotas(0, 0, 0, 0), "ml-b", Usage(), demand_of(PROFILES["cpu-small"]), _refused(
        RefusalReason.WORKSPACE_QUOTA_EXCEEDED,
        "team ml-b may not create workspaces (quota 0): ask your team admin")),
    (ML_A, "ml-a", Usage(0, 0, 0, 49 * GI), snapshot_demand(2 * GI), _refused(
        RefusalReason.SNAPSHOT_QUOTA_EXCEEDED,
        "team ml-a stores 49Gi/50Gi of snapshots and this snapshot needs 2Gi: delete "
        f"workspaces or snapshots you no longer need, {WS_LIST}")),
    (ML_A, "ml-a", Usage(0, 0, 0, 50 * GI), snapshot_demand(GI // 2), _refused(
        RefusalReason.SNAPSHOT_QUOTA_EXCEEDED,
        "team ml-a stores 50Gi/50Gi of snapshots: delete workspaces or snapshots you no "
        f"longer need, {WS_LIST}")),
])
def test_admit(quotas: Quotas, team: str, usage: Usage, demand: Usage,
               expected: Usage | Refusal) -> None:
    result = admit(quotas, usage, demand, team)
    if isinstance(expected, Refusal):
        assert result == expected
        assert not result.ok
    else:
        assert result == Admitted(expected)
        assert result.ok


def test_a_team_without_quota_is_told_whom_to_ask() -> None:
    team = CATALOG.teams["ml-b"]
    result = admit(team.quotas, Usage(), demand_of(PROFILES["tpu-v5e-8"]), team.id,
                   contact=team.who_to_ask)
    assert isinstance(result, Refusal)
    assert result.message == ("team ml-b has no TPU quota: choose a profile without TPU chips, "
                              "or ask carol for TPU quota")


@pytest.mark.parametrize(("usage", "demand", "expected"), [
    (Usage(4, 3, 8, 10 * GI), Usage(1, 1, 0, 0), Usage(3, 2, 8, 10 * GI)),
    (Usage(4, 3, 8, 10 * GI), Usage(0, 0, 8, GI), Usage(4, 3, 0, 9 * GI)),
    # a redelivered release, or counters that drifted: never below zero
    (Usage(0, 0, 0, 0), Usage(1, 1, 8, GI), Usage(0, 0, 0, 0)),
    (Usage(1, 0, 2, 0), Usage(2, 1, 8, 1), Usage(0, 0, 0, 0)),
])
def test_release(usage: Usage, demand: Usage, expected: Usage) -> None:
    assert release(usage, demand) == expected


def test_usage_document_round_trip() -> None:
    usage = Usage(3, 1, 8, 5 * GI)
    assert usage.as_dict() == {"workspaces": 3, "gpus": 1, "tpus": 8,
                               "snapshot_bytes": 5 * GI}
    assert Usage.from_dict(usage.as_dict()) == usage
    assert Usage.from_dict(None) == Usage.from_dict({}) == Usage()


@pytest.mark.parametrize("bad", [{"gpus": -1}, {"workspaces": True}, {"tpus": 1.5}])
def test_usage_refuses_impossible_counters(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Usage(**bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------

_count = st.integers(min_value=0, max_value=12)
_bytes = st.integers(min_value=0, max_value=64 * GI)
quotas_st = st.builds(Quotas, _count, _count, _count, _bytes)
usage_st = st.builds(Usage, _count, _count, _count, _bytes)
demand_st = st.one_of(
    st.sampled_from([demand_of(p) for p in PROFILES.values()]
                    + [accelerators_of(p) for p in PROFILES.values()]),
    st.builds(Usage, st.integers(0, 2), st.integers(0, 4), st.integers(0, 8),
              st.integers(0, 4 * GI)),
)


def _within(usage: Usage, quotas: Quotas) -> bool:
    return (usage.workspaces <= quotas.workspaces and usage.gpus <= quotas.gpus
            and usage.tpus <= quotas.tpus and usage.snapshot_bytes <= quotas.snapshot_bytes)


@given(quotas_st, usage_st, demand_st)
def test_release_undoes_admit(quotas: Quotas, usage: Usage, demand: Usage) -> None:
    result = admit(quotas, usage, demand, "ml-a")
    if isinstance(result, Admitted):
        assert release(result.usage, demand) == usage
    else:
        assert result.reason in {RefusalReason.WORKSPACE_QUOTA_EXCEEDED,
                                 RefusalReason.GPU_QUOTA_EXCEEDED,
                                 RefusalReason.TPU_QUOTA_EXCEEDED,
                                 RefusalReason.SNAPSHOT_QUOTA_EXCEEDED}
        assert not _within(usage + demand, quotas)


@settings(max_examples=200)
@given(quotas_st, st.lists(st.tuples(st.booleans(), demand_st, st.integers(0, 50)),
                           max_size=40))
def test_usage_never_exceeds_quota_after_any_sequence(
        quotas: Quotas, steps: list[tuple[bool, Usage, int]]) -> None:
    usage, held = Usage(), list[Usage]()
    for is_admit, demand, pick in steps:
        if is_admit or not held:
            result = admit(quotas, usage, demand, "ml-a")
            if isinstance(result, Admitted):
                usage = result.usage
                held.append(demand)
        else:
            usage = release(usage, held.pop(pick % len(held)))
        assert _within(usage, quotas)
        total = sum(held, Usage())
        assert usage == total  # the counters are exactly what is held


@given(usage_st, usage_st)
def test_release_never_goes_below_zero(usage: Usage, demand: Usage) -> None:
    released = release(usage, demand)
    assert min(released.as_dict().values()) >= 0
