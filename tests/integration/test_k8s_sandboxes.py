"""Agent sandboxes on the Kubernetes runtime, over HTTP: the sandbox runtime adapter and the
monitor's sandbox watch, through the official ``kubernetes`` client against kmock's
``KubernetesEmulator``, with the bundle and results in fake-gcs-server and sandbox.finished
on the Pub/Sub emulator.

The repository is a real git repository served over HTTP (git's "dumb" protocol, a plain
file server). The tests play the parts the emulator does not have: the kubelet (the Pod's
phase and container states) and the collector (uploading exit status, patch and log). One
test runs the Pod's own checkout, task and collector scripts with ``/bin/sh``, with their
directories moved into a temporary one and the signed URLs of the Secret the adapter made.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import requests
from google.cloud import pubsub_v1, storage
from k8s_emulator import EmulatedCluster, emulated_cluster
from kubernetes import client

import events
from events import SandboxFinished
from functions.domain.sandboxes import DEFAULT_LIMITS, RunSpec, result_prefix
from functions.kubernetes.api import KubeApi
from functions.kubernetes.objects import sandbox as sm
from functions.kubernetes.objects.meta import (
    ANN_BASE_SHA,
    ANN_IDLE_SECONDS,
    ANN_NETWORK,
    ANN_REQUESTID,
    ANN_SANDBOX_ID,
    ANN_SEQUENCE,
)
from functions.kubernetes.objects.podsnapshot import PS_NAME_ANNOTATION
from functions.kubernetes.sandboxes import GcsUrlSigner, KubernetesSandboxRuntime
from functions.ports import RuntimeRefused, RuntimeUnavailable
from runtime.kubernetes.cluster import KubeCluster
from runtime.kubernetes.sandbox_watch import SandboxWatch
from runtime.local.publisher import PubSubPublisher

K8S_VERSION = "1.35"
TEAM = "ml-a"
NAMESPACE = "stasis-ml-a"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false"]
CALC = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"
FIX = "sed -i 's/a - b/a + b/' calc.py && echo fixed > NOTES.txt"


@pytest.fixture(autouse=True, scope="module")
def _schemas_read_once() -> Iterator[None]:
    """kubernetes-validate parses its schema files on every call; read them once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kubernetes_validate.utils, "schema_contents", functools.cache(
            kubernetes_validate.utils.schema_contents))
        yield


# -- the parts: a git server, the cluster, storage, Pub/Sub --------------------------------


