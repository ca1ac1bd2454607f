"""Scale-out jobs, the pure part: state machine, demand = accelerators x hosts, admission
against this node's hardware (local jobs) and the team's quota, with refusals that speak of
the job, release on finish, and the JobSet builder validated against the JobSet CRD
(transcribed) and the Kubernetes schemas (kubernetes-validate)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from crd_schemas import jobset_schema

from functions.domain.catalog import Accelerator, Catalog, RefusalReason
from functions.domain.jobs import (
    IllegalTransition,
    Job,
    JobState,
    Request,
    demand_of,
    finish,
    move,
    submit,
)
from functions.domain.quota import Usage
from functions.kubernetes.objects import jobset as js
from functions.kubernetes.objects.hardware import GKE_TPU, GKE_TPU_TOPOLOGY

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples/stasis.yaml").read_text()))
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TPU = CATALOG.profiles["tpu-v5e-8"]  # 8 chips a host
ML_A = CATALOG.teams["ml-a"]  # 8 TPU chips, 4 GPUs
#: A multi-host v5e shape: 4 chips a host (ct5lp-hightpu-4t), 4 hosts = a 4x4 slice.
V5E_4 = replace(TPU, id="tpu-v5e-4", accelerator=Accelerator("tpu-v5-lite-podslice", 4, "2x2"),
                node_selector={})


def request(profile: str = "tpu-v5e-8", hosts: int = 1, job_id: str = "job-1",
            runtime: str = "local") -> Request:
    return Request(job_id, "ml-a", "alice", profile, hosts, runtime=runtime)


def run(req: Request, usage: Usage | None = None, team: str = "ml-a",
        caps: dict[str, Any] | None = None) -> Any:
    usage = usage or Usage()
    t = CATALOG.teams[team]
    return submit(req, existing=None, profile=CATALOG.profiles.get(req.profile),
                  team_profiles=t.profiles, quotas=t.quotas, usage=usage, now=NOW,
                  contact=t.who_to_ask, host_capabilities=caps)


@pytest.mark.parametrize(("profile", "hosts", "demand"), [
    ("cpu-small", 4, Usage()),
    ("gpu-small", 3, Usage(gpus=3)),
    ("tpu-v5e-8", 1, Usage(tpus=8)),
    ("tpu-v5e-8", 4, Usage(tpus=32)),
])
def test_demand_is_the_profile_accelerators_times_hosts(profile: str, hosts: int,
                                                        demand: Usage) -> None:
    assert demand_of(CATALOG.profiles[profile], hosts) == demand


@pytest.mark.parametrize("hosts", [0, -1, True, 1025])
def test_hosts_must_be_sensible(hosts: Any) -> None:
    with pytest.raises(ValueError, match="hosts"):
        demand_of(TPU, hosts)


def test_state_machine() -> None:
    assert move(JobState.SUBMITTED, JobState.RUNNING) == JobState.RUNNING
    assert move(JobState.RUNNING, JobState.FAILED) == JobState.FAILED
    for bad in ((JobState.SUCCEEDED, JobState.RUNNING), (JobState.REFUSED, JobState.RUNNING),
                (JobState.SUBMITTED, JobState.SUCCEEDED)):
        with pytest.raises(IllegalTransition):
            move(*bad)


def test_admitted_job_runs_and_adds_its_accelerators() -> None:
    d = run(request(), Usage(workspaces=2, gpus=1))
    assert d.accepted and d.job.state == JobState.RUNNING and d.job.tpus == 8
    assert d.usage == Usage(workspaces=2, gpus=1, tpus=8)  # no workspace slot taken


@pytest.mark.parametrize(("profile", "hosts", "used", "wording"), [
    # more than the whole allowance: waiting would not help
    ("tpu-v5e-8", 2, Usage(), "job job-1 (2 x tpu-v5e-8) needs 16 TPU chips, more than team "
     "ml-a's allowance of 8: use at most 1 host, or ask alice, or #ml-a-infra on Slack for "
     "more"),
    ("gpu-small", 5, Usage(), "needs 5 GPUs, more than team ml-a's allowance of 4: use at "
     "most 4 hosts"),
    # within the allowance, but others hold it now
    ("tpu-v5e-8", 1, Usage(tpus=4), "job job-1 (1 x tpu-v5e-8) needs 8 TPU chips but team "
     "ml-a uses 4/8: wait for one of its jobs to end, or pause a workspace that holds some"),
    ("gpu-small", 2, Usage(gpus=3), "needs 2 GPUs but team ml-a uses 3/4"),
])
def test_a_job_over_the_team_allowance_is_refused_with_what_to_do(
        profile: str, hosts: int, used: Usage, wording: str) -> None:
    d = run(request(profile, hosts), used)
    assert not d.accepted and d.job.state == JobState.REFUSED and d.usage is None
    assert d.reason == str(RefusalReason.TPU_QUOTA_EXCEEDED if profile.startswith("tpu")
                           else RefusalReason.GPU_QUOTA_EXCEEDED)
    assert wording in d.message and "workspace needs" not in d.message


NO_ACCELERATORS = {"runtime": "local", "cpus": 2, "accelerators": {}}
ONE_L4 = {"runtime": "local", "cpus": 8, "accelerators": {"nvidia-l4": 1}}
FOUR_L4 = {"runtime": "local", "cpus": 8, "accelerators": {"nvidia-l4": 4}}
A_CLUSTER = {"runtime": "kubernetes", "ides": ["jupyterlab"]}  # reports no accelerators


@pytest.mark.parametrize(("profile", "hosts", "runtime", "caps", "refusal"), [
    ("tpu-v5e-8", 1, "local", NO_ACCELERATORS,
     "job job-1 (1 x tpu-v5e-8) needs 8 x tpu-v5-lite-podslice on this node, which has no "
     "TPU: submit it with a profile without TPUs here, or from a workspace on a cluster "
     "that has tpu-v5-lite-podslice"),
    ("gpu-small", 1, "local", NO_ACCELERATORS, "which has no GPU"),
    # every local host runs on this node: 2 hosts of 1 GPU need 2 GPUs here
    ("gpu-small", 2, "local", ONE_L4,
     "needs 2 x nvidia-l4 (2 hosts x 1, all here) on this node, which has 1 x nvidia-l4"),
    ("tpu-v5e-8", 1, "local", ONE_L4, "which has no TPU"),
    ("gpu-small", 1, "local", ONE_L4, None),
    ("gpu-small", 4, "local", FOUR_L4, None),
    ("cpu-small", 4, "local", NO_ACCELERATORS, None),
    # a cluster places hosts on its own nodes: nothing is checked
    ("tpu-v5e-8", 1, "kubernetes", NO_ACCELERATORS, None),
    ("tpu-v5e-8", 1, "local", A_CLUSTER, None),
    ("tpu-v5e-8", 1, "local", None, None),
])
def test_a_local_job_needs_its_accelerators_on_this_node(
        profile: str, hosts: int, runtime: str, caps: dict[str, Any] | None,
        refusal: str | None) -> None:
    d = run(request(profile, hosts, runtime=runtime), caps=caps)
    if refusal is None:
        assert d.accepted and d.job.state == JobState.RUNNING
        return
    assert not d.accepted and d.job.state == JobState.REFUSED and d.usage is None
    assert d.reason == str(RefusalReason.ACCELERATOR_UNAVAILABLE)
    assert refusal in d.message and "workspace needs" not in d.message


def test_hardware_is_checked_before_the_quota() -> None:
    # over the allowance AND impossible here: the node's answer, not "ask an admin"
    d = run(request("tpu-v5e-8", 2), caps=NO_ACCELERATORS)
    assert d.reason == str(RefusalReason.ACCELERATOR_UNAVAILABLE)


def test_no_quota_at_all_and_profiles_the_team_may_not_use() -> None:
    t = CATALOG.teams["ml-b"]
    d = submit(Request("job-2", "ml-b", "carol", "tpu-v5e-8", 1), existing=None,
               profile=TPU, team_profiles=None, quotas=t.quotas, usage=Usage(), now=NOW,
               contact=t.who_to_ask)
    assert not d.accepted and "no TPU quota" in d.message and "carol" in d.message
    assert d.message.startswith("job job-2 (1 x tpu-v5e-8) refused: team ml-b has no TPU")
    d = run(Request("job-3", "ml-b", "carol", "tpu-v5e-8", 1), team="ml-b")
    assert d.reason == "profile_not_allowed"
    assert run(request(profile="nope")).reason == "unknown_profile"


def test_a_duplicate_submission_changes_nothing() -> None:
    first = run(request()).job
    d = submit(request(), existing=first, profile=TPU, team_profiles=None,
               quotas=ML_A.quotas, usage=Usage(tpus=8), now=NOW)
    assert d.job is None and d.usage is None and d.reason == "duplicate"


def test_finish_releases_once_and_records_how_it_ended() -> None:
    job = run(request()).job
    later = NOW + timedelta(seconds=90)
    d = finish(job, job_id=job.id, succeeded=False, termination="host_failed", exit_status=1,
               failed_host=2, error="host 2 exited with status 1", log_uri="file:///l",
               usage=Usage(tpus=8, gpus=1), now=later)
    assert d.job.state == JobState.FAILED and d.job.failed_host == 2
    assert d.usage == Usage(gpus=1) and d.job.duration_ms == 90_000
    again = finish(d.job, job_id=job.id, succeeded=True, termination="exited", exit_status=0,
                   failed_host=None, error=None, log_uri=None, usage=Usage(), now=later)
    assert again.job is None and again.usage is None  # nothing released twice
    assert finish(None, job_id="x", succeeded=True, termination="exited", exit_status=0,
                  failed_host=None, error=None, log_uri=None, usage=Usage(),
                  now=NOW).reason == "unknown_job"
    cancelled = finish(job, job_id=job.id, succeeded=False, termination="cancelled",
                       exit_status=None, failed_host=None, error=None, log_uri=None,
                       usage=Usage(tpus=8), now=later)
    assert cancelled.job.state == JobState.CANCELLED


def test_job_document_round_trip() -> None:
    job = run(request()).job
    assert Job.from_doc(json.loads(json.dumps(job.to_doc(), default=str)) | {
        "submitted_at": NOW, "started_at": NOW, "finished_at": None}) == job


# --- the JobSet -----------------------------------------------------------------------------


def spec(hosts: int = 4, profile: Any = V5E_4, topology: str | None = "4x4") -> js.JobSpec:
    return js.JobSpec(job_id="job-20261201-a1b2c3", team="ml-a", namespace="team-ml-a",
                      image="us-docker.pkg.dev/p/stasis/jobs:1",
                      command=("python", "-m", "runtime.local.jobs"), profile=profile,
                      hosts=hosts, topology=topology, env={"STASIS_TEAM": "ml-a"})


@pytest.mark.parametrize(("hosts", "profile", "topology"), [
    (4, V5E_4, "4x4"), (1, TPU, None), (2, V5E_4, "2x4"),
])
def test_jobset_validates_against_the_crd_and_kubernetes(hosts: int, profile: Any,
                                                         topology: str | None) -> None:
    s = spec(hosts, profile, topology)
    obj = js.jobset(s)
    jsonschema.validate(obj, jobset_schema())
    rj = obj["spec"]["replicatedJobs"]  # type: ignore[index]
    assert len(rj) == 1 and rj[0]["replicas"] == 1
    job = rj[0]["template"]
    # the inlined batch/v1 JobSpec, strictly, as a Job
    kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job",
                                  "metadata": {"name": "x", **job["metadata"]},
                                  "spec": job["spec"]}, "1.35", strict=True)
    kubernetes_validate.validate(js.coordinator_service(s), "1.35", strict=True)
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == hosts
    assert job["spec"]["completionMode"] == "Indexed"
    pod = job["spec"]["template"]["spec"]
    chips = str(profile.accelerator.count)
    assert pod["nodeSelector"] == {GKE_TPU: "tpu-v5-lite-podslice",
                                   GKE_TPU_TOPOLOGY: topology or "2x4"}
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": chips}
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["TPU_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == js.COMPLETION_INDEX
    assert env["JAX_NUM_PROCESSES"]["value"] == str(hosts)
    names = env["TPU_WORKER_HOSTNAMES"]["value"].split(",")
    assert names[0] == "job-20261201-a1b2c3-workers-0-0.job-20261201-a1b2c3"
    assert len(names) == hosts
    assert env["JAX_COORDINATOR_ADDRESS"]["value"] == f"{names[0]}:8476"
    svc = js.coordinator_service(s)
    assert svc["spec"]["clusterIP"] == "None"  # type: ignore[index]
    assert obj["spec"]["network"]["subdomain"] == svc["metadata"]["name"]  # type: ignore
    assert obj["spec"]["ttlSecondsAfterFinished"] == 600  # type: ignore[index]


def test_the_crd_refuses_what_it_does_not_know() -> None:
    obj = js.jobset(spec())
    obj["spec"]["replicatedJobs"][0]["bogus"] = 1  # type: ignore[index]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, jobset_schema())


@pytest.mark.parametrize(("hosts", "profile", "topology", "match"), [
    (4, V5E_4, "2x4", "has 8 chips"),
    (4, V5E_4, None, "name the slice topology"),
    (2, CATALOG.profiles["gpu-small"], "2x2", "no TPU"),
])
def test_a_slice_that_does_not_add_up_is_refused(hosts: int, profile: Any,
                                                 topology: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        js.jobset(spec(hosts, profile, topology))


def test_a_kubernetes_job_is_started_and_cancelled_by_its_decisions_a_local_one_is_not() -> None:
    from functions.domain.jobs import CancelJob, StartJob

    cluster = run(replace(request(runtime="kubernetes"), payload_uri="gs://b/p.pkl",
                          topology="2x4", workspace_id="ml-a--nb"))
    assert cluster.commands == (StartJob("job-1", "ml-a", "alice", "tpu-v5e-8", 1,
                                         "gs://b/p.pkl", "2x4", "ml-a--nb"),)
    [admitted] = cluster.events
    assert (admitted.from_state, admitted.to_state, admitted.event_id) == (
        None, "RUNNING", "job-1-running")
    ended = finish(cluster.job, job_id="job-1", succeeded=False, termination="cancelled",
                   exit_status=None, failed_host=None, error=None, log_uri=None,
                   usage=cluster.usage, now=NOW)
    assert ended.commands == (CancelJob("job-1", "ml-a"),)
    assert [(e.from_state, e.to_state) for e in ended.events] == [("RUNNING", "CANCELLED")]
    local = run(request())
    assert local.commands == () and [e.to_state for e in local.events] == ["RUNNING"]
    refused = run(request(hosts=2))
    assert refused.commands == () and [e.to_state for e in refused.events] == ["REFUSED"]
    assert refused.outcome() == {"accepted": False, "reason": refused.reason,
                                 "message": refused.message, "state": "REFUSED"}
