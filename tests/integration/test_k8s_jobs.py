"""Scale-out jobs on the Kubernetes runtime, over HTTP against kmock's KubernetesEmulator,
with the Firestore and Pub/Sub emulators and fake-gcs-server.

The control plane admits job.submitted and, through the ledger's outbox (sent again when a
retry finds it pending), applies the coordinator Service and the JobSet
(``KubernetesJobRuntime``), which validate against the JobSet CRD and the Kubernetes
schemas; a redelivery changes nothing. The tests play the
JobSet controller and the kubelet (pods and ``status`` patched in, or the hosts run for
real as processes: ``job_pods``); the job watcher turns the JobSet's end into job.finished
on a real Pub/Sub topic, with the host that failed first and its traceback (the
monitor stays read-only); delivered to the handler, the job is recorded, the team's chips
come back and the JobSet and its Service are deleted.
From the notebook side, ``stasis.jobs.submit(..., runtime="kubernetes")`` runs a torch
all-reduce on real hosts, streams their log chunks and reads the result; ``cancel()`` ends
a job through the control plane, which deletes its JobSet.

A K3s test (a real cluster with the JobSet controller, from its release manifests, and an
image with torch) skips with the reason where Docker is absent.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from crd_schemas import jobset_schema
from google.cloud import firestore, pubsub_v1
from job_pods import start_hosts
from k8s_emulator import EmulatedCluster, emulated_cluster

from events import from_pubsub, new_event, spec_for
from events.payloads import JobFinished, JobSubmitted
from functions.adapters.firestore_store import FirestoreStore
from functions.adapters.job_store import FirestoreJobStore
from functions.adapters.pubsub_bus import PubSubBus
from functions.domain.catalog import Catalog
from functions.handlers import jobs as handler
from functions.kubernetes.api import KubeApi
from functions.kubernetes.jobs import KubernetesJobRuntime
from functions.kubernetes.objects import jobset as js
from functions.kubernetes.objects.hardware import GKE_TPU_TOPOLOGY
from functions.kubernetes.objects.meta import ANN_REQUESTID
from functions.ports import JobRun
from runtime.kubernetes.cluster import KubeCluster
from runtime.kubernetes.job_watch import JobWatch
from runtime.local.publisher import PubSubPublisher
from runtime.snapshot.storage import ObjectStore

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CONFIG = yaml.safe_load((ROOT / "examples/stasis.yaml").read_text())
# A multi-host TPU shape: 4 chips a host, so 2 hosts (a 2x4 slice) are team ml-a's 8 chips.
_V5E_4 = {**copy.deepcopy(next(p for p in CONFIG["profiles"] if p["id"] == "tpu-v5e-8")),
          "id": "tpu-v5e-4", "title": "TPU v5e, 4 chips a host",
          "accelerator": {"type": "tpu-v5-lite-podslice", "count": 4, "topology": "2x2"},
          "node_selector": {}}
CONFIG["profiles"].append(_V5E_4)
next(t for t in CONFIG["teams"] if t["id"] == "ml-a")["profiles"].append("tpu-v5e-4")
CATALOG = Catalog.from_config(CONFIG)
NAMESPACE = "stasis-ml-a"
AGENT_IMAGE = "stasis-agent:test"


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    with emulated_cluster() as running:
        yield running


@pytest.fixture
def env(emulator_env: dict[str, str], cluster: EmulatedCluster) -> Any:
    project, bucket = emulator_env["STASIS_PROJECT"], emulator_env["STASIS_SNAPSHOT_BUCKET"]
    db = firestore.Client(project=project)
    db.collection("teams").document("ml-a").set(
        {"id": "ml-a", "usage": {"workspaces": 1, "gpus": 0, "tpus": 0, "snapshot_bytes": 0}})
    objects = ObjectStore(emulator_host=emulator_env["STORAGE_EMULATOR_HOST"])
    objects.client.create_bucket(bucket)
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(project, spec_for("job.finished").topic)
    publisher.create_topic(name=topic)
    # the handler's outbox publishes each recorded change, as on the stack's topology
    publisher.create_topic(name=publisher.topic_path(project, spec_for("job.state_changed").topic))
    subscription = subscriber.subscription_path(project, "test-job-finished")
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    runtime = KubernetesJobRuntime(
        cluster.api_client, catalog=lambda: CATALOG, bucket=bucket, image="stasis-env:test",
        source_image=AGENT_IMAGE,
        env={"STORAGE_EMULATOR_HOST": emulator_env["STORAGE_EMULATOR_HOST"],
             "STASIS_JOB_LOG_INTERVAL": "0.5"})
    deps = SimpleNamespace(jobs=FirestoreJobStore(db), catalog=lambda: CATALOG,
                           clock=lambda: datetime.now(UTC), job_runtime=runtime,
                           bus=PubSubBus(project, origin="on_job_submitted"),
                           store=FirestoreStore(db))
    kube = KubeApi(cluster.api_client)
    watch = JobWatch(KubeCluster(cluster.api_client),
                     PubSubPublisher(project, origin="monitor"), objects)
    return SimpleNamespace(db=db, deps=deps, kube=kube, watch=watch, objects=objects,
                           bucket=bucket, project=project, subscription=subscription,
                           subscriber=subscriber, runtime=runtime,
                           emulator_env=emulator_env)


def submitted(env: Any, job_id: str, profile: str, hosts: int,
              topology: str | None = None) -> Any:
    uri = f"gs://{env.bucket}/{js.job_prefix('ml-a', job_id)}/{js.PAYLOAD}"
    return new_event(JobSubmitted(job_id=job_id, team="ml-a", owner="alice", profile=profile,
                                  hosts=hosts, workspace_id="ml-a--nb", runtime="kubernetes",
                                  function="train", payload_uri=uri, topology=topology),
                     source="//stasis/notebook", requestid=f"submit-{job_id}")


def deliver(env: Any, event: Any) -> Any:
    consumer = "on_job_submitted" if event.name == "job.submitted" else "on_job_finished"
    return handler.handle(event, env.deps, consumer)


def job(env: Any, job_id: str) -> dict[str, Any]:
    return env.db.collection("jobs").document(job_id).get().to_dict() or {}


def usage(env: Any) -> dict[str, int]:
    return env.db.collection("teams").document("ml-a").get().to_dict()["usage"]


def jobsets(env: Any) -> list[dict[str, Any]]:
    return env.kube.list("JobSet", NAMESPACE)


def pull(env: Any, want: int, timeout: float = 20) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        response = env.subscriber.pull(request={"subscription": env.subscription,
                                                "max_messages": 10,
                                                "return_immediately": True}, timeout=10)
        for received in response.received_messages:
            got.append(from_pubsub(received.message.data, dict(received.message.attributes)))
        if response.received_messages:
            env.subscriber.acknowledge(request={"subscription": env.subscription, "ack_ids": [
                m.ack_id for m in response.received_messages]})
        else:
            time.sleep(0.1)
    return got


def pod(job_id: str, host: int, phase: str, exit_code: int | None = None,
        finished_at: str = "2026-12-01T12:00:10Z", reason: str = "Error",
        waiting: str | None = None) -> dict[str, Any]:
    """A pod of the JobSet's Job, as the Job controller and the kubelet would make it."""
    status: dict[str, Any] = {"phase": phase}
    container = {"name": "worker", "image": "stasis-env:test", "imageID": "", "ready": False,
                 "restartCount": 0}
    if exit_code is not None:
        status["containerStatuses"] = [{**container, "state": {"terminated": {
            "exitCode": exit_code, "reason": reason, "finishedAt": finished_at}}}]
    if waiting:
        status["containerStatuses"] = [{**container, "state": {"waiting": {
            "reason": waiting, "message": "no such image"}}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job_id}-workers-0-{host}-x{host}", "namespace": NAMESPACE,
                         "labels": {js.JOBSET_NAME_LABEL: job_id},
                         "annotations": {js.COMPLETION_INDEX_KEY: str(host)}},
            "spec": {"containers": [{"name": "worker", "image": "stasis-env:test"}]},
            "status": status}


