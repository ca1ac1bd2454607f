"""Jobs handler: admission on job.submitted, release on job.finished.

Each event takes one step through the pipeline (``functions.handlers.pipeline``): in the
transaction, load ``jobs/{id}`` and the team document with its usage -> decide
(``functions.domain.jobs.submit`` / ``finish``, quota via ``functions.domain.quota.admit``)
-> write the job, the team's usage and an audit entry. The outbox then carries what the job
runtime must do (``functions.handlers.commands``) and a job.state_changed. The submitter
learns the outcome from ``jobs/{id}.state`` (RUNNING: go; REFUSED: ``message`` says why and
what to do).

Runtimes: a ``local`` job runs as the submitting kernel's children, which the notebook
starts once admitted; the control plane only keeps the books. A ``kubernetes`` job is
started here: an admitted job.submitted's outbox asks ``Deps.job_runtime`` to start it (a
JobSet, ``functions.kubernetes.jobs``), and the end of a kubernetes job,
whoever reports it (the cluster's job watcher, the notebook cancelling it, the reconciler
finding it lost), asks the runtime to release it (JobSet and Service deleted: the slice is
freed even where the hosts still run). So cancelling is a job.finished ``cancelled`` from
the notebook: the books and the cluster follow from the one event. A runtime that refuses
to start a job is answered as the job's end: a job.finished ``failed_to_start`` gives the
accelerators back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from events import Event
from events.payloads import JobFinished, JobSubmitted
from functions.domain.jobs import Decision, Job, finish, submit
from functions.domain.quota import Usage
from functions.handlers import pipeline
from functions.handlers.deps import Deps
from functions.ports import Subject, Tx, catalog_knowing

SOURCE = "//stasis/functions/jobs"
JOBS = "jobs"


def handle(event: Event[Any], deps: Deps, consumer: str) -> Decision | None:
    """Apply job.submitted or job.finished; the decision (None: a duplicate)."""
    if getattr(deps, "jobs", None) is None:
        raise RuntimeError("jobs are not configured (Deps.jobs is None)")
    decision: Decision | None = pipeline.run(event, event.payload, deps, consumer, STEPS)
    return decision


def _submitted(event: Event[Any], request: JobSubmitted, deps: Deps,
               now: datetime) -> pipeline.Step:
    catalog = catalog_knowing(deps, lambda c: c.knows(team=request.team, member=request.owner,
                                                      profile=request.profile))
    team = catalog.teams.get(request.team)
    # a local job's hosts run on the node: its hardware is checked, as for a workspace
    runtime = getattr(deps, "runtime", None)
    capabilities = (runtime.capabilities() if runtime is not None
                    and request.runtime == "local" else None)

    def decide_in_tx(tx: Tx) -> Decision:
        existing = _job(tx, request.job_id)
        usage = _usage(tx, request.team)
        decision = submit(request, existing=existing,
                          profile=catalog.profiles.get(request.profile),
                          team_profiles=team.profiles if team else None,
                          quotas=team.quotas if team else None, usage=usage, now=now,
                          contact=team.who_to_ask if team else None,
                          host_capabilities=capabilities)
        _persist(tx, decision, event, request.team, request.owner, request.job_id, now)
        return decision

    # A team's admissions run one at a time in an instance, as for workspaces.
    return pipeline.Step(Subject("job", request.job_id, lock=f"team:{request.team}"),
                         decide_in_tx, SOURCE)


def _finished(event: Event[Any], report: JobFinished, deps: Deps,
              now: datetime) -> pipeline.Step:
    def decide_in_tx(tx: Tx) -> Decision:
        job = _job(tx, report.job_id)
        team = job.team if job is not None else ""
        decision = finish(job, job_id=report.job_id, succeeded=report.succeeded,
                          termination=report.termination, exit_status=report.exit_status,
                          failed_host=report.failed_host, error=report.error,
                          log_uri=report.log_uri, usage=_usage(tx, team), now=now)
        _persist(tx, decision, event, team, event.source, report.job_id, now)
        return decision

    return pipeline.Step(Subject("job", report.job_id), decide_in_tx, SOURCE)


#: Which decision each job event takes.
STEPS: dict[type[Any], pipeline.StepFor] = {JobSubmitted: _submitted, JobFinished: _finished}


def _job(tx: Tx, job_id: str) -> Job | None:
    doc = tx.get(JOBS, job_id)
    return Job.from_doc(doc) if doc is not None else None


def _usage(tx: Tx, team: str) -> Usage:
    return Usage.from_dict(((tx.get("teams", team) if team else None) or {}).get("usage"))


def _persist(tx: Tx, decision: Decision, event: Event[Any], team: str, actor: str,
             job_id: str, now: datetime) -> None:
    if decision.job is not None:
        tx.set(JOBS, job_id, {**decision.job.to_doc(), "updated_at": now})
        pipeline.audit(tx, event, decision, actor=actor, target=job_id, team=team, now=now)
    if decision.usage is not None and team:
        tx.set("teams", team, {"usage": decision.usage.as_dict()}, merge=True)
