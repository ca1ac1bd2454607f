"""Host-wide uid leases (``runtime/local/uids.py``): two node agents on one host never give out
the same uid, for workspace users and sandbox users alike."""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from runtime.local import tenancy
from runtime.local.uids import HostUids, UidTaken

BASE = tenancy.UID_BASE


def nobody_runs() -> set[int]:
    return set()


def _claim_many(owner: str, root: str, count: int, start: Any, out: Any) -> None:
    """One agent's process: ``count`` claims as fast as it can, once both are ready."""
    leases = HostUids(Path(owner), Path(root), in_use=nobody_runs)
    start.wait()
    out.put([leases.claim(f"workspace:{owner}-{n}", range(BASE, BASE + 1000))
             for n in range(count)])


def test_two_agents_on_one_host_never_get_the_same_uid(tmp_path: Path) -> None:
    """Two processes, two data dirs, one host directory: every uid goes to one of them."""
    root = tmp_path / "uids"
    owners = [tmp_path / "agent-a", tmp_path / "agent-b"]
    for owner in owners:
        owner.mkdir()
    context = multiprocessing.get_context("fork")
    start, out = context.Event(), context.Queue()
    processes = [context.Process(target=_claim_many, args=(str(o), str(root), 60, start, out))
                 for o in owners]
    for process in processes:
        process.start()
    start.set()
    results = [out.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(10)
    first, second = (set(r) for r in results)
    assert len(first) == len(second) == 60
    assert not first & second, sorted(first & second)
    assert first | second == set(range(BASE, BASE + 120))


def test_a_uid_leased_elsewhere_is_skipped_until_its_owner_is_gone(tmp_path: Path) -> None:
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a = HostUids(a_dir, tmp_path / "uids", in_use=nobody_runs)
    b = HostUids(b_dir, tmp_path / "uids", in_use=nobody_runs)
    assert a.claim("workspace:t--x", range(BASE, BASE + 10)) == BASE
    assert b.claim("workspace:t--y", range(BASE, BASE + 10)) == BASE + 1
    assert a.claim("workspace:t--x", range(BASE, BASE + 10)) == BASE  # its own, again
    with pytest.raises(UidTaken, match="t--x"):
        b.hold(BASE, "workspace:t--y")
    shutil.rmtree(a_dir)  # a deleted data dir leaves only stale leases
    assert b.claim("workspace:t--z", range(BASE, BASE + 10)) == BASE


def test_a_uid_a_process_runs_as_is_never_claimed(tmp_path: Path) -> None:
    leases = HostUids(tmp_path, tmp_path / "uids", in_use=lambda: {BASE, BASE + 1})
    assert leases.claim("sandbox:s1", range(BASE, BASE + 10)) == BASE + 2
    with pytest.raises(UidTaken):
        leases.claim("sandbox:s2", [BASE, BASE + 1, BASE + 2])


def test_a_released_uid_goes_back(tmp_path: Path) -> None:
    leases = HostUids(tmp_path, tmp_path / "uids", in_use=nobody_runs)
    uid = leases.claim("sandbox:s1", range(BASE, BASE + 10))
    assert leases.held() == {uid: "sandbox:s1"}
    leases.release(uid, "sandbox:other")  # not its key: kept
    assert leases.held() == {uid: "sandbox:s1"}
    leases.release(uid, "sandbox:s1")
    assert leases.held() == {} and leases.holder(uid) is None
    assert leases.claim("sandbox:s2", range(BASE, BASE + 10)) == uid


@pytest.mark.skipif(os.geteuid() != 0, reason="workspace users need a root agent")
def test_the_node_agent_gives_no_uid_another_agent_holds(tmp_path: Path) -> None:
    """The agent's own allocation (``NodeAgent._user``) goes through the host's leases: a
    uid another agent holds is skipped, the uid is kept on resume, and released on a destroy
    that does not keep the home."""
    import sys

    from runtime.local.node import NodeAgent, Refused
    from runtime.local.publisher import RecordingPublisher
    from runtime.local.settings import AgentSettings
    from runtime.local.state import WorkspaceRecord

    root = tmp_path / "uids"
    elsewhere = tmp_path / "other-agent"
    elsewhere.mkdir()
    HostUids(elsewhere, root, in_use=nobody_runs).claim("workspace:team--theirs", [BASE])
    settings = AgentSettings(data_dir=tmp_path / "data")
    settings.homes_dir.mkdir(parents=True)
    users = tenancy.Tenancy(True, None, settings.repo_root,
                            _runnable={(sys.executable, str(settings.homes_dir)): None})
    leases = HostUids(settings.data_dir, root, in_use=nobody_runs)
    agent = NodeAgent(settings, RecordingPublisher(), isolation=users, uids=leases)
    uid = agent._user("team--mine", {}, sys.executable)
    assert uid == BASE + 1 and leases.held() == {BASE + 1: "workspace:team--mine"}
    agent._records["team--mine"] = WorkspaceRecord("team--mine", home="/h", uid=uid)
    assert agent._user("team--mine", {}, sys.executable) == uid
    agent._records["team--clash"] = WorkspaceRecord("team--clash", home="/h2", uid=BASE)
    with pytest.raises(Refused, match="team--theirs"):
        agent._user("team--clash", {}, sys.executable)
    agent._records.pop("team--clash")
    agent.destroy("team--mine", keep_home=True)
    assert leases.held() == {BASE + 1: "workspace:team--mine"}
    agent.destroy("team--mine", keep_home=False)
    assert leases.held() == {}


def test_a_sandbox_gets_no_uid_another_agent_holds(tmp_path: Path) -> None:
    """The sandbox runner's allocation goes through the same leases; the lease of a sandbox
    that ended is given up at the next start (nothing is run here)."""
    from runtime.local import sandboxes
    from runtime.local.publisher import RecordingPublisher
    from runtime.local.settings import AgentSettings

    root = tmp_path / "uids"
    elsewhere = tmp_path / "other-agent"
    elsewhere.mkdir()
    HostUids(elsewhere, root, in_use=nobody_runs).claim("sandbox:theirs", [sandboxes.UID_BASE])
    boxes = tmp_path / "sandboxes"
    leases = HostUids(boxes, root, in_use=nobody_runs)
    runner = sandboxes.SandboxRunner(
        AgentSettings(data_dir=tmp_path / "data"), RecordingPublisher(),
        isolation=sandboxes.Isolation(network=False, separate_users=True, detail="test"),
        root=boxes, recover=False, uids=leases)
    first = runner._free_uid("s1")
    assert first == sandboxes.UID_BASE + 1
    assert leases.held() == {first: "sandbox:s1"}
    # s1 never ran (no directory, so not live): its lease goes back at the next start
    assert runner._free_uid("s2") == first
    assert leases.held() == {first: "sandbox:s2"}


def test_a_sandbox_gives_its_uid_up_when_its_result_is_reported(tmp_path: Path) -> None:
    import json

    from runtime.local import sandboxes
    from runtime.local.publisher import RecordingPublisher
    from runtime.local.settings import AgentSettings

    boxes = tmp_path / "sandboxes"
    leases = HostUids(boxes, tmp_path / "uids", in_use=nobody_runs)
    bus = RecordingPublisher()
    runner = sandboxes.SandboxRunner(
        AgentSettings(data_dir=tmp_path / "data"), bus,
        isolation=sandboxes.Isolation(network=False, separate_users=True, detail="test"),
        root=boxes, recover=False, uids=leases)
    uid = runner._free_uid("sb-one")
    (boxes / "sb-one").mkdir()
    (boxes / "sb-one" / "spec.json").write_text(json.dumps({"sandbox_id": "sb-one", "uid": uid}))
    (boxes / "sb-one" / "result.json").write_text(json.dumps(
        {"sandbox_id": "sb-one", "succeeded": True, "termination": "exited", "network": "none"}))
    assert leases.held() == {uid: "sandbox:sb-one"}
    runner._report("sb-one")
    assert bus.names() == ["sandbox.finished"]
    assert leases.held() == {}
