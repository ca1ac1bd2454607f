"""Agent sandboxes, the pure parts: policy, limits, network rules, admission and completion
tables, the Kubernetes manifests, and the runner's decisions that need no process."""

from __future__ import annotations

import dataclasses
import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from store_fakes import Clock, MemoryDb, RecordingSandboxRuntime, handler_deps

from events.payloads import SandboxFinished, SandboxIdleDetected, SandboxSuspended
from functions.domain.catalog import Catalog
from functions.domain.sandboxes import (
    DEFAULT_LIMITS,
    DEFAULT_POLICY,
    Limits,
    Reason,
    Refusal,
    Request,
    RunSpec,
    Sandbox,
    SandboxPolicy,
    SandboxState,
    TeamQueue,
    admit,
    destination_permitted,
    finish,
    outcome_of,
    overdue,
    policy_problems,
    request_resume,
    resolve_limits,
    resolve_policy,
    suspend,
)
from functions.kubernetes.objects import sandbox as sm
from functions.kubernetes.objects.meta import ANN_IDLE_SECONDS
from functions.kubernetes.objects.monitor import monitor_manifests
from runtime.local.node import BadRequest
from runtime.local.sandbox_task import Watch, classify, exec_argv, scrubbed_env
from runtime.local.sandboxes import Isolation, parse_run_spec

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)
OBSERVED_AT = NOW.isoformat()
GiB = 2**30


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    import yaml

    return Catalog.from_config(yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text()))


def request(sandbox_id: str = "sbx-1", *, team: str = "ml-a", requester: str = "alice",
            limits: dict[str, Any] | None = None, network: tuple[str, ...] = (),
            repository: str = "/src/repo") -> Request:
    return Request(sandbox_id=sandbox_id, team=team, requester=requester,
                   repository=repository, command="make fix", base_ref="main",
                   limits=limits or {}, allowed_network=network, requestid=f"r-{sandbox_id}")


def admitted(catalog: Catalog, sandbox_id: str, queue: TeamQueue,
             policy: SandboxPolicy = DEFAULT_POLICY) -> tuple[Sandbox, TeamQueue]:
    decision = admit(request(sandbox_id), team=catalog.teams["ml-a"], policy=policy, queue=queue,
                     existing=None, now=NOW)
    assert decision.accepted and decision.queue is not None and decision.subject is not None
    return decision.subject, decision.queue


# -- policy and limits -----------------------------------------------------------------------


def test_no_policy_section_means_the_defaults() -> None:
    assert resolve_policy(None, "ml-a") == DEFAULT_POLICY
    assert DEFAULT_POLICY.defaults == Limits(600, 2 * GiB, 900, 256, idle_seconds=600)
    assert DEFAULT_POLICY.concurrency == 2 and DEFAULT_POLICY.network == ()


def test_team_overrides_apply_field_by_field() -> None:
    section = {"concurrency": 3, "defaults": {"memory": "1Gi"}, "network": ["pypi.org"],
               "teams": {"ml-b": {"concurrency": 1, "maximum": {"wall_clock_seconds": 1200},
                                  "network": []}}}
    a, b = resolve_policy(section, "ml-a"), resolve_policy(section, "ml-b")
    assert isinstance(a, SandboxPolicy) and isinstance(b, SandboxPolicy)
    assert (a.concurrency, a.defaults.memory_bytes, a.network) == (3, GiB, ("pypi.org",))
    assert (b.concurrency, b.defaults.memory_bytes, b.network) == (1, GiB, ())
    assert b.maximum.wall_clock_seconds == 1200 and b.maximum.cpu_seconds == 3600


@pytest.mark.parametrize(("section", "path"), [
    ({"concurency": 2}, "/sandboxes/concurency"),
    ({"concurrency": 0}, "/sandboxes/concurrency"),
    ({"defaults": {"memory": "lots"}}, "/sandboxes/defaults/memory"),
    ({"defaults": {"gpu": 1}}, "/sandboxes/defaults/gpu"),
    ({"network": "pypi.org"}, "/sandboxes/network"),
    ({"repositories": "/srv/git/*"}, "/sandboxes/repositories"),
    ({"teams": {"ml-a": {"repositories": [""]}}}, "/sandboxes/teams/ml-a/repositories"),
    ({"teams": {"ml-a": {"teams": {}}}}, "/sandboxes/teams/ml-a/teams"),
    ({"defaults": {"wall_clock_seconds": 7200}}, "/sandboxes"),
])
def test_policy_problems_name_their_path(section: dict[str, Any], path: str) -> None:
    assert path in [p.path for p in policy_problems(section)]
    refused = resolve_policy(section, "ml-a")
    assert isinstance(refused, Refusal) and refused.reason == Reason.INVALID_POLICY


def test_limits_default_from_policy_and_refuse_above_maximum() -> None:
    assert resolve_limits({}, DEFAULT_POLICY, "ml-a") == DEFAULT_LIMITS
    asked = resolve_limits({"memory": "512Mi", "wall_clock_seconds": 60}, DEFAULT_POLICY, "ml-a")
    assert asked == dataclasses.replace(DEFAULT_LIMITS, memory_bytes=512 * 2**20,
                                        wall_clock_seconds=60)
    over = resolve_limits({"memory": "16Gi", "cpu_seconds": 99999}, DEFAULT_POLICY, "ml-a")
    assert isinstance(over, Refusal) and over.reason == Reason.LIMIT_ABOVE_MAXIMUM
    assert "memory 16Gi > 8Gi" in over.message and "cpu_seconds 99999 > 3600" in over.message
    bad = resolve_limits({"memory": "much"}, DEFAULT_POLICY, "ml-a")
    assert isinstance(bad, Refusal) and bad.reason == Reason.INVALID_LIMITS


@pytest.mark.parametrize(("destination", "permitted", "ok"), [
    ("pypi.org", ["pypi.org"], True),
    ("PyPI.org.", ["pypi.org"], True),
    ("files.pythonhosted.org", ["*.pythonhosted.org"], True),
    ("pythonhosted.org", ["*.pythonhosted.org"], False),
    ("evil-pythonhosted.org", ["*.pythonhosted.org"], False),
    ("10.1.2.3", ["10.0.0.0/8"], True),
    ("10.1.0.0/16", ["10.0.0.0/8"], True),
    ("10.0.0.0/7", ["10.0.0.0/8"], False),
    ("192.168.1.1", ["10.0.0.0/8"], False),
    ("pypi.org", [], False),
])
def test_destination_rules(destination: str, permitted: list[str], ok: bool) -> None:
    assert destination_permitted(destination, permitted) is ok


# -- admission -------------------------------------------------------------------------------


def test_first_requests_run_then_queue_with_positions(catalog: Catalog) -> None:
    queue = TeamQueue()
    first, queue = admitted(catalog, "sbx-1", queue)
    second, queue = admitted(catalog, "sbx-2", queue)
    third, queue = admitted(catalog, "sbx-3", queue)
    fourth, queue = admitted(catalog, "sbx-4", queue)
    assert [s.state for s in (first, second, third, fourth)] == [
        SandboxState.RUNNING, SandboxState.RUNNING, SandboxState.QUEUED, SandboxState.QUEUED]
    assert (third.queue_position, fourth.queue_position) == (1, 2)
    assert queue == TeamQueue(("sbx-1", "sbx-2"), ("sbx-3", "sbx-4"))
    assert first.started_at == NOW and third.started_at is None
    assert "position 2 of 2" in fourth.message and "runs 2/2" in fourth.message


def test_admission_says_what_to_start(catalog: Catalog) -> None:
    decision = admit(request("sbx-1"), team=catalog.teams["ml-a"], policy=DEFAULT_POLICY,
                     queue=TeamQueue(), existing=None, now=NOW)
    assert decision.start == ("sbx-1",) and decision.reason == Reason.ADMITTED
    queued = admit(request("sbx-9"), team=catalog.teams["ml-a"], policy=DEFAULT_POLICY,
                   queue=TeamQueue(("a", "b")), existing=None, now=NOW)
    assert queued.start == () and queued.reason == Reason.QUEUED
    assert queued.positions == (("sbx-9", 1, queued.message),)


