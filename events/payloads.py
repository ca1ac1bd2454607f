"""Every event payload of Stasis, one frozen dataclass each, and the registry of them.

A payload holds only JSON types (str, int, float, bool, lists and dicts of them, None), so
that ``dataclasses.asdict`` is its wire form and ``schemas/events/<name>.json`` can describe
it exactly; ``tests/unit/test_schemas.py`` checks the two agree both ways. Times inside
payloads are RFC 3339 strings; the envelope's own ``time`` is a datetime.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

CE_TYPE_PREFIX = "dev.stasis."
TOPIC_PREFIX = "stasis-"
WORKSPACE_SEPARATOR = "--"


def workspace_id(team: str, name: str) -> str:
    """The id of a team's workspace. Slugs never contain ``--``, so ids never collide."""
    return f"{team}{WORKSPACE_SEPARATOR}{name}"


def ide_path(workspace_id: str) -> str:
    """``/w/<workspace id>/``: where the IDE access proxy serves the workspace's IDE. Part of
    the contract: the runtimes configure the IDE's server for it (``ide_server_path``)."""
    return f"/w/{workspace_id}/"


def ide_server_path(ide_kind: str | None, workspace_id: str) -> str:
    """The path the IDE's own server serves under: JupyterLab under the proxy's (so the
    proxy forwards paths unchanged), code-server at its root (it works relatively behind
    the proxy's prefix, which the proxy strips)."""
    return "/" if ide_kind == "vscode" else ide_path(workspace_id)


@dataclass(frozen=True)
class WorkspaceRequested:
    """A user asked for a new workspace (chat, CLI)."""

    team: str
    owner: str
    name: str
    profile: str
    ide: str = "jupyterlab"
    environment: str = "python-3-11"
    reply_to: str | None = None

    @property
    def workspace_id(self) -> str:
        return workspace_id(self.team, self.name)


@dataclass(frozen=True)
class WorkspaceReady:
    """The runtime reports the workspace's server up (after provision or resume)."""

    workspace_id: str
    url: str
    runtime_handle: str
    kernels_restored: int = 0
    restore_ms: int | None = None


@dataclass(frozen=True)
class WorkspaceRuntimeFailed:
    """The runtime could not do what it was asked (provision, resume, release, destroy)."""

    workspace_id: str
    operation: str
    reason: str
    #: A resume refused with the snapshot intact, so the workspace stays PAUSED:
    #: ``snapshot_integrity`` (the manifest or a part is not what was recorded; nothing
    #: was unpickled) or ``restore_refused`` (the kernel lacks the accelerator its device
    #: arrays need), or ``interrupted`` (the runtime restarted during the operation, which
    #: changed nothing it was given: a resume's snapshot and home are as they were).
    #: None: any other failure.
    cause: str | None = None


@dataclass(frozen=True)
class WorkspacePauseRequested:
    """Pause this workspace with its running state (user, idle policy, schedule)."""

    workspace_id: str
    actor: str
    cause: str = "user"
    #: Why, in words for the owner (the idle policy fills it in); becomes the message of
    #: the workspace's state change and its ``state_message``.
    detail: str = ""


@dataclass(frozen=True)
class WorkspaceIdleDetected:
    """Activity signals of one workspace, as seen by the node agent or cluster monitor, or
    a GPU-idle alert of cluster monitoring (``cause`` ``gpu_idle``)."""

    workspace_id: str
    last_activity: str
    observed_at: str
    busy_kernels: int = 0
    connections: int = 0
    gpu_utilization: float | None = None
    #: ``activity``: the runtime's own signals. ``gpu_idle``: cluster monitoring measured
    #: the GPU quiet (``gpu_utilization`` is its duty cycle) and knows nothing of the
    #: kernels; the idle handler asks the runtime for them before the policy decides.
    cause: str = "activity"
    #: Where a monitoring signal comes from, in words (the alert, its threshold, window).
    evidence: str = ""