@dataclass
class Repo:
    path: Path
    url: str
    head: str


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[Repo]:
    """A repository whose test fails, served read-only over HTTP."""
    work = tmp_path / "src"
    work.mkdir()
    _git("init", "-q", "-b", "main", cwd=work)
    (work / "calc.py").write_text(CALC)
    (work / "test_calc.py").write_text(TEST)
    _git("add", ".", cwd=work)
    _git("commit", "-qm", "add, with a bug", cwd=work)
    served = tmp_path / "served"
    served.mkdir()
    _git("clone", "-q", "--bare", str(work), str(served / "calc.git"), cwd=tmp_path)
    _git("update-server-info", cwd=served / "calc.git")
    handler = functools.partial(_QuietHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Repo(work, f"http://127.0.0.1:{server.server_address[1]}/calc.git",
                   _git("rev-parse", "HEAD", cwd=work))
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    with emulated_cluster() as running:
        yield running


@pytest.fixture
def bucket(emulator_env: dict[str, str]) -> storage.Bucket:
    gcs = storage.Client.create_anonymous_client()
    return gcs.create_bucket(emulator_env["STASIS_SNAPSHOT_BUCKET"])


class Finished:
    """An event as the control plane would receive it: a pull subscription to its topic."""

    def __init__(self, project: str, name: str = "sandbox.finished") -> None:
        self.subscriber = pubsub_v1.SubscriberClient()
        topic = f"projects/{project}/topics/{events.spec_for(name).topic}"
        pubsub_v1.PublisherClient().create_topic(request={"name": topic})
        self.subscription = self.subscriber.subscription_path(
            project, f"test-{name.replace('.', '-')}")
        self.subscriber.create_subscription(request={"name": self.subscription,
                                                     "topic": topic})

    def pull(self, want: int = 1, timeout: float = 30.0) -> list[events.Event[Any]]:
        got: list[events.Event[Any]] = []
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            response = self.subscriber.pull(request={
                "subscription": self.subscription, "max_messages": 10,
                "return_immediately": True}, timeout=10)
            for received in response.received_messages:
                got.append(events.from_pubsub(received.message.data,
                                              dict(received.message.attributes)))
            if response.received_messages:
                self.subscriber.acknowledge(request={
                    "subscription": self.subscription,
                    "ack_ids": [r.ack_id for r in response.received_messages]})
            else:
                time.sleep(0.1)
        return got

    def none_pending(self) -> bool:
        response = self.subscriber.pull(request={"subscription": self.subscription,
                                                 "max_messages": 10,
                                                 "return_immediately": True}, timeout=10)
        return not response.received_messages


@pytest.fixture
def finished(emulator_env: dict[str, str]) -> Finished:
    return Finished(emulator_env["STASIS_PROJECT"])


class RecordingKube(KubeApi):
    """The real API client, noting what was applied in which order."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.applied: list[tuple[str, str]] = []

    def apply(self, obj: dict[str, Any]) -> None:
        self.applied.append((obj["kind"], obj["metadata"]["name"]))
        super().apply(obj)


@pytest.fixture
def runtime(cluster: EmulatedCluster, bucket: storage.Bucket, emulators: Any,
            emulator_env: dict[str, str]) -> KubernetesSandboxRuntime:
    runtime = KubernetesSandboxRuntime(
        cluster.api_client, storage=bucket.client,
        signer=GcsUrlSigner.for_emulator(emulators.gcs.url),
        bus=PubSubPublisher(emulator_env["STASIS_PROJECT"], origin="monitor"))
    runtime.kube = RecordingKube(cluster.api_client)
    return runtime


@pytest.fixture
def watch(cluster: EmulatedCluster, bucket: storage.Bucket,
          emulator_env: dict[str, str]) -> SandboxWatch:
    kube = KubeCluster(cluster.api_client)
    return SandboxWatch(kube.pods, kube, bucket.client,
                        PubSubPublisher(emulator_env["STASIS_PROJECT"], origin="monitor"),
                        snapshots=kube)


def spec_for(repo: Repo, bucket: storage.Bucket, sandbox_id: str = "sbx-1", *,
             command: str = FIX, allowed: tuple[str, ...] = (),
             repository: str | None = None, base_ref: str = "main") -> RunSpec:
    return RunSpec(sandbox_id, TEAM, repository or repo.url, base_ref, command,
                   DEFAULT_LIMITS, allowed, f"req-{sandbox_id}", bucket.name,
                   result_prefix(TEAM, sandbox_id))


# -- reading the cluster -----------------------------------------------------------------


def core(cluster: EmulatedCluster) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api_client)


def _json(response: Any) -> dict[str, Any]:
    return json.loads(response.data)


def read(cluster: EmulatedCluster, kind: str, name: str) -> dict[str, Any] | None:
    return KubeApi(cluster.api_client).read(kind, NAMESPACE, name)


def sandbox_objects(cluster: EmulatedCluster) -> list[tuple[str, str]]:
    """Every object of the team namespace, as (kind, name)."""
    api = KubeApi(cluster.api_client)
    return sorted((kind, o["metadata"]["name"])
                  for kind in ("Pod", "Secret", "NetworkPolicy", "FQDNNetworkPolicy")
                  for o in api.list(kind, NAMESPACE))


def kubelet(cluster: EmulatedCluster, spec: RunSpec, status: dict[str, Any]) -> None:
    """Play the kubelet: the Pod's status."""
    core(cluster).patch_namespaced_pod_status(sm.object_name(spec.sandbox_id), NAMESPACE,
                                              {"status": status}, _preload_content=False)


def collector(bucket: storage.Bucket, spec: RunSpec, exit_status: str | None,
              patch: str | None = None, log: str = "") -> None:
    """Play the collector: what it uploads through its signed URLs."""
    if patch is not None:
        bucket.blob(f"{spec.prefix}/{sm.PATCH_OBJECT}").upload_from_string(
            patch, content_type="text/x-diff")
    bucket.blob(f"{spec.prefix}/{sm.LOG_OBJECT}").upload_from_string(log)
    if exit_status is not None:
        bucket.blob(f"{spec.prefix}/{sm.STATUS_OBJECT}").upload_from_string(exit_status)


def names(bucket: storage.Bucket, spec: RunSpec) -> list[str]:
    return sorted(b.name.rsplit("/", 1)[-1]
                  for b in bucket.client.list_blobs(bucket.name, prefix=f"{spec.prefix}/"))


def terminated(name: str, code: int, reason: str = "Completed") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {
        "exitCode": code, "reason": reason, "startedAt": "2026-01-01T00:00:10Z",
        "finishedAt": "2026-01-01T00:01:40Z"}}}


# -- start -----------------------------------------------------------------------------------


def test_start_bundles_the_base_commit_and_applies_policies_before_the_pod(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, repo: Repo,
        bucket: storage.Bucket, tmp_path: Path) -> None:
    spec = spec_for(repo, bucket, allowed=("pypi.org", "10.20.0.0/16"))
    runtime.start(spec)

    applied = runtime.kube.applied  # type: ignore[attr-defined]
    # the team's namespace is created only if missing (never patched), and no RoleBinding:
    # the install step binds (deploy/cluster.py)
    assert [kind for kind, _ in applied] == ["NetworkPolicy", "NetworkPolicy",
                                             "FQDNNetworkPolicy", "Secret", "Pod"]
    assert KubeApi(cluster.api_client).read("Namespace", None, NAMESPACE) is not None
    for kind, name in applied:
        obj = read(cluster, kind, name)
        assert obj is not None, (kind, name)
        if kind != "FQDNNetworkPolicy":  # a GKE CRD, not in the Kubernetes schema
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    namespace = KubeApi(cluster.api_client).read("Namespace", None, NAMESPACE)
    assert namespace is not None
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    pod = read(cluster, "Pod", sm.object_name(spec.sandbox_id))
    assert pod is not None
    annotations = pod["metadata"]["annotations"]
    assert annotations[ANN_BASE_SHA] == repo.head
    assert annotations[ANN_SANDBOX_ID] == spec.sandbox_id
    assert annotations[ANN_REQUESTID] == spec.requestid
    assert "only pypi.org, 10.20.0.0/16" in annotations[ANN_NETWORK]

    bundle = bucket.get_blob(f"{spec.prefix}/{sm.BUNDLE_OBJECT}")
    assert bundle is not None and bundle.metadata == {"base-sha": repo.head}
    secret = read(cluster, "Secret", sm.object_name(spec.sandbox_id))
    assert secret is not None
    urls = secret["stringData"]
    assert set(urls) == set(sm.SECRET_KEYS)
    for key, (obj, _method, _type) in sm.URL_OBJECTS.items():
        # It may be suspended (idle_seconds): its URLs outlive a suspension (7 days).
        assert "X-Goog-Expires=604800&" in urls[key]
        assert urls[key].startswith(f"{os.environ['STORAGE_EMULATOR_HOST']}/{bucket.name}/"
                                    f"{spec.prefix}/{obj}?")
        assert "X-Goog-Signature=" in urls[key] and "X-Goog-Algorithm=GOOG4-RSA-SHA256" in urls[key]
    # The signed GET fetches the bundle, and the bundle holds the base commit.
    fetched = tmp_path / "fetched.bundle"
    fetched.write_bytes(requests.get(urls["bundle-url"], timeout=10).content)
    _git("clone", "-q", "--no-checkout", str(fetched), str(tmp_path / "clone"), cwd=tmp_path)
    assert _git("rev-parse", f"{repo.head}^{{commit}}", cwd=tmp_path / "clone") == repo.head


