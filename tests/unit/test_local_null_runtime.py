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


def test_instances_with_one_state_file_see_the_same_node(tmp_path) -> None:
    # Two workers of the function host: what one started the other's reconciler must see.
    state = tmp_path / "null-runtime.sqlite"
    one, other = NullRuntime(Bus(), state_file=state), NullRuntime(Bus(), state_file=state)
    one.provision(SPEC)
    assert other.status(SPEC.workspace_id) is not None
    assert [s.workspace_id for s in other.list()] == [SPEC.workspace_id]
    other.destroy(SPEC.workspace_id, keep_home=False)
    assert one.status(SPEC.workspace_id) is None and one.running == set()


def test_a_split_runtime_routes_by_workspace_id_and_lists_each_side_once() -> None:
    """``STASIS_NULL_RUNTIME_MATCH`` (bench/load.py --local): the matching ids go to the
    null runtime, the others to the real one, for every call the port has."""
    from dataclasses import replace

    from functions.adapters.split_runtime import SplitRuntime

    real, null = NullRuntime(Bus(), accelerators={"nvidia-l4": 1}), NullRuntime(Bus())
    split = SplitRuntime(real, null, "team--load-*")
    pretend = replace(SPEC, workspace_id="team--load-1", name="load-1")
    for spec in (SPEC, pretend):
        split.provision(spec)
        split.snapshot(spec, "snap-1")
        split.restore(spec, "snap-1")
        assert split.progress(spec.workspace_id) is None
    assert [s.workspace_id for s in split.list()] == ["team--ws", "team--load-1"]
    split.release("team--ws")
    assert real.calls == [("provision", "team--ws"), ("snapshot", "team--ws"),
                          ("restore", "team--ws"), ("release", "team--ws")]
    assert [op for op, ws in null.calls if ws == "team--load-1"] == [
        "provision", "snapshot", "restore"]
    status = split.status("team--load-1")
    assert status is not None and status.running
    split.destroy("team--load-1", keep_home=False)
    assert split.status("team--load-1") is None
    assert split.capabilities() == real.capabilities()


def test_it_remembers_only_its_latest_calls() -> None:
    """The stack's function host runs it for the load bench: every call kept would be
    memory that only grows (bench/load.py --trace-memory found it so)."""
    from functions.adapters.null_runtime import CALLS_KEPT

    runtime = NullRuntime(Bus())
    for i in range(3 * CALLS_KEPT):
        runtime.release(f"team--ws-{i}")
    assert CALLS_KEPT <= len(runtime.calls) <= 2 * CALLS_KEPT
    assert runtime.calls[-1] == ("release", f"team--ws-{3 * CALLS_KEPT - 1}")
