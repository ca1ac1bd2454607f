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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from runtime.local.jobs import FRAMEWORKS, JobFailed, LocalJob, jax_initialize, new_job_id

__all__ = ["ControlPlane", "Job", "JobFailed", "JobRefused", "jax_initialize", "submit"]


class JobRefused(RuntimeError):
    """The control plane did not admit the job (the message says why and what to do)."""


class ControlPlane(Protocol):
    """Admission and release of a job's accelerators (job.submitted / job.finished)."""

    def submitted(self, job_id: str, *, profile: str, hosts: int, function: str) -> None:
        """Returns once the job is admitted; raises :class:`JobRefused` otherwise."""
        ...

    def finished(self, job_id: str, *, succeeded: bool, termination: str,
                 exit_status: int | None, failed_host: int | None, error: str | None,
                 log_uri: str | None, duration_ms: int) -> None: ...


Job = LocalJob


def submit(fn: Callable[..., Any], *args: Any, profile: str = "cpu-small", hosts: int = 1,
           kwargs: Mapping[str, Any] | None = None, job_id: str | None = None,
           env: Mapping[str, str] | None = None, framework: str = "torch",
           control_plane: ControlPlane | str | None = "auto") -> LocalJob:
    """Run ``fn(*args, **kwargs)`` on ``hosts`` hosts of ``profile``; returns once the job
    is admitted and started (raises :class:`JobRefused` if it is not admitted).

    ``control_plane``: ``"auto"`` (the default) admits through the control plane when this
    kernel runs in a workspace of one (``stasis.control_plane.available()``), and runs
    without admission otherwise; ``None`` never asks.

    ``framework``: the distributed system every host joins before ``fn`` runs: ``"torch"``
    (a gloo process group, when torch is installed), ``"jax"`` or ``"none"``.
    """
    if control_plane == "auto":
        from stasis import control_plane as cp

        control_plane = cp.from_environment() if cp.available() else None
    assert control_plane is None or not isinstance(control_plane, str)
    if framework not in FRAMEWORKS:  # before admission: nothing to give back
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, "
                         f"got {framework!r}")
    job_id = job_id or new_job_id()
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
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