@dataclass(frozen=True)
class WorkspaceRuntimeAlert:
    """Cluster monitoring saw trouble in a running workspace that no state change answers
    (``oom_killed``: a container was OOM-killed, its kernels restart empty;
    ``gpu_memory_high``: its GPU memory is near full). Recorded for the owner."""

    workspace_id: str
    alert: str
    observed_at: str
    detail: str
    value: float | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class WorkspacePreempted:
    """The node a workspace's server ran on went away, as the platform's own logs say (a
    Spot preemption, the node's deletion), or the server itself vanished (the reconciler
    found a RUNNING workspace without it): the server and its kernels' memory are gone."""

    workspace_id: str
    node: str
    #: When it happened (the log entry's time): a server that started later is not hit.
    preempted_at: str
    #: ``spot_preemption`` (Compute Engine reclaimed the VM), ``node_deleted``, or
    #: ``server_lost`` (the reconciler: the runtime no longer runs it).
    cause: str = "spot_preemption"
    detail: str = ""


@dataclass(frozen=True)
class WorkspaceScheduled:
    """The scheduler's verdict on one workspace at the ``version`` it saw: ``admit`` a
    QUEUED one (on ``node``), ``expire`` it (past its maximum wait), ``preempt`` a RUNNING
    one by pause for ``for_workspace``, ``warn`` the owner of a busy one that it will be
    (in ``after_seconds``), or take a ``checkpoint`` of a RUNNING one."""

    workspace_id: str
    version: int
    action: str
    node: str | None = None
    for_workspace: str | None = None
    after_seconds: int | None = None
    #: In words, for the owner.
    message: str = ""


@dataclass(frozen=True)
class SnapshotFinished:
    """A snapshot of a workspace ended, successfully or not."""

    workspace_id: str
    snapshot_id: str
    succeeded: bool
    method: str = "kernel"
    uri: str | None = None
    bytes: int = 0
    duration_ms: int = 0
    accelerator: str | None = None
    accelerator_count: int = 0
    captured: list[str] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    #: sha256 of the manifest as written: the control plane keeps it, and every restore
    #: refuses a manifest that does not match it (``kernel`` method).
    manifest_sha256: str | None = None
    #: The stored parts the snapshot uses, ``{object name: bytes}``; parts shared with
    #: other snapshots of the workspace are counted once against the team.
    parts: dict[str, int] = field(default_factory=dict)
    #: Bytes this snapshot sent; the rest were parts the previous snapshot had stored.
    uploaded_bytes: int = 0


@dataclass(frozen=True)
class WorkspaceResumeRequested:
    """Bring a paused workspace back, optionally on another hardware profile."""

    workspace_id: str
    actor: str
    profile: str | None = None
    #: Restore device arrays (GPU tensors) onto CPU: how a snapshot taken on a GPU
    #: resumes on a profile without one.
    device_arrays_to_cpu: bool = False


@dataclass(frozen=True)
class WorkspaceDeleteRequested:
    """Delete a workspace; its home directory survives when ``keep_home`` is set."""

    workspace_id: str
    actor: str
    keep_home: bool = False


@dataclass(frozen=True)
class WorkspaceStateChanged:
    """A workspace moved from one lifecycle state to another (notify, audit)."""

    workspace_id: str
    team: str
    owner: str
    name: str
    from_state: str | None
    to_state: str
    reason: str
    version: int
    message: str = ""
    url: str | None = None
    reply_to: str | None = None

    @property
    def event_id(self) -> str:
        """Deterministic: one event per version of the workspace, however often it is sent."""
        return f"{self.workspace_id}-v{self.version}"


@dataclass(frozen=True)
class LinkCreated:
    """A revocable link for a coding agent was created (the token itself never travels)."""

    link_id: str
    workspace_id: str
    team: str
    creator: str
    scope: str
    expires_at: str


@dataclass(frozen=True)
class LinkRevoked:
    """A link was revoked; proxies drop it from their caches."""

    link_id: str
    workspace_id: str
    actor: str


@dataclass(frozen=True)
class SandboxRequested:
    """Run a task in an isolated sandbox and return a patch for review.

    ``limits`` may ask for ``cpu_seconds``, ``memory`` (a quantity: "2Gi" or bytes),
    ``wall_clock_seconds`` and ``processes``; what is not asked for comes from the team's
    sandbox policy, and asking above the policy's maximum is refused. ``allowed_network``
    lists destinations (host names or CIDRs); empty means no network at all.
    """

    sandbox_id: str
    team: str
    requester: str
    repository: str
    command: str
    base_ref: str = "HEAD"
    limits: dict[str, Any] = field(default_factory=dict)
    allowed_network: list[str] = field(default_factory=list)
    reply_to: str | None = None


