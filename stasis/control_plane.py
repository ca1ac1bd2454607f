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

A workspace the node agent gave an identity (``STASIS_WORKSPACE_TOKEN`` and
``STASIS_WORKSPACE_URL``, ``events.identity``) reaches the control plane only through the
``workspace_api`` function instead (:func:`from_identity`, the standard library's HTTP
client): it publishes the job's events and reads ``jobs/{id}`` there, as its workspace,
whose team and owner the function takes from the workspace's document. On Kubernetes the
credential is the pod's projected service-account token (``STASIS_WORKSPACE_TOKEN_FILE``),
re-read for every call because the kubelet rotates it, sent with ``X-Stasis-Workspace``.
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


def from_identity(env: Mapping[str, str]) -> EventControlPlane:
    """The control plane through the ``workspace_api`` function, as this workspace."""
    import dataclasses
    import json
    import urllib.error
    import urllib.request

    from events.identity import TOKEN_FILE_VAR, TOKEN_VAR, URL_VAR

    base = env[URL_VAR].rstrip("/")
    token_file = env.get(TOKEN_FILE_VAR)
    workspace_id = env.get("STASIS_WORKSPACE_ID") or None

    def credential() -> dict[str, str]:
        if not token_file:
            return {"Authorization": f"Bearer {env[TOKEN_VAR]}"}
        with open(token_file, encoding="utf-8") as projected:  # rotated: read every call
            token = projected.read().strip()
        return {"Authorization": f"Bearer {token}",
                "X-Stasis-Workspace": workspace_id or ""}

    def call(method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            f"{base}{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={**credential(), "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as refused:
            if refused.code == 404 and method == "GET":
                return None
            raise PermissionError(f"the control plane refused {method} {path} "
                                  f"({refused.code}): {refused.read().decode()[:500]}"
                                  ) from None

    def publish(event: Event[Any]) -> Any:
        return call("POST", "/events", {"type": event.name, "requestid": event.requestid,
                                        "payload": dataclasses.asdict(event.payload)})

    team = (workspace_id or "").split(WORKSPACE_SEPARATOR)[0]
    return EventControlPlane(publish, lambda job_id: call("GET", f"/jobs/{job_id}"),
                             team=team, owner="(the workspace's)", workspace_id=workspace_id,
                             upload_log=_log_uploader(env, team))


def from_environment(env: Mapping[str, str] | None = None) -> EventControlPlane:
    """The workspace's identity where it has one (:func:`from_identity`), else Pub/Sub +
    Firestore of ``STASIS_PROJECT`` (the emulators when their hosts are set)."""
    env = env if env is not None else os.environ
    if has_identity(env):
        return from_identity(env)
    from google.cloud import firestore

    from functions.adapters.pubsub_bus import PubSubBus
    from functions.domain.publishers import WORKSPACE

    project = env["STASIS_PROJECT"]
    bus = PubSubBus(project, origin=WORKSPACE)
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
    return EventControlPlane(bus.publish, read_job, team=team, owner=owner or "unknown",
                             workspace_id=workspace_id, upload_log=_log_uploader(env, team))


def _log_uploader(env: Mapping[str, str], team: str) -> Callable[[str, str], str] | None:
    """How a job's log reaches Cloud Storage (``gs://BUCKET/jobs/TEAM/ID/log.txt``), where
    this kernel may write the bucket (``STASIS_SNAPSHOT_BUCKET``; a workspace with a user of
    its own has none: its jobs' logs stay in its home)."""
    bucket, project = env.get("STASIS_SNAPSHOT_BUCKET"), env.get("STASIS_PROJECT")
    if not bucket or not project:
        return None

    def upload_log(job_id: str, path: str) -> str:
        from functions.adapters.snapshots import storage_client

        name = f"jobs/{team}/{job_id}/log.txt"
        storage_client(project).bucket(bucket).blob(name).upload_from_filename(
            path, content_type="text/plain")
        return f"gs://{bucket}/{name}"

    return upload_log


def has_identity(env: Mapping[str, str]) -> bool:
    """Whether this kernel has a workspace identity (a token, or on Kubernetes its file)
    and the ``workspace_api`` URL to use it at."""
    return bool((env.get("STASIS_WORKSPACE_TOKEN") or env.get("STASIS_WORKSPACE_TOKEN_FILE"))
                and env.get("STASIS_WORKSPACE_URL"))


def available(env: Mapping[str, str] | None = None) -> bool:
    """Whether this kernel runs in a workspace of a control plane (``from_environment``
    has what it needs)."""
    env = env if env is not None else os.environ
    if has_identity(env):
        return True
    return bool(env.get("STASIS_PROJECT") and
                (env.get("STASIS_WORKSPACE_ID") or env.get("STASIS_TEAM")))