def end_jobset(env: Any, job_id: str, state: str) -> None:
    """Play the JobSet controller: the JobSet's terminal state and condition."""
    env.kube.patch("JobSet", NAMESPACE, job_id, {"status": {
        "terminalState": state,
        "conditions": [{"type": state, "status": "True", "reason": f"AllJobs{state}",
                        "message": f"jobset {state.lower()}",
                        "lastTransitionTime": "2026-12-01T12:00:11Z"}]}})


def test_admission_applies_a_valid_jobset_once(env: Any) -> None:
    event = submitted(env, "job-tpu-a", "tpu-v5e-4", 2, topology="2x4")
    decision = deliver(env, event)
    assert decision is not None and decision.accepted
    assert job(env, "job-tpu-a")["state"] == "RUNNING" and usage(env)["tpus"] == 8
    obj = env.kube.read("JobSet", NAMESPACE, "job-tpu-a")
    svc = env.kube.read("Service", NAMESPACE, "job-tpu-a")
    assert obj is not None and svc is not None
    served = {k: obj[k] for k in ("apiVersion", "kind", "spec")}
    served["metadata"] = {k: v for k, v in obj["metadata"].items()
                          if k in ("name", "namespace", "labels", "annotations")}
    jsonschema.validate(served, jobset_schema())
    template = obj["spec"]["replicatedJobs"][0]["template"]
    kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job",
                                  "metadata": {"name": "x", **template["metadata"]},
                                  "spec": template["spec"]}, "1.35", strict=True)
    kubernetes_validate.validate({k: svc[k] for k in ("apiVersion", "kind", "spec")} | {
        "metadata": {"name": svc["metadata"]["name"]}}, "1.35", strict=True)
    pod_spec = template["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"][GKE_TPU_TOPOLOGY] == "2x4"
    assert pod_spec["initContainers"][0]["image"] == AGENT_IMAGE
    container = pod_spec["containers"][0]
    assert container["command"] == list(js.HOST_COMMAND)
    values = {e["name"]: e.get("value") for e in container["env"]}
    assert values["STASIS_JOB_URI"] == f"gs://{env.bucket}/jobs/ml-a/job-tpu-a"
    assert values["PYTHONPATH"] == js.SOURCE_MOUNT
    assert obj["metadata"]["annotations"][ANN_REQUESTID] == "submit-job-tpu-a"
    # the ledger entry's outbox was sent and marked done
    ledger = [d.to_dict() for d in env.db.collection("processed").stream()]
    assert [(d["status"], d["outbox"]) for d in ledger] == [("done", [])]

    # a redelivered submission, and the outbox sent again, change nothing
    assert deliver(env, event) is None
    env.runtime.start(JobRun("job-tpu-a", "ml-a", "alice", "tpu-v5e-4", 2,
                             values["STASIS_JOB_URI"] + "/payload.pkl", "submit-job-tpu-a",
                             topology="2x4"))
    assert [j["metadata"]["name"] for j in jobsets(env)] == ["job-tpu-a"]
    assert env.runtime.job_ids() == {"job-tpu-a"}  # what the reconciler checks
    assert usage(env)["tpus"] == 8

    # over the quota: refused, nothing applied
    refused = deliver(env, submitted(env, "job-tpu-b", "tpu-v5e-8", 1))
    assert refused is not None and not refused.accepted
    assert [j["metadata"]["name"] for j in jobsets(env)] == ["job-tpu-a"]