def test_a_new_request_never_overtakes_the_queue(catalog: Catalog) -> None:
    # The cap was raised: a slot is free, but sbx-w waited first.
    policy = dataclasses.replace(DEFAULT_POLICY, concurrency=3)
    decision = admit(request("sbx-new"), team=catalog.teams["ml-a"], policy=policy,
                     queue=TeamQueue(("a", "b"), ("sbx-w",)), existing=None, now=NOW)
    assert decision.queue == TeamQueue(("a", "b", "sbx-w"), ("sbx-new",))
    assert decision.subject is not None and decision.subject.state == SandboxState.QUEUED


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"team": "nope"}, Reason.UNKNOWN_TEAM),
    ({"requester": "mallory"}, Reason.NOT_A_MEMBER),
    ({"limits": {"memory": "64Gi"}}, Reason.LIMIT_ABOVE_MAXIMUM),
    ({"network": ("pypi.org",)}, Reason.NETWORK_NOT_PERMITTED),
])
def test_refusals_are_recorded_failed_with_the_reason(catalog: Catalog, kwargs: dict[str, Any],
                                                      reason: Reason) -> None:
    req = request(**kwargs)
    decision = admit(req, team=catalog.teams.get(req.team), policy=DEFAULT_POLICY,
                     queue=TeamQueue(), existing=None, now=NOW)
    assert not decision.accepted and decision.reason == reason
    record = decision.subject
    assert record is not None and record.state == SandboxState.FAILED
    assert record.reason == reason and record.message.startswith("refused: ")
    assert decision.queue is None and decision.start == ()


def test_network_refusal_says_whom_to_ask(catalog: Catalog) -> None:
    decision = admit(request(network=("pypi.org", "evil.example")), team=catalog.teams["ml-a"],
                     policy=dataclasses.replace(DEFAULT_POLICY, network=("pypi.org",)),
                     queue=TeamQueue(), existing=None, now=NOW)
    assert "evil.example" in decision.message and "pypi.org," not in decision.message
    assert "alice" in decision.message  # ml-a's contact


@pytest.mark.parametrize(("repository", "permitted"), [
    ("/srv/git/app", True),
    ("https://github.com/org/app.git", True),
    ("/srv/git/../../etc/shadow-repo", False),   # normalised before matching
    ("/home/bob/secret-repo", False),
    ("https://github.com/other/app.git", False),
])
def test_only_the_policys_repositories_may_be_named(catalog: Catalog, repository: str,
                                                    permitted: bool) -> None:
    section = {"repositories": ["/srv/git/*", "https://github.com/org/*"],
               "teams": {"ml-b": {"repositories": []}}}
    policy = resolve_policy(section, "ml-a")
    decision = admit(request(repository=repository), team=catalog.teams["ml-a"], policy=policy,
                     queue=TeamQueue(), existing=None, now=NOW)
    assert decision.accepted is permitted
    if not permitted:
        assert decision.reason == Reason.REPOSITORY_NOT_PERMITTED
        assert repository in decision.message and "/srv/git/*" in decision.message
    closed = resolve_policy(section, "ml-b")  # a team override with none: nothing at all
    assert isinstance(closed, SandboxPolicy) and closed.repositories == ()
    assert resolve_policy({}, "ml-a") == DEFAULT_POLICY and DEFAULT_POLICY.repositories is None


def test_a_full_queue_is_refused_loudly(catalog: Catalog) -> None:
    policy = dataclasses.replace(DEFAULT_POLICY, max_queued=1)
    decision = admit(request("sbx-x"), team=catalog.teams["ml-a"], policy=policy,
                     queue=TeamQueue(("a", "b"), ("c",)), existing=None, now=NOW)
    assert decision.reason == Reason.QUEUE_FULL and "1 sandboxes waiting" in decision.message


def test_a_reused_id_changes_nothing(catalog: Catalog) -> None:
    first, queue = admitted(catalog, "sbx-1", TeamQueue())
    again = admit(request("sbx-1"), team=catalog.teams["ml-a"], policy=DEFAULT_POLICY,
                  queue=queue, existing=first, now=NOW)
    assert again.reason == Reason.SANDBOX_ID_IN_USE and again.sandboxes == ()


# -- completion ------------------------------------------------------------------------------


@pytest.mark.parametrize(("report", "state", "reason"), [
    (SandboxFinished("s", True, exit_status=0), SandboxState.SUCCEEDED, Reason.SUCCEEDED),
    (SandboxFinished("s", False, exit_status=1), SandboxState.FAILED, Reason.EXITED_NONZERO),
    (SandboxFinished("s", False, termination="wall_clock_exceeded", exit_status=137),
     SandboxState.TIMED_OUT,
     Reason.WALL_CLOCK_EXCEEDED),
    (SandboxFinished("s", False, termination="cpu_time_exceeded", exit_status=152),
     SandboxState.TIMED_OUT,
     Reason.CPU_TIME_EXCEEDED),
    (SandboxFinished("s", False, termination="memory_limit_exceeded", exit_status=137),
     SandboxState.KILLED,
     Reason.MEMORY_LIMIT_EXCEEDED),
    (SandboxFinished("s", False, termination="cancelled"), SandboxState.KILLED, Reason.CANCELLED),
    (SandboxFinished("s", False, termination="failed_to_start"), SandboxState.FAILED,
     Reason.FAILED_TO_START),
    (SandboxFinished("s", False, termination="runtime_lost"), SandboxState.FAILED,
     Reason.RUNTIME_LOST),
])
def test_outcomes(report: SandboxFinished, state: SandboxState, reason: Reason) -> None:
    assert outcome_of(report) == (state, reason)


def test_finish_frees_the_slot_and_promotes_the_first_waiting(catalog: Catalog) -> None:
    queue = TeamQueue()
    records: dict[str, Sandbox] = {}
    for sandbox_id in ("sbx-1", "sbx-2", "sbx-3", "sbx-4"):
        records[sandbox_id], queue = admitted(catalog, sandbox_id, queue)
    later = NOW + timedelta(seconds=30)
    report = SandboxFinished("sbx-1", True, exit_status=0, patch_uri="gs://b/p",
                             patch_bytes=120, files_changed=["calc.py"], base_sha="abc")
    decision = finish(records["sbx-1"], report, policy=DEFAULT_POLICY, queue=queue,
                      load=records.get, now=later)
    ended, promoted = decision.sandboxes
    assert ended.state == SandboxState.SUCCEEDED and ended.version == 2
    assert "stasis sandbox show sbx-1" in ended.message and "1 file" in ended.message
    assert promoted.id == "sbx-3" and promoted.state == SandboxState.RUNNING
    assert promoted.started_at == later and promoted.queue_position is None
    assert "30 s in the queue" in promoted.message
    assert decision.start == ("sbx-3",)
    assert decision.queue == TeamQueue(("sbx-2", "sbx-3"), ("sbx-4",))
    assert [(i, p) for i, p, _ in decision.positions] == [("sbx-4", 1)]


def test_an_end_cleans_up_first_then_starts_the_promoted_and_tells_both_changes(
        catalog: Catalog) -> None:
    from functions.domain.sandboxes import CleanUpSandbox, StartSandbox

    queue, records = TeamQueue(), {}
    for sandbox_id in ("sbx-1", "sbx-2", "sbx-3"):
        records[sandbox_id], queue = admitted(catalog, sandbox_id, queue)
    decision = finish(records["sbx-1"], SandboxFinished("sbx-1", False, termination="killed"),
                      policy=DEFAULT_POLICY, queue=queue, load=records.get, now=NOW)
    assert decision.commands == (CleanUpSandbox("sbx-1", "ml-a"), StartSandbox("sbx-3"))
    assert [(e.sandbox_id, e.from_state, e.to_state, e.version, e.event_id)
            for e in decision.events] == [("sbx-1", "RUNNING", "KILLED", 2, "sbx-1-v2"),
                                          ("sbx-3", "QUEUED", "RUNNING", 2, "sbx-3-v2")]
    assert decision.outcome()["started"] == ["sbx-3"]
    # Admission tells the new record's state; a refusal that changes nothing tells nothing.
    assert [(e.from_state, e.to_state) for e in admit(
        request("sbx-4"), team=catalog.teams["ml-a"], policy=DEFAULT_POLICY, queue=queue,
        existing=None, now=NOW).events] == [(None, "QUEUED")]
    in_use = admit(request("sbx-1"), team=catalog.teams["ml-a"], policy=DEFAULT_POLICY,
                   queue=queue, existing=records["sbx-1"], now=NOW)
    assert in_use.events == () and in_use.commands == ()


