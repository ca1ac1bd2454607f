"""Jobs on the Firestore emulator: ``jobs/{id}`` and the team's usage change in ONE
transaction; the quota refuses a job over the team's allowance and this node's hardware a
local job it cannot run; a job's end gives its chips back exactly once, and a redelivered
event has one effect; the reconciler ends a local job whose workspace was paused
(``runtime_lost``), and the kernel's late report of the same job changes nothing."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from google.cloud import firestore

from events import new_event
from events.payloads import JobFinished, JobSubmitted
from functions.adapters.firestore_store import FirestoreStore
from functions.adapters.job_store import FirestoreJobStore
from functions.domain.catalog import Catalog
from functions.handlers import jobs as handler
from functions.routes import ROUTES
from runtime.local.publisher import RecordingPublisher

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples/stasis.yaml").read_text()))
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def env(emulator_env: dict[str, str]) -> Any:
    db = firestore.Client(project=emulator_env["STASIS_PROJECT"])
    db.collection("teams").document("ml-a").set(
        {"id": "ml-a", "usage": {"workspaces": 1, "gpus": 1, "tpus": 0, "snapshot_bytes": 0}})
    deps = SimpleNamespace(store=FirestoreStore(db), jobs=FirestoreJobStore(db),
                           bus=RecordingPublisher(), catalog=lambda: CATALOG,
                           clock=lambda: NOW)
    return SimpleNamespace(db=db, deps=deps)


def submitted(job_id: str, hosts: int = 1, profile: str = "tpu-v5e-8") -> Any:
    return new_event(JobSubmitted(job_id=job_id, team="ml-a", owner="alice", profile=profile,
                                  hosts=hosts, workspace_id="ml-a--nb"),
                     source="//stasis/notebook", requestid=f"req-{job_id}")


def finished(job_id: str, succeeded: bool = True) -> Any:
    return new_event(JobFinished(job_id=job_id, succeeded=succeeded,
                                 termination="exited" if succeeded else "host_failed",
                                 exit_status=0 if succeeded else 1,
                                 failed_host=None if succeeded else 3,
                                 error=None if succeeded else "host 3 exited with status 1"),
                     source="//stasis/notebook", requestid=f"fin-{job_id}")


def usage(env: Any) -> dict[str, int]:
    return env.db.collection("teams").document("ml-a").get().to_dict()["usage"]


def job(env: Any, job_id: str) -> dict[str, Any]:
    return env.db.collection("jobs").document(job_id).get().to_dict()


def test_routes_take_the_job_events() -> None:
    assert ROUTES["on_job_submitted"].handler is handler.handle
    assert ROUTES["on_job_finished"].event == "job.finished"


def test_admission_release_and_refusal_in_one_transaction(env: Any) -> None:
    d = handler.handle(submitted("job-a"), env.deps, "on_job_submitted")
    assert d is not None and d.accepted
    assert job(env, "job-a")["state"] == "RUNNING" and job(env, "job-a")["tpus"] == 8
    assert usage(env) == {"workspaces": 1, "gpus": 1, "tpus": 8, "snapshot_bytes": 0}

    # the team's 8 chips are taken: the next one is refused, nothing is charged
    d = handler.handle(submitted("job-b"), env.deps, "on_job_submitted")
    assert d is not None and not d.accepted
    doc = job(env, "job-b")
    assert doc["state"] == "REFUSED"
    assert "job-b (1 x tpu-v5e-8) needs 8 TPU chips but team ml-a uses 8/8" in doc["message"]
    assert usage(env)["tpus"] == 8

    # a redelivered submission has one effect (the ledger)
    assert handler.handle(submitted("job-a"), env.deps, "on_job_submitted") is None
    assert usage(env)["tpus"] == 8

    d = handler.handle(finished("job-a", succeeded=False), env.deps, "on_job_finished")
    assert d is not None and d.accepted
    doc = job(env, "job-a")
    assert doc["state"] == "FAILED" and doc["failed_host"] == 3
    assert usage(env)["tpus"] == 0
    assert handler.handle(finished("job-a", succeeded=False), env.deps,
                          "on_job_finished") is None
    assert usage(env)["tpus"] == 0
    # over the allowance on its own, even with every chip free: 2 hosts x 8 chips > 8
    d = handler.handle(submitted("job-c", hosts=2), env.deps, "on_job_submitted")
    assert d is not None and not d.accepted and "needs 16" in d.message
    assert usage(env)["tpus"] == 0
    audit = [a.to_dict() for a in env.db.collection("audit").stream()]
    assert {(a["target"], a["outcome"].split(":")[0]) for a in audit} >= {
        ("job-a", "accepted"), ("job-b", "refused")}
    # each recorded change is told once, from the ledger's outbox
    changes = [(e.id, e.payload.from_state, e.payload.to_state)
               for e in env.deps.bus.events if e.name == "job.state_changed"]
    assert changes == [("job-a-running", None, "RUNNING"), ("job-b-refused", None, "REFUSED"),
                       ("job-a-failed", "RUNNING", "FAILED"), ("job-c-refused", None, "REFUSED")]


def test_concurrent_submissions_never_exceed_the_quota(env: Any) -> None:
    """Two stores (two function instances: no shared lock) race for the last 8 chips."""
    clients = [firestore.Client(project=env.db.project) for _ in range(2)]
    results: list[Any] = []

    def go(i: int) -> None:
        deps = SimpleNamespace(store=FirestoreStore(clients[i]),
                               jobs=FirestoreJobStore(clients[i]), bus=RecordingPublisher(),
                               catalog=lambda: CATALOG, clock=lambda: NOW)
        ev = submitted(f"job-r{i}")
        # a different team lock per thread: only the Firestore transaction arbitrates
        results.append(handler.handle(ev, deps, f"on_job_submitted_{i}"))

    import functions.adapters.firestore_store as module

    real = module._lock
    module._lock = lambda name: threading.Lock()  # type: ignore[assignment]
    try:
        threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        module._lock = real  # type: ignore[assignment]
    assert sorted(r.accepted for r in results) == [False, True]
    assert usage(env)["tpus"] == 8


def test_the_notebook_api_is_admitted_refused_and_releases(env: Any) -> None:
    """``stasis.jobs.submit`` with a control plane: job.submitted is decided by the
    handler (delivered in-process, as the push subscription would), the job runs only
    once admitted, and job.finished gives the chips back."""
    pytest.importorskip("torch")
    import stasis.jobs
    from stasis.control_plane import EventControlPlane

    def deliver(event: Any) -> None:
        consumer = "on_job_submitted" if event.name == "job.submitted" else "on_job_finished"
        handler.handle(event, env.deps, consumer)

    cp = EventControlPlane(deliver, lambda i: job(env, i), team="ml-a", owner="alice",
                           workspace_id="ml-a--nb")
    with pytest.raises(stasis.jobs.JobRefused, match="needs 16"):
        stasis.jobs.submit(lambda: 1, profile="tpu-v5e-8", hosts=2, job_id="job-big",
                           control_plane=cp)
    assert job(env, "job-big")["state"] == "REFUSED"

    def square(x: int) -> int:
        print("squaring", x)
        return x * x

    running = stasis.jobs.submit(square, 7, profile="tpu-v5e-8", hosts=1, job_id="job-sq",
                                 control_plane=cp)
    assert usage(env)["tpus"] == 8  # held while it runs
    assert running.result(timeout=60) == 49
    assert "[host 0] squaring 7" in list(running.logs())
    # the end is reported before result() returns
    assert job(env, "job-sq")["state"] == "SUCCEEDED"
    assert usage(env)["tpus"] == 0


def test_a_local_job_this_node_cannot_run_is_refused_before_the_quota(env: Any) -> None:
    """The runtime's capabilities (here the null runtime's, told this node has GPUs and no
    TPU) decide, as for a workspace; nothing is charged."""
    from functions.adapters.null_runtime import KNOWN_ACCELERATORS, NullRuntime

    node = {kind: 0 for kind in KNOWN_ACCELERATORS} | {"nvidia-l4": 2}
    deps = SimpleNamespace(**{**vars(env.deps),
                              "runtime": NullRuntime(bus=None, accelerators=node)})  # type: ignore[arg-type]
    d = handler.handle(submitted("job-tpu"), deps, "on_job_submitted")
    assert d is not None and not d.accepted and d.reason == "accelerator_unavailable"
    doc = job(env, "job-tpu")
    assert doc["state"] == "REFUSED" and doc["message"].startswith(
        "job job-tpu (1 x tpu-v5e-8) needs 8 x tpu-v5-lite-podslice on this node, which has "
        "no TPU")
    d = handler.handle(submitted("job-3gpu", hosts=3, profile="gpu-small"), deps,
                       "on_job_submitted")
    assert d is not None and "which has 2 x nvidia-l4" in d.message
    assert usage(env) == {"workspaces": 1, "gpus": 1, "tpus": 0, "snapshot_bytes": 0}
    d = handler.handle(submitted("job-2gpu", hosts=2, profile="gpu-small"), deps,
                       "on_job_submitted")
    assert d is not None and d.accepted and usage(env)["gpus"] == 3


def test_the_reconciler_gives_back_a_paused_workspace_jobs_chips_once(env: Any) -> None:
    from datetime import timedelta

    from functions.adapters.firestore_store import FirestoreStore, workspace_to_doc
    from functions.adapters.null_runtime import NullRuntime
    from functions.domain.lifecycle import State, Workspace
    from functions.domain.reconcile import JOB_GRACE
    from functions.handlers import reconciler

    assert handler.handle(submitted("job-p"), env.deps, "on_job_submitted").accepted
    assert usage(env)["tpus"] == 8
    paused_at = NOW + timedelta(minutes=5)
    env.db.collection("workspaces").document("ml-a--nb").set(workspace_to_doc(Workspace(
        id="ml-a--nb", team="ml-a", owner="alice", name="nb", profile="tpu-v5e-8",
        state=State.PAUSED, state_reason="paused", version=7, updated_at=paused_at)))

    class Deliver:  # Pub/Sub's push, in-process: job.finished to its consumer
        def __init__(self) -> None:
            self.events: list[Any] = []

        def publish(self, event: Any) -> str:
            self.events.append(event)
            handler.handle(event, env.deps, "on_job_finished")
            return str(event.id)

    bus = Deliver()

    def reconcile(at: Any) -> Any:
        deps = SimpleNamespace(store=FirestoreStore(env.db), bus=bus,
                               runtime=NullRuntime(bus), jobs=env.deps.jobs,
                               sandboxes=None, fleet=None, clock=lambda: at, consumers={})
        return reconciler.reconcile(deps)

    assert not reconcile(paused_at + JOB_GRACE).jobs  # the kernel may still report it
    assert job(env, "job-p")["state"] == "RUNNING"
    later = paused_at + JOB_GRACE + timedelta(seconds=1)
    assert [r.job_id for r in reconcile(later).jobs] == ["job-p"]
    doc = job(env, "job-p")
    assert doc["state"] == "FAILED" and "workspace ml-a--nb is PAUSED" in doc["message"]
    assert usage(env)["tpus"] == 0
    # a second run finds nothing RUNNING; the same event redelivered has one effect
    assert not reconcile(later).jobs
    assert handler.handle(bus.events[0], env.deps, "on_job_finished") is None
    # the kernel's own report, late: the job already ended, nothing is released twice
    d = handler.handle(finished("job-p"), env.deps, "on_job_finished")
    assert d is not None and not d.accepted and d.reason == "not_running"
    assert job(env, "job-p")["state"] == "FAILED" and usage(env)["tpus"] == 0