def test_a_redelivered_start_changes_nothing(cluster: EmulatedCluster,
                                             runtime: KubernetesSandboxRuntime, repo: Repo,
                                             bucket: storage.Bucket) -> None:
    spec = spec_for(repo, bucket)
    runtime.start(spec)
    before = {kind: read(cluster, kind, name) for kind, name in sandbox_objects(cluster)}
    generation = bucket.get_blob(f"{spec.prefix}/{sm.BUNDLE_OBJECT}").generation
    applied = len(runtime.kube.applied)  # type: ignore[attr-defined]
    # The branch moves on meanwhile: a redelivery must not pick the new commit.
    (repo.path / "later.txt").write_text("later\n")
    _git("add", ".", cwd=repo.path)
    _git("commit", "-qm", "later", cwd=repo.path)

    runtime.start(spec)
    assert len(runtime.kube.applied) == applied  # type: ignore[attr-defined]
    after = {kind: read(cluster, kind, name) for kind, name in sandbox_objects(cluster)}
    assert after == before
    assert bucket.get_blob(f"{spec.prefix}/{sm.BUNDLE_OBJECT}").generation == generation

    # Crashed after the bundle, before the Pod: the start completes with the same commit.
    KubeApi(cluster.api_client).delete("Pod", NAMESPACE, sm.object_name(spec.sandbox_id))
    runtime.start(spec)
    pod = read(cluster, "Pod", sm.object_name(spec.sandbox_id))
    assert pod is not None and pod["metadata"]["annotations"][ANN_BASE_SHA] == repo.head


@pytest.mark.parametrize("where", ["path", "relative", "file-url"])
def test_a_local_repository_is_refused(cluster: EmulatedCluster,
                                       runtime: KubernetesSandboxRuntime, repo: Repo,
                                       bucket: storage.Bucket, where: str) -> None:
    repository = {"path": str(repo.path), "relative": "./src",
                  "file-url": f"file://{repo.path}"}[where]
    with pytest.raises(RuntimeRefused, match="local path; sandboxes on the Kubernetes runtime "
                                             "need a git URL"):
        runtime.start(spec_for(repo, bucket, repository=repository))
    assert runtime.kube.applied == []  # type: ignore[attr-defined]
    assert names(bucket, spec_for(repo, bucket)) == []


def test_an_unknown_base_ref_is_refused(runtime: KubernetesSandboxRuntime, repo: Repo,
                                        bucket: storage.Bucket) -> None:
    with pytest.raises(RuntimeRefused, match="base ref 'no-such-branch'"):
        runtime.start(spec_for(repo, bucket, base_ref="no-such-branch"))
    with pytest.raises(RuntimeRefused, match=r"cloning http://127\.0\.0\.1"):
        runtime.start(spec_for(repo, bucket, repository=repo.url.replace("calc", "nothing")))
    # A token in the URL never reaches the message (the sandbox's record, chat).
    with pytest.raises(RuntimeRefused) as refused:
        runtime.start(spec_for(repo, bucket, repository=repo.url.replace(
            "http://", "http://bot:s3cr3t@").replace("calc", "nothing")))
    assert "s3cr3t" not in str(refused.value) and "http://***@127.0.0.1" in str(refused.value)
    assert runtime.kube.applied == []  # type: ignore[attr-defined]


# -- the watch ------------------------------------------------------------------------------

PATCH = ("diff --git a/calc.py b/calc.py\nindex 1..2 100644\n--- a/calc.py\n+++ b/calc.py\n"
         "@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
         "diff --git a/NOTES.txt b/NOTES.txt\nnew file mode 100644\n")


@dataclass(frozen=True)
class Case:
    status: dict[str, Any]
    exit_status: str | None
    termination: str
    code: int | None
    error: str | None
    patch: bool = False