@pytest.mark.parametrize(("state", "reason"), [
    (SandboxState.SUCCEEDED, Reason.ALREADY_FINISHED),
    (SandboxState.QUEUED, Reason.NOT_STARTED),
])
def test_stale_reports_change_nothing(catalog: Catalog, state: SandboxState,
                                      reason: Reason) -> None:
    record, queue = admitted(catalog, "sbx-1", TeamQueue())
    decision = finish(dataclasses.replace(record, state=state), SandboxFinished("sbx-1", True),
                      policy=DEFAULT_POLICY, queue=queue, load=lambda _i: None, now=NOW)
    assert decision.reason == reason and decision.sandboxes == () and decision.queue is None
    unknown = finish(None, SandboxFinished("sbx-0", True), policy=DEFAULT_POLICY, queue=queue,
                     load=lambda _i: None, now=NOW)
    assert unknown.reason == Reason.UNKNOWN_SANDBOX


def test_a_broken_policy_still_frees_and_promotes(catalog: Catalog) -> None:
    queue = TeamQueue()
    records: dict[str, Sandbox] = {}
    for sandbox_id in ("sbx-1", "sbx-2", "sbx-3"):
        records[sandbox_id], queue = admitted(catalog, sandbox_id, queue)
    decision = finish(records["sbx-2"], SandboxFinished("sbx-2", False, exit_status=3),
                      policy=Refusal(Reason.INVALID_POLICY, "broken"), queue=queue,
                      load=records.get, now=NOW)
    assert decision.start == ("sbx-3",)
    assert decision.subject is not None and "exited with status 3" in decision.subject.message


def test_records_round_trip_through_documents(catalog: Catalog) -> None:
    record, _ = admitted(catalog, "sbx-1", TeamQueue())
    assert Sandbox.from_doc(record.to_doc()) == record


def test_overdue_running_sandboxes() -> None:
    record = Sandbox(id="s", team="ml-a", requester="a", repository="r", command="c",
                     base_ref="main", limits=dataclasses.replace(DEFAULT_LIMITS,
                                                                 wall_clock_seconds=60),
                     allowed_network=(), state=SandboxState.RUNNING, reason="admitted",
                     requestid="r", requested_at=NOW, started_at=NOW)
    assert overdue([record], NOW + timedelta(minutes=5)) == []
    assert overdue([record], NOW + timedelta(minutes=7)) == [record]


# -- Kubernetes manifests --------------------------------------------------------------------


SPEC = RunSpec("sbx-20250610-01", "ml-a", "https://example.org/r.git", "main", "pytest -q",
               DEFAULT_LIMITS, ("pypi.org", "*.pythonhosted.org", "10.20.0.0/16"), "req-1",
               "stasis-snapshots", "sandboxes/ml-a/sbx-20250610-01")
URLS = {key: f"https://storage.googleapis.com/signed/{key}" for key in sm.SECRET_KEYS}