def test_an_outbox_that_failed_is_sent_again_on_redelivery(env: Any) -> None:
    """The API server was unreachable after the admission committed: the ledger entry stays
    pending with its outbox, the event is retried, and the retry starts the job once."""
    from functions.ports import OutboxUnsent, RuntimeUnavailable

    real, calls = env.runtime, []

    class Flaky:
        name = "kubernetes"

        def start(self, run: JobRun) -> None:
            calls.append(run.job_id)
            if len(calls) == 1:
                raise RuntimeUnavailable("Kubernetes API unreachable")
            real.start(run)

        def cancel(self, job_id: str, *, team: str) -> None:
            real.cancel(job_id, team=team)

    env.deps.job_runtime = Flaky()
    event = submitted(env, "job-retry", "cpu-small", 2)
    with pytest.raises(OutboxUnsent) as unsent:
        deliver(env, event)
    assert isinstance(unsent.value.__cause__, RuntimeUnavailable)
    assert job(env, "job-retry")["state"] == "RUNNING" and not jobsets(env)
    (entry,) = [d.to_dict() for d in env.db.collection("processed").stream()]
    assert entry["status"] == "pending" and entry["outbox"][0] == {
        "command": "StartJob", "fields": {
            "job_id": "job-retry", "team": "ml-a", "owner": "alice", "profile": "cpu-small",
            "hosts": 2, "payload_uri": event.payload.payload_uri, "topology": None,
            "workspace_id": "ml-a--nb"}}
    assert deliver(env, event) is None  # a duplicate for the ledger, but its outbox is sent
    assert calls == ["job-retry", "job-retry"]
    assert [j["metadata"]["name"] for j in jobsets(env)] == ["job-retry"]
    (entry,) = [d.to_dict() for d in env.db.collection("processed").stream()]
    assert (entry["status"], entry["outbox"]) == ("done", [])
    assert deliver(env, event) is None and calls == ["job-retry", "job-retry"]


