"""NullRuntime: the runtime for control-plane tests and benchmarks."""

from __future__ import annotations

from typing import Any

from events import Event
from functions.adapters.null_runtime import NullRuntime
from functions.ports import WorkspaceSpec

SPEC = WorkspaceSpec(
    workspace_id="team--ws",
    team="team",
    owner="ana",
    name="ws",
    ide="jupyterlab",
    environment={"id": "python-3-11"},
    profile={"id": "cpu-small"},
    snapshot_bucket="bucket",
    snapshot_prefix="snapshots/team/team--ws",
    requestid="req-7",
)


class Bus:
    def __init__(self) -> None:
        self.events: list[Event[Any]] = []

    def publish(self, event: Event[Any]) -> str:
        self.events.append(event)
        return event.id


def test_provision_and_restore_are_ready_at_once_with_the_request_id() -> None:
    bus = Bus()
    runtime = NullRuntime(bus)
    runtime.provision(SPEC)
    runtime.restore(SPEC, "snap-1")
    assert [e.name for e in bus.events] == ["workspace.ready", "workspace.ready"]
    ready = bus.events[0].payload
    assert (ready.url, ready.runtime_handle) == ("null://team--ws", "null")
    assert all(e.requestid == "req-7" for e in bus.events)
    assert bus.events[1].payload.restore_ms == 0


def test_snapshot_succeeds_empty() -> None:
    bus = Bus()
    NullRuntime(bus).snapshot(SPEC, "snap-1")
    (event,) = bus.events
    assert event.name == "snapshot.finished" and event.requestid == "req-7"
    assert event.payload.succeeded is True and event.payload.bytes == 0
    assert event.payload.snapshot_id == "snap-1"


def test_release_and_destroy_publish_nothing_and_track_state() -> None:
    bus = Bus()
    runtime = NullRuntime(bus)
    runtime.provision(SPEC)
    status = runtime.status("team--ws")
    assert status is not None and status.running
    runtime.release("team--ws")
    assert runtime.status("team--ws") is None
    runtime.destroy("team--ws", keep_home=False)
    runtime.destroy("team--ws", keep_home=True)
    assert [e.name for e in bus.events] == ["workspace.ready"]
    assert runtime.list() == []
    assert [c[0] for c in runtime.calls] == ["provision", "release", "destroy", "destroy"]


def test_capabilities_admit_every_example_profile() -> None:
    caps = NullRuntime(Bus(), accelerators={"nvidia-custom": 2}).capabilities()
    assert {"jupyterlab", "vscode"} <= set(caps["ides"])
    for kind in ("nvidia-l4", "nvidia-h100-80gb", "tpu-v5-lite-podslice", "nvidia-custom"):
        assert caps["accelerators"][kind] >= 1
    assert caps["cpus"] >= 64 and caps["memory_bytes"] >= 2**40
