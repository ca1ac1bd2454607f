"""Scale-out jobs from a notebook: the same function on one host or on a multi-host slice.

    import stasis.jobs

    def train(steps):
        import torch, torch.distributed as dist
        ...                                   # every host runs this; they form one group
        return loss

    job = stasis.jobs.submit(train, 100, profile="cpu-small", hosts=4)
    for line in job.logs():                   # "[host 2] step 10 loss 0.41", as they come
        print(line)
    job.result()                              # host 0's return value, or JobFailed
    job.status(), job.cancel()

The function and its arguments travel with cloudpickle; the notebook's working directory
(the workspace's home) is importable on every host. On the local runtime the hosts are
processes of this machine joined by ``torch.distributed`` (gloo, loopback rendezvous):
``runtime.local.jobs``. A JAX function says ``framework="jax"`` (every host then joins
``jax.distributed`` before it runs; torch is not imported), or calls
``stasis.jobs.jax_initialize()`` first thing itself. With a control plane
(``control_plane=``), the job is first admitted against the team's accelerator quota
(``job.submitted``; refused: ``JobRefused``) and its end gives them back (``job.finished``).

On the Kubernetes runtime (``STASIS_RUNTIME=kubernetes`` in the kernel's environment, which
the workspace pod sets, or ``runtime="kubernetes"``) the same call becomes a JobSet that
the control plane starts: the notebook holds no cluster credentials. It uploads the
pickled ``(fn, args, kwargs)`` to ``gs://BUCKET/jobs/TEAM/ID/payload.pkl`` (the snapshot
bucket, ``STASIS_SNAPSHOT_BUCKET``), publishes job.submitted naming it, and returns a
:class:`KubernetesJob` once admitted. The modules the notebook imported from its home
directory travel inside the pickle (cloudpickle's pickle-by-value), since the hosts do
not mount the workspace's disk; installed packages come from the job's image (the
workspace's environment). ``logs()`` reads the hosts' log chunks from the bucket,
``result()`` host 0's ``result.pkl`` once ``jobs/{id}`` (or every host's exit record) says
the job ended, and ``cancel()`` reports the job's end as ``cancelled`` (job.finished), on
which the control plane deletes the JobSet and gives the accelerators back.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import cloudpickle

from functions.kubernetes.objects import jobset as js
from runtime.local.jobs import FRAMEWORKS, JobFailed, LocalJob, jax_initialize, new_job_id

__all__ = ["ControlPlane", "Job", "JobFailed", "JobRefused", "KubernetesJob",
           "jax_initialize", "submit"]

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "REFUSED")


class JobRefused(RuntimeError):
    """The control plane did not admit the job (the message says why and what to do)."""


class ControlPlane(Protocol):
    """Admission and release of a job's accelerators (job.submitted / job.finished)."""

    def submitted(self, job_id: str, *, profile: str, hosts: int, function: str,
                  **kubernetes: Any) -> None:
        """Returns once the job is admitted; raises :class:`JobRefused` otherwise.
        A kubernetes job adds ``runtime``, ``payload_uri`` and ``topology``."""
        ...

    def finished(self, job_id: str, *, succeeded: bool, termination: str,
                 exit_status: int | None, failed_host: int | None, error: str | None,
                 log_uri: str | None, duration_ms: int) -> None: ...


Job = LocalJob