def test_a_slice_that_cannot_exist_fails_to_start_and_gives_the_chips_back(env: Any) -> None:
    # 2 hosts of 4 chips without a topology: admitted (quota), refused by the runtime
    assert deliver(env, submitted(env, "job-no-topo", "tpu-v5e-4", 2)).accepted
    (event,) = pull(env, 1)
    assert event.payload.termination == "failed_to_start"
    assert "name the slice topology" in event.payload.error
    assert not jobsets(env)
    deliver(env, event)
    assert job(env, "job-no-topo")["state"] == "FAILED" and usage(env)["tpus"] == 0


def test_the_watcher_names_the_first_failed_host_and_releases_the_slice(env: Any) -> None:
    assert deliver(env, submitted(env, "job-fail", "tpu-v5e-4", 2, topology="2x4")).accepted
    assert env.watch.sync() is True  # running: nothing to report
    assert pull(env, 1, timeout=1) == []
    prefix = js.job_prefix("ml-a", "job-fail")
    # host 1 failed first (its own record); host 0 was killed a moment later, without one
    env.objects.put_bytes(env.bucket, f"{prefix}/{js.exit_record(1)}", json.dumps(
        {"host": 1, "exit_status": 1, "finished_ms": 1_796_126_409_000}).encode(),
        "application/json")
    env.objects.put_bytes(env.bucket, f"{prefix}/{js.traceback_object(1)}",
                          b"Traceback (most recent call last):\n  File \"train.py\"\n"
                          b"RuntimeError: host 1 lost its data", "text/plain")
    env.objects.put_bytes(env.bucket, f"{prefix}/{js.log_chunk(1, 0)}", b"step 1\n",
                          "text/plain")
    for p in (pod("job-fail", 0, "Failed", 137, "2026-12-01T12:00:15Z"),
              pod("job-fail", 1, "Failed", 1, "2026-12-01T12:00:10Z")):
        env.kube.create(p)
    end_jobset(env, "job-fail", "Failed")
    assert env.watch.sync() is False
    (event,) = pull(env, 1)
    finished = event.payload
    assert isinstance(finished, JobFinished) and not finished.succeeded
    assert (finished.termination, finished.failed_host, finished.exit_status) == (
        "host_failed", 1, 1)
    assert finished.error.startswith("host 1 exited with status 1; its log:\nTraceback")
    assert "RuntimeError: host 1 lost its data" in finished.error
    assert finished.log_uri == f"gs://{env.bucket}/{prefix}/logs/"
    assert event.requestid == "finish-job-fail"
    # reported once; a restarted watcher reports it again, as the same event
    assert env.watch.sync() is False and pull(env, 1, timeout=1) == []
    restarted = JobWatch(env.watch.kube,
                         PubSubPublisher(env.project, origin="monitor"), env.objects)
    assert restarted.sync() is False
    (again,) = pull(env, 1)
    assert (again.id, again.requestid) == (event.id, event.requestid)

    # the control plane records the end, gives the chips back and deletes the objects
    deliver(env, event)
    doc = job(env, "job-fail")
    assert doc["state"] == "FAILED" and doc["failed_host"] == 1
    assert "host 1 lost its data" in doc["message"]
    assert usage(env)["tpus"] == 0
    assert env.kube.read("JobSet", NAMESPACE, "job-fail") is None
    assert env.kube.read("Service", NAMESPACE, "job-fail") is None
    assert deliver(env, again) is None and usage(env)["tpus"] == 0