def test_pod_is_gvisor_without_token_or_privileges() -> None:
    pod = sm.sandbox_pod(SPEC, "a" * 40)
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["activeDeadlineSeconds"] == 900 + 600 and spec["restartPolicy"] == "Never"
    task = next(c for c in spec["containers"] if c["name"] == "task")
    assert task["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}
    assert task["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not any("valueFrom" in e for e in task["env"]), "the task gets no secret"
    assert {e["name"]: e["value"] for e in task["env"]}["CPU_SECONDS"] == "600"
    holders = {c["name"] for c in [*spec["containers"], *spec["initContainers"]]
               if any("valueFrom" in e for e in c.get("env", []))}
    assert holders == {"checkout", "collector"}


def test_network_policy_denies_all_but_transfers_and_allowed_addresses() -> None:
    policy = sm.sandbox_network_policy(SPEC)["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == []
    cidrs = [b["ipBlock"]["cidr"] for rule in policy["egress"] for b in rule["to"]]
    assert cidrs == ["199.36.153.8/30", "10.20.0.0/16"]
    no_network = dataclasses.replace(SPEC, allowed_network=())
    assert sm.sandbox_fqdn_policy(no_network) is None and sm.sandbox_dns_policy(no_network) is None
    fqdn = sm.sandbox_fqdn_policy(SPEC)
    assert fqdn is not None
    assert fqdn["spec"]["egress"][0]["matches"] == [{"name": "pypi.org"},
                                                    {"pattern": "*.pythonhosted.org"}]


def test_manifests_are_valid_kubernetes_objects() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    objects = sm.sandbox_manifests(SPEC, "a" * 40, URLS)
    assert [o["kind"] for o in objects] == ["NetworkPolicy", "NetworkPolicy",
                                            "FQDNNetworkPolicy", "Secret", "Pod"]
    for obj in objects:
        if obj["apiVersion"].startswith("networking.gke.io"):
            continue  # a GKE CRD: not in the Kubernetes OpenAPI schema
        kubernetes_validate.validate(obj, "1.35", strict=True)


# -- the local runner's pure decisions -------------------------------------------------------


def test_the_task_environment_is_an_allow_list() -> None:
    host = {"PATH": "/usr/bin", "LANG": "de_DE.UTF-8", "HOME": "/root",
            "GOOGLE_APPLICATION_CREDENTIALS": "/creds.json", "SLACK_BOT_TOKEN": "xoxb-1",
            "AWS_SECRET_ACCESS_KEY": "k", "SSH_AUTH_SOCK": "/tmp/agent", "ANY_NEW_SECRET": "s",
            "STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"}
    env = scrubbed_env(sandbox_id="sbx-1", home="/s/home", tmp="/s/tmp", path="/usr/bin",
                       host=host)
    assert env["HOME"] == "/s/home" and env["LANG"] == "de_DE.UTF-8"
    leaked = {k for k in env if k in host and k not in ("PATH", "LANG", "HOME")}
    assert leaked == set()
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG", "USER", "LOGNAME", "SHELL", "TERM",
                        "STASIS_SANDBOX_ID", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL",
                        "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_TERMINAL_PROMPT",
                        "PYTHONDONTWRITEBYTECODE"}


def test_exec_argv_carries_isolation_and_limits() -> None:
    spec = {"net": "isolated", "uid": 200001, "gid": 200001, "python": "/py",
            "limits": {"processes": 64}}
    argv = exec_argv(spec, ["/bin/sh", "-c", "x"], cwd="/w", cpu_seconds=5,
                     memory_bytes=10, file_bytes=20)
    assert argv[:3] == ["/py", "-I", argv[2]] and argv[2].endswith("sandbox_exec.py")
    text = " ".join(argv)
    for part in ("--net isolated", "--uid 200001 --gid 200001", "--processes 64",
                 "--cpu-seconds 5", "--memory-bytes 10", "--file-bytes 20", "-- /bin/sh -c x"):
        assert part in text
    assert "--uid" not in exec_argv({**spec, "uid": None}, ["true"], cwd="/", cpu_seconds=1,
                                    memory_bytes=1, file_bytes=1)


def _exited(code: int) -> int:
    return code << 8  # a wait status


LIMITS = {"cpu_seconds": 10, "memory_bytes": 100, "wall_clock_seconds": 5, "processes": 8}


@pytest.mark.parametrize(("watch", "tail", "termination"), [
    (Watch(status=_exited(0)), b"", "exited"),
    (Watch(status=_exited(2)), b"", "exited"),
    (Watch(status=_exited(1), stopped="wall_clock_exceeded"), b"", "wall_clock_exceeded"),
    (Watch(status=_exited(1), stopped="memory_limit_exceeded"), b"", "memory_limit_exceeded"),
    (Watch(status=_exited(128 + signal.SIGXCPU)), b"", "cpu_time_exceeded"),
    (Watch(status=signal.SIGXCPU), b"", "cpu_time_exceeded"),
    (Watch(status=_exited(1)), b"Traceback\nMemoryError\n", "memory_limit_exceeded"),
    (Watch(status=_exited(125)), b"sandbox setup failed, the task did not run: x",
     "failed_to_start"),
    (Watch(status=signal.SIGSEGV), b"", "killed"),
    (Watch(status=_exited(1), stopped="cancelled"), b"", "cancelled"),
])
def test_classify(watch: Watch, tail: bytes, termination: str) -> None:
    assert classify(watch, LIMITS, tail)[0] == termination


def test_exit_status_follows_the_shell_convention() -> None:
    assert Watch(status=_exited(3)).exit_status == 3
    assert Watch(status=signal.SIGKILL).exit_status == 128 + 9
    assert os.WIFSIGNALED(signal.SIGKILL)


@pytest.mark.parametrize("isolation, allowed, uid, consent, refused", [
    (Isolation(True, True, "probed", mounts=True), [], 0, False, None),
    (Isolation(True, True, "probed", mounts=True), ["pypi.org"], 0, False, None),  # policy
    (Isolation(False, True, "unshare: EPERM", mounts=True), [], 0, False,
     "network isolation could not"),
    (Isolation(False, True, "unshare: EPERM", mounts=True), [], 0, True, None),
    (Isolation(True, False, "probed", "setuid: EPERM", True), [], 0, False, "never runs as root"),
    (Isolation(True, False, "probed", "setuid: EPERM", True), [], 0, True, "never runs as root"),
    (Isolation(True, False, "probed", mounts=True), [], 1000, False, "runs as uid 1000, not root"),
    (Isolation(True, False, "probed", mounts=True), [], 1000, True, None),
    # The mount namespace is probed on its own; without it the agent's state is readable.
    (Isolation(True, True, "probed", mounts_detail="mount: EPERM"), [], 0, False,
     "mount namespace that hides the node agent's state"),
    (Isolation(True, True, "probed", mounts_detail="mount: EPERM"), ["pypi.org"], 0, False,
     "(mount: EPERM)"),
    (Isolation(True, True, "probed", mounts_detail="mount: EPERM"), [], 0, True, None),
])
def test_sandboxes_fail_closed(isolation: Isolation, allowed: list[str], uid: int,
                               consent: bool, refused: str | None) -> None:
    why = isolation.refusal(allowed, agent_uid=uid, allow_unisolated=consent)
    assert (why is None) == (refused is None), why
    assert refused is None or (why is not None and refused in why)


def test_exec_argv_hides_and_keeps_what_the_spec_says() -> None:
    spec = {"net": "isolated", "limits": {"processes": 64}, "uid": None,
            "hide": ["/srv/stasis", "/opt/venv"], "keep": ["/srv/stasis/sandboxes/s"]}
    argv = exec_argv(spec, ["true"], cwd="/w", cpu_seconds=1, memory_bytes=1, file_bytes=1)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--hide"] == spec["hide"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--keep"] == spec["keep"]
    assert argv.index("--keep") < argv.index("--")


def test_the_trampoline_hides_only_outermost_directories_and_never_the_root(
        tmp_path: Path) -> None:
    from runtime.local import sandbox_exec

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    outer = sandbox_exec._outermost([str(tmp_path / "a" / "b"), str(tmp_path / "a"),
                                     str(tmp_path / "c"), str(tmp_path / "missing")])
    assert outer == [str(tmp_path / "a"), str(tmp_path / "c")]
    # Checked before any namespace is made: this very process is left as it was.
    before = os.readlink("/proc/self/ns/mnt")
    with pytest.raises(sandbox_exec.SetupError, match="refusing to hide /"):
        sandbox_exec.hide_paths([str(tmp_path / "c"), "/"], [])
    assert os.readlink("/proc/self/ns/mnt") == before


def test_every_task_gets_rlimit_nproc() -> None:
    spec = {"net": "isolated", "limits": {"processes": 64}, "uid": None}
    argv = exec_argv(spec, ["true"], cwd="/w", cpu_seconds=1, memory_bytes=1, file_bytes=1)
    assert argv[argv.index("--processes") + 1] == "64"


def test_network_statements_never_overstate() -> None:
    enforced = Isolation(True, True, "probed")
    assert enforced.statement([]).startswith("none: a network namespace")
    assert "NOT ENFORCED" in Isolation(False, False, "unshare: EPERM").statement([])
    opened = enforced.statement(["pypi.org"])
    assert "pypi.org" in opened and "does not filter by destination" in opened


def test_run_spec_is_checked() -> None:
    good = RunSpec.of(Sandbox(id="sbx-1", team="ml-a", requester="a", repository="/r",
                              command="c", base_ref="main", limits=DEFAULT_LIMITS,
                              allowed_network=(), state=SandboxState.RUNNING, reason="admitted",
                              requestid="r", requested_at=NOW), "bucket").to_json()
    assert parse_run_spec("sbx-1", good)["prefix"] == "sandboxes/ml-a/sbx-1"
    with pytest.raises(BadRequest, match="not a sandbox id"):
        parse_run_spec("../etc", {**good, "sandbox_id": "../etc"})
    with pytest.raises(BadRequest, match=r"limits\.memory_bytes"):
        parse_run_spec("sbx-1", {**good, "limits": {**good["limits"], "memory_bytes": 0}})
    with pytest.raises(BadRequest, match="not sbx-2"):
        parse_run_spec("sbx-2", good)


def test_the_policy_schema_and_the_domain_agree() -> None:
    from events.schemas import errors

    good = {"concurrency": 3, "max_queued": 5, "defaults": {"memory": "1Gi"},
            "maximum": {"wall_clock_seconds": 1800}, "network": ["pypi.org", "10.0.0.0/8"],
            "repositories": ["/srv/git/*"],
            "teams": {"ml-b": {"concurrency": 1, "repositories": []}}}
    assert errors("sandbox_policy.schema.json", good) == [] and policy_problems(good) == []
    for bad in ({"concurency": 1}, {"defaults": {"gpu": 1}}, {"teams": {"ml-a": {"x": 1}}},
                {"concurrency": 0}):
        assert errors("sandbox_policy.schema.json", bad) and policy_problems(bad)


def test_the_disk_quota_defaults_from_policy_and_is_refused_above_its_maximum() -> None:
    assert DEFAULT_LIMITS.disk_bytes == 2 * GiB
    asked = resolve_limits({"disk": "512Mi"}, DEFAULT_POLICY, "ml-a")
    assert isinstance(asked, Limits) and asked.disk_bytes == 512 * 2**20
    over = resolve_limits({"disk": "64Gi"}, DEFAULT_POLICY, "ml-a")
    assert isinstance(over, Refusal) and over.reason == Reason.LIMIT_ABOVE_MAXIMUM
    assert "disk 64Gi > 16Gi" in over.message
    bad = resolve_limits({"disk": "much"}, DEFAULT_POLICY, "ml-a")
    assert isinstance(bad, Refusal) and bad.reason == Reason.INVALID_LIMITS
    section = {"defaults": {"disk": "1Gi"}, "maximum": {"disk": "4Gi"}}
    from events.schemas import errors

    assert errors("sandbox_policy.schema.json", section) == []
    assert [e for e in errors("config.schema.json", {"sandboxes": section})
            if e[0].startswith("/sandboxes")] == []
    policy = resolve_policy(section, "ml-a")
    assert isinstance(policy, SandboxPolicy) and policy.defaults.disk_bytes == GiB
    assert "/sandboxes/defaults/disk" in [p.path for p in
                                           policy_problems({"defaults": {"disk": "lots"}})]
    # A record admitted before quotas: the default quota, not none.
    doc = {k: v for k, v in DEFAULT_LIMITS.to_doc().items() if k != "disk_bytes"}
    assert Limits.from_doc(doc).disk_bytes == 2 * GiB


def test_the_run_spec_carries_the_disk_quota() -> None:
    spec = dataclasses.replace(SPEC, limits=dataclasses.replace(DEFAULT_LIMITS,
                                                                disk_bytes=GiB)).to_json()
    spec["prefix"] = "p"
    assert parse_run_spec(SPEC.sandbox_id, spec)["limits"]["disk_bytes"] == GiB
    older = {**spec, "limits": {k: v for k, v in spec["limits"].items() if k != "disk_bytes"}}
    assert parse_run_spec(SPEC.sandbox_id, older)["limits"]["disk_bytes"] == 2 * GiB
    with pytest.raises(BadRequest, match=r"limits\.disk_bytes"):
        parse_run_spec(SPEC.sandbox_id, {**spec, "limits": {**spec["limits"], "disk_bytes": 0}})


def test_the_admin_policy_may_allow_unisolated_sandboxes_per_team(catalog: Catalog) -> None:
    section = {"teams": {"ml-a": {"allow_unisolated": True}}}
    a, b = resolve_policy(section, "ml-a"), resolve_policy(section, "ml-b")
    assert isinstance(a, SandboxPolicy) and isinstance(b, SandboxPolicy)
    assert (a.allow_unisolated, b.allow_unisolated, DEFAULT_POLICY.allow_unisolated) == \
        (True, False, False)
    from events.schemas import errors

    assert errors("sandbox_policy.schema.json", section) == []
    assert [e for e in errors("config.schema.json", {"sandboxes": section})
            if e[0].startswith("/sandboxes")] == []
    bad = {"allow_unisolated": "yes"}
    assert "/sandboxes/allow_unisolated" in [p.path for p in policy_problems(bad)]
    assert errors("sandbox_policy.schema.json", bad)
    # Recorded at admission, carried to the runtime in the run spec.
    decision = admit(request("sbx-1"), team=catalog.teams["ml-a"], policy=a,
                     queue=TeamQueue(), existing=None, now=NOW)
    [record] = decision.sandboxes
    assert record.allow_unisolated is True
    assert Sandbox.from_doc(record.to_doc()).allow_unisolated is True
    spec = RunSpec.of(record, "bucket").to_json()
    assert spec["allow_unisolated"] is True
    spec["prefix"] = "p"
    assert parse_run_spec("sbx-1", spec)["allow_unisolated"] is True
    older = {k: v for k, v in spec.items() if k != "allow_unisolated"}
    assert parse_run_spec("sbx-1", older)["allow_unisolated"] is False
    with pytest.raises(BadRequest, match="allow_unisolated must be true or false"):
        parse_run_spec("sbx-1", {**spec, "allow_unisolated": "yes"})


@pytest.mark.parametrize("policy, node, allowed", [
    (False, None, False),
    (True, None, True),  # the admin policy decides
    (False, "1", True),  # the node's override wins: a single-user host
    (True, "0", False),  # ... both ways
    (True, "", True),
])
def test_the_node_may_override_the_unisolated_policy(policy: bool, node: str | None,
                                                     allowed: bool) -> None:
    from runtime.local.sandboxes import unisolated_allowed

    environ = {} if node is None else {"STASIS_SANDBOX_ALLOW_UNISOLATED": node}
    assert unisolated_allowed({"allow_unisolated": policy}, environ) is allowed


# -- the handler, against small fakes ------------------------------------------------------


def _deps(catalog: Catalog, runtime: RecordingSandboxRuntime) -> Any:
    """The sandbox handler's ports in memory, under a policy of one slot per team."""
    db = MemoryDb()
    db.put("catalog", "current", {"sandboxes": {"concurrency": 1}})
    return handler_deps(catalog, db=db, sandbox_runtime=runtime, clock=Clock(NOW))


def _docs(deps: Any) -> dict[tuple[str, str], dict[str, Any]]:
    db: MemoryDb = deps.store.db
    return db.docs


def _requested(sandbox_id: str, requestid: str | None = None) -> Any:
    from events import SandboxRequested, new_event

    return new_event(SandboxRequested(sandbox_id=sandbox_id, team="ml-a", requester="alice",
                                      repository="/r", command="true"),
                     source="//t", requestid=requestid)


def test_the_handler_starts_admitted_sandboxes_once(catalog: Catalog) -> None:
    from functions.handlers import sandboxes as handler

    runtime = RecordingSandboxRuntime()
    deps = _deps(catalog, runtime)
    event = _requested("sbx-1")
    handler.handle(event, deps, "on_sandbox_requested")
    handler.handle(event, deps, "on_sandbox_requested")  # a redelivery
    handler.handle(_requested("sbx-2"), deps, "on_sandbox_requested")  # over the cap of 1
    assert [s.sandbox_id for s in runtime.started] == ["sbx-1"]
    spec = runtime.started[0]
    assert (spec.bucket, spec.prefix, spec.requestid) == ("bucket", "sandboxes/ml-a/sbx-1",
                                                          event.requestid)
    store = _docs(deps)
    assert store[("sandboxes", "sbx-2")]["state"] == "QUEUED"

    from events import SandboxFinished, new_event

    done = new_event(SandboxFinished("sbx-1", True, exit_status=0, patch_uri="gs://b/p"),
                     source="//runtime", requestid=event.requestid)
    handler.handle(done, deps, "on_sandbox_finished")
    assert [s.sandbox_id for s in runtime.started] == ["sbx-1", "sbx-2"]
    assert store[("sandboxes", "sbx-1")]["state"] == "SUCCEEDED"
    assert store[("sandboxes", "sbx-2")]["state"] == "RUNNING"


def test_a_runtime_refusal_is_reported_as_failed_to_start(catalog: Catalog) -> None:
    from functions.handlers import sandboxes as handler

    deps = _deps(catalog, RecordingSandboxRuntime(refuse=True))
    event = _requested("sbx-1")
    handler.handle(event, deps, "on_sandbox_requested")
    [published] = [e for e in deps.bus.events if e.name == "sandbox.finished"]
    assert published.requestid == event.requestid
    assert published.payload.termination == "failed_to_start"
    assert "no such repository" in published.payload.error


def test_the_sandbox_document_schema_matches_the_record(catalog: Catalog) -> None:
    import json

    from jsonschema import Draft202012Validator, FormatChecker

    schema = json.loads((ROOT / "schemas" / "documents" / "sandbox.json").read_text())
    Draft202012Validator.check_schema(schema)
    fields = {f.name for f in dataclasses.fields(Sandbox)}
    assert set(schema["properties"]) == fields | {"updated_at"}
    record, _ = admitted(catalog, "sbx-1", TeamQueue())
    ended = finish(record, SandboxFinished("sbx-1", True, exit_status=0, patch_uri="gs://b/p"),
                   policy=DEFAULT_POLICY, queue=TeamQueue(("sbx-1",)), load=lambda _i: None,
                   now=NOW).sandboxes[0]
    for doc in (record.to_doc(), ended.to_doc()):
        as_json = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in doc.items()}
        errors = list(Draft202012Validator(schema, format_checker=FormatChecker())
                      .iter_errors(as_json))
        assert errors == [], errors