def submit(fn: Callable[..., Any], *args: Any, profile: str = "cpu-small", hosts: int = 1,
           kwargs: Mapping[str, Any] | None = None, job_id: str | None = None,
           env: Mapping[str, str] | None = None, framework: str = "torch",
           control_plane: ControlPlane | str | None = "auto", runtime: str | None = None,
           topology: str | None = None, bucket: str | None = None,
           home: str | Path | None = None) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``hosts`` hosts of ``profile``; returns once the job
    is admitted and started (raises :class:`JobRefused` if it is not admitted).

    ``control_plane``: ``"auto"`` (the default) admits through the control plane when this
    kernel runs in a workspace of one (``stasis.control_plane.available()``), and runs
    without admission otherwise; ``None`` never asks.

    ``framework``: the distributed system every host joins before ``fn`` runs: ``"torch"``
    (a gloo process group, when torch is installed), ``"jax"`` or ``"none"``.

    ``runtime``: ``"local"`` (a :class:`LocalJob`, processes of this machine) or
    ``"kubernetes"`` (a :class:`KubernetesJob`, a JobSet; it always goes through the
    control plane). Default: ``kubernetes`` where ``STASIS_RUNTIME`` says so, else
    ``local``. ``topology``, ``bucket`` and ``home`` only matter on Kubernetes: a
    multi-host TPU slice's topology, the bucket (``STASIS_SNAPSHOT_BUCKET``), and the
    directory whose modules travel with the function (the working directory). ``env``
    only applies to local hosts (a JobSet's environment is the deployment's).
    """
    runtime = runtime or ("kubernetes" if os.environ.get("STASIS_RUNTIME") == "kubernetes"
                          else "local")
    if runtime == "kubernetes":
        return _submit_kubernetes(fn, args, kwargs, profile=profile, hosts=hosts,
                                  job_id=job_id, framework=framework,
                                  control_plane=control_plane, topology=topology,
                                  bucket=bucket, home=home)
    if runtime != "local":
        raise ValueError(f"runtime must be local or kubernetes, got {runtime!r}")
    if control_plane == "auto":
        from stasis import control_plane as cp

        control_plane = cp.from_environment() if cp.available() else None
    assert control_plane is None or not isinstance(control_plane, str)
    if framework not in FRAMEWORKS:  # before admission: nothing to give back
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, "
                         f"got {framework!r}")
    job_id = job_id or new_job_id()
    name = _function_name(fn)
    if control_plane is not None:
        control_plane.submitted(job_id, profile=profile, hosts=hosts, function=name)

    def report(job: LocalJob) -> None:
        if control_plane is None:
            return
        termination = {"SUCCEEDED": "exited", "CANCELLED": "cancelled"}.get(
            job.state, "host_failed")
        duration = int(((job.finished_at or 0) - (job.started_at or 0)) * 1000)
        control_plane.finished(job.id, succeeded=job.state == "SUCCEEDED",
                               termination=termination, exit_status=job.exit_status,
                               failed_host=job.failed_host, error=job.error,
                               log_uri=job.log_path.as_uri(), duration_ms=max(0, duration))

    job = LocalJob(fn, args, kwargs, hosts=hosts, job_id=job_id, env=env,
                   framework=framework, on_finish=report)
    return job.start()


# -- the Kubernetes runtime -------------------------------------------------------------------


def _function_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _from_home(module: Any, home: Path) -> bool:
    """A module the notebook imported from its home directory (not an installed package,
    even one installed into home with ``pip install --user``)."""
    file = getattr(module, "__file__", None)
    if not file:
        return False
    try:
        path = Path(file).resolve()
    except (OSError, ValueError):
        return False
    return path.is_relative_to(home) and not ({"site-packages", "dist-packages"}
                                              & set(path.parts))


def payload_bytes(fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: Mapping[str, Any] | None, home: str | Path) -> bytes:
    """cloudpickle of ``(fn, args, kwargs)``, the modules imported from ``home`` by value
    (the hosts have the job's image, not the workspace's disk)."""
    root = Path(home).resolve()
    registered = []
    # "/" as home would ship every module that is not an installed package
    for module in list(sys.modules.values()) if root != Path(root.anchor) else []:
        if module is not None and _from_home(module, root):
            try:
                cloudpickle.register_pickle_by_value(module)
            except ValueError:  # not importable by its name (e.g. __main__)
                continue
            registered.append(module)
    try:
        return bytes(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))))
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def _submit_kubernetes(fn: Callable[..., Any], args: tuple[Any, ...],
                       kwargs: Mapping[str, Any] | None, *, profile: str, hosts: int,
                       job_id: str | None, framework: str, control_plane: Any,
                       topology: str | None, bucket: str | None,
                       home: str | Path | None) -> KubernetesJob:
    from runtime.snapshot.storage import get_store

    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, "
                         f"got {framework!r}")
    if control_plane == "auto":
        from stasis import control_plane as cp

        if not cp.available():
            raise RuntimeError("a job on the Kubernetes runtime is started by the control "
                               "plane: STASIS_PROJECT and STASIS_WORKSPACE_ID (or "
                               "STASIS_TEAM) must be set in the kernel's environment")
        control_plane = cp.from_environment()
    if control_plane is None:
        raise ValueError("a job on the Kubernetes runtime needs the control plane")
    bucket = bucket or os.environ.get("STASIS_SNAPSHOT_BUCKET")
    if not bucket:
        raise RuntimeError("STASIS_SNAPSHOT_BUCKET: where does the job's payload go?")
    job_id = job_id or new_job_id()
    team = control_plane.team
    prefix = js.job_prefix(team, job_id)
    store = get_store()
    store.put_bytes(bucket, f"{prefix}/{js.PAYLOAD}",
                    payload_bytes(fn, args, kwargs, home or Path.cwd()),
                    "application/octet-stream")
    store.put_bytes(bucket, f"{prefix}/{js.JOB_SETTINGS}",
                    json.dumps({"framework": framework}).encode(), "application/json")
    try:
        control_plane.submitted(job_id, profile=profile, hosts=hosts,
                                function=_function_name(fn), runtime="kubernetes",
                                payload_uri=f"gs://{bucket}/{prefix}/{js.PAYLOAD}",
                                topology=topology)
    except BaseException:
        # Refused (or not decided): nothing will ever read them.
        store.delete_objects(bucket, list(store.list_objects(bucket, prefix + "/")))
        raise
    return KubernetesJob(job_id, hosts=hosts, team=team, bucket=bucket, store=store,
                         control_plane=control_plane)


class KubernetesJob:
    """A job of the Kubernetes runtime as the notebook sees it: ``jobs/{id}`` in Firestore
    (its state, through the control plane's ``read_job``) and its objects in the bucket."""

    def __init__(self, job_id: str, *, hosts: int, team: str, bucket: str, store: Any,
                 control_plane: Any, poll: float = 1.0) -> None:
        self.id, self.hosts, self.team, self.bucket = job_id, hosts, team, bucket
        self.prefix = js.job_prefix(team, job_id)
        self._store, self._cp, self._poll = store, control_plane, poll
        self.started_at = time.time()

    @property
    def log_uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}/logs/"

    def _doc(self) -> Mapping[str, Any]:
        return self._cp.read_job(self.id) or {}

    def _exits(self) -> dict[int, int]:
        """Host -> exit status, from the hosts' exit records."""
        found = {}
        for name in self._store.list_objects(self.bucket, f"{self.prefix}/hosts/"):
            if name.endswith("/exit.json"):
                record = json.loads(self._store.get_bytes(self.bucket, name))
                found[int(record["host"])] = int(record["exit_status"])
        return found

    def status(self) -> str:
        """``jobs/{id}.state``; SUCCEEDED or FAILED as soon as every host's exit record
        says so, even before the control plane recorded it."""
        state = str(self._doc().get("state") or "SUBMITTED")
        if state in TERMINAL:
            return state
        exits = self._exits()
        if any(code != 0 for code in exits.values()):
            return "FAILED"
        if len(exits) == self.hosts:
            return "SUCCEEDED"
        return state

    def done(self) -> bool:
        return self.status() in TERMINAL

    def wait(self, timeout: float | None = None) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.status()
            if state in TERMINAL:
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {state} after {timeout} s")
            time.sleep(self._poll)

    def logs(self, *, follow: bool = True) -> Iterator[str]:
        """Every host's lines, ``[host N] ...``, chunk by chunk as the hosts upload them;
        with ``follow`` (the default) until the job has ended."""
        seen: set[str] = set()
        while True:
            finished = not follow or self.done()
            names = sorted((n for n in self._store.list_objects(
                self.bucket, f"{self.prefix}/logs/") if n not in seen), key=_chunk_order)
            for name in names:
                seen.add(name)
                host = _chunk_order(name)[0]
                text = self._store.get_bytes(self.bucket, name).decode("utf-8", "replace")
                for line in text.splitlines():
                    yield f"[host {host}] {line}"
            if finished:
                return
            time.sleep(self._poll)

    def result(self, timeout: float | None = None) -> Any:
        """Host 0's return value; raises :class:`JobFailed` if the job did not succeed."""
        from runtime.snapshot.errors import ObjectNotFound

        state = self.wait(timeout)
        if state != "SUCCEEDED":
            doc = self._doc()
            raise JobFailed(str(doc.get("message") or f"job {self.id} {state.lower()}"),
                            failed_host=doc.get("failed_host"),
                            exit_status=doc.get("exit_status"), state=state)
        try:
            return cloudpickle.loads(self._store.get_bytes(
                self.bucket, f"{self.prefix}/{js.RESULT}"))
        except ObjectNotFound:
            raise JobFailed(f"job {self.id} succeeded but host 0 stored no result",
                            state=state) from None

    def cancel(self, timeout: float = 60.0) -> str:
        """Ask the control plane to end the job (job.finished ``cancelled``: it deletes the
        JobSet and gives the accelerators back); returns the state it ended in."""
        if self.done():
            return self.status()
        self._cp.finished(self.id, succeeded=False, termination="cancelled",
                          exit_status=None, failed_host=None,
                          error=f"job {self.id} was cancelled", log_uri=self.log_uri,
                          duration_ms=max(0, int((time.time() - self.started_at) * 1000)))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = str(self._doc().get("state") or "")
            if state in TERMINAL:
                return state
            time.sleep(self._poll)
        return self.status()

    def __repr__(self) -> str:
        return f"<KubernetesJob {self.id} {self.hosts} hosts>"


def _chunk_order(name: str) -> tuple[int, int]:
    """``.../logs/host-<i>/<seq>.txt`` -> (i, seq)."""
    parts = name.rsplit("/", 2)
    return int(parts[-2].removeprefix("host-")), int(parts[-1].split(".")[0])