def test_a_host_whose_image_cannot_be_pulled_fails_to_start(env: Any) -> None:
    assert deliver(env, submitted(env, "job-pull", "cpu-small", 2)).accepted
    env.kube.create(pod("job-pull", 0, "Running"))
    env.kube.create(pod("job-pull", 1, "Pending", waiting="ImagePullBackOff"))
    assert env.watch.sync() is False
    (event,) = pull(env, 1)
    assert event.payload.termination == "failed_to_start"
    assert event.payload.failed_host == 1 and "ImagePullBackOff" in event.payload.error
    deliver(env, event)
    assert job(env, "job-pull")["state"] == "FAILED" and not jobsets(env)


def test_a_jobset_deleted_while_running_loses_its_job(env: Any) -> None:
    assert deliver(env, submitted(env, "job-gone", "tpu-v5e-8", 1)).accepted
    assert env.watch.sync() is True and usage(env)["tpus"] == 8
    env.kube.delete("JobSet", NAMESPACE, "job-gone")  # by hand, outside Stasis
    assert env.watch.sync() is False
    (event,) = pull(env, 1)
    assert event.payload.termination == "runtime_lost" and "went away" in event.payload.error
    deliver(env, event)
    assert job(env, "job-gone")["state"] == "FAILED" and usage(env)["tpus"] == 0
    assert env.kube.read("Service", NAMESPACE, "job-gone") is None
    assert env.watch.sync() is False and pull(env, 1, timeout=1) == []


def all_reduce(scale: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1) * scale])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} sum {int(t.item())}", flush=True)
    return int(t.item())