CASES = {
    "succeeded": Case({"phase": "Succeeded", "containerStatuses": [terminated("task", 0)]},
                      "0 exited", "exited", 0, None, patch=True),
    "exit-1": Case({"phase": "Succeeded"}, "1 exited", "exited", 1, "exit status 1",
                   patch=True),
    "oom": Case({"phase": "Running", "containerStatuses": [
        terminated("task", 137, "OOMKilled"),
        {"name": "collector", "state": {"running": {}}}]}, None, "memory_limit_exceeded",
        137, "the task used more memory than its limit (2Gi) and was killed"),
    "deadline": Case({"phase": "Failed", "reason": "DeadlineExceeded"}, None,
                     "wall_clock_exceeded", None,
                     "the pod passed its deadline of 1500 s (the wall clock plus the time to "
                     "fetch and collect); no patch was collected"),
    "wall-clock": Case({"phase": "Succeeded"}, "124 wall_clock_exceeded",
                       "wall_clock_exceeded", 124,
                       "the task ran past its wall clock of 900 s and was stopped", patch=True),
    "cpu": Case({"phase": "Succeeded"}, "152 exited", "cpu_time_exceeded", 152,
                "the task used more than 600 CPU seconds (SIGXCPU)", patch=True),
    "image": Case({"phase": "Pending", "containerStatuses": [{"name": "task", "state": {
        "waiting": {"reason": "ImagePullBackOff", "message": "manifest unknown"}}}]}, None,
        "failed_to_start", None,
        "container task cannot start: ImagePullBackOff: manifest unknown"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_watch_reports_how_the_pod_ended_and_cleans_up(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, watch: SandboxWatch,
        repo: Repo, bucket: storage.Bucket, finished: Finished, case: str) -> None:
    want = CASES[case]
    spec = spec_for(repo, bucket)
    runtime.start(spec)
    assert watch.sync() is True  # running: nothing to report
    assert finished.none_pending()

    collector(bucket, spec, want.exit_status, PATCH if want.patch else None, log="the log\n")
    kubelet(cluster, spec, want.status)
    assert watch.sync() is False

    [event] = finished.pull()
    payload = event.payload
    assert isinstance(payload, SandboxFinished)
    assert event.requestid == spec.requestid
    assert event.id == sm.finished_event_id(spec.sandbox_id, spec.requestid)
    assert (payload.termination, payload.exit_status, payload.error) == (
        want.termination, want.code, want.error)
    assert payload.succeeded is (case == "succeeded")
    assert payload.base_sha == repo.head
    assert payload.network.startswith("none: default-deny NetworkPolicy")
    assert payload.log_uri == f"gs://{bucket.name}/{spec.prefix}/{sm.LOG_OBJECT}"
    if want.patch:
        assert payload.patch_uri == f"gs://{bucket.name}/{spec.prefix}/{sm.PATCH_OBJECT}"
        assert payload.patch_bytes == len(PATCH)
        assert payload.files_changed == ["calc.py", "NOTES.txt"]
    else:
        assert (payload.patch_uri, payload.patch_bytes, payload.files_changed) == (None, 0, [])
    if case == "succeeded":
        assert payload.duration_ms == 90_000
    # Reported once; the monitor only reads: the objects stay until the control plane,
    # recording the end, removes them (and a pod that ended is not "cancelled").
    assert watch.sync() is False and finished.none_pending()
    assert ("Pod", sm.object_name(spec.sandbox_id)) in sandbox_objects(cluster)
    runtime.cancel(spec.sandbox_id)
    assert sandbox_objects(cluster) == []
    assert sm.BUNDLE_OBJECT not in names(bucket, spec)
    assert finished.none_pending()


class FailingBus:
    def publish(self, event: Any) -> str:
        raise ConnectionError("Pub/Sub is down")


def test_a_restarted_watch_reports_again_under_the_same_id(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, watch: SandboxWatch,
        repo: Repo, bucket: storage.Bucket, finished: Finished) -> None:
    spec = spec_for(repo, bucket)
    runtime.start(spec)
    collector(bucket, spec, "0 exited", PATCH)
    kubelet(cluster, spec, {"phase": "Succeeded"})
    dying = SandboxWatch(watch.pods, watch.logs, watch.storage, FailingBus())
    with pytest.raises(ConnectionError):
        dying.sync()
    assert finished.none_pending()

    assert watch.sync() is False
    restarted = SandboxWatch(watch.pods, watch.logs, watch.storage, watch.bus)
    assert restarted.sync() is False
    first, again = finished.pull(2)
    assert first.id == again.id == sm.finished_event_id(spec.sandbox_id, spec.requestid)
    assert first.payload == again.payload and first.requestid == again.requestid
    assert first.payload.termination == "exited" and first.payload.succeeded


def test_cancel_deletes_the_objects_and_reports_cancelled(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, repo: Repo,
        bucket: storage.Bucket, finished: Finished) -> None:
    spec = spec_for(repo, bucket, allowed=("pypi.org",))
    runtime.start(spec)
    assert len(sandbox_objects(cluster)) == 5
    assert runtime.status(spec.sandbox_id) == {
        "sandbox_id": spec.sandbox_id, "namespace": NAMESPACE,
        "pod": sm.object_name(spec.sandbox_id), "phase": None, "state": "running",
        "base_sha": repo.head}
    runtime.cancel(spec.sandbox_id, team=TEAM)
    assert sandbox_objects(cluster) == []
    assert sm.BUNDLE_OBJECT not in names(bucket, spec)
    [event] = finished.pull()
    assert (event.payload.termination, event.payload.succeeded) == ("cancelled", False)
    assert event.id == sm.finished_event_id(spec.sandbox_id, spec.requestid)
    runtime.cancel(spec.sandbox_id)  # idempotent
    assert runtime.status(spec.sandbox_id) is None and finished.none_pending()


# -- the Pod's own scripts, run for real ----------------------------------------------------


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod["spec"]
    return next(c for c in [*spec["initContainers"], *spec["containers"]] if c["name"] == name)


def _run_container(pod: dict[str, Any], secret: dict[str, Any], name: str,
                   root: Path) -> subprocess.CompletedProcess[str]:
    """One container's script with /bin/sh, its volumes moved under ``root``."""
    container = _container(pod, name)
    moved = re.compile(r"(?<![\w/.-])/(work|results|private|tmp)\b")

    def move(text: str) -> str:
        return moved.sub(lambda match: f"{root}/{match.group(1)}", text)

    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    for entry in container["env"]:
        if "valueFrom" in entry:
            env[entry["name"]] = secret["stringData"][entry["valueFrom"]["secretKeyRef"]["key"]]
        elif moved.fullmatch(entry["value"]):  # HOME=/tmp; the task's command stays as is
            env[entry["name"]] = move(entry["value"])
        else:
            env[entry["name"]] = entry["value"]
    return subprocess.run(["/bin/sh", "-c", move(container["command"][2])], env=env,
                          cwd=move(container.get("workingDir", "/work")), capture_output=True,
                          text=True, timeout=120)


def test_the_pod_scripts_return_a_patch_that_fixes_the_test(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, watch: SandboxWatch,
        repo: Repo, bucket: storage.Bucket, finished: Finished, tmp_path: Path) -> None:
    root = tmp_path / "pod"
    for volume in ("work", "results", "private", "tmp"):
        (root / volume).mkdir(parents=True)
    # The task fixes the bug, and plants a hook and an fsmonitor that would run in the
    # collector (which holds the upload URLs) if it trusted the repository's config.
    planted = root / "planted-ran"
    command = (f"{FIX} && git config core.fsmonitor 'touch {planted}' && "
               f"printf '#!/bin/sh\\ntouch {planted}\\n' > .git/hooks/pre-commit && "
               "chmod +x .git/hooks/pre-commit")
    spec = spec_for(repo, bucket, command=command)
    runtime.start(spec)
    pod = read(cluster, "Pod", sm.object_name(spec.sandbox_id))
    secret = read(cluster, "Secret", sm.object_name(spec.sandbox_id))
    assert pod is not None and secret is not None

    for name in ("checkout", "task", "collector"):
        done = _run_container(pod, secret, name, root)
        assert done.returncode == 0, (name, done.stdout, done.stderr)
    assert not planted.exists()
    assert names(bucket, spec) == sorted([sm.BUNDLE_OBJECT, sm.PATCH_OBJECT, sm.LOG_OBJECT,
                                          sm.STATUS_OBJECT])

    kubelet(cluster, spec, {"phase": "Succeeded"})
    watch.sync()
    [event] = finished.pull()
    payload = event.payload
    assert (payload.termination, payload.exit_status, payload.succeeded) == ("exited", 0, True)
    assert payload.files_changed == ["NOTES.txt", "calc.py"]
    patch = bucket.blob(f"{spec.prefix}/{sm.PATCH_OBJECT}").download_as_bytes()
    assert payload.patch_bytes == len(patch)

    # Reviewed and applied by hand, the patch makes the failing test pass.
    check = tmp_path / "review"
    _git("clone", "-q", str(repo.path), str(check), cwd=tmp_path)
    assert subprocess.run(["python3", "test_calc.py"], cwd=check,
                          capture_output=True).returncode != 0
    (tmp_path / "fix.diff").write_bytes(patch)
    _git("apply", str(tmp_path / "fix.diff"), cwd=check)
    passed = subprocess.run(["python3", "test_calc.py"], cwd=check, capture_output=True,
                            text=True)
    assert passed.returncode == 0 and passed.stdout.strip() == "ok"


def test_the_task_script_stops_a_task_at_its_wall_clock(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, repo: Repo,
        bucket: storage.Bucket, tmp_path: Path) -> None:
    root = tmp_path / "pod"
    for volume in ("work", "results", "private", "tmp"):
        (root / volume).mkdir(parents=True)
    spec = dataclasses.replace(spec_for(repo, bucket, command="echo started; sleep 30"),
                               limits=dataclasses.replace(DEFAULT_LIMITS, wall_clock_seconds=1))
    runtime.start(spec)
    pod = read(cluster, "Pod", sm.object_name(spec.sandbox_id))
    secret = read(cluster, "Secret", sm.object_name(spec.sandbox_id))
    assert pod is not None and secret is not None
    for name in ("checkout", "task"):
        done = _run_container(pod, secret, name, root)
        assert done.returncode == 0, (name, done.stderr)
    status = (root / "results" / "exit_status").read_text()
    assert status == "124 wall_clock_exceeded\n"
    assert sm.pod_outcome({**pod, "status": {"phase": "Succeeded"}}, status) == sm.PodOutcome(
        "wall_clock_exceeded", 124, "the task ran past its wall clock of 1 s and was stopped")
    assert (root / "results" / "log.txt").read_text() == "started\n"


# -- idle suspension: GKE Pod Snapshots --------------------------------------------------------

GROUP, VERSION = "podsnapshot.gke.io", "v1"


def gke_completes_snapshot(cluster: EmulatedCluster, trigger_name: str) -> str:
    """Play GKE's Pod Snapshot controller: a PodSnapshot for the trigger, then Ready."""
    api = client.CustomObjectsApi(cluster.api_client)
    ps_name = f"ps-{trigger_name}"
    api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "podsnapshots", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodSnapshot",
        "metadata": {"name": ps_name, "namespace": NAMESPACE,
                     "labels": {"gke-pod-snapshot-triggered-by": trigger_name}},
        "spec": {"policyName": "stasis-pod-snapshots"}})
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, NAMESPACE, "podsnapshotmanualtriggers", trigger_name,
        {"status": {"conditions": [{"type": "Triggered", "status": "True",
                                    "reason": "Complete", "message": "",
                                    "lastTransitionTime": "2026-01-01T00:10:00Z"}],
                    "snapshotCreated": {"name": ps_name}}})
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, NAMESPACE, "podsnapshots", ps_name,
        {"status": {"conditions": [{"type": "Ready", "status": "True",
                                    "reason": "AllSnapshotsAvailable", "message": "",
                                    "lastTransitionTime": "2026-01-01T00:10:05Z"}],
                    "storageStatus": {"gcs": {"observedGCSPath":
                                              f"gs://b/snapshots/ml-a/pod/{ps_name}"}}}})
    return ps_name


