"""The ``workspace_api`` function: who the caller is (its workspace's token), and that team
and owner are the workspace's, never the request's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from store_fakes import handler_deps, published
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from events.identity import KEY_VAR, workspace_token
from functions.domain.catalog import Catalog
from functions.domain.jobs import Job, JobState
from functions.domain.lifecycle import State, Workspace
from functions.handlers import workspace_api

ROOT = Path(__file__).resolve().parents[2]
KEY = "k" * 43
WS = Workspace(id="ml-a--nb", team="ml-a", owner="alice", name="nb", profile="cpu-small",
               state=State.RUNNING, version=3, incarnation="inc-1")
JOB = {"job_id": "job-1", "profile": "cpu-small", "hosts": 1, "function": "f"}


@pytest.fixture
def deps(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(KEY_VAR, KEY)
    deps = handler_deps(Catalog.from_config(yaml.safe_load(
        (ROOT / "examples" / "stasis.yaml").read_text())))
    deps.store.put_workspace(WS)
    return deps


def call(deps: Any, method: str, path: str, body: Any = None,
         token: str | None = None) -> tuple[int, dict[str, Any]]:
    token = workspace_token(KEY, WS.id, WS.incarnation) if token is None else token
    request = Request(EnvironBuilder(method=method, path=path, json=body,
                                     headers={"Authorization": f"Bearer {token}"}).get_environ())
    response = workspace_api.serve(request, deps)
    return response.status_code, response.get_json()


def test_a_job_is_the_workspaces_own_whatever_the_payload_says(deps: Any) -> None:
    status, body = call(deps, "POST", "/events", {"type": "job.submitted",
                                                  "payload": {**JOB, "owner": "mallory"}})
    assert status == 202, body
    (submitted,) = published(deps, "job.submitted")
    assert (submitted.team, submitted.owner, submitted.workspace_id) == (
        "ml-a", "alice", WS.id)


def test_another_teams_job_is_refused_and_nothing_published(deps: Any) -> None:
    status, body = call(deps, "POST", "/events", {"type": "job.submitted",
                                                  "payload": {**JOB, "team": "ml-b"}})
    assert status == 403 and "own team (ml-a) only" in body["refusal"]
    assert published(deps, "job.submitted") == []


@pytest.mark.parametrize("token", [
    "", "garbage", workspace_token("other-key", WS.id, WS.incarnation),
    workspace_token(KEY, WS.id, "inc-0"),  # an earlier workspace of the same id
    workspace_token(KEY, "ml-b--other", None),  # a workspace that does not exist
])
def test_no_valid_identity_no_call(deps: Any, token: str) -> None:
    status, _ = call(deps, "POST", "/events", {"type": "job.submitted", "payload": JOB},
                     token=token)
    assert status == 401 and published(deps, "job.submitted") == []


def test_a_deleted_workspaces_token_is_refused(deps: Any) -> None:
    deps.store.put_workspace(Workspace(**{**WS.__dict__, "state": State.DELETED}))
    assert call(deps, "GET", "/jobs/job-1")[0] == 401


def test_only_its_own_events_and_its_teams_jobs(deps: Any) -> None:
    status, body = call(deps, "POST", "/events", {"type": "workspace.requested",
                                                  "payload": {}})
    assert status == 400 and "job.submitted or job.finished" in body["refusal"]
    theirs = Job(id="job-9", team="ml-b", owner="bob", profile="cpu-small", hosts=1,
                 state=JobState.RUNNING, workspace_id="ml-b--x")
    deps.jobs.db.put("jobs", theirs.id, theirs.to_doc())
    assert call(deps, "GET", "/jobs/job-9")[0] == 404
    finished = {"job_id": "job-9", "succeeded": True, "termination": "completed",
                "exit_status": 0, "failed_host": None, "error": None, "log_uri": None,
                "duration_ms": 1}
    assert call(deps, "POST", "/events", {"type": "job.finished", "payload": finished})[0] \
        == 403