def test_the_notebook_runs_real_hosts_follows_their_logs_and_cancels(env: Any) -> None:
    pytest.importorskip("torch")
    import stasis.jobs
    from stasis.control_plane import EventControlPlane

    cp = EventControlPlane(lambda e: deliver(env, e), lambda i: job(env, i) or None,
                           team="ml-a", owner="alice", workspace_id="ml-a--nb")
    running = stasis.jobs.submit(all_reduce, 5, profile="cpu-small", hosts=2,
                                 job_id="job-nb", runtime="kubernetes", control_plane=cp,
                                 bucket=env.bucket, home=HERE)
    assert isinstance(running, stasis.jobs.KubernetesJob)
    obj = env.kube.read("JobSet", NAMESPACE, "job-nb")
    assert obj is not None and running.status() == "RUNNING"
    # the kubelet's part: the pods' command, with the pods' environment, for real
    hosts = start_hosts(obj)
    codes = [p.wait(timeout=240) for p in hosts]
    assert codes == [0, 0], [p.stdout.read() for p in hosts if p.stdout]
    end_jobset(env, "job-nb", "Completed")
    assert env.watch.sync() is False
    (event,) = pull(env, 1)
    assert event.payload.succeeded and event.payload.failed_host is None
    deliver(env, event)
    assert running.status() == "SUCCEEDED" and not jobsets(env)
    lines = list(running.logs())
    assert "[host 0] rank 0 sum 15" in lines and "[host 1] rank 1 sum 15" in lines
    assert running.result(timeout=10) == 15

    # cancel: job.finished "cancelled" through the control plane, which deletes the JobSet
    other = stasis.jobs.submit(all_reduce, 1, profile="cpu-small", hosts=2,
                               job_id="job-nb-cancel", runtime="kubernetes",
                               control_plane=cp, bucket=env.bucket, home=HERE)
    assert env.kube.read("JobSet", NAMESPACE, "job-nb-cancel") is not None
    assert other.cancel(timeout=30) == "CANCELLED"
    assert env.kube.read("JobSet", NAMESPACE, "job-nb-cancel") is None
    assert env.kube.read("Service", NAMESPACE, "job-nb-cancel") is None
    with pytest.raises(stasis.jobs.JobFailed, match="cancelled"):
        other.result(timeout=5)


def test_a_refused_notebook_job_leaves_no_objects(env: Any) -> None:
    import stasis.jobs
    from stasis.control_plane import EventControlPlane

    cp = EventControlPlane(lambda e: deliver(env, e), lambda i: job(env, i) or None,
                           team="ml-a", owner="alice", workspace_id="ml-a--nb")
    with pytest.raises(stasis.jobs.JobRefused, match="needs 16"):
        stasis.jobs.submit(all_reduce, 1, profile="tpu-v5e-8", hosts=2, job_id="job-big",
                           runtime="kubernetes", control_plane=cp, bucket=env.bucket,
                           home=HERE)
    assert env.objects.list_objects(env.bucket, "jobs/ml-a/job-big/") == {}
    assert not jobsets(env)


# -- a real cluster ---------------------------------------------------------------------------

JOB_IMAGE = "stasis-job-env:k3s-test"
JOB_DOCKERFILE = """\
FROM python:3.11-slim
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \\
 && pip install --no-cache-dir "cloudpickle>=3,<4" "google-cloud-storage>=2.18,<4" \\
      "requests>=2.32,<3"
"""
JOBSET_RELEASE = ("https://github.com/kubernetes-sigs/jobset/releases/download/v0.10.1/"
                  "manifests.yaml")
GCS_NODE_PORT = 30443