@dataclass(frozen=True)
class SandboxFinished:
    """A sandbox ended; its patch and log are in Cloud Storage."""

    sandbox_id: str
    succeeded: bool
    exit_status: int | None = None
    patch_uri: str | None = None
    log_uri: str | None = None
    error: str | None = None
    #: How the task ended: exited (see exit_status), wall_clock_exceeded,
    #: cpu_time_exceeded, memory_limit_exceeded, killed (by a signal), cancelled,
    #: failed_to_start (no working copy, bad ref) or runtime_lost (the runner went away).
    termination: str = "exited"
    base_sha: str | None = None
    patch_bytes: int = 0
    files_changed: list[str] = field(default_factory=list)
    duration_ms: int = 0
    cpu_seconds: float = 0.0
    peak_memory_bytes: int = 0
    #: What the sandbox could reach, as enforced (never as merely requested).
    network: str = ""


@dataclass(frozen=True)
class SandboxSuspended:
    """A sandbox waited on nothing for longer than its ``idle_seconds`` limit: its task is
    held (``method``), its CPU and its concurrency slot released, and the working copy's
    diff so far uploaded as a checkpoint patch. sandbox.resume_requested brings it back.

    ``method`` says how it is held: ``freeze`` on the local runtime (the process tree
    frozen by the cgroup freezer or stopped by SIGSTOP; its memory stays resident, which
    ``memory_released`` says plainly).
    """

    sandbox_id: str
    #: How long the task had made no progress (no CPU time, no I/O) when it was suspended.
    idle_seconds: int
    #: The n-th suspension of this sandbox (1, 2, ...): a report older than the record is
    #: stale and changes nothing.
    sequence: int = 1
    method: str = "freeze"
    checkpoint_uri: str | None = None
    checkpoint_bytes: int = 0
    files_changed: list[str] = field(default_factory=list)
    #: Run time so far, suspended time not counted, and CPU time so far.
    elapsed_ms: int = 0
    cpu_seconds: float = 0.0
    memory_released: bool = False
    detail: str = ""


@dataclass(frozen=True)
class SandboxIdleDetected:
    """A runtime saw a running sandbox make no progress for ``idle_seconds``: on
    Kubernetes, its ``task`` container's CPU (metrics.k8s.io) stayed below
    ``threshold_millicores`` the whole time. The control plane decides: a RUNNING sandbox
    idle past its ``idle_seconds`` limit is suspended (sandbox.suspended follows).
    """

    sandbox_id: str
    #: How long the task had been below the threshold when it was reported.
    idle_seconds: int
    observed_at: str
    #: What was measured, for people (``cpu of container task (metrics.k8s.io)``).
    measured: str = ""
    threshold_millicores: float = 0.0
    #: The highest CPU seen during the idle period, and how many samples it spans.
    peak_millicores: float = 0.0
    samples: int = 0
    #: The suspension this would be, as the runtime counts them (those begun + 1).
    sequence: int = 1


@dataclass(frozen=True)
class SandboxResumeRequested:
    """Bring a suspended sandbox back (CLI, chat, an agent): it resumes when a slot is free."""

    sandbox_id: str
    requester: str
    reply_to: str | None = None


@dataclass(frozen=True)
class SandboxStateChanged:
    """A sandbox moved from one state to another (notify, audit): the one a report or a
    request was about, and every queued or suspended one that took a freed slot. A
    request refused at once is recorded FAILED from no state (``from_state`` None)."""

    sandbox_id: str
    team: str
    requester: str
    from_state: str | None
    to_state: str
    reason: str
    version: int
    message: str = ""
    #: A suspension, as the runtime reported it: how long the task had made no progress,
    #: how it is held (``freeze``, ``pod``), and the checkpoint of its changes so far.
    idle_seconds: int = 0
    method: str = ""
    checkpoint_uri: str | None = None
    checkpoint_files: int = 0

    @property
    def event_id(self) -> str:
        """Deterministic: one event per version of the sandbox, however often it is sent."""
        return f"{self.sandbox_id}-v{self.version}"


@dataclass(frozen=True)
class SnapshotExpired:
    """A snapshot passed its retention; its objects are to be deleted."""

    snapshot_id: str
    workspace_id: str
    team: str
    uri: str
    bytes: int
    reason: str