@pytest.fixture
def suspended(emulator_env: dict[str, str]) -> Finished:
    return Finished(emulator_env["STASIS_PROJECT"], "sandbox.suspended")


def test_an_idle_sandbox_is_snapshotted_released_and_restored(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, watch: SandboxWatch,
        repo: Repo, bucket: storage.Bucket, suspended: Finished, finished: Finished) -> None:
    spec = spec_for(repo, bucket)
    runtime.start(spec)
    kubelet(cluster, spec, {"phase": "Running"})
    with pytest.raises(RuntimeRefused, match="no completed Pod Snapshot"):
        runtime.release(spec.sandbox_id, team=TEAM)
    with pytest.raises(RuntimeRefused, match="cannot be resumed"):
        runtime.resume(spec)
    original = read(cluster, "Pod", sm.object_name(spec.sandbox_id))
    assert original is not None

    runtime.suspend(spec.sandbox_id, team=TEAM, sequence=1, idle_seconds=600)
    runtime.suspend(spec.sandbox_id, team=TEAM, sequence=1, idle_seconds=600)  # redelivered
    api = KubeApi(cluster.api_client)
    [trigger] = api.list("PodSnapshotManualTrigger", NAMESPACE)
    assert trigger["spec"] == {"targetPod": sm.object_name(spec.sandbox_id)}
    policy = api.read("PodSnapshotPolicy", NAMESPACE, "stasis-pod-snapshots")
    assert policy is not None  # the team's policy selects the sandbox's Pod
    selector = policy["spec"]["selector"]["matchLabels"]
    assert selector.items() <= original["metadata"]["labels"].items()
    assert watch.sync() is True and suspended.none_pending()  # the snapshot is being taken

    ps_name = gke_completes_snapshot(cluster, trigger["metadata"]["name"])
    assert watch.sync() is True  # the sandbox's Pod still runs
    [event] = suspended.pull()
    assert event.requestid == f"{spec.requestid}.suspend-1"
    payload = event.payload
    assert (payload.sandbox_id, payload.method, payload.sequence, payload.idle_seconds) == (
        spec.sandbox_id, "pod", 1, 600)
    assert ps_name in payload.detail
    watch.sync()
    assert suspended.none_pending()  # reported once

    with pytest.raises(RuntimeUnavailable, match="still has the pod"):
        runtime.resume(spec)
    runtime.release(spec.sandbox_id, team=TEAM)
    assert ("Pod", sm.object_name(spec.sandbox_id)) not in sandbox_objects(cluster)
    assert ("Secret", sm.object_name(spec.sandbox_id)) in sandbox_objects(cluster)
    assert sm.BUNDLE_OBJECT in names(bucket, spec)

    runtime.resume(spec)
    restored = read(cluster, "Pod", sm.object_name(spec.sandbox_id))
    assert restored is not None
    assert restored["metadata"]["annotations"].pop("podsnapshot.gke.io/ps-name") == ps_name
    assert restored["spec"] == original["spec"]  # GKE restores only an identical Pod
    assert restored["metadata"]["annotations"] == original["metadata"]["annotations"]
    before = read(cluster, "Pod", sm.object_name(spec.sandbox_id))
    runtime.resume(spec)  # redelivered: nothing changes
    assert read(cluster, "Pod", sm.object_name(spec.sandbox_id)) == before

    # The restored task ends like any other; cancel then removes the snapshots too.
    collector(bucket, spec, "0 exited", PATCH)
    kubelet(cluster, spec, {"phase": "Succeeded"})
    watch.sync()
    [done] = finished.pull()
    assert done.payload.termination == "exited" and done.requestid == spec.requestid
    runtime.cancel(spec.sandbox_id, team=TEAM)
    assert sandbox_objects(cluster) == []
    assert api.list("PodSnapshotManualTrigger", NAMESPACE) == []
    assert api.list("PodSnapshot", NAMESPACE) == []