@pytest.fixture(scope="module")
def k3s_jobs() -> Iterator[Any]:
    """K3s in Docker with the JobSet controller (its release manifests, from the network),
    fake-gcs-server in the cluster (reached from here through a NodePort), and the images
    the job needs: the agent (Stasis) and an environment with torch."""
    import test_k3s_runtime as k3s

    client = k3s._docker_or_skip()
    from kubernetes import client as kube
    from kubernetes import config
    from testcontainers.community.k3s import K3SContainer

    k3s._build(client, k3s.AGENT_IMAGE, dockerfile="runtime/kubernetes/Dockerfile.agent")
    k3s._build(client, JOB_IMAGE, inline=JOB_DOCKERFILE)
    k3s._build(client, k3s.GCS_IMAGE, inline=k3s.GCS_DOCKERFILE)
    with K3SContainer().with_exposed_ports(GCS_NODE_PORT) as cluster:
        for tag in (k3s.AGENT_IMAGE, JOB_IMAGE, k3s.GCS_IMAGE):
            k3s._import_image(client, cluster, tag)
        applied = cluster.get_wrapped_container().exec_run(
            ["kubectl", "apply", "--server-side", "-f", JOBSET_RELEASE])
        assert applied.exit_code == 0, applied.output.decode(errors="replace")
        configuration = kube.Configuration()
        config.load_kube_config_from_dict(yaml.safe_load(cluster.config_yaml()),
                                          client_configuration=configuration)
        api = kube.ApiClient(configuration)
        k3s._start_gcs(api)
        kube.CoreV1Api(api).create_namespaced_service("stasis-system", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "gcs-node"},
            "spec": {"type": "NodePort", "selector": {"app": "gcs"}, "ports": [
                {"port": 4443, "targetPort": 4443, "nodePort": GCS_NODE_PORT}]}})
        apps = kube.AppsV1Api(api)
        k3s._until(lambda: any((d.status.ready_replicas or 0) > 0 for d in
                               apps.list_namespaced_deployment("jobset-system").items),
                   300, "the JobSet controller")
        host = cluster.get_container_host_ip()
        yield SimpleNamespace(api=api, bucket=k3s.BUCKET, agent_image=k3s.AGENT_IMAGE,
                              until=k3s._until, gcs=ObjectStore(
                                  emulator_host=f"http://{host}:"
                                                f"{cluster.get_exposed_port(GCS_NODE_PORT)}"))
        api.close()


def test_on_k3s_a_jobset_of_torch_hosts_runs_to_its_end(k3s_jobs: Any) -> None:
    """The whole path on a real cluster: the JobSet controller makes the pods, the hosts
    all-reduce over the headless Service's names, the watcher reports the end."""
    from runtime.local.publisher import RecordingPublisher
    from stasis.jobs import payload_bytes

    config = copy.deepcopy(CONFIG)
    small = next(p for p in config["profiles"] if p["id"] == "cpu-small")
    small.update({"cpu": 0.25, "memory": "1Gi"})  # two hosts fit one K3s node
    catalog = Catalog.from_config(config)
    k8s = k3s_jobs
    job_id = f"job-k3s-{os.urandom(3).hex()}"
    prefix = js.job_prefix("ml-a", job_id)
    k8s.gcs.put_bytes(k8s.bucket, f"{prefix}/{js.PAYLOAD}",
                      payload_bytes(all_reduce, (5,), {}, HERE), "application/octet-stream")
    runtime = KubernetesJobRuntime(
        k8s.api, catalog=lambda: catalog, bucket=k8s.bucket, image=JOB_IMAGE,
        source_image=k8s.agent_image,
        env={"STORAGE_EMULATOR_HOST": "http://gcs.stasis-system.svc.cluster.local:4443"})
    runtime.start(JobRun(job_id, "ml-a", "alice", "cpu-small", 2,
                         f"gs://{k8s.bucket}/{prefix}/{js.PAYLOAD}", "req-k3s"))
    bus = RecordingPublisher()
    watch = JobWatch(KubeCluster(k8s.api), bus, k8s.gcs)

    def finished() -> Any:
        watch.sync()
        return next((e for e in bus.events if e.name == "job.finished"), None)

    event = k8s.until(finished, 600, "job.finished")
    assert event.payload.succeeded, event.payload.error
    assert cloudpickle_loads(k8s.gcs.get_bytes(k8s.bucket, f"{prefix}/{js.RESULT}")) == 15
    logs = "\n".join(k8s.gcs.get_bytes(k8s.bucket, name).decode()
                     for name in k8s.gcs.list_objects(k8s.bucket, f"{prefix}/logs/"))
    assert "rank 0 sum 15" in logs and "rank 1 sum 15" in logs
    runtime.cancel(job_id, team="ml-a")
    kube = KubeApi(k8s.api)
    k8s.until(lambda: kube.read("JobSet", NAMESPACE, job_id) is None, 120, "the JobSet to go")


def cloudpickle_loads(data: bytes) -> Any:
    import cloudpickle

    return cloudpickle.loads(data)