# -- idle: suspension and resume ---------------------------------------------------------------


def test_the_idle_limit_defaults_from_policy_and_never_ranks_above_any_number() -> None:
    assert resolve_limits({}, DEFAULT_POLICY, "ml-a").idle_seconds == 600  # type: ignore[union-attr]
    assert resolve_limits({"idle_seconds": 60}, DEFAULT_POLICY, "ml-a").idle_seconds == 60  # type: ignore[union-attr]
    never = resolve_limits({"idle_seconds": 0}, DEFAULT_POLICY, "ml-a")
    assert isinstance(never, Refusal) and never.reason == Reason.LIMIT_ABOVE_MAXIMUM
    assert "idle_seconds never > 3600" in never.message
    lenient = resolve_policy({"maximum": {"idle_seconds": 0}}, "ml-a")
    assert isinstance(lenient, SandboxPolicy)
    assert resolve_limits({"idle_seconds": 0}, lenient, "ml-a").idle_seconds == 0  # type: ignore[union-attr]
    assert [p.path for p in policy_problems({"defaults": {"idle_seconds": 0}})] == ["/sandboxes"]
    assert policy_problems({"defaults": {"idle_seconds": -1}})
    # A record admitted before the limit existed is never suspended.
    old = {k: v for k, v in DEFAULT_LIMITS.to_doc().items() if k != "idle_seconds"}
    assert Limits.from_doc(old).idle_seconds == 0
    assert "suspended after 600 s idle" in DEFAULT_LIMITS.describe()


def _running(catalog: Catalog, *ids: str) -> tuple[dict[str, Sandbox], TeamQueue]:
    queue, records = TeamQueue(), {}
    for sandbox_id in ids:
        records[sandbox_id], queue = admitted(catalog, sandbox_id, queue)
    return records, queue


