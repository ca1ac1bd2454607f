"""Which uid is a workspace's (``runtime.local.tenancy``): allocation, reuse, ownership."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from functions.domain.catalog import Catalog, validate_config
from runtime.local import tenancy
from runtime.local.state import StateFile, WorkspaceRecord

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())


def test_the_lowest_free_uid_is_given() -> None:
    assert tenancy.allocate("t--a", Path("/nonexistent"), set()) == tenancy.UID_BASE
    taken = {tenancy.UID_BASE, tenancy.UID_BASE + 1}
    assert tenancy.allocate("t--a", Path("/nonexistent"), taken) == tenancy.UID_BASE + 2


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_kept_home_gives_its_owner_back_unless_another_holds_it(tmp_path: Path) -> None:
    home = tmp_path / "t--a"
    tenancy.own(home, tenancy.UID_BASE + 5)
    assert (home.stat().st_uid, oct(home.stat().st_mode & 0o777)) == (
        tenancy.UID_BASE + 5, "0o700")
    assert tenancy.allocate("t--a", home, set()) == tenancy.UID_BASE + 5
    assert tenancy.allocate("t--a", home, {tenancy.UID_BASE + 5}) == tenancy.UID_BASE
    assert tenancy.home_owners(tmp_path) == {tenancy.UID_BASE + 5}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_own_gives_the_whole_tree_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "a" / "b").mkdir(parents=True)
    (home / "a" / "b" / "f.txt").write_text("x")
    tenancy.own(home, tenancy.UID_BASE + 1)
    assert {p.stat().st_uid for p in [home, *home.rglob("*")]} == {tenancy.UID_BASE + 1}


def test_the_uid_is_kept_in_the_agents_state(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "state.json")
    state.save({"t--a": WorkspaceRecord("t--a", home="/h", uid=300_003),
                "t--b": WorkspaceRecord("t--b", home="/h2")})
    loaded = state.load()
    assert (loaded["t--a"].uid, loaded["t--b"].uid) == (300_003, None)


def test_what_requires_isolation_comes_from_the_spec() -> None:
    assert tenancy.required_by({"extra": {"isolation_required_by": ["team t"]}}) == ["team t"]
    assert tenancy.required_by({"extra": {}}) == [] and tenancy.required_by({}) == []


def test_a_single_tenant_agent_refuses_every_interpreter_with_its_reason() -> None:
    single = tenancy.Tenancy(False, "the node agent runs as uid 1000, not root")
    assert single.refusal("/usr/bin/python3", Path("/tmp")) == single.reason
    assert single.describe() == {"mode": "single-tenant", "reason": single.reason,
                                 "single_tenant": {}}


# -- the catalog's side: isolation: required ------------------------------------------------


def _config(**where: str) -> dict[str, Any]:
    config = copy.deepcopy(CONFIG)
    if "team" in where:
        next(t for t in config["teams"] if t["id"] == where["team"])["isolation"] = "required"
    if "profile" in where:
        next(p for p in config["profiles"] if p["id"] == where["profile"])[
            "isolation"] = "required"
    return config


def test_a_team_or_profile_may_require_isolation_and_the_schema_checks_it() -> None:
    assert Catalog.from_config(CONFIG).isolation_required_by("ml-a", "cpu-small") == []
    both = Catalog.from_config(_config(team="ml-a", profile="cpu-small"))
    assert both.isolation_required_by("ml-a", "cpu-small") == ["team ml-a",
                                                              "profile cpu-small"]
    schema = Draft202012Validator(json.loads((ROOT / "schemas" / "config.schema.json")
                                             .read_text()))
    good = _config(team="ml-a", profile="cpu-small")
    assert list(schema.iter_errors(good)) == [] and validate_config(good) == []
    wrong = _config()
    wrong["teams"][0]["isolation"] = "strict"
    (error,) = schema.iter_errors(wrong)
    assert list(error.absolute_path)[-1] == "isolation" and "strict" in error.message


def test_the_workspace_spec_names_what_requires_isolation() -> None:
    from store_fakes import handler_deps

    from functions.domain.lifecycle import State, Workspace
    from functions.handlers.commands import workspace_spec

    ws = Workspace(id="ml-a--nb", team="ml-a", owner="alice", name="nb", profile="cpu-small",
                   state=State.REQUESTED, version=1, environment="python-3-11")
    deps = handler_deps(Catalog.from_config(_config(profile="cpu-small")))
    spec = workspace_spec(ws, deps, "req")
    assert tenancy.required_by({"extra": spec.extra}) == ["profile cpu-small"]
    usual = workspace_spec(ws, handler_deps(Catalog.from_config(CONFIG)), "req")
    assert "isolation_required_by" not in usual.extra
