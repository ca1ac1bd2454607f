"""The node agent's state file and its data-dir lock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.local.servers import ServerProcess
from runtime.local.state import AgentLock, AgentLockError, Operation, StateFile, WorkspaceRecord


def _record() -> WorkspaceRecord:
    server = ServerProcess(
        workspace_id="team--ws",
        pid=123,
        port=4567,
        token="t" * 64,
        marker="m",
        create_time=1.5,
        started_at=2.5,
        log_path="/tmp/x.log",
        log_offset=10,
        python="/usr/bin/python3",
    )
    return WorkspaceRecord(
        workspace_id="team--ws",
        home="/data/homes/team--ws",
        spec={"ide": "jupyterlab"},
        server=server,
        operation=Operation("snapshot", "req-1", 3.5, snapshot_id="s1", bucket="b", prefix="p/s1"),
        restored_from="s0",
        kernels_restored=2,
        restore_ms=900,
    )


def test_round_trip(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "agent" / "state.json")
    assert state.load() == {}
    state.save({"team--ws": _record()})
    loaded = state.load()["team--ws"]
    expected = _record()
    assert loaded.to_json() == expected.to_json()
    assert loaded.server is not None and loaded.server.pgid == 123
    raw = json.loads(state.path.read_text())
    assert raw["workspaces"]["team--ws"]["server"]["pgid"] == 123
    # It holds tokens: readable by the agent's user only.
    assert state.path.stat().st_mode & 0o077 == 0


def test_corrupt_file_is_set_aside(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "state.json")
    state.path.write_text("{not json")
    assert state.load() == {}
    assert (tmp_path / "state.json.corrupt").read_text() == "{not json"


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    first, second = AgentLock(tmp_path / "agent.lock"), AgentLock(tmp_path / "agent.lock")
    first.acquire()
    with pytest.raises(AgentLockError, match="already serves"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()
