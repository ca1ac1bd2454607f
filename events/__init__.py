"""The event contract of Stasis.

Owns every event type (a frozen payload dataclass, its Pub/Sub topic and its CloudEvent
type ``dev.stasis.<name>``), the envelope that carries one, and the codec to and from
CloudEvents (structured and binary HTTP) and Pub/Sub messages. Payloads are validated
against ``schemas/events/<name>.json`` on encode and on decode. Pure: no network I/O.
"""

from events.codec import (
    from_cloudevent,
    from_http,
    from_pubsub,
    new_event,
    to_cloudevent,
    to_http,
    to_pubsub,
)
from events.envelope import Event, InvalidEvent, UnknownEventType
from events.payloads import (
    CATALOG,
    EventSpec,
    JobStateChanged,
    LinkCreated,
    LinkRevoked,
    SandboxFinished,
    SandboxIdleDetected,
    SandboxRequested,
    SandboxResumeRequested,
    SandboxStateChanged,
    SandboxSuspended,
    SnapshotExpired,
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspaceIdleDetected,
    WorkspacePauseRequested,
    WorkspacePreempted,
    WorkspaceReady,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    WorkspaceRuntimeAlert,
    WorkspaceRuntimeFailed,
    WorkspaceStateChanged,
    spec_for,
)

__all__ = [
    "CATALOG",
    "Event",
    "EventSpec",
    "InvalidEvent",
    "JobStateChanged",
    "LinkCreated",
    "LinkRevoked",
    "SandboxFinished",
    "SandboxIdleDetected",
    "SandboxRequested",
    "SandboxResumeRequested",
    "SandboxStateChanged",
    "SandboxSuspended",
    "SnapshotExpired",
    "SnapshotFinished",
    "UnknownEventType",
    "WorkspaceDeleteRequested",
    "WorkspaceIdleDetected",
    "WorkspacePauseRequested",
    "WorkspacePreempted",
    "WorkspaceReady",
    "WorkspaceRequested",
    "WorkspaceResumeRequested",
    "WorkspaceRuntimeAlert",
    "WorkspaceRuntimeFailed",
    "WorkspaceStateChanged",
    "from_cloudevent",
    "from_http",
    "from_pubsub",
    "new_event",
    "spec_for",
    "to_cloudevent",
    "to_http",
    "to_pubsub",
]
