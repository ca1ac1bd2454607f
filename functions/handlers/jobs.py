"""Jobs handler: admission on job.submitted, release on job.finished.

load (in the transaction: ``jobs/{id}``, the team document with its usage) -> decide
(``functions.domain.jobs.submit`` / ``finish``, quota via ``functions.domain.quota.admit``)
-> persist (same transaction: the job, the team's usage, an audit entry, the ledger with its
outbox) -> send the outbox to the job runtime -> mark the ledger entry done. The submitter
learns the outcome from ``jobs/{id}.state`` (RUNNING: go; REFUSED: ``message`` says why and
what to do).

Runtimes: a ``local`` job runs as the submitting kernel's children, which the notebook
starts once admitted; the control plane only keeps the books. A ``kubernetes`` job is
started here: an admitted job.submitted's outbox asks ``Deps.job_runtime`` to start it (a
JobSet, ``functions.adapters.kubernetes_job_runtime``), and the end of a kubernetes job,
whoever reports it (the cluster's job watcher, the notebook cancelling it, the reconciler
finding it lost), asks the runtime to release it (JobSet and Service deleted: the slice is
freed even where the hosts still run). So cancelling is a job.finished ``cancelled`` from
the notebook: the books and the cluster follow from the one event. A runtime that refuses
to start a job is answered as the job's end: a job.finished ``failed_to_start`` gives the
accelerators back.
"""

from __future__ import annotations

import logging
from typing import Any

from events import Event, new_event
from events.payloads import JobFinished, JobSubmitted
from functions.domain.jobs import Decision, JobState, finish, submit
from functions.handlers.deps import Deps
from functions.ports import JobRun, RuntimeRefused

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/jobs"
KUBERNETES = "kubernetes"


def handle(event: Event[Any], deps: Deps, consumer: str) -> Decision | None:
    """Apply job.submitted or job.finished; the decision (None: a duplicate)."""
    store = getattr(deps, "jobs", None)
    if store is None:
        raise RuntimeError("jobs are not configured (Deps.jobs is None)")
    now = deps.clock()
    payload = event.payload
    if isinstance(payload, JobSubmitted):
        catalog = deps.catalog()
        team = catalog.teams.get(payload.team)
        request = payload
        # a local job's hosts run on the node: its hardware is checked, as for a workspace
        runtime = getattr(deps, "runtime", None)
        capabilities = (runtime.capabilities() if runtime is not None
                        and payload.runtime == "local" else None)

        def decide(view: Any) -> Decision:
            decision = submit(request, existing=view.job,
                              profile=catalog.profiles.get(payload.profile),
                              team_profiles=team.profiles if team else None,
                              quotas=team.quotas if team else None, usage=view.usage,
                              now=now, contact=team.who_to_ask if team else None,
                              host_capabilities=capabilities)
            _persist(view, decision, event, payload.team, payload.owner, payload.job_id, now)
            if decision.accepted and decision.job is not None \
                    and payload.runtime == KUBERNETES:
                view.outbox = [{"start": _start_command(payload, event.requestid)}]
            return decision

        result = store.transact(event, consumer, decide, job_id=payload.job_id,
                                team=payload.team, now=now)
    elif isinstance(payload, JobFinished):
        def decide(view: Any) -> Decision:
            decision = finish(view.job, job_id=payload.job_id, succeeded=payload.succeeded,
                              termination=payload.termination,
                              exit_status=payload.exit_status,
                              failed_host=payload.failed_host, error=payload.error,
                              log_uri=payload.log_uri, usage=view.usage, now=now)
            team = view.job.team if view.job is not None else ""
            _persist(view, decision, event, team, event.source, payload.job_id, now)
            if decision.accepted and view.job is not None and view.job.runtime == KUBERNETES:
                view.outbox = [{"release": {"job_id": payload.job_id, "team": team}}]
            return decision

        result = store.transact(event, consumer, decide, job_id=payload.job_id, team=None,
                                now=now)
    else:
        raise TypeError(f"the jobs handler does not take {event.name}")
    _send(result.ledger.outbox, deps)
    if result.ledger.status == "pending":
        store.mark_done(result.ledger.key)
    decision: Decision | None = result.value
    if decision is not None:
        log.info("%s %s: %s (%s) %s", event.name, getattr(payload, "job_id", "?"),
                 "accepted" if decision.accepted else "refused", decision.reason,
                 decision.message)
    return decision


def _start_command(payload: JobSubmitted, requestid: str) -> dict[str, Any]:
    return {"job_id": payload.job_id, "team": payload.team, "owner": payload.owner,
            "profile": payload.profile, "hosts": payload.hosts,
            "payload_uri": payload.payload_uri, "topology": payload.topology,
            "workspace_id": payload.workspace_id, "requestid": requestid}


def _persist(view: Any, decision: Decision, event: Event[Any], team: str, actor: str,
             job_id: str, now: Any) -> None:
    view.new_job = decision.job
    view.new_usage = decision.usage
    if decision.job is not None:
        view.audit = {
            "actor": actor, "action": event.name, "target": job_id, "team": team,
            "outcome": ("accepted: " if decision.accepted else "refused: ") + decision.reason,
            "message": decision.message, "event_id": event.id, "requestid": event.requestid,
            "time": now,
        }
    view.outcome.update({"accepted": decision.accepted, "reason": decision.reason,
                         "message": decision.message,
                         "state": str(decision.job.state) if decision.job else None})


def _send(outbox: list[dict[str, Any]], deps: Deps) -> None:
    runtime = getattr(deps, "job_runtime", None)
    for item in outbox:
        if "release" in item:
            if runtime is not None:
                runtime.cancel(item["release"]["job_id"], team=item["release"]["team"])
            continue
        command = item["start"]
        job = deps.jobs.get(command["job_id"])
        if job is None or job.state != JobState.RUNNING:
            continue  # it ended meanwhile (a redelivered outbox): nothing to start
        try:
            if runtime is None:
                raise RuntimeRefused("this control plane has no Kubernetes job runtime "
                                     "(STASIS_RUNTIME is not kubernetes)")
            if not command.get("payload_uri"):
                raise RuntimeRefused("job.submitted has no payload_uri: nothing to run")
            runtime.start(JobRun(
                job_id=command["job_id"], team=command["team"], owner=command["owner"],
                profile=command["profile"], hosts=int(command["hosts"]),
                payload_uri=command["payload_uri"], requestid=command["requestid"],
                workspace_id=command.get("workspace_id"), topology=command.get("topology"),
                image=_image_of(deps, command.get("workspace_id"))))
        except RuntimeRefused as exc:
            # Permanent: the job ends here, as if the runtime had reported it.
            failure = JobFinished(command["job_id"], False, termination="failed_to_start",
                                  error=f"the runtime refused the job: {exc}"[-4000:])
            deps.bus.publish(new_event(failure, source=SOURCE,
                                       requestid=f"start-failed-{command['job_id']}"))


def _image_of(deps: Deps, workspace_id: str | None) -> str | None:
    """The workspace's environment image: the hosts import what the notebook imports."""
    if not workspace_id:
        return None
    workspace = deps.store.get_workspace(workspace_id)
    environment = deps.catalog().environments.get(getattr(workspace, "environment", ""))
    return getattr(environment, "image", None) or None