def _suspended(record: Sandbox, at: datetime = NOW) -> Sandbox:
    return dataclasses.replace(record, state=SandboxState.SUSPENDED,
                               reason=str(Reason.SUSPENDED_IDLE), suspended_at=at, suspensions=1)


def test_an_idle_sandbox_is_suspended_and_its_slot_goes_to_the_queue(catalog: Catalog) -> None:
    records, queue = _running(catalog, "sbx-1", "sbx-2", "sbx-3", "sbx-4")
    later = NOW + timedelta(minutes=11)
    report = SandboxSuspended("sbx-1", idle_seconds=610, checkpoint_uri="gs://b/c-1.diff",
                        checkpoint_bytes=42, files_changed=("a.py",), cpu_seconds=3.0)
    decision = suspend(records["sbx-1"], report, policy=DEFAULT_POLICY, queue=queue,
                       load=records.get, now=later)
    held, promoted = decision.sandboxes
    assert decision.accepted and decision.reason == Reason.SUSPENDED_IDLE
    assert (held.state, held.suspended_at, held.suspensions) == (SandboxState.SUSPENDED, later, 1)
    assert (held.checkpoint_uri, held.checkpoint_bytes, held.files_changed) == \
        ("gs://b/c-1.diff", 42, ("a.py",))
    assert "610 s without progress" in held.message
    assert "memory stays resident" in held.message
    assert "stasis sandbox resume sbx-1" in held.message
    assert promoted.id == "sbx-3" and promoted.state == SandboxState.RUNNING
    assert decision.start == ("sbx-3",) and decision.resume == ()
    assert decision.queue == TeamQueue(("sbx-2", "sbx-3"), ("sbx-4",))


@pytest.mark.parametrize(("state", "suspensions", "sequence", "reason"), [
    (SandboxState.SUSPENDED, 1, 2, Reason.ALREADY_SUSPENDED),
    (SandboxState.RUNNING, 2, 1, Reason.STALE_REPORT),   # resumed since: an old report
    (SandboxState.RUNNING, 1, 1, Reason.STALE_REPORT),
    (SandboxState.QUEUED, 0, 1, Reason.NOT_RUNNING),
    (SandboxState.SUCCEEDED, 0, 1, Reason.ALREADY_FINISHED),
    (SandboxState.KILLED, 1, 2, Reason.ALREADY_FINISHED),
])
def test_suspensions_that_change_nothing(catalog: Catalog, state: SandboxState,
                                         suspensions: int, sequence: int,
                                         reason: Reason) -> None:
    records, queue = _running(catalog, "sbx-1")
    record = dataclasses.replace(records["sbx-1"], state=state, suspensions=suspensions)
    decision = suspend(record, SandboxSuspended("sbx-1", 700, sequence=sequence),
                       policy=DEFAULT_POLICY, queue=queue, load=records.get, now=NOW)
    assert not decision.accepted and decision.reason == reason
    assert decision.sandboxes == () and decision.queue is None and decision.resume == ()
    unknown = suspend(None, SandboxSuspended("sbx-0", 700), policy=DEFAULT_POLICY, queue=queue,
                      load=records.get, now=NOW)
    assert unknown.reason == Reason.UNKNOWN_SANDBOX and unknown.sandboxes == ()


def test_a_resume_with_a_free_slot_runs_at_once(catalog: Catalog) -> None:
    records, _ = _running(catalog, "sbx-1")
    held = dataclasses.replace(_suspended(records["sbx-1"]), suspended_ms=5000)
    decision = request_resume(held, "sbx-1", "bob", team=catalog.teams["ml-a"],
                              policy=DEFAULT_POLICY, queue=TeamQueue(),
                              now=NOW + timedelta(seconds=90))
    [resumed] = decision.sandboxes
    assert decision.accepted and decision.reason == Reason.RESUMED
    assert (resumed.state, resumed.suspended_at, resumed.suspended_ms) == \
        (SandboxState.RUNNING, None, 95_000)
    assert "resumed after 90 s suspended" in resumed.message
    assert decision.resume == ("sbx-1",) and decision.start == ()
    assert decision.queue == TeamQueue(("sbx-1",), ())


def test_a_resume_without_a_slot_waits_in_line_and_is_resumed_when_promoted(
        catalog: Catalog) -> None:
    records, queue = _running(catalog, "sbx-1", "sbx-2", "sbx-3", "sbx-4")
    records["sbx-1"] = dataclasses.replace(records["sbx-1"], state=SandboxState.RUNNING,
                                           started_at=NOW)
    suspended = suspend(records["sbx-1"], SandboxSuspended("sbx-1", 600), policy=DEFAULT_POLICY,
                        queue=queue, load=records.get, now=NOW)
    for record in suspended.sandboxes:
        records[record.id] = record
    assert suspended.queue is not None
    queue = suspended.queue  # running: sbx-2, sbx-3; queued: sbx-4
    decision = request_resume(records["sbx-1"], "sbx-1", "alice", team=catalog.teams["ml-a"],
                              policy=DEFAULT_POLICY, queue=queue, now=NOW)
    [waiting] = decision.sandboxes
    # First in, first out: behind sbx-4, which was waiting already.
    assert decision.accepted and decision.reason == Reason.RESUME_QUEUED
    assert (waiting.state, waiting.queue_position) == (SandboxState.SUSPENDED, 2)
    assert waiting.message.startswith("resume queued:") and "position 2 of 2" in waiting.message
    assert decision.resume == () and decision.queue == TeamQueue(("sbx-2", "sbx-3"),
                                                                 ("sbx-4", "sbx-1"))
    records["sbx-1"], queue = waiting, decision.queue
    again = request_resume(waiting, "sbx-1", "alice", team=catalog.teams["ml-a"],
                           policy=DEFAULT_POLICY, queue=queue, now=NOW)
    assert again.reason == Reason.RESUME_ALREADY_QUEUED and again.sandboxes == ()

    # Two slots free up: sbx-4 starts, sbx-1 is resumed (not started again).
    later = NOW + timedelta(minutes=2)
    first = finish(records["sbx-2"], SandboxFinished("sbx-2", True, exit_status=0),
                   policy=DEFAULT_POLICY, queue=queue, load=records.get, now=later)
    assert first.start == ("sbx-4",) and first.resume == ()
    assert first.queue is not None
    second = finish(records["sbx-3"], SandboxFinished("sbx-3", True, exit_status=0),
                    policy=DEFAULT_POLICY, queue=first.queue, load=records.get, now=later)
    _, resumed = second.sandboxes
    assert second.start == () and second.resume == ("sbx-1",)
    assert (resumed.state, resumed.reason, resumed.queue_position) == \
        (SandboxState.RUNNING, "resumed", None)
    assert resumed.suspended_ms == 120_000 and "waited for a slot" in resumed.message
    assert second.queue == TeamQueue(("sbx-4", "sbx-1"), ())


@pytest.mark.parametrize(("state", "requester", "reason"), [
    (SandboxState.RUNNING, "alice", Reason.NOT_SUSPENDED),
    (SandboxState.QUEUED, "alice", Reason.NOT_SUSPENDED),
    (SandboxState.KILLED, "alice", Reason.ALREADY_FINISHED),
    (SandboxState.SUSPENDED, "carol", Reason.NOT_A_MEMBER),
])
def test_resumes_that_change_nothing(catalog: Catalog, state: SandboxState, requester: str,
                                     reason: Reason) -> None:
    records, queue = _running(catalog, "sbx-1")
    record = dataclasses.replace(_suspended(records["sbx-1"]), state=state)
    decision = request_resume(record, "sbx-1", requester, team=catalog.teams["ml-a"],
                              policy=DEFAULT_POLICY, queue=TeamQueue(), now=NOW)
    assert not decision.accepted and decision.reason == reason
    assert decision.sandboxes == () and decision.queue is None and decision.resume == ()
    unknown = request_resume(None, "sbx-0", "alice", team=catalog.teams["ml-a"],
                             policy=DEFAULT_POLICY, queue=queue, now=NOW)
    assert unknown.reason == Reason.UNKNOWN_SANDBOX


