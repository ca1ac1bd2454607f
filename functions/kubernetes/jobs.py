"""The job runtime on a team's cluster: one JobSet (and its headless Service) per job.

``start`` applies what ``objects.jobset`` builds, with ``api.KubeApi``: the
team's namespace and service account (the identity of its workspaces: with Workload
Identity it may read and write the team's objects in the bucket), the coordinator Service,
then the JobSet. Creating an object that exists and is ours is success, so a redelivered
start changes nothing (idempotent per job id). ``cancel`` deletes the JobSet (its Jobs and
pods follow by garbage collection) and the Service; objects already gone are not an error.

The hosts run ``python -m runtime.kubernetes.job_host`` in the job's image (the
workspace's environment image, from the catalog; else ``STASIS_K8S_JOB_IMAGE``), with
Stasis copied from the agent image by an init container, and ``STASIS_JOB_URI`` naming
the job's prefix in the bucket (``gs://BUCKET/jobs/TEAM/ID``), where the payload is and
the logs, exit records and result go. The end is reported by the cluster's job watcher
(``runtime.kubernetes.job_watch``), not here. Errors follow the port: a profile or a slice
that cannot exist raises ``RuntimeRefused`` (the handler ends the job), the API being
unreachable ``RuntimeUnavailable`` (the event is retried).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from functions.domain.catalog import WorkKind
from functions.kubernetes.api import KubeApi
from functions.kubernetes.objects import jobset as js
from functions.kubernetes.objects import kueue
from functions.kubernetes.objects.meta import (
    ANN_JOB_URI,
    ANN_REQUESTID,
    ANN_SUBMITTED_AT,
    LABEL_JOB,
    MANAGED_SELECTOR,
    is_managed,
    labels_of,
)
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.team import (
    WORKSPACE_SA,
    team_namespace,
    team_namespace_name,
    team_service_account,
)
from functions.ports import JobRun, RuntimeRefused

DEFAULT_IMAGE = "us-docker.pkg.dev/example-project/stasis/python:3.11"


class KubernetesJobRuntime:
    name = "kubernetes"

    def __init__(self, api_client: Any = None, *, catalog: Callable[[], Any], bucket: str,
                 image: str = DEFAULT_IMAGE, settings: ClusterSettings | None = None,
                 source_image: str | None = None, env: Mapping[str, str] | None = None,
                 workspace_gsa: str | None = None, ttl_seconds: int = 600,
                 clock: Callable[[], float] = time.time) -> None:
        """``catalog``: the applied catalog (profiles). ``source_image``: an image with
        Stasis under ``settings.agent_source_root`` (None: the job image has it).
        ``env``: extra environment of every host (e.g. ``STORAGE_EMULATOR_HOST``)."""
        self.kube = KubeApi(api_client)
        self.settings = settings or ClusterSettings()
        self._catalog = catalog
        self.bucket = bucket
        self.image = image
        self.source_image = source_image
        self.env = dict(env or {})
        self._workspace_gsa = workspace_gsa
        self.ttl_seconds = ttl_seconds
        self._clock = clock

    @classmethod
    def from_environment(cls, catalog: Callable[[], Any]) -> KubernetesJobRuntime:
        """Settings from ``STASIS_K8S_*`` and the snapshot bucket (see the README)."""
        env = os.environ.get
        settings = ClusterSettings.from_env(os.environ)
        extra = {"STORAGE_EMULATOR_HOST": env("STASIS_K8S_JOB_STORAGE_EMULATOR_HOST", "")}
        return cls(catalog=catalog, bucket=env("STASIS_SNAPSHOT_BUCKET", "stasis-snapshots"),
                   image=env("STASIS_K8S_JOB_IMAGE", DEFAULT_IMAGE), settings=settings,
                   source_image=settings.agent_image,
                   env={k: v for k, v in extra.items() if v},
                   workspace_gsa=env("STASIS_K8S_WORKSPACE_GSA") or None,
                   ttl_seconds=int(env("STASIS_K8S_JOB_TTL_SECONDS", "600")))

    def job_uri(self, team: str, job_id: str) -> str:
        return f"gs://{self.bucket}/{js.job_prefix(team, job_id)}"

    def objects(self, run: JobRun) -> list[dict[str, Any]]:
        """What ``start`` applies, in order (the Service first: the hosts' names resolve
        as soon as their pods exist)."""
        profile = self._catalog().profiles.get(run.profile)
        if profile is None:
            raise RuntimeRefused(f"profile {run.profile} is not in the catalog")
        prefix = self.job_uri(run.team, run.job_id)
        if run.payload_uri != f"{prefix}/{js.PAYLOAD}":
            raise RuntimeRefused(f"the payload of job {run.job_id} must be {prefix}/"
                                 f"{js.PAYLOAD}, not {run.payload_uri}")
        spec = js.JobSpec(
            job_id=run.job_id, team=run.team,
            namespace=team_namespace_name(run.team, self.settings),
            image=run.image or self.image, command=js.HOST_COMMAND, profile=profile,
            hosts=run.hosts, topology=run.topology,
            env={"STASIS_JOB_URI": prefix, "STASIS_TEAM": run.team, **self.env},
            ttl_seconds=self.ttl_seconds, service_account=WORKSPACE_SA,
            source_image=self.source_image, source_root=self.settings.agent_source_root,
            annotations={ANN_REQUESTID: run.requestid, ANN_JOB_URI: prefix,
                         ANN_SUBMITTED_AT: str(int(self._clock() * 1000))},
            labels=kueue.queue_labels(self._catalog().priority_for(
                run.team, run.profile, WorkKind.JOB).id) if self.settings.kueue else {})
        try:
            return [js.coordinator_service(spec), js.jobset(spec)]
        except ValueError as exc:  # a slice that cannot exist: never retried
            raise RuntimeRefused(str(exc)) from exc

    # -- the port ------------------------------------------------------------------------

    def start(self, run: JobRun) -> None:
        objects = self.objects(run)
        self.kube.ensure_namespace(team_namespace(run.team, self.settings), run.team)
        self.kube.apply(team_service_account(run.team, self.settings,
                                             gcp_service_account=self._workspace_gsa))
        for obj in objects:
            self.kube.apply(obj)

    def cancel(self, job_id: str, *, team: str) -> None:
        namespace = team_namespace_name(team, self.settings)
        self.kube.delete("JobSet", namespace, job_id)
        self.kube.delete("Service", namespace, js.service_name(job_id))

    def job_ids(self) -> set[str]:
        """The jobs that have a JobSet, in every namespace."""
        return {str(labels_of(obj).get(LABEL_JOB))
                for obj in self.kube.list("JobSet", None, MANAGED_SELECTOR) if is_managed(obj)}
