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
    """Activity signals of one workspace, as seen by the node agent or cluster monitor."""

    workspace_id: str
    last_activity: str
    observed_at: str
    busy_kernels: int = 0
    connections: int = 0
    gpu_utilization: float | None = None


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


@dataclass(frozen=True)
class WorkspaceResumeRequested:
    """Bring a paused workspace back, optionally on another hardware profile."""

    workspace_id: str
    actor: str
    profile: str | None = None


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
        EventSpec("snapshot.expired", SnapshotExpired),
        EventSpec("job.submitted", JobSubmitted),
        EventSpec("job.finished", JobFinished),
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
