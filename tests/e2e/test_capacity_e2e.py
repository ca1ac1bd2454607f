"""When the GPUs run out, on the whole local stack with real kernels: one declared L4 on
this CPU machine (the admin file's ``scheduling.nodes``), the reconciler on a 3-second
schedule (it is what turns a vanished server into PAUSED and fails a request past its
maximum wait: nothing here calls it by hand).

- alice's low-priority workspace is idle; carol's higher-priority create is QUEUED, then
  alice's is paused with its kernels and carol's runs; alice's resume is QUEUED and runs
  when carol pauses; alice's variables are intact;
- the server of a Spot workspace is killed: PAUSED from its last checkpoint within one
  reconcile interval, the quota given back at once; resume restores the checkpoint;
- a queued request past its maximum wait fails with the reason; a cancelled one leaves
  nothing behind.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from croniter import croniter
from google.cloud import firestore

from harness.notebook import Notebook
from tests.e2e.conftest import ROOT, Stack, start_stack

RECONCILE_EVERY = "* * * * * */3"  # croniter's sixth field, after the weekday: seconds


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # "*/3 * * * * *" once read as every second of every third minute: two minutes
    # without a reconcile, past the waits below (a CI failure whenever a test began late
    # in such a minute).
    firings = croniter(RECONCILE_EVERY, datetime(2026, 1, 1, 0, 0, 58))
    times = [firings.get_next(datetime) for _ in range(4)]
    assert {(b - a).total_seconds() for a, b in itertools.pairwise(times)} == {3.0}, times
    yield from start_stack(tmp_path_factory.mktemp("capacity"), "local",
                           scheduled={"reconcile": RECONCILE_EVERY})


@pytest.fixture(scope="module", autouse=True)
def one_declared_l4(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The admin file: priority classes, a low-priority and a Spot L4 profile, a profile
    that waits at most 5 s, and one L4 declared for this node."""
    node = requests.get(f"{stack.settings.node_agent_url}/capabilities",
                        headers=stack.settings.node_agent_headers(), timeout=10).json()
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    config["scheduling"] = {
        "priority_classes": [{"id": "interactive", "value": 1000},
                             {"id": "background", "value": 100}],
        "defaults": {"workspace": "interactive"},
        "nodes": [{"id": node["node"], "accelerators": {"nvidia-l4": 1}}]}
    gpu = next(p for p in config["profiles"] if p["id"] == "gpu-small")
    for profile_id, policy in (
            ("gpu-low", {"priority_class": "background"}),
            ("gpu-spot", {"checkpoint_every_seconds": 5}),
            ("gpu-wait", {"max_wait_seconds": 5})):
        extra = copy.deepcopy(gpu)
        extra.update(id=profile_id, title=profile_id, scheduling=policy)
        config["profiles"].append(extra)
    for team in config["teams"]:
        team["profiles"] += ["gpu-low", "gpu-spot", "gpu-wait"]
    path = tmp_path_factory.mktemp("admin") / "capacity.yaml"
    path.write_text(yaml.safe_dump(config))
    stack.cli("admin", "apply", str(path))
    return str(node["node"])


def status(stack: Stack, name: str, team: str, user: str) -> dict[str, Any]:
    out = stack.cli("ws", "status", name, "--team", team, "--json", user=user).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def kernel(stack: Stack, name: str, team: str, user: str) -> tuple[Notebook, str]:
    info = status(stack, name, team, user)
    nb = Notebook(info["direct_url"], info["token"])
    return nb, nb.open("work.ipynb")


def reconciler(stack: Stack) -> str:
    """What the local Cloud Scheduler last saw of the reconciler (for a failure's message:
    these steps wait on its schedule)."""
    try:
        jobs = requests.get(f"http://127.0.0.1:{stack.settings.scheduler_port}/",
                            timeout=5).json()["jobs"]
        return json.dumps(jobs.get("reconcile"))
    except (requests.RequestException, ValueError, KeyError) as exc:
        return f"scheduler not answering: {exc}"