def test_a_suspended_sandbox_that_ends_leaves_the_queue(catalog: Catalog) -> None:
    records, _ = _running(catalog, "sbx-1")
    held = dataclasses.replace(_suspended(records["sbx-1"]), queue_position=1)
    queue = TeamQueue(("sbx-2", "sbx-3"), ("sbx-1", "sbx-4"))
    decision = finish(held, SandboxFinished("sbx-1", False, termination="cancelled"),
                      policy=DEFAULT_POLICY, queue=queue, load=lambda _i: None,
                      now=NOW + timedelta(seconds=30))
    [ended] = decision.sandboxes
    assert (ended.state, ended.reason) == (SandboxState.KILLED, "cancelled")
    assert ended.suspended_at is None and ended.suspended_ms == 30_000
    assert decision.queue == TeamQueue(("sbx-2", "sbx-3"), ("sbx-4",))
    assert [(i, p) for i, p, _ in decision.positions] == [("sbx-4", 1)]


def test_suspended_time_is_not_overdue_time() -> None:
    record = Sandbox(id="s", team="ml-a", requester="a", repository="r", command="c",
                     base_ref="main", limits=dataclasses.replace(DEFAULT_LIMITS,
                                                                 wall_clock_seconds=60),
                     allowed_network=(), state=SandboxState.RUNNING, reason="resumed",
                     requestid="r", requested_at=NOW, started_at=NOW, suspended_ms=600_000)
    assert overdue([record], NOW + timedelta(minutes=15)) == []
    assert overdue([record], NOW + timedelta(minutes=17)) == [record]
    held = dataclasses.replace(record, state=SandboxState.SUSPENDED, suspended_at=NOW)
    assert overdue([held], NOW + timedelta(days=1)) == []


def test_the_run_spec_carries_the_idle_limit() -> None:
    spec = dataclasses.replace(SPEC, limits=dataclasses.replace(DEFAULT_LIMITS,
                                                                idle_seconds=30)).to_json()
    spec["prefix"] = "p"
    assert parse_run_spec(SPEC.sandbox_id, spec)["limits"]["idle_seconds"] == 30
    older = {**spec, "limits": {k: v for k, v in spec["limits"].items() if k != "idle_seconds"}}
    assert parse_run_spec(SPEC.sandbox_id, older)["limits"]["idle_seconds"] == 0
    with pytest.raises(BadRequest, match=r"limits\.idle_seconds"):
        parse_run_spec(SPEC.sandbox_id, {**spec, "limits": {**spec["limits"],
                                                            "idle_seconds": -1}})


def _event(payload: Any, requestid: str | None = None) -> Any:
    from events import new_event

    return new_event(payload, source="//t", requestid=requestid)


def test_the_handler_suspends_and_resumes_through_the_runtime(catalog: Catalog) -> None:
    from events import SandboxResumeRequested, SandboxSuspended
    from functions.handlers import sandboxes as handler

    runtime = RecordingSandboxRuntime()
    deps = _deps(catalog, runtime)  # the fake policy: one slot
    request = _requested("sbx-1")
    handler.handle(request, deps, "on_sandbox_requested")
    handler.handle(_requested("sbx-2"), deps, "on_sandbox_requested")
    store = _docs(deps)
    suspended = _event(SandboxSuspended("sbx-1", 600, checkpoint_uri="gs://b/c.diff",
                                        checkpoint_bytes=9),
                       requestid=f"{request.requestid}.suspend-1")
    handler.handle(suspended, deps, "on_sandbox_suspended")
    handler.handle(suspended, deps, "on_sandbox_suspended")  # a redelivery
    assert store[("sandboxes", "sbx-1")]["state"] == "SUSPENDED"
    assert [s.sandbox_id for s in runtime.started] == ["sbx-1", "sbx-2"]

    resume = _event(SandboxResumeRequested("sbx-1", "alice"))
    handler.handle(resume, deps, "on_sandbox_resume_requested")
    assert store[("sandboxes", "sbx-1")]["reason"] == "resume_queued"
    assert runtime.resumed == []

    from events import SandboxFinished

    handler.handle(_event(SandboxFinished("sbx-2", True, exit_status=0)), deps,
                   "on_sandbox_finished")
    assert [s.sandbox_id for s in runtime.resumed] == ["sbx-1"]
    assert [s.sandbox_id for s in runtime.started] == ["sbx-1", "sbx-2"]  # not started again
    doc = store[("sandboxes", "sbx-1")]
    assert (doc["state"], doc["reason"], doc["suspensions"]) == ("RUNNING", "resumed", 1)
    handler.handle(resume, deps, "on_sandbox_resume_requested")  # a redelivery
    assert len(runtime.resumed) == 1


def test_an_ended_sandbox_is_cleaned_up_and_a_pod_suspension_releases_its_pod(
        catalog: Catalog) -> None:
    from events import SandboxFinished, SandboxSuspended
    from functions.handlers import sandboxes as handler

    runtime = RecordingSandboxRuntime()
    deps = _deps(catalog, runtime)
    handler.handle(_requested("sbx-1"), deps, "on_sandbox_requested")
    handler.handle(_event(SandboxSuspended("sbx-1", 600)), deps, "on_sandbox_suspended")
    assert runtime.released == []  # a local freeze holds nothing more to free
    handler.handle(_requested("sbx-2"), deps, "on_sandbox_requested")
    pod = _event(SandboxSuspended("sbx-2", 600, method="pod"))
    handler.handle(pod, deps, "on_sandbox_suspended")
    assert runtime.released == [("sbx-2", "ml-a")]

    assert runtime.cleaned == []
    finished = _event(SandboxFinished("sbx-1", False, termination="cancelled"))
    handler.handle(finished, deps, "on_sandbox_finished")
    handler.handle(finished, deps, "on_sandbox_finished")  # a redelivery: done once
    assert runtime.cleaned == [("sbx-1", "ml-a")]
    handler.handle(_event(SandboxFinished("nobody", True)), deps, "on_sandbox_finished")
    assert runtime.cleaned == [("sbx-1", "ml-a")]  # a report of nothing cleans nothing


def test_a_runtime_that_lost_a_suspended_sandbox_reports_it_lost(catalog: Catalog) -> None:
    from events import SandboxResumeRequested, SandboxSuspended
    from functions.handlers import sandboxes as handler

    deps = _deps(catalog, RecordingSandboxRuntime())
    request = _requested("sbx-1")
    handler.handle(request, deps, "on_sandbox_requested")
    handler.handle(_event(SandboxSuspended("sbx-1", 600)), deps, "on_sandbox_suspended")
    deps.sandboxes.runtime.refuse = True
    handler.handle(_event(SandboxResumeRequested("sbx-1", "alice")), deps,
                   "on_sandbox_resume_requested")
    [lost] = [e for e in deps.bus.events if e.name == "sandbox.finished"]
    assert lost.requestid == request.requestid
    assert lost.payload.termination == "runtime_lost"
    assert "refused to resume" in lost.payload.error