@dataclass(frozen=True)
class JobSubmitted:
    """A notebook submitted a function to run on ``hosts`` hosts of ``profile`` (a job)."""

    job_id: str
    team: str
    owner: str
    profile: str
    hosts: int
    workspace_id: str | None = None
    #: Where it runs: ``local`` (processes on the node) or ``kubernetes`` (a JobSet).
    runtime: str = "local"
    #: The function's qualified name, for people (the code itself travels pickled).
    function: str = ""
    log_uri: str | None = None
    #: ``kubernetes``: where the notebook put the pickled (fn, args, kwargs), which the
    #: hosts download (``gs://BUCKET/jobs/TEAM/ID/payload.pkl``).
    payload_uri: str | None = None
    #: A multi-host TPU slice's topology (``4x4``); None: the profile's own.
    topology: str | None = None


@dataclass(frozen=True)
class JobFinished:
    """A job ended; its accelerators go back to the team."""

    job_id: str
    succeeded: bool
    termination: str = "exited"
    exit_status: int | None = None
    #: The first host that failed (its log is in ``error``), or None.
    failed_host: int | None = None
    error: str | None = None
    log_uri: str | None = None
    duration_ms: int = 0


@dataclass(frozen=True)
class JobStateChanged:
    """A job was admitted or refused (``from_state`` None), or it ended (notify, audit)."""

    job_id: str
    team: str
    owner: str
    from_state: str | None
    to_state: str
    reason: str
    message: str = ""
    workspace_id: str | None = None
    runtime: str = "local"

    @property
    def event_id(self) -> str:
        """Deterministic: a job enters each of its states at most once."""
        return f"{self.job_id}-{self.to_state.lower()}"


@dataclass(frozen=True)
class EventSpec:
    """What the contract says about one event type."""

    name: str
    payload: type[Any]

    @property
    def ce_type(self) -> str:
        return CE_TYPE_PREFIX + self.name

    @property
    def topic(self) -> str:
        return TOPIC_PREFIX + self.name.replace(".", "-").replace("_", "-")

    def field_names(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self.payload)]


CATALOG: dict[str, EventSpec] = {
    spec.name: spec
    for spec in (
        EventSpec("workspace.requested", WorkspaceRequested),
        EventSpec("workspace.ready", WorkspaceReady),
        EventSpec("workspace.runtime_failed", WorkspaceRuntimeFailed),
        EventSpec("workspace.pause_requested", WorkspacePauseRequested),
        EventSpec("workspace.idle_detected", WorkspaceIdleDetected),
        EventSpec("workspace.preempted", WorkspacePreempted),
        EventSpec("workspace.scheduled", WorkspaceScheduled),
        EventSpec("workspace.runtime_alert", WorkspaceRuntimeAlert),
        EventSpec("snapshot.finished", SnapshotFinished),
        EventSpec("workspace.resume_requested", WorkspaceResumeRequested),
        EventSpec("workspace.delete_requested", WorkspaceDeleteRequested),
        EventSpec("workspace.state_changed", WorkspaceStateChanged),
        EventSpec("link.created", LinkCreated),
        EventSpec("link.revoked", LinkRevoked),
        EventSpec("sandbox.requested", SandboxRequested),
        EventSpec("sandbox.finished", SandboxFinished),
        EventSpec("sandbox.suspended", SandboxSuspended),
        EventSpec("sandbox.resume_requested", SandboxResumeRequested),
        EventSpec("sandbox.idle_detected", SandboxIdleDetected),
        EventSpec("sandbox.state_changed", SandboxStateChanged),
        EventSpec("snapshot.expired", SnapshotExpired),
        EventSpec("job.submitted", JobSubmitted),
        EventSpec("job.finished", JobFinished),
        EventSpec("job.state_changed", JobStateChanged),
    )
}

_BY_PAYLOAD: dict[type[Any], EventSpec] = {spec.payload: spec for spec in CATALOG.values()}
_BY_CE_TYPE: dict[str, EventSpec] = {spec.ce_type: spec for spec in CATALOG.values()}


def spec_for(key: str | type[Any] | object) -> EventSpec:
    """The spec for an event name (``workspace.ready``), a CloudEvent type
    (``dev.stasis.workspace.ready``), a payload class or a payload instance.

    Raises KeyError when nothing matches; the codec turns that into UnknownEventType.
    """
    if isinstance(key, str):
        found = CATALOG.get(key) or _BY_CE_TYPE.get(key)
        if found is None:
            raise KeyError(key)
        return found
    cls = key if isinstance(key, type) else type(key)
    return _BY_PAYLOAD[cls]
