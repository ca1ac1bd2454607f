"""What each command of an outbox does: ONE table, :data:`EXECUTORS`, from command type to
the function that carries it out.

A decision's commands (frozen dataclasses of ``functions.domain.lifecycle``, ``.sandboxes``
and ``.jobs``) are committed in its ledger entry's outbox and carried out here once the
transaction has committed (``functions.handlers.pipeline`` sends them). A redelivered event
whose entry is still pending sends its outbox again, perhaps after the subject moved on,
so every executor is idempotent and acts on the subject as it is now: runtime calls are
idempotent, a start first checks that the record is still RUNNING, and a workspace's
Provision, Restore or Release is carried out only while it still applies
(``lifecycle.outdated``).

A runtime that refuses for good (``RuntimeRefused``) is answered as the runtime would have
reported it, so the family's handler records the failure and frees what it held: a refused
provision or restore becomes workspace.runtime_failed, a refused snapshot a failed
snapshot.finished, a sandbox that cannot start (or resume) a sandbox.finished
``failed_to_start`` (``runtime_lost``), a job that cannot start a job.finished
``failed_to_start``. A refused sandbox suspension or release is logged and not retried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from events import Event, SandboxFinished, SnapshotFinished, WorkspaceRuntimeFailed, new_event
from events.payloads import JobFinished
from functions.domain import admission, lifecycle, retention
from functions.domain.jobs import CancelJob, JobState, StartJob
from functions.domain.lifecycle import (
    Destroy,
    DiscardSnapshot,
    Provision,
    Release,
    Restore,
    RuntimeDestroyed,
    Schedule,
    Snapshot,
    Workspace,
)
from functions.domain.sandboxes import (
    CleanUpSandbox,
    ReleaseSandbox,
    ResumeSandbox,
    RunSpec,
    SandboxState,
    StartSandbox,
    SuspendSandbox,
)
from functions.handlers.deps import Deps
from functions.handlers.sandbox_ports import SandboxDeps
from functions.ports import JobRun, RuntimeRefused, WorkspaceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Context:
    """What an executor gets besides its command."""

    deps: Deps
    #: The event whose decision the outbox holds (a redelivery: the same request).
    event: Event[Any]
    #: The deciding family's CloudEvents source, for the events an executor publishes.
    source: str
    #: Run an internal signal of the same family through the pipeline, as ``consumer``.
    apply: Callable[[Any, str], Any]

    def publish(self, payload: Any, *, requestid: str | None = None) -> None:
        self.deps.bus.publish(new_event(payload, source=self.source,
                                        requestid=requestid or self.event.requestid))


Executor = Callable[[Any, Context], None]


# --- workspaces ------------------------------------------------------------------------------
def _provision(command: Provision, ctx: Context) -> None:
    _on_runtime(command, ctx, lambda spec: ctx.deps.runtime.provision(spec),
                lambda error: WorkspaceRuntimeFailed(command.workspace_id, "provision", error))


def _snapshot(command: Snapshot, ctx: Context) -> None:
    _on_runtime(command, ctx,
                lambda spec: ctx.deps.runtime.snapshot(
                    spec, command.snapshot_id, base=command.base,
                    base_manifest_sha256=command.base_manifest_sha256),
                lambda error: SnapshotFinished(command.workspace_id, command.snapshot_id, False,
                                               error=error))


def _restore(command: Restore, ctx: Context) -> None:
    _on_runtime(command, ctx,
                lambda spec: ctx.deps.runtime.restore(
                    spec, command.snapshot_id, manifest_sha256=command.manifest_sha256,
                    device_arrays_to_cpu=command.device_arrays_to_cpu),
                lambda error: WorkspaceRuntimeFailed(command.workspace_id, "resume", error))


def _on_runtime(command: Provision | Snapshot | Restore, ctx: Context,
                call: Callable[[WorkspaceSpec], None], failure: Callable[[str], Any]) -> None:
    """Ask the runtime to act on the workspace as it is now, unless the command no longer
    applies to it; a refusal for good is reported as the runtime would, so the lifecycle
    records the failure."""
    ws = ctx.deps.store.get_workspace(command.workspace_id)
    if ws is None or _outdated(command, ws):
        return
    try:
        call(workspace_spec(ws, ctx.deps, ctx.event.requestid))
    except RuntimeRefused as exc:
        ctx.publish(failure(str(exc)))


def _release(command: Release, ctx: Context) -> None:
    if not _outdated(command, ctx.deps.store.get_workspace(command.workspace_id)):
        ctx.deps.runtime.release(command.workspace_id)


def _outdated(command: Any, ws: Workspace | None) -> bool:
    why = lifecycle.outdated(command, ws)
    if why:
        log.info("%s: %s not carried out: %s", command.workspace_id, type(command).__name__,
                 why)
    return why is not None


def _discard_snapshot(command: DiscardSnapshot, ctx: Context) -> None:
    ctx.deps.snapshots.discard(command.workspace_id, command.snapshot_id)


def _destroy(command: Destroy, ctx: Context) -> None:
    ws_id = command.workspace_id
    ctx.deps.runtime.destroy(ws_id, keep_home=command.keep_home)
    # Snapshots go with the workspace unless the retention policy keeps them (the janitor
    # then expires them by age, count and bytes like any other).
    released = ctx.deps.snapshots.discard_all(ws_id, by=ctx.event.id) \
        if _snapshots_go_with(ws_id, ctx.deps) else 0
    ctx.apply(RuntimeDestroyed(ws_id, released), "internal-destroyed")


def _snapshots_go_with(ws_id: str, deps: Deps) -> bool:
    ws = deps.store.get_workspace(ws_id)
    return ws is None or retention.deletes_with_workspace(deps.catalog(), ws.team, ws.profile)


def _schedule(command: Schedule, ctx: Context) -> None:
    from functions.handlers import scheduler

    scheduler.run(ctx.deps, why=command.reason)


def workspace_spec(ws: Workspace, deps: Deps, requestid: str) -> WorkspaceSpec:
    """What the runtime needs to run ``ws``: its environment and profile from the catalog,
    its version and priority class, and where the control plane counts accelerators, the
    node it placed it on with the accelerators the admin declared there (the node agent
    serves those without a device)."""
    catalog = deps.catalog()
    declared = catalog.scheduling.nodes.get(ws.node or "")
    extra: dict[str, Any] = (
        {"node": ws.node, "declared_accelerators": dict(declared.accelerators)}
        if declared is not None else {"node": ws.node} if ws.node else {})
    # where a cluster admits it (Kueue): its class, and the version its pod stands for
    extra.update(version=ws.version, priority_class=ws.priority_class)
    if ws.incarnation:  # what its identity is minted from (events.identity)
        extra["incarnation"] = ws.incarnation
    # what the runtime must refuse to run without an OS user of its own (tenancy)
    required = catalog.isolation_required_by(ws.team, ws.profile)
    if required:
        extra["isolation_required_by"] = required
    return WorkspaceSpec(
        workspace_id=ws.id, team=ws.team, owner=ws.owner, name=ws.name, ide=ws.ide,
        environment=admission.environment_of(catalog, ws.environment),
        profile=admission.profile_of(catalog, ws.profile),
        snapshot_bucket=deps.snapshot_bucket,
        snapshot_prefix=f"snapshots/{ws.team}/{ws.id}", requestid=requestid, extra=extra)


# --- sandboxes -------------------------------------------------------------------------------
def _start_sandbox(command: StartSandbox, ctx: Context) -> None:
    _run_sandbox(command.sandbox_id, ctx, resume=False)


def _resume_sandbox(command: ResumeSandbox, ctx: Context) -> None:
    _run_sandbox(command.sandbox_id, ctx, resume=True)


def _run_sandbox(sandbox_id: str, ctx: Context, *, resume: bool) -> None:
    sandboxes = sandbox_deps(ctx.deps)
    sandbox = sandboxes.store.get(sandbox_id)
    if sandbox is None or sandbox.state != SandboxState.RUNNING:
        return  # it ended or was held meanwhile (a redelivered outbox): nothing to do
    spec = RunSpec.of(sandbox, ctx.deps.snapshot_bucket)
    try:
        if resume:
            sandboxes.runtime.resume(spec)
        else:
            sandboxes.runtime.start(spec)
    except RuntimeRefused as exc:
        # Permanent: report it as the runtime would, so the slot is freed.
        ctx.publish(SandboxFinished(
            sandbox.id, False, termination="runtime_lost" if resume else "failed_to_start",
            error=f"the runtime refused to {'resume' if resume else 'start'} it: {exc}"),
            requestid=sandbox.requestid)


def _suspend_sandbox(command: SuspendSandbox, ctx: Context) -> None:
    try:
        sandbox_deps(ctx.deps).runtime.suspend(
            command.sandbox_id, team=command.team, sequence=command.sequence,
            idle_seconds=command.idle_seconds)
    except RuntimeRefused as exc:  # it ended or moved meanwhile: nothing to hold
        log.warning("sandbox %s not suspended: %s", command.sandbox_id, exc)


def _clean_up_sandbox(command: CleanUpSandbox, ctx: Context) -> None:
    sandbox_deps(ctx.deps).runtime.cleanup(command.sandbox_id, team=command.team)


def _release_sandbox(command: ReleaseSandbox, ctx: Context) -> None:
    try:
        sandbox_deps(ctx.deps).runtime.release(command.sandbox_id, team=command.team)
    except RuntimeRefused as exc:  # no snapshot to come back to: it keeps running
        log.warning("sandbox %s stays on its node: %s", command.sandbox_id, exc)


def sandbox_deps(deps: Deps) -> SandboxDeps:
    sandboxes: SandboxDeps | None = deps.sandboxes
    if sandboxes is None:
        raise RuntimeError("sandboxes are not configured (Deps.sandboxes is None)")
    return sandboxes


# --- jobs ------------------------------------------------------------------------------------
def _start_job(command: StartJob, ctx: Context) -> None:
    job = ctx.deps.jobs.get(command.job_id)
    if job is None or job.state != JobState.RUNNING:
        return  # it ended meanwhile (a redelivered outbox): nothing to start
    runtime = getattr(ctx.deps, "job_runtime", None)
    try:
        if runtime is None:
            raise RuntimeRefused("this control plane has no Kubernetes job runtime "
                                 "(STASIS_RUNTIME is not kubernetes)")
        if not command.payload_uri:
            raise RuntimeRefused("job.submitted has no payload_uri: nothing to run")
        runtime.start(JobRun(
            job_id=command.job_id, team=command.team, owner=command.owner,
            profile=command.profile, hosts=command.hosts, payload_uri=command.payload_uri,
            requestid=ctx.event.requestid, workspace_id=command.workspace_id,
            topology=command.topology, image=_image_of(ctx.deps, command.workspace_id)))
    except RuntimeRefused as exc:
        # Permanent: the job ends here, as if the runtime had reported it.
        ctx.publish(JobFinished(command.job_id, False, termination="failed_to_start",
                                error=f"the runtime refused the job: {exc}"[-4000:]),
                    requestid=f"start-failed-{command.job_id}")


def _image_of(deps: Deps, workspace_id: str | None) -> str | None:
    """The workspace's environment image: the hosts import what the notebook imports."""
    if not workspace_id:
        return None
    workspace = deps.store.get_workspace(workspace_id)
    environment = deps.catalog().environments.get(getattr(workspace, "environment", ""))
    return getattr(environment, "image", None) or None


def _cancel_job(command: CancelJob, ctx: Context) -> None:
    runtime = getattr(ctx.deps, "job_runtime", None)
    if runtime is not None:
        runtime.cancel(command.job_id, team=command.team)


EXECUTORS: Mapping[type[Any], Executor] = {
    Provision: _provision,
    Snapshot: _snapshot,
    Restore: _restore,
    Release: _release,
    DiscardSnapshot: _discard_snapshot,
    Destroy: _destroy,
    Schedule: _schedule,
    StartSandbox: _start_sandbox,
    ResumeSandbox: _resume_sandbox,
    SuspendSandbox: _suspend_sandbox,
    CleanUpSandbox: _clean_up_sandbox,
    ReleaseSandbox: _release_sandbox,
    StartJob: _start_job,
    CancelJob: _cancel_job,
}