def wait_state(stack: Stack, ws_id: str, state: str, what: str) -> None:
    """Wait (on the reconciler's schedule) for ``ws_id`` to be ``state``; a timeout says
    what the scheduler last saw of the reconciler."""
    try:
        stack.wait_for(lambda: state_of(stack, ws_id) == state, timeout=120, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the reconciler's last run: {reconciler(stack)}") from exc


def state_of(stack: Stack, ws_id: str) -> str:
    return str((stack.workspace(ws_id) or {}).get("state"))


def node_used(stack: Stack, node: str) -> dict[str, int]:
    snap = stack.db.collection("nodes").document(node).get()
    return dict((snap.to_dict() or {}).get("used") or {})


def usage(stack: Stack, team: str) -> dict[str, int]:
    return dict(stack.db.collection("teams").document(team).get().to_dict()["usage"])


def outcomes(stack: Stack, ws_id: str) -> list[str]:
    entries = [d.to_dict() for d in stack.db.collection("audit").stream()]
    rows = sorted((e for e in entries if e.get("target") == ws_id), key=lambda e: e["time"])
    return [e["outcome"] for e in rows]


def test_a_higher_priority_create_preempts_an_idle_workspace_by_pause(
        stack: Stack, one_declared_l4: str) -> None:
    stack.cli("ws", "create", "low", "--team", "ml-a", "--profile", "gpu-low", "--wait",
              user="alice")
    nb, k = kernel(stack, "low", "ml-a", "alice")
    seen = nb.run(k, "import os\nstate = {'n': 42, 'blob': bytes(range(256)) * 4096}\n"
                     "print(os.environ.get('CUDA_VISIBLE_DEVICES'), "
                     "os.environ.get('STASIS_DECLARED_ACCELERATORS'))").stdout.split()
    assert seen == ["0", "nvidia-l4"]  # its declared L4: an index, no device claimed
    assert node_used(stack, one_declared_l4) == {"nvidia-l4": 1}

    stack.cli("ws", "create", "high", "--team", "ml-b", "--profile", "gpu-small",
              user="carol")
    stack.wait_for(lambda: state_of(stack, "ml-b--high") == "RUNNING", timeout=240,
                   what="carol's workspace RUNNING")
    assert outcomes(stack, "ml-b--high")[0] == "accepted: queued"
    low = stack.workspace("ml-a--low") or {}
    assert (low["state"], low["state_reason"], low["preempted_by"]) == (
        "QUEUED", "requeued", "ml-b--high")
    assert low["state_message"].startswith("paused with its state for ml-b--high (interactive)")
    queued = status(stack, "low", "ml-a", "alice")
    assert queued["queue_position"] == 1 and "1 x nvidia-l4" in queued["queue"]
    assert (usage(stack, "ml-a")["gpus"], usage(stack, "ml-b")["gpus"]) == (0, 1)

    stack.cli("ws", "pause", "high", "--team", "ml-b", "--wait", user="carol")
    stack.wait_for(lambda: state_of(stack, "ml-a--low") == "RUNNING", timeout=240,
                   what="alice's resume to run")
    nb, k = kernel(stack, "low", "ml-a", "alice")
    assert nb.run(k, "print(state['n'], len(state['blob']))").stdout.split() == \
        ["42", str(256 * 4096)]
    for name, team, user in (("low", "ml-a", "alice"), ("high", "ml-b", "carol")):
        stack.cli("ws", "delete", name, "--team", team, "--wait", user=user)
    assert node_used(stack, one_declared_l4) == {"nvidia-l4": 0}


def test_a_killed_spot_server_comes_back_paused_from_its_last_checkpoint(
        stack: Stack, one_declared_l4: str) -> None:
    stack.cli("ws", "create", "spot", "--team", "ml-a", "--profile", "gpu-spot", "--wait",
              user="alice")
    nb, k = kernel(stack, "spot", "ml-a", "alice")
    nb.run(k, "kept = 'from before the checkpoint'")
    first = (stack.workspace("ml-a--spot") or {}).get("current_snapshot")
    stack.wait_for(lambda: (stack.workspace("ml-a--spot") or {}).get("last_checkpoint_at"),
                   timeout=120, what="a checkpoint")
    checkpoint = (stack.workspace("ml-a--spot") or {})["current_snapshot"]
    assert checkpoint and checkpoint != first
    nb.run(k, "lost = 'after the checkpoint'")
    assert usage(stack, "ml-a")["gpus"] == 1

    agent = requests.get(f"{stack.settings.node_agent_url}/workspaces/ml-a--spot",
                         headers=stack.settings.node_agent_headers(), timeout=10).json()
    os.killpg(agent["pid"], signal.SIGKILL)  # the server and its kernels are gone
    wait_state(stack, "ml-a--spot", "PAUSED", "PAUSED by the reconciler")
    lost = stack.workspace("ml-a--spot") or {}
    assert lost["state_reason"] == "recovered" and lost["current_snapshot"] == checkpoint
    assert "the server on node" in lost["state_message"] and "of work since then is lost" \
        in lost["state_message"]
    assert lost["lost_work_seconds"] is not None
    assert usage(stack, "ml-a")["gpus"] == 0
    assert node_used(stack, one_declared_l4) == {"nvidia-l4": 0}

    stack.cli("ws", "resume", "spot", "--team", "ml-a", "--wait", user="alice")
    nb, k = kernel(stack, "spot", "ml-a", "alice")
    assert nb.run(k, "print(kept, 'lost' in dir())").stdout.strip() == \
        "from before the checkpoint False"
    stack.cli("ws", "delete", "spot", "--team", "ml-a", "--wait", user="alice")


def test_past_its_maximum_wait_a_request_fails_and_a_cancelled_one_leaves_nothing(
        stack: Stack, one_declared_l4: str) -> None:
    stack.cli("ws", "create", "holder", "--team", "ml-a", "--profile", "gpu-small", "--wait",
              user="alice")
    stack.cli("ws", "create", "late", "--team", "ml-b", "--profile", "gpu-wait", user="carol")
    stack.cli("ws", "create", "nevermind", "--team", "ml-b", "--profile", "gpu-small",
              user="carol")
    stack.wait_for(lambda: state_of(stack, "ml-b--nevermind") == "QUEUED", timeout=60,
                   what="a queued request")
    before = usage(stack, "ml-b")
    out = stack.cli("ws", "cancel", "nevermind", "--team", "ml-b", "--wait", user="carol")
    assert "DELETED" in out.stdout
    assert usage(stack, "ml-b")["workspaces"] == before["workspaces"] - 1
    home = Path(stack.settings.data_dir) / "homes" / "ml-b--nevermind"
    assert not home.exists()
    snapshots = stack.db.collection("snapshots").where(
        filter=firestore.FieldFilter("workspace", "==", "ml-b--nevermind"))
    assert list(snapshots.stream()) == []
    assert requests.get(f"{stack.settings.node_agent_url}/workspaces/ml-b--nevermind",
                        headers=stack.settings.node_agent_headers(),
                        timeout=10).status_code == 404

    wait_state(stack, "ml-b--late", "FAILED", "the request past its maximum wait to fail")
    late = stack.workspace("ml-b--late") or {}
    assert late["state_reason"] == "queue_expired"
    assert "the most its profile allows (5s): no node has 1 x nvidia-l4 free: 1/1 (1 declared)" \
        in late["state_message"]
    assert usage(stack, "ml-b")["workspaces"] == before["workspaces"] - 2
    stack.cli("ws", "delete", "holder", "--team", "ml-a", "--wait", user="alice")
