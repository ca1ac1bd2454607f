"""Monitoring triggers on the whole local stack (local runtime, real kernels), driven as an
operator would: `stasis events monitoring FILE.json --restamp` replays a saved
notification onto the monitoring topic, and Alertmanager's webhook is posted to the
function host.

The module's stack gets one extra profile, ``cpu-quick`` (pauses after 1 s idle), so the
idle policy can pause within the test; a GPU-idle incident is evidence, and the policy
decides with what the node agent says of the kernels.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from functions.kubernetes.objects.workspace import workspace_names
from harness.notebook import CellError, Notebook
from stack.monitoring import LOCAL_ALERTMANAGER_TOKEN

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "monitoring"
#: The test profile's idle policy: pause after this long without activity.
IDLE_SECONDS = 1


@pytest.fixture(scope="module")
def stack(local_stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    quick = copy.deepcopy(next(p for p in config["profiles"] if p["id"] == "cpu-small"))
    quick.update(id="cpu-quick", title="Pauses after 1 s idle (tests)",
                 idle_policy={"rules": [{"idle_seconds": IDLE_SECONDS, "effect": "pause"}]})
    config["profiles"].append(quick)
    next(t for t in config["teams"] if t["id"] == "ml-a")["profiles"].append("cpu-quick")
    path = tmp_path_factory.mktemp("config") / "stasis.yaml"
    path.write_text(yaml.safe_dump(config))
    local_stack.cli("admin", "apply", str(path))
    return local_stack


def _incident_for(ws_id: str, tmp: Path) -> Path:
    """The saved GPU-idle incident, about the pod of ``ws_id``."""
    payload = json.loads((DATA / "cloud-monitoring-gpu-idle.json").read_text())
    names = workspace_names(ws_id.split("--")[0], ws_id)
    incident = payload["incident"]
    incident["metadata"]["user_labels"]["stasis.dev/workspace"] = names.label
    incident["resource"]["labels"]["pod_name"] = names.pod
    path = tmp / f"{ws_id}.json"
    path.write_text(json.dumps(payload))
    return path


def _idle_for(stack: Any, ws_id: str) -> float:
    """Seconds the node agent saw ``ws_id`` without activity (0 while a kernel is busy)."""
    seen = requests.get(f"{stack.settings.node_agent_url}/workspaces/{ws_id}/activity",
                        headers=stack.settings.node_agent_headers(), timeout=10).json()
    if seen.get("busy_kernels") or not seen.get("last_activity"):
        return 0.0
    last = datetime.fromisoformat(seen["last_activity"].replace("Z", "+00:00"))
    return (datetime.fromisoformat(seen["observed_at"]) - last).total_seconds()


def _status(stack: Any, name: str) -> dict[str, Any]:
    return json.loads(stack.cli("ws", "status", name, "--team", "ml-a", "--json").stdout)


def _state(stack: Any, ws_id: str, state: str) -> dict[str, Any]:
    return stack.wait_for(lambda: (d := stack.workspace(ws_id)) and d["state"] == state and d,
                          timeout=120, what=f"{ws_id} {state}")


def test_a_gpu_idle_incident_pauses_an_idle_workspace_but_not_a_busy_one(
        stack: Any, tmp_path: Path) -> None:
    stack.cli("ws", "create", "busy", "--team", "ml-a", "--profile", "cpu-quick", "--wait")
    stack.cli("ws", "create", "quiet", "--team", "ml-a", "--profile", "cpu-quick", "--wait")
    # A cell runs in "busy" for as long as the test needs it to.
    info = _status(stack, "busy")
    nb = Notebook(info["direct_url"], info["token"])
    kernel = nb.open("train.ipynb")

    def cell() -> None:
        with contextlib.suppress(CellError):  # ended below by an interrupt
            nb.run(kernel, "import time\ntime.sleep(600)", timeout=700)

    threading.Thread(target=cell, daemon=True).start()
    agent, headers = stack.settings.node_agent_url, stack.settings.node_agent_headers()
    stack.wait_for(lambda: requests.get(f"{agent}/workspaces/ml-a--busy/activity",
                                        headers=headers, timeout=10).json().get("busy_kernels"),
                   timeout=60, what="the cell running")
    changes = stack.subscribe("stasis-workspace-state-changed")
    evidence = stack.subscribe("stasis-workspace-idle-detected")

    # The busy one first: its evidence is weighed while the cell runs, before the other
    # notification is even sent.
    replay = stack.cli("events", "monitoring", str(_incident_for("ml-a--busy", tmp_path)),
                       "--restamp")
    assert "gpu_idle for pod label stasis.dev/workspace=" in replay.stdout
    [seen] = stack.pull(evidence, want=1)
    assert json.loads(seen.data)["cause"] == "gpu_idle"
    stack.cli("events", "monitoring", str(_incident_for("ml-a--quiet", tmp_path)), "--restamp")
    quiet = _state(stack, "ml-a--quiet", "PAUSED")
    assert quiet["pause_cause"] == "idle"
    assert "GPU duty cycle 0% (under 10% for 20m) (Cloud Monitoring incident" in \
        _status(stack, "quiet")["state_message"]
    assert stack.workspace("ml-a--busy")["state"] == "RUNNING"
    moved = {json.loads(m.data)["workspace_id"] for m in stack.pull(changes, want=2)}
    assert moved == {"ml-a--quiet"}

    # The cell ends: the same kind of incident now finds the kernels idle.
    requests.post(f"{info['direct_url'].rstrip('/').removesuffix('/lab')}/api/kernels/{kernel}/"
                  "interrupt", headers={"Authorization": f"token {info['token']}"}, timeout=30)
    # Idle for longer than the policy's idle_seconds before the incident is replayed: the
    # handler counts idle time from the kernel's last activity (the interrupt), so a replay
    # sooner than that (a fast CLI) would rightly find it not idle yet.
    stack.wait_for(lambda: _idle_for(stack, "ml-a--busy") > IDLE_SECONDS, timeout=60,
                   what="the cell interrupted and the kernel idle for the policy's time")
    stack.cli("events", "monitoring", str(_incident_for("ml-a--busy", tmp_path)), "--restamp")
    assert _state(stack, "ml-a--busy", "PAUSED")["pause_cause"] == "idle"


def test_the_alertmanager_webhook_needs_its_token_and_bad_alerts_are_dead_lettered(
        stack: Any) -> None:
    url = f"{stack.settings.functions_url}/alertmanager/"
    body = json.loads((DATA / "alertmanager-gpu-idle.json").read_text())
    for headers in ({}, {"Authorization": "Bearer wrong"},
                    {"Authorization": f"Basic {LOCAL_ALERTMANAGER_TOKEN}"}):
        refused = requests.post(url, json=body, headers=headers, timeout=30)
        assert refused.status_code == 401, headers
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    # Authenticated: relayed, and read like any notification. Its alerts name a pod of no
    # workspace here (and another rule's alert): refused, with the reasons in `stasis dlq`.
    accepted = requests.post(url, json=body, timeout=30,
                             headers={"Authorization": f"Bearer {LOCAL_ALERTMANAGER_TOKEN}"})
    assert accepted.status_code == 202 and accepted.json()["relayed"]

    def dead_letter() -> dict[str, Any] | None:
        rows = json.loads(stack.cli("dlq", "--json").stdout)
        return next((r for r in rows if r["consumer"] == "on_monitoring"), None)

    row = stack.wait_for(dead_letter, timeout=60, what="the dead letter")
    # The saved alerts are old by now (stale), and the second is not a Stasis signal.
    assert row["reason"].startswith("stale: alert 1 (StasisWorkspaceGPUIdle) ended at ")
    assert "unsupported: alert 2 (KubeNodeNotReady) is not a Stasis signal" in row["reason"]


def test_a_spot_preemption_of_this_node_fails_the_workspace_running_on_it(
        stack: Any, tmp_path: Path) -> None:
    stack.cli("ws", "create", "spot", "--team", "ml-a", "--profile", "cpu-small", "--wait")
    entry = json.loads((DATA / "cloud-logging-spot-preemption.json").read_text())
    node = socket.gethostname()  # the node agent's node (runtime/local/node.py NODE_NAME)
    entry["protoPayload"]["resourceName"] = f"projects/p/zones/z/instances/{node}"
    path = tmp_path / "preempted.json"
    path.write_text(json.dumps(entry))
    replay = stack.cli("events", "monitoring", str(path), "--restamp")
    assert f"spot_preemption for node {node}" in replay.stdout
    doc = _state(stack, "ml-a--spot", "FAILED")
    assert doc["state_reason"] == "preempted"
    assert doc["state_message"].startswith(f"node {node} was preempted (Spot) at ")
    agent, headers = stack.settings.node_agent_url, stack.settings.node_agent_headers()
    stack.wait_for(lambda: not requests.get(f"{agent}/workspaces/ml-a--spot", headers=headers,
                                            timeout=10).json().get("running"),
                   timeout=60, what="the server released")
