"""Agent sandboxes on the Kubernetes runtime: the SandboxRuntime port over a cluster.

``start(spec)`` returns once the cluster accepted the sandbox's objects; the cluster
monitor's sandbox watch (``runtime.kubernetes.sandbox_watch``) reports the outcome as
sandbox.finished. Steps:

1. **Refuse** a repository that is not a git URL the control plane can fetch (``https``,
   ``http``, ``ssh``, ``git`` or ``user@host:path``): a local path names a directory on
   the requester's machine, which the cluster has never seen (``RuntimeRefused``).
2. **Bundle** (once per sandbox): a bare clone of the repository, the base ref resolved to
   a commit, ``git bundle create`` of that commit, uploaded to
   ``gs://BUCKET/<result_prefix>/base.bundle`` with the commit in the object's metadata.
3. **Sign** V4 URLs (:class:`GcsUrlSigner`): GET for the bundle, PUT for patch, log and
   exit status; they expire after the wall clock plus an hour.
4. **Apply** the team namespace (and the control plane's RoleBinding in it, as for
   workspaces) and ``sandbox_manifests`` in order: policies before the Pod, so the Pod
   never runs unconfined.

``cancel`` deletes the Pod, Secret, policies, bundle and Pod Snapshots. The control plane
calls it as it records a sandbox's end as well as to stop one: the monitor that reports
the end only reads (its ClusterRole gets, lists and watches), like for jobs.

Idle suspension (GKE Pod Snapshots; gVisor Pods are what they support): ``suspend``
creates a PodSnapshotManualTrigger for the sandbox's Pod (which the team's
PodSnapshotPolicy selects); the watch reports sandbox.suspended once the PodSnapshot is
Ready; ``release`` deletes the Pod (only then); ``resume`` re-creates it identical but for
``podsnapshot.gke.io/ps-name``, and GKE restores memory, root file system and emptyDirs
(the working copy). The collector's URLs live in the snapshot of its memory, so a sandbox
that may be suspended gets URLs valid for 7 days (V4's longest): a sandbox suspended
longer comes back unable to upload, and is reported as such.

Where the bundle is made: here, in the function, not in the Pod. The Pod's egress is
default-deny (only Cloud Storage, by address); cloning in the Pod would need egress to
any git host and, for a private repository, a credential inside the sandbox, both of
which the sandbox must not have. The function has the network and the credentials
already, and resolves the base ref exactly once: the commit is pinned in the bundle's
metadata and the Pod's annotations, so the patch is against a known commit even if the
branch moves, and a redelivered start uses the same commit. The price is the function's
memory-backed ``/tmp`` (``max_bundle_bytes`` refuses bigger repositories).

Idempotent per sandbox id: an existing Pod means it runs; an existing bundle is reused with
its commit; objects are created with ``KubeApi.apply`` (409 on ours is success). The
Secret keeps the URLs minted first. (A start redelivered after the sandbox ended is never
made: the handler starts only sandboxes it still records as running, and their objects
are deleted only once the end is recorded.)

Signed URLs: on GCP, :class:`GcsUrlSigner` with the function's credentials; credentials
without a private key (Cloud Functions, GKE metadata) sign through IAM ``signBlob``
(``service_account_email`` + ``access_token``: the service account needs
``roles/iam.serviceAccountTokenCreator`` on itself). The ``endpoint`` is where the Pod
reaches Cloud Storage. Against fake-gcs-server, which checks no signature, the signer is
injected: with ``STORAGE_EMULATOR_HOST`` set, :meth:`GcsUrlSigner.for_emulator` signs with
a key made in memory and points the URLs at the emulator (or at
``STASIS_K8S_SANDBOX_STORAGE_URL``, where the Pods reach it): the same code path as on
GCP, with a key nothing trusts.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from events import SandboxFinished, new_event
from functions.domain.redaction import redact
from functions.domain.sandboxes import RunSpec, Termination
from functions.kubernetes.api import KubeApi
from functions.kubernetes.objects import sandbox as sm
from functions.kubernetes.objects.meta import (
    ANN_BASE_SHA,
    ANN_BUCKET,
    ANN_NETWORK,
    ANN_PREFIX,
    ANN_REQUESTID,
    ANN_SANDBOX_ID,
    ANN_SEQUENCE,
    MANAGED_SELECTOR,
    annotations_of,
    as_int,
    is_managed,
)
from functions.kubernetes.objects.podsnapshot import (
    PS_NAME_ANNOTATION,
    podsnapshot_outcome,
    team_pod_snapshots,
    trigger_outcome,
)
from functions.kubernetes.objects.reports import SOURCE
from functions.kubernetes.objects.settings import ClusterSettings, SandboxClusterSettings
from functions.kubernetes.objects.team import team_namespace, team_namespace_name
from functions.ports import Bus, RuntimeRefused, RuntimeUnavailable

#: Schemes git may use to fetch a repository for a sandbox (``GIT_ALLOW_PROTOCOL``): never
#: ``file`` (the function's own disk) nor ``ext`` (runs a command).
GIT_PROTOCOLS = ("https", "http", "ssh", "git")
GIT_TIMEOUT_S = 300.0
_SCP_LIKE = re.compile(r"^(?:[\w.-]+@)?[\w.-]+:(?!//)[^\s]+$")
_SHA = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")
#: Kinds of a sandbox's objects, deleted Pod first (it stops using the Secret).
OBJECT_KINDS = ("Pod", "Secret", "NetworkPolicy", "FQDNNetworkPolicy")
MAX_URL_SECONDS = 7 * 86400


class UrlSigner(Protocol):
    def sign(self, bucket: str, name: str, *, method: str, content_type: str | None,
             expires: timedelta) -> str:
        """A URL through which whoever holds it may ``method`` the one object."""
        ...


class GcsUrlSigner:
    """V4 signed URLs with google-cloud-storage (``Blob.generate_signed_url``)."""

    def __init__(self, credentials: Any = None, *, endpoint: str | None = None) -> None:
        """``credentials``: ``google.auth`` credentials (None: the environment's default);
        ``endpoint``: where the URL points (None: https://storage.googleapis.com)."""
        self._credentials = credentials
        self.endpoint = endpoint

    def sign(self, bucket: str, name: str, *, method: str, content_type: str | None,
             expires: timedelta) -> str:
        from google.auth.credentials import Signing
        from google.cloud import storage

        credentials = self._signing_credentials()
        kwargs: dict[str, Any] = {}
        if isinstance(credentials, Signing):
            # A key (service account) or IAM through impersonation: it signs itself.
            kwargs["credentials"] = credentials
        else:
            # No key (Cloud Functions, GKE metadata): IAM signBlob with a fresh token.
            from google.auth.transport.requests import Request

            if not credentials.valid:
                credentials.refresh(Request())
            kwargs.update(service_account_email=credentials.service_account_email,
                          access_token=credentials.token)
        if self.endpoint:
            kwargs["api_access_endpoint"] = self.endpoint.rstrip("/")
        blob = storage.Client.create_anonymous_client().bucket(bucket).blob(name)
        return str(blob.generate_signed_url(version="v4", expiration=expires, method=method,
                                            content_type=content_type, **kwargs))

    @classmethod
    def for_emulator(cls, endpoint: str) -> GcsUrlSigner:
        """Signs with a key made now, for fake-gcs-server: it checks no signature (it
        only needs the V4 query to take a PUT as an upload). Never for Cloud Storage,
        which trusts no such key."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from google.oauth2 import service_account

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        credentials = service_account.Credentials.from_service_account_info({
            "type": "service_account", "client_email": "sandbox-signer@emulator.invalid",
            "private_key": pem, "token_uri": "http://127.0.0.1:9/token"})
        return cls(credentials, endpoint=endpoint)

    def _signing_credentials(self) -> Any:
        if self._credentials is None:
            import google.auth

            self._credentials, _project = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return self._credentials


def git_url_problem(repository: str) -> str | None:
    """Why the cluster cannot run a sandbox of ``repository`` (None: a usable URL)."""
    scheme = urlsplit(repository).scheme.lower()
    if scheme in GIT_PROTOCOLS and urlsplit(repository).netloc:
        return None
    if not scheme and _SCP_LIKE.match(repository) and not repository.startswith(("/", ".")):
        return None  # git@github.com:org/repo.git
    if scheme and scheme not in ("file",) and "://" in repository:
        return (f"repository {redact(repository)!r} uses {scheme}://, which sandboxes on the "
                f"Kubernetes runtime do not fetch; use {', '.join(GIT_PROTOCOLS)} or "
                "user@host:path")
    return (f"repository {redact(repository)!r} is a local path; sandboxes on the Kubernetes "
            "runtime need a git URL the control plane can fetch (https://..., ssh://... or "
            "git@host:org/repo.git): push the branch and pass its URL")


class KubernetesSandboxRuntime:
    name = "kubernetes"

    def __init__(self, api_client: Any = None, *, storage: Any, signer: UrlSigner,
                 settings: SandboxClusterSettings | None = None,
                 cluster: ClusterSettings | None = None, bus: Bus | None = None,
                 max_bundle_bytes: int = 1 << 30) -> None:
        """``storage``: a ``google.cloud.storage.Client`` (the function's: uploads the
        bundle); ``signer``: mints the Pod's URLs; ``bus``: where ``cancel`` reports. Its
        rights in a team namespace come from the install step: it binds nothing."""
        self.kube = KubeApi(api_client)
        self.storage = storage
        self.signer = signer
        self.settings = settings or SandboxClusterSettings()
        self.cluster = cluster or ClusterSettings(
            namespace_prefix=self.settings.namespace_prefix)
        self.bus = bus
        self.max_bundle_bytes = max_bundle_bytes

    @classmethod
    def from_environment(cls, *, bus: Bus | None = None, storage: Any = None,
                         project: str | None = None) -> KubernetesSandboxRuntime:
        """Settings from ``STASIS_K8S_*`` (see the README's Kubernetes section)."""
        from google.cloud import storage as gcs

        env = os.environ.get
        emulator = env("STORAGE_EMULATOR_HOST")
        endpoint = env("STASIS_K8S_SANDBOX_STORAGE_URL") or emulator
        signer = (GcsUrlSigner.for_emulator(endpoint) if emulator and endpoint
                  else GcsUrlSigner(endpoint=endpoint or None))
        if storage is None:
            storage = (gcs.Client.create_anonymous_client() if emulator
                       else gcs.Client(project=project))
        return cls(storage=storage, signer=signer,
                   settings=SandboxClusterSettings.from_env(os.environ), bus=bus)

    # -- the port ----------------------------------------------------------------------------

    def start(self, spec: RunSpec) -> None:
        problem = git_url_problem(spec.repository)
        if problem:
            raise RuntimeRefused(problem)
        if spec.base_ref.startswith("-"):
            raise RuntimeRefused(f"base ref {spec.base_ref!r} is not a git ref")
        namespace = team_namespace_name(spec.team, self.settings)
        bucket = self._bucket(spec.bucket)
        pod = self.kube.read("Pod", namespace, sm.object_name(spec.sandbox_id))
        if pod is not None:
            if annotations_of(pod).get(ANN_SANDBOX_ID) != spec.sandbox_id:
                raise RuntimeRefused(f"pod {namespace}/{sm.object_name(spec.sandbox_id)} "
                                     f"exists and is not sandbox {spec.sandbox_id}'s")
            return  # already running
        base_sha = self._bundle(spec, bucket)
        # A sandbox that may be suspended keeps its URLs in the snapshot of its collector's
        # memory: they must outlive the suspension (V4's longest, 7 days).
        expires = timedelta(seconds=MAX_URL_SECONDS if spec.limits.idle_seconds else
                            min(spec.limits.wall_clock_seconds + 3600, MAX_URL_SECONDS))
        urls = {key: self._sign(spec, obj, method, content_type, expires)
                for key, (obj, method, content_type) in sm.URL_OBJECTS.items()}
        self.kube.ensure_namespace(team_namespace(spec.team, self.cluster), spec.team)
        for obj in sm.sandbox_manifests(spec, base_sha, urls, self.settings):
            self.kube.apply(obj)

    def suspend(self, sandbox_id: str, *, team: str, sequence: int, idle_seconds: int) -> None:
        """Snapshot an idle sandbox's Pod (GKE Pod Snapshots; its ``sequence``-th
        suspension). The watch reports sandbox.suspended once the PodSnapshot is Ready;
        :meth:`release` then deletes the Pod. Idempotent per sequence."""
        namespace = team_namespace_name(team, self.settings)
        pod = self._read_own("Pod", namespace, sandbox_id)
        if pod is None or sm.pod_outcome(pod, None) is not None:
            raise RuntimeRefused(f"sandbox {sandbox_id} has no running pod to suspend")
        bucket = str(annotations_of(pod).get(ANN_BUCKET) or "")
        for obj in team_pod_snapshots(team, bucket, self.cluster):
            self.kube.apply(obj)
        self.kube.apply(sm.sandbox_snapshot_trigger(pod, sequence=sequence,
                                                    idle_seconds=idle_seconds))

    def release(self, sandbox_id: str, *, team: str) -> None:
        """Delete a suspended sandbox's Pod (compute released), keeping its Secret,
        policies and bundle for :meth:`resume`. Refused unless a snapshot of it is Ready:
        without one, deleting the Pod would lose the sandbox."""
        namespace = team_namespace_name(team, self.settings)
        if self._snapshot_of(namespace, sandbox_id) is None:
            raise RuntimeRefused(f"sandbox {sandbox_id} has no completed Pod Snapshot: its "
                                 "pod is kept")
        self.kube.delete("Pod", namespace, sm.object_name(sandbox_id))

    def resume(self, spec: RunSpec) -> None:
        """Re-create a released sandbox's Pod from its latest PodSnapshot
        (``podsnapshot.gke.io/ps-name``): identical to the first, so GKE restores the
        task where it was. Idempotent; refused when nothing of it can be restored."""
        namespace = team_namespace_name(spec.team, self.settings)
        ps_name = self._snapshot_of(namespace, spec.sandbox_id)
        if ps_name is None:
            raise RuntimeRefused(f"sandbox {spec.sandbox_id} has no completed Pod Snapshot on "
                                 "this cluster: it cannot be resumed")
        pod = self._read_own("Pod", namespace, spec.sandbox_id)
        if pod is not None:
            if annotations_of(pod).get(PS_NAME_ANNOTATION) == ps_name:
                return  # already restored (a redelivered resume)
            raise RuntimeUnavailable(f"sandbox {spec.sandbox_id} still has the pod of before "
                                     "its suspension; retry once it is released")
        secret = self._read_own("Secret", namespace, spec.sandbox_id)
        bundle = self._bucket(spec.bucket).blob(_object(spec, sm.BUNDLE_OBJECT))
        if secret is None or not _reload(bundle) or not (bundle.metadata or {}).get("base-sha"):
            raise RuntimeRefused(f"sandbox {spec.sandbox_id} lost its URLs or its bundle: it "
                                 "cannot be resumed")
        restored = sm.restored_pod(spec, str(bundle.metadata["base-sha"]), ps_name,
                                   self.settings)
        self.kube.apply(restored)

    def cleanup(self, sandbox_id: str, *, team: str) -> None:
        """An ended sandbox: its objects go (the same deletions as :meth:`cancel`)."""
        self.cancel(sandbox_id, team=team)

    def cancel(self, sandbox_id: str, *, team: str | None = None) -> None:
        """Delete the sandbox's Pod, Secret, policies and bundle (idempotent). A sandbox
        still running is reported ``cancelled`` (when a bus is given) under the id of the
        watch's report, so whichever comes first is the one that counts. ``team`` narrows
        the search to its namespace; without it every team namespace is looked at (the
        control plane may list namespaces, not pods across them)."""
        for namespace in self._namespaces(team):
            pod = self._read_own("Pod", namespace, sandbox_id)
            secret = self._read_own("Secret", namespace, sandbox_id)
            if pod is None and secret is None and not self._triggers(namespace, sandbox_id):
                continue
            if pod is not None and self.bus is not None and sm.pod_outcome(pod, None) is None:
                self._report_cancelled(pod)
            delete_objects(self.kube, namespace, sandbox_id)
            for trigger in self._triggers(namespace, sandbox_id):
                created = trigger_outcome(trigger).name
                if created:  # GKE deletes a deleted PodSnapshot's objects
                    self.kube.delete("PodSnapshot", namespace, created)
                self.kube.delete("PodSnapshotManualTrigger", namespace,
                                 str(trigger["metadata"]["name"]))
            annotations = annotations_of(pod or secret or {})
            bucket, prefix = annotations.get(ANN_BUCKET), annotations.get(ANN_PREFIX)
            if bucket and prefix:
                _delete(self._bucket(bucket), f"{prefix.strip('/')}/{sm.BUNDLE_OBJECT}")

    def status(self, sandbox_id: str, *, team: str | None = None) -> dict[str, Any] | None:
        """The Pod's phase and whether it ended (None: no Pod)."""
        for namespace in self._namespaces(team):
            pod = self._read_own("Pod", namespace, sandbox_id)
            if pod is None:
                continue
            return {"sandbox_id": sandbox_id, "namespace": namespace,
                    "pod": sm.object_name(sandbox_id),
                    "phase": (pod.get("status") or {}).get("phase"),
                    "state": "running" if sm.pod_outcome(pod, None) is None else "ended",
                    "base_sha": annotations_of(pod).get(ANN_BASE_SHA)}
        return None

    # -- the cluster ---------------------------------------------------------------------------

    def _namespaces(self, team: str | None) -> list[str]:
        if team is not None:
            return [team_namespace_name(team, self.settings)]
        prefix = self.settings.namespace_prefix
        return sorted(str(ns["metadata"]["name"])
                      for ns in self.kube.list("Namespace", None, MANAGED_SELECTOR)
                      if is_managed(ns) and str(ns["metadata"].get("name", "")).startswith(
                          prefix) and ns["metadata"]["name"] != self.cluster.system_namespace)

    def _triggers(self, namespace: str, sandbox_id: str) -> list[dict[str, Any]]:
        return [t for t in self.kube.list("PodSnapshotManualTrigger", namespace,
                                          sm.sandbox_labels_selector(sandbox_id))
                if self._own(t, sandbox_id) is not None]

    def _snapshot_of(self, namespace: str, sandbox_id: str) -> str | None:
        """The PodSnapshot of the sandbox's latest completed suspension."""
        best: tuple[int, str] | None = None
        for trigger in self._triggers(namespace, sandbox_id):
            outcome = trigger_outcome(trigger)
            if outcome.state != "succeeded" or not outcome.name:
                continue
            snapshot = self.kube.read("PodSnapshot", namespace, outcome.name)
            if snapshot is None or podsnapshot_outcome(snapshot).state != "succeeded":
                continue
            sequence = as_int(annotations_of(trigger).get(ANN_SEQUENCE))
            if best is None or sequence > best[0]:
                best = (sequence, outcome.name)
        return best[1] if best else None

    def _read_own(self, kind: str, namespace: str, sandbox_id: str) -> dict[str, Any] | None:
        """The sandbox's Pod or Secret, if it exists and is this sandbox's."""
        return self._own(self.kube.read(kind, namespace, sm.object_name(sandbox_id)), sandbox_id)

    @staticmethod
    def _own(obj: dict[str, Any] | None, sandbox_id: str) -> dict[str, Any] | None:
        """``obj`` if it is this sandbox's (names are slugs: the annotation decides)."""
        if obj is None or not sm.is_sandbox(obj):
            return None
        return obj if annotations_of(obj).get(ANN_SANDBOX_ID) == sandbox_id else None

    def _report_cancelled(self, pod: Mapping[str, Any]) -> None:
        annotations = annotations_of(pod)
        sandbox_id = str(annotations.get(ANN_SANDBOX_ID) or "")
        payload = SandboxFinished(
            sandbox_id, False, termination=Termination.CANCELLED,
            error="cancelled: the sandbox's pod was deleted",
            base_sha=annotations.get(ANN_BASE_SHA) or None,
            network=str(annotations.get(ANN_NETWORK) or ""))
        assert self.bus is not None
        requestid = str(annotations.get(ANN_REQUESTID) or "")
        self.bus.publish(new_event(payload, source=SOURCE, requestid=requestid or None,
                                   id=sm.finished_event_id(sandbox_id, requestid)))

    # -- the bundle ------------------------------------------------------------------------

    def _bundle(self, spec: RunSpec, bucket: Any) -> str:
        """The base commit; its bundle is in Cloud Storage (made now, or before)."""
        blob = bucket.blob(_object(spec, sm.BUNDLE_OBJECT))
        if _reload(blob):
            sha = (blob.metadata or {}).get("base-sha")
            if sha:
                return str(sha)
        with tempfile.TemporaryDirectory(prefix="stasis-bundle-") as tmp:
            repo = Path(tmp) / "repo.git"
            shown = redact(spec.repository)
            self._git(["clone", "--bare", "--quiet", "--", spec.repository, str(repo)],
                      what=f"cloning {shown}")
            sha = self._git(["rev-parse", "--verify", "--quiet", "--end-of-options",
                             f"{spec.base_ref}^{{commit}}"], cwd=repo,
                            what=f"base ref {spec.base_ref!r} of {shown}",
                            refused=True).strip()
            if not _SHA.match(sha):
                raise RuntimeRefused(f"base ref {spec.base_ref!r} of {shown} did "
                                     f"not resolve to a commit ({sha!r})")
            self._git(["update-ref", "refs/heads/stasis-base", sha], cwd=repo, what="bundle")
            self._git(["symbolic-ref", "HEAD", "refs/heads/stasis-base"], cwd=repo,
                      what="bundle")
            path = Path(tmp) / sm.BUNDLE_OBJECT
            self._git(["bundle", "create", "--quiet", str(path), "HEAD",
                       "refs/heads/stasis-base"], cwd=repo, what="bundle")
            size = path.stat().st_size
            if size > self.max_bundle_bytes:
                raise RuntimeRefused(
                    f"the repository's history at {sha[:12]} is {size >> 20} MiB, more than "
                    f"the {self.max_bundle_bytes >> 20} MiB a sandbox takes")
            blob.metadata = {"base-sha": sha}
            try:
                blob.upload_from_filename(str(path), content_type="application/x-git-bundle")
            except Exception as exc:  # any transport or server error: try again later
                raise RuntimeUnavailable(f"uploading the bundle to gs://{bucket.name}/"
                                         f"{blob.name} failed: {exc}") from exc
        return sha

    def _git(self, args: list[str], *, what: str, cwd: Path | None = None,
             refused: bool = False) -> str:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tempfile.gettempdir(),
               "GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": ":".join(GIT_PROTOCOLS),
               "GIT_CONFIG_NOSYSTEM": "1", "LANG": "C"}
        for key in ("GIT_SSH_COMMAND", "GIT_CONFIG_GLOBAL", "SSL_CERT_FILE", "HTTPS_PROXY",
                    "NO_PROXY"):
            if os.environ.get(key):
                env[key] = os.environ[key]
        try:
            done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=GIT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeUnavailable(f"{what}: git took more than {GIT_TIMEOUT_S:g} s") \
                from exc
        if done.returncode != 0:
            lines = [redact(line) for line in done.stderr.strip().splitlines()
                     if line.strip()]
            why = lines[-1] if lines else f"exit status {done.returncode}"
            if refused or args[0] == "clone":
                # A wrong URL, a private repository or an unknown ref: retrying won't help.
                raise RuntimeRefused(f"{what}: {why}" if lines or not refused
                                     else f"{what} not found")
            raise RuntimeUnavailable(f"{what}: git {args[0]} failed: {why}")
        return done.stdout

    # -- Cloud Storage ---------------------------------------------------------------------

    def _bucket(self, name: str) -> Any:
        return self.storage.bucket(name)

    def _sign(self, spec: RunSpec, obj: str, method: str, content_type: str | None,
              expires: timedelta) -> str:
        return self.signer.sign(spec.bucket, _object(spec, obj), method=method,
                                content_type=content_type, expires=expires)


def _object(spec: RunSpec, name: str) -> str:
    return f"{spec.prefix.strip('/')}/{name}"


def _reload(blob: Any) -> bool:
    """Load the object's metadata; False when it does not exist."""
    from google.api_core.exceptions import NotFound

    try:
        blob.reload()
    except NotFound:
        return False
    except Exception as exc:
        raise RuntimeUnavailable(f"Cloud Storage: reading gs://{blob.bucket.name}/{blob.name} "
                                 f"failed: {exc}") from exc
    return True


def delete_objects(kube: KubeApi, namespace: str, sandbox_id: str) -> None:
    """Delete one sandbox's Pod, Secret and policies (missing ones are fine)."""
    base = sm.object_name(sandbox_id)
    for kind in OBJECT_KINDS:
        kube.delete(kind, namespace, base)
    kube.delete("NetworkPolicy", namespace, sm.dns_policy_name(sandbox_id))


def _delete(bucket: Any, name: str) -> None:
    from google.api_core.exceptions import NotFound

    try:
        bucket.blob(name).delete()
    except NotFound:
        return
    except Exception as exc:
        raise RuntimeUnavailable(f"Cloud Storage: deleting gs://{bucket.name}/{name} failed: "
                                 f"{exc}") from exc