class _SandboxPageReader:
    """Just what the dashboard's sandboxes page reads: the catalog, counts, one page."""

    def __init__(self, sandboxes: dict[str, dict[str, Any]], config: dict[str, Any]) -> None:
        from functions.dashboard.reads import ReadStats

        self.sandboxes, self.config, self.stats = sandboxes, config, ReadStats()

    def document(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        return {**self.config, "id": doc_id} if (collection, doc_id) == ("catalog",
                                                                         "current") else None

    def documents(self, collection: str, doc_ids: Any) -> dict[str, Any]:
        return {i: self.document(collection, i) for i in doc_ids}

    def _where(self, where: Any) -> list[dict[str, Any]]:
        def holds(d: dict[str, Any], name: str, op: str, value: Any) -> bool:
            return d.get(name) in value if op == "in" else d.get(name) == value

        return [{**d, "id": i} for i, d in self.sandboxes.items()
                if all(holds(d, name, op, value) for name, op, value in where)]

    def page(self, query: Any) -> Any:
        from functions.dashboard.reads import Page

        return Page(self._where(query.where))

    def aggregate(self, queries: Any) -> list[dict[str, float]]:
        return [{"count": len(self._where(q.where))} for q in queries]


def test_the_dashboard_shows_a_suspended_sandbox_and_how_to_resume_it(catalog: Catalog) -> None:
    import yaml
    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request as WebRequest

    from functions.dashboard.web import WebDeps
    from functions.dashboard.web import handle as web

    record, _ = admitted(catalog, "sbx-idle", TeamQueue())
    held = suspend(record, SandboxSuspended("sbx-idle", 600), policy=DEFAULT_POLICY,
                   queue=TeamQueue(("sbx-idle",)), load=lambda _i: None, now=NOW).sandboxes[0]
    waiting = dataclasses.replace(held, id="sbx-wait", queue_position=1)
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    reader = _SandboxPageReader({s.id: s.to_doc() for s in (held, waiting)}, config)
    environ = EnvironBuilder(path="/sandboxes", method="GET").get_environ()
    environ["SCRIPT_NAME"] = "/dashboard"
    deps = WebDeps(reader=lambda: reader, clock=lambda: NOW + timedelta(minutes=5),  # type: ignore[arg-type,return-value]
                   iap=lambda _a, _u: None,  # type: ignore[arg-type,return-value]
                   environ=lambda: {"FIRESTORE_EMULATOR_HOST": "127.0.0.1:1",
                                    "STASIS_PROJECT": "p"})
    html, status, _ = web(WebRequest(environ), deps)
    assert status == 200, html
    assert 'data-value="SUSPENDED" data-count="2"' in html
    assert "idle, held since 5m 0s ago" in html
    assert "stasis sandbox resume sbx-idle" in html
    assert "#1 in queue to resume" in html


# -- idle reported by a runtime that only measures (the cluster monitor) ---------------------


@pytest.mark.parametrize(("state", "suspensions", "idle_limit", "observed", "sequence",
                          "reason", "suspend_as"), [
    (SandboxState.RUNNING, 0, 600, 600, 1, Reason.SUSPENDING_IDLE, 1),
    (SandboxState.RUNNING, 0, 600, 4000, 1, Reason.SUSPENDING_IDLE, 1),
    (SandboxState.RUNNING, 1, 600, 650, 2, Reason.SUSPENDING_IDLE, 2),   # resumed once
    (SandboxState.RUNNING, 1, 600, 650, 3, Reason.SUSPENDING_IDLE, 3),   # a snapshot failed
    (SandboxState.RUNNING, 0, 600, 599, 1, Reason.NOT_IDLE_LONG_ENOUGH, None),
    (SandboxState.RUNNING, 0, 0, 9000, 1, Reason.IDLE_SUSPENSION_OFF, None),
    (SandboxState.RUNNING, 2, 600, 650, 2, Reason.STALE_REPORT, None),   # a late duplicate
    (SandboxState.SUSPENDED, 1, 600, 650, 2, Reason.ALREADY_SUSPENDED, None),
    (SandboxState.QUEUED, 0, 600, 650, 1, Reason.NOT_RUNNING, None),
    (SandboxState.SUCCEEDED, 0, 600, 650, 1, Reason.ALREADY_FINISHED, None),
    (SandboxState.KILLED, 1, 600, 650, 2, Reason.ALREADY_FINISHED, None),
])
def test_an_idle_report_suspends_only_a_running_sandbox_idle_past_its_limit(
        catalog: Catalog, state: SandboxState, suspensions: int, idle_limit: int,
        observed: int, sequence: int, reason: Reason, suspend_as: int | None) -> None:
    from functions.domain.sandboxes import SuspendSandbox, idle_detected

    records, _ = _running(catalog, "sbx-1")
    record = dataclasses.replace(
        records["sbx-1"], state=state, suspensions=suspensions,
        limits=dataclasses.replace(records["sbx-1"].limits, idle_seconds=idle_limit))
    decision = idle_detected(record, SandboxIdleDetected("sbx-1", observed, OBSERVED_AT,
                                                         sequence=sequence))
    assert decision.reason == reason
    # Never a record written nor a slot moved: the runtime's sandbox.suspended does that.
    assert decision.sandboxes == () and decision.queue is None
    assert decision.start == () and decision.resume == ()
    if suspend_as is None:
        assert not decision.accepted and decision.suspend == ()
    else:
        assert decision.accepted
        assert decision.suspend == (SuspendSandbox("sbx-1", "ml-a", suspend_as, observed),)
        assert f"idle {observed} s (limit {idle_limit} s)" in decision.message
    unknown = idle_detected(None, SandboxIdleDetected("sbx-0", 700, OBSERVED_AT))
    assert (unknown.accepted, unknown.reason, unknown.suspend) == (
        False, Reason.UNKNOWN_SANDBOX, ())


def test_the_handler_has_the_runtime_suspend_an_idle_sandbox_once(catalog: Catalog) -> None:
    from events import SandboxIdleDetected, SandboxSuspended
    from functions.handlers import sandboxes as handler

    runtime = RecordingSandboxRuntime()
    deps = _deps(catalog, runtime)
    request = _requested("sbx-1")
    handler.handle(request, deps, "on_sandbox_requested")
    store = _docs(deps)

    def idle(seconds: int, sequence: int = 1) -> Any:
        return _event(SandboxIdleDetected("sbx-1", seconds, "2025-06-10T12:10:00+00:00",
                                          sequence=sequence),
                      requestid=f"{request.requestid}.idle-{sequence}")

    short = _event(SandboxIdleDetected("sbx-1", 30, "2025-06-10T12:10:00+00:00"))
    assert handler.handle(short, deps, "on_sandbox_idle_detected").reason == \
        Reason.NOT_IDLE_LONG_ENOUGH  # type: ignore[union-attr]
    report = idle(615)
    handler.handle(report, deps, "on_sandbox_idle_detected")
    handler.handle(report, deps, "on_sandbox_idle_detected")  # a redelivery
    assert runtime.suspended == [("sbx-1", "ml-a", 1, 615)]
    assert store[("sandboxes", "sbx-1")]["state"] == "RUNNING"  # until it is held

    handler.handle(_event(SandboxSuspended("sbx-1", 615, method="pod"),
                          requestid=f"{request.requestid}.suspend-1"),
                   deps, "on_sandbox_suspended")
    handler.handle(idle(700, sequence=2), deps, "on_sandbox_idle_detected")
    assert runtime.suspended == [("sbx-1", "ml-a", 1, 615)]  # already suspended

    # A runtime that no longer has it refuses: logged, never retried.
    handler.handle(_requested("sbx-2"), deps, "on_sandbox_requested")
    assert store[("sandboxes", "sbx-2")]["state"] == "RUNNING"
    runtime.refuse = True
    second = _event(SandboxIdleDetected("sbx-2", 615, "2025-06-10T12:10:00+00:00"))
    assert handler.handle(second, deps, "on_sandbox_idle_detected").accepted  # type: ignore[union-attr]
    assert [e for e in deps.bus.events if e.name == "sandbox.finished"] == []  # nothing ended
    assert all(entry["status"] == "done" for entry in deps.store.entries())


def test_runtimes_that_suspend_by_themselves_refuse_a_suspend_command() -> None:
    from functions.adapters.sandbox_runtime import LocalSandboxRuntime, NullSandboxRuntime
    from functions.ports import RuntimeRefused
    from runtime.local.publisher import RecordingPublisher

    for runtime in (LocalSandboxRuntime("http://127.0.0.1:9"),
                    NullSandboxRuntime(RecordingPublisher())):
        with pytest.raises(RuntimeRefused):
            runtime.suspend("sbx-1", team="ml-a", sequence=1, idle_seconds=600)


def test_the_monitor_may_read_pod_metrics_and_the_pod_says_its_idle_limit() -> None:
    role = next(o for o in monitor_manifests(project="p") if o["kind"] == "ClusterRole")
    metrics = [r for r in role["rules"] if r["apiGroups"] == ["metrics.k8s.io"]]
    assert metrics == [{"apiGroups": ["metrics.k8s.io"], "resources": ["pods"],
                        "verbs": ["get", "list"]}]
    spec = RunSpec("sbx-1", "ml-a", "https://git.example/r.git", "main", "true",
                   dataclasses.replace(DEFAULT_LIMITS, idle_seconds=120), (), "r-1", "b",
                   "sandboxes/ml-a/sbx-1")
    assert sm.sandbox_pod(spec, "0" * 40)["metadata"]["annotations"][ANN_IDLE_SECONDS] == \
        "120"
