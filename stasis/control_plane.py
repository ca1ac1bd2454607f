"""The notebook's side of job admission: job.submitted out, ``jobs/{id}`` back, job.finished.

:class:`EventControlPlane` publishes job.submitted, then waits until the control plane
(``on_job_submitted``: ``functions.handlers.jobs``) has decided in ``jobs/{id}``: RUNNING
lets the job start, REFUSED raises :class:`stasis.jobs.JobRefused` with the reason and what
to do. When the job ends it publishes job.finished, which gives the team's accelerators
back, with the job's log copied to Cloud Storage (``gs://BUCKET/jobs/TEAM/ID/log.txt``,
the snapshot bucket). ``from_environment()`` wires it to Pub/Sub, Firestore and Cloud
Storage (emulators included) for a kernel of a workspace: ``STASIS_PROJECT`` and
``STASIS_WORKSPACE_ID`` (the node agent sets both; the team is the id's prefix, the owner
the workspace's), or ``STASIS_TEAM`` / ``STASIS_OWNER`` outside one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from events import Event, new_event
from events.payloads import WORKSPACE_SEPARATOR, JobFinished, JobSubmitted

SOURCE = "//stasis/notebook"


class EventControlPlane:
    def __init__(self, publish: Callable[[Event[Any]], Any],
                 read_job: Callable[[str], Mapping[str, Any] | None], *, team: str,
                 owner: str, workspace_id: str | None = None, runtime: str = "local",
                 timeout: float = 60.0, poll: float = 0.2,
                 upload_log: Callable[[str, str], str] | None = None) -> None:
        self.publish, self.read_job = publish, read_job
        #: ``upload_log(job_id, local_path) -> uri``: where the job's log is kept.
        self.upload_log = upload_log
        self.team, self.owner, self.workspace_id = team, owner, workspace_id
        self.runtime, self.timeout, self.poll = runtime, timeout, poll

    def submitted(self, job_id: str, *, profile: str, hosts: int, function: str,
                  runtime: str | None = None, payload_uri: str | None = None,
                  topology: str | None = None) -> None:
        """``runtime``: where the job runs (default: this control plane's); a
        ``kubernetes`` job names its uploaded payload and, for a slice, its topology."""
        from stasis.jobs import JobRefused

        self.publish(new_event(JobSubmitted(
            job_id=job_id, team=self.team, owner=self.owner, profile=profile, hosts=hosts,
            workspace_id=self.workspace_id, runtime=runtime or self.runtime,
            function=function[:512], payload_uri=payload_uri, topology=topology),
            source=SOURCE, requestid=f"submit-{job_id}"))
        deadline = time.monotonic() + self.timeout
        while True:
            doc = self.read_job(job_id)
            state = (doc or {}).get("state")
            if state == "REFUSED":
                raise JobRefused((doc or {}).get("message") or f"job {job_id} was refused")
            if state in ("RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id}: no admission decision after "
                                   f"{self.timeout:.0f} s (is the control plane up?)")
            time.sleep(self.poll)

    def finished(self, job_id: str, *, succeeded: bool, termination: str,
                 exit_status: int | None, failed_host: int | None, error: str | None,
                 log_uri: str | None, duration_ms: int) -> None:
        if self.upload_log is not None and log_uri and log_uri.startswith("file://"):
            from urllib.parse import unquote, urlparse

            log_uri = self.upload_log(job_id, unquote(urlparse(log_uri).path))
        self.publish(new_event(JobFinished(
            job_id=job_id, succeeded=succeeded, termination=termination,
            exit_status=exit_status, failed_host=failed_host,
            error=error[-4000:] if error else None, log_uri=log_uri,
            duration_ms=duration_ms), source=SOURCE, requestid=f"finish-{job_id}"))


def from_environment(env: Mapping[str, str] | None = None) -> EventControlPlane:
    """Pub/Sub + Firestore of ``STASIS_PROJECT`` (the emulators when their hosts are set)."""
    from google.cloud import firestore

    from functions.adapters.pubsub_bus import PubSubBus

    env = env if env is not None else os.environ
    project = env["STASIS_PROJECT"]
    bus = PubSubBus(project)
    db = firestore.Client(project=project)

    def read_job(job_id: str) -> Mapping[str, Any] | None:
        snap = db.collection("jobs").document(job_id).get()
        return snap.to_dict() if snap.exists else None

    workspace_id = env.get("STASIS_WORKSPACE_ID") or None
    team = env.get("STASIS_TEAM") or (workspace_id or "").split(WORKSPACE_SEPARATOR)[0]
    if not team:
        raise KeyError("STASIS_TEAM or STASIS_WORKSPACE_ID: whose quota does the job use?")
    owner = env.get("STASIS_OWNER")
    if not owner and workspace_id:
        snap = db.collection("workspaces").document(workspace_id).get()
        owner = (snap.to_dict() or {}).get("owner") if snap.exists else None
    bucket = env.get("STASIS_SNAPSHOT_BUCKET")

    def upload_log(job_id: str, path: str) -> str:
        from functions.adapters.snapshots import storage_client

        name = f"jobs/{team}/{job_id}/log.txt"
        storage_client(project).bucket(bucket).blob(name).upload_from_filename(
            path, content_type="text/plain")
        return f"gs://{bucket}/{name}"

    return EventControlPlane(bus.publish, read_job, team=team, owner=owner or "unknown",
                             workspace_id=workspace_id,
                             upload_log=upload_log if bucket else None)


def available(env: Mapping[str, str] | None = None) -> bool:
    """Whether this kernel runs in a workspace of a control plane (``from_environment``
    has what it needs)."""
    env = env if env is not None else os.environ
    return bool(env.get("STASIS_PROJECT") and
                (env.get("STASIS_WORKSPACE_ID") or env.get("STASIS_TEAM")))
