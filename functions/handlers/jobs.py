"""Jobs handler: admission on job.submitted, release on job.finished.

load (in the transaction: ``jobs/{id}``, the team document with its usage) -> decide
(``functions.domain.jobs.submit`` / ``finish``, quota via ``functions.domain.quota.admit``)
-> persist (same transaction: the job, the team's usage, an audit entry, the ledger). The
submitter learns the outcome from ``jobs/{id}.state`` (RUNNING: go; REFUSED: ``message``
says why and what to do).
"""

from __future__ import annotations

import logging
from typing import Any

from events import Event
from events.payloads import JobFinished, JobSubmitted
from functions.domain.jobs import Decision, finish, submit
from functions.handlers.deps import Deps

log = logging.getLogger(__name__)


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

        def decide(view: Any) -> Decision:
            decision = submit(request, existing=view.job,
                              profile=catalog.profiles.get(payload.profile),
                              team_profiles=team.profiles if team else None,
                              quotas=team.quotas if team else None, usage=view.usage,
                              now=now, contact=team.who_to_ask if team else None)
            _persist(view, decision, event, payload.team, payload.owner, payload.job_id, now)
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
            return decision

        result = store.transact(event, consumer, decide, job_id=payload.job_id, team=None,
                                now=now)
    else:
        raise TypeError(f"the jobs handler does not take {event.name}")
    decision: Decision | None = result.value
    if decision is not None:
        log.info("%s %s: %s (%s) %s", event.name, getattr(payload, "job_id", "?"),
                 "accepted" if decision.accepted else "refused", decision.reason,
                 decision.message)
    return decision


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