def test_a_sandbox_that_never_suspends_gets_short_lived_urls(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, repo: Repo,
        bucket: storage.Bucket) -> None:
    spec = dataclasses.replace(spec_for(repo, bucket),
                               limits=dataclasses.replace(DEFAULT_LIMITS, idle_seconds=0))
    runtime.start(spec)
    secret = read(cluster, "Secret", sm.object_name(spec.sandbox_id))
    assert secret is not None
    for url in secret["stringData"].values():
        assert "X-Goog-Expires=4500&" in url  # the wall clock (900 s) and an hour


# -- idleness: the monitor measures, the control plane decides and commands ---------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def metrics_server(cluster: EmulatedCluster, sandbox_id: str, cpu: str, clock: Clock) -> None:
    """Play metrics-server: the sandbox Pod's latest PodMetrics (its task's CPU now)."""
    api = client.CustomObjectsApi(cluster.api_client)
    name = sm.object_name(sandbox_id)
    body = {"apiVersion": "metrics.k8s.io/v1beta1", "kind": "PodMetrics",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "timestamp": clock.now.isoformat().replace("+00:00", "Z"), "window": "15s",
            "containers": [{"name": "task", "usage": {"cpu": cpu, "memory": "40Mi"}},
                           {"name": "collector", "usage": {"cpu": "90m", "memory": "8Mi"}}]}
    try:
        api.create_namespaced_custom_object("metrics.k8s.io", "v1beta1", NAMESPACE, "pods",
                                            body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        api.patch_namespaced_custom_object("metrics.k8s.io", "v1beta1", NAMESPACE, "pods",
                                           name, body)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def idle_watch(cluster: EmulatedCluster, bucket: storage.Bucket, clock: Clock,
               emulator_env: dict[str, str]) -> SandboxWatch:
    kube = KubeCluster(cluster.api_client)
    return SandboxWatch(kube.pods, kube, bucket.client,
                        PubSubPublisher(emulator_env["STASIS_PROJECT"], origin="monitor"),
                        snapshots=kube,
                        metrics=kube, clock=clock)


@pytest.fixture
def idle(emulator_env: dict[str, str]) -> Finished:
    return Finished(emulator_env["STASIS_PROJECT"], "sandbox.idle_detected")


def sample(cluster: EmulatedCluster, watch: SandboxWatch, clock: Clock,
           cpus: dict[str, str], seconds: float = 60) -> None:
    """``seconds`` later: metrics-server's new samples, then one monitor pass."""
    clock.advance(seconds)
    for sandbox_id, cpu in cpus.items():
        metrics_server(cluster, sandbox_id, cpu, clock)
    watch.sync()


def test_an_idle_pod_is_reported_once_and_a_busy_one_never(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, idle_watch: SandboxWatch,
        repo: Repo, bucket: storage.Bucket, clock: Clock, idle: Finished) -> None:
    quiet, busy, never = (spec_for(repo, bucket, sandbox_id) for sandbox_id in
                          ("sbx-quiet", "sbx-busy", "sbx-never"))
    never = dataclasses.replace(never, limits=dataclasses.replace(DEFAULT_LIMITS,
                                                                  idle_seconds=0))
    for spec in (quiet, busy, never):
        runtime.start(spec)
        kubelet(cluster, spec, {"phase": "Running"})
    pod = read(cluster, "Pod", sm.object_name(quiet.sandbox_id))
    assert pod is not None and pod["metadata"]["annotations"][ANN_IDLE_SECONDS] == "600"

    cpus = {quiet.sandbox_id: "1200000n", busy.sandbox_id: "2m", never.sandbox_id: "0"}
    sample(cluster, idle_watch, clock, cpus, 0)
    for _ in range(9):  # 540 s below 5 millicores, except the busy one's bursts
        sample(cluster, idle_watch, clock, cpus)
        cpus[busy.sandbox_id] = "300m" if cpus[busy.sandbox_id] == "2m" else "2m"
    assert idle.none_pending()  # not idle long enough yet
    sample(cluster, idle_watch, clock, cpus)
    sample(cluster, idle_watch, clock, cpus)
    [event] = idle.pull()
    assert event.requestid == f"{quiet.requestid}.idle-1"
    payload = event.payload
    assert (payload.sandbox_id, payload.sequence, payload.samples) == (quiet.sandbox_id, 1, 11)
    assert payload.idle_seconds >= 600 and payload.peak_millicores == 1.2
    assert payload.threshold_millicores == 5.0 and "task" in payload.measured
    for _ in range(3):
        sample(cluster, idle_watch, clock, cpus)
    assert idle.none_pending()  # one report per idle period, and never the busy one

    # A restarted monitor measures from scratch and reports the same period under the
    # same id, which the control plane's ledger absorbs.
    kube = KubeCluster(cluster.api_client)
    restarted = SandboxWatch(kube.pods, kube, bucket.client, idle_watch.bus, snapshots=kube,
                             metrics=kube, clock=clock)
    sample(cluster, restarted, clock, cpus, 0)
    assert idle.none_pending()
    for _ in range(10):
        sample(cluster, restarted, clock, cpus)
    [again] = idle.pull()
    assert (again.id, again.requestid) == (event.id, event.requestid)


def test_without_the_metrics_api_no_sandbox_is_reported_idle(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, repo: Repo,
        bucket: storage.Bucket, clock: Clock, idle: Finished,
        caplog: pytest.LogCaptureFixture) -> None:
    # No metrics-server: the API server answers 404 (and nothing may be written there).
    del cluster.emulator.resources["metrics.k8s.io/v1beta1/pods"]
    assert KubeCluster(cluster.api_client).pod_metrics() is None
    spec = spec_for(repo, bucket)
    runtime.start(spec)
    kubelet(cluster, spec, {"phase": "Running"})
    kube = KubeCluster(cluster.api_client)
    watch = SandboxWatch(kube.pods, kube, bucket.client,
                         PubSubPublisher(os.environ["STASIS_PROJECT"], origin="monitor"),
                         snapshots=kube,
                         metrics=kube, clock=clock)
    with caplog.at_level("WARNING", logger="runtime.kubernetes.sandbox_watch"):
        for _ in range(12):
            clock.advance(60)
            watch.sync()
    assert idle.none_pending()
    warnings = [r.getMessage() for r in caplog.records if "metrics-server" in r.getMessage()]
    assert len(warnings) == 1  # said once, not every pass


def test_an_idle_sandbox_is_suspended_by_the_control_plane_and_resumed(
        cluster: EmulatedCluster, runtime: KubernetesSandboxRuntime, idle_watch: SandboxWatch,
        repo: Repo, bucket: storage.Bucket, clock: Clock, idle: Finished,
        suspended: Finished, emulator_env: dict[str, str]) -> None:
    """sandbox.requested -> the handler starts the Pod; the monitor sees it idle ->
    sandbox.idle_detected -> the handler (Firestore emulator) has the runtime create a Pod
    Snapshot trigger -> GKE (played) snapshots -> sandbox.suspended -> SUSPENDED, the Pod
    released -> resumed from the snapshot, and measured again as a new period."""
    import yaml
    from google.cloud import firestore

    from events import SandboxRequested, SandboxResumeRequested, new_event
    from functions.adapters.firestore_store import FirestoreStore
    from functions.adapters.sandbox_store import FirestoreSandboxStore
    from functions.domain.catalog import Catalog
    from functions.handlers import sandboxes as handler
    from functions.handlers.deps import Deps
    from functions.handlers.sandbox_ports import SandboxDeps

    root = Path(__file__).resolve().parents[2]
    catalog = Catalog.from_config(yaml.safe_load((root / "examples" / "stasis.yaml").read_text()))
    db = firestore.Client(project=emulator_env["STASIS_PROJECT"])
    # what the handler records, it tells on sandbox.state_changed (from its outbox)
    changes = Finished(emulator_env["STASIS_PROJECT"], "sandbox.state_changed")
    deps = Deps(store=FirestoreStore(db), bus=idle_watch.bus, runtime=None,  # type: ignore[arg-type]
                snapshots=None, catalog=lambda: catalog,  # type: ignore[arg-type]
                clock=clock, snapshot_bucket=bucket.name,
                dead_letters=None,  # type: ignore[arg-type]
                sandboxes=SandboxDeps(FirestoreSandboxStore(db), runtime))
    sandbox_id = "sbx-idle"
    requested = new_event(SandboxRequested(sandbox_id=sandbox_id, team=TEAM, requester="alice",
                                           repository=repo.url, command=FIX, base_ref="main",
                                           limits={"idle_seconds": 120}),
                          source="//test", requestid="req-idle")
    handler.handle(requested, deps, "on_sandbox_requested")
    pod_name = sm.object_name(sandbox_id)
    assert read(cluster, "Pod", pod_name) is not None
    kubelet(cluster, spec_for(repo, bucket, sandbox_id), {"phase": "Running"})

    for _ in range(4):
        sample(cluster, idle_watch, clock, {sandbox_id: "0"})
    [report] = idle.pull()
    assert report.payload.idle_seconds >= 120 and report.requestid == "req-idle.idle-1"
    decision = handler.handle(report, deps, "on_sandbox_idle_detected")
    assert decision is not None and decision.reason == "suspending_idle"
    assert handler.handle(report, deps, "on_sandbox_idle_detected") is None  # a redelivery
    api = KubeApi(cluster.api_client)
    [trigger] = api.list("PodSnapshotManualTrigger", NAMESPACE)
    assert trigger["spec"] == {"targetPod": pod_name}
    annotations = trigger["metadata"]["annotations"]
    assert (annotations[ANN_SEQUENCE], annotations[ANN_IDLE_SECONDS]) == (
        "1", str(report.payload.idle_seconds))
    doc = db.collection("sandboxes").document(sandbox_id).get().to_dict()
    assert doc["state"] == "RUNNING"  # until the runtime says it holds it

    sample(cluster, idle_watch, clock, {sandbox_id: "0"}, 600)
    assert idle.none_pending()  # being snapshotted: not measured
    gke_completes_snapshot(cluster, trigger["metadata"]["name"])
    idle_watch.sync()
    [held] = suspended.pull()
    assert (held.payload.sequence, held.payload.method) == (1, "pod")
    handler.handle(held, deps, "on_sandbox_suspended")
    doc = db.collection("sandboxes").document(sandbox_id).get().to_dict()
    assert (doc["state"], doc["suspensions"]) == ("SUSPENDED", 1)
    assert read(cluster, "Pod", pod_name) is None  # released
    sample(cluster, idle_watch, clock, {sandbox_id: "0"}, 600)
    assert idle.none_pending()

    resume = new_event(SandboxResumeRequested(sandbox_id, "alice"), source="//test")
    handler.handle(resume, deps, "on_sandbox_resume_requested")
    restored = read(cluster, "Pod", pod_name)
    assert restored is not None and PS_NAME_ANNOTATION in restored["metadata"]["annotations"]
    kubelet(cluster, spec_for(repo, bucket, sandbox_id), {"phase": "Running"})
    sample(cluster, idle_watch, clock, {sandbox_id: "0"})
    sample(cluster, idle_watch, clock, {sandbox_id: "40m"})  # it works again: not idle
    for _ in range(4):
        sample(cluster, idle_watch, clock, {sandbox_id: "0"})
    [second] = idle.pull()
    assert second.requestid == "req-idle.idle-2" and second.payload.sequence == 2
    assert second.payload.samples == 3  # counted from the last busy sample
    decision = handler.handle(second, deps, "on_sandbox_idle_detected")
    assert decision is not None and decision.suspend[0].sequence == 2
    assert len(api.list("PodSnapshotManualTrigger", NAMESPACE)) == 2
    told = sorted((e.payload.version, e.payload.to_state, e.payload.method)
                  for e in changes.pull(want=3))
    assert told == [(1, "RUNNING", ""), (2, "SUSPENDED", "pod"), (3, "RUNNING", "")]
