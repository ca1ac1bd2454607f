"""One OS user per workspace (``runtime.local.tenancy``), seen from inside real kernels.

A node agent that runs as root (CI and this machine do) gives every workspace a uid of its
own; these tests start real JupyterLab servers and kernels on an environment a workspace
user can run (``shared_python``: the host's ``/usr/bin/python3`` of the same minor version,
layered on this repo's venv, since the venv's own interpreter lives under ``/root``, which
no other user may enter) and a data dir other users can traverse. From a kernel: its uid,
its home (0700, its own), another workspace's home, the agent's token and state, the
agent's endpoints, its environment. pip installs land in its home, as that user; the warm
pool's process drops to the workspace's user when adopted; a restarted agent gives the
workspace the same user. The agent's non-root path
(single-tenant, and ``isolation: required`` refused) is checked too.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from test_node_agent import (  # the agent and emulator fixtures of the node agent's tests
    CPU_SMALL,
    IMPORT_PROBE,
    WS,
    Agent,
    Emulated,
    Workspace,
    _warm_pids,
    _wheel,
    agent,
    emulated,
    provision,
    spec_for,
)
from test_warm_kernels import _pools, _probe, _warm_kernels

from functions.adapters.local_runtime import spec_to_json
from functions.ports import RuntimeRefused
from runtime.local import tenancy
from runtime.local.node import NodeAgent
from runtime.local.publisher import RecordingPublisher
from runtime.local.settings import AgentSettings
from runtime.supervisor import free_port

__all__ = ["agent", "emulated"]  # fixtures used by name

OTHER = "team--other"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-workspace users need root")


@pytest.fixture(scope="module")
def shared_python() -> Iterator[str]:
    """An interpreter every user may run, with this repo's packages: a venv of the host's
    Python (same minor version as this one, so the compiled packages fit) whose
    site-packages adds this venv's."""
    host = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not host.exists():
        pytest.skip(f"{host} is not installed: no interpreter other users may run")
    root = Path(tempfile.mkdtemp(prefix="stasis-shared-py-"))
    os.chmod(root, 0o755)
    venv = root / "venv"
    subprocess.run([str(host), "-m", "venv", "--without-pip", str(venv)], check=True)
    (own,) = (venv / "lib").glob("python*/site-packages")
    (own / "repo-venv.pth").write_text("".join(
        f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()))
    subprocess.run(["chmod", "-R", "go+rX", str(root)], check=True)
    try:
        yield str(venv / "bin" / "python")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def agent_settings(emulated: Emulated) -> Iterator[AgentSettings]:
    """A data dir workspace users can traverse to their homes (pytest's own is 0700)."""
    data_dir = Path(tempfile.mkdtemp(prefix="stasis-tenancy-"))
    os.chmod(data_dir, 0o711)
    try:
        yield AgentSettings(data_dir=data_dir, project=emulated.project, port=free_port(),
                            stop_grace=5, start_timeout=90, kernel_timeout=120)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def env_of(python: str) -> dict[str, Any]:
    return {"id": "shared-py", "python": python}


def isolated(agent: Agent, emulated: Emulated, python: str, workspace_id: str = WS,
             requestid: str = "req-provision", **overrides: Any) -> tuple[Workspace, int]:
    provision(agent, emulated, requestid=requestid, workspace_id=workspace_id,
              name=workspace_id.split("--")[1], environment=env_of(python),
              snapshot_prefix=f"snapshots/team/{workspace_id}", **overrides)
    status = agent.get(f"/workspaces/{workspace_id}").json()
    assert status["isolated"] is True, status
    return Workspace.of(agent, workspace_id), int(status["uid"])


PROBE = """
import json, os, urllib.request, urllib.error
def tried(what):
    try:
        what()
        return "allowed"
    except PermissionError:
        return "denied"
def call(method, path):
    request = urllib.request.Request("{url}" + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code
home = os.environ["HOME"]
print(json.dumps({{
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "home_owner": os.stat(home).st_uid, "home_mode": oct(os.stat(home).st_mode & 0o777),
    "other_home": tried(lambda: os.listdir({other!r})),
    "other_file": tried(lambda: open({other_file!r}).read()),
    "homes": tried(lambda: os.listdir({homes!r})),
    "token": tried(lambda: open({token!r}).read()),
    "state": tried(lambda: open({state!r}).read()),
    "agent": [call("GET", "/workspaces"), call("POST", "/workspaces/{other_id}/restore"),
              call("DELETE", "/workspaces/{other_id}")],
    "env": sorted(os.environ),
    "secret_values": [k for k, v in os.environ.items() if {token_value!r} in v],
}}))
"""


def test_each_workspace_is_its_own_user_and_cannot_touch_another(
    agent: Agent, emulated: Emulated, shared_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From one workspace's kernel: it runs as its own uid without groups, owns its home
    (0700); the other workspace's home, the homes' list, the agent's token and state are
    closed to it; the agent refuses its calls; its environment holds no emulator host,
    project, bucket or credential. Its uid is recorded and kept for the next start."""
    monkeypatch.setenv("STASIS_NODE_AGENT_TOKEN", agent.settings.control_token())
    monkeypatch.setenv("STASIS_SLACK_BOT_TOKEN", "xoxb-secret")
    theirs, their_uid = isolated(agent, emulated, shared_python, OTHER, "req-other")
    secret = agent.settings.home(OTHER) / "notes.txt"
    theirs.run(theirs.open_notebook("w.ipynb"),
               f"open({str(secret)!r}, 'w').write('private')")
    ws, uid = isolated(agent, emulated, shared_python)
    assert uid != their_uid
    settings = agent.settings
    code = PROBE.format(url=settings.url, other=str(settings.home(OTHER)),
                        other_file=str(secret), homes=str(settings.homes_dir),
                        token=str(settings.agent_dir / "token"), state=str(settings.state_path),
                        other_id=OTHER, token_value=settings.control_token())
    result = ws.run(ws.open_notebook("probe.ipynb"), code)
    assert result["status"] == "ok", result
    seen = json.loads(result["stdout"])
    assert (seen["uid"], seen["gid"], seen["groups"]) == (uid, uid, [])
    assert (seen["home_owner"], seen["home_mode"]) == (uid, "0o700")
    assert {k: seen[k] for k in ("other_home", "other_file", "homes", "token", "state")} == {
        "other_home": "denied", "other_file": "denied", "homes": "denied",
        "token": "denied", "state": "denied"}
    assert seen["agent"] == [401, 401, 401]
    leaked = [k for k in seen["env"] if k.endswith("_EMULATOR_HOST") or k in (
        "STASIS_PROJECT", "GOOGLE_CLOUD_PROJECT", "STASIS_SNAPSHOT_BUCKET",
        "STASIS_NODE_AGENT_TOKEN", "STASIS_NODE_AGENT_URL", "STASIS_SLACK_BOT_TOKEN")]
    assert leaked == [] and seen["secret_values"] == [], seen["env"]
    assert {"HOME", "PATH", "VIRTUAL_ENV", "STASIS_WORKSPACE_ID"} <= set(seen["env"])
    # The server and every kernel process run as the workspace's user.
    server = psutil.Process(agent.get(f"/workspaces/{WS}").json()["pid"])
    assert {p.uids().real for p in [server, *server.children(recursive=True)]} == {uid}

    # Recorded in the agent's state (root's alone) and kept for the next start.
    state = json.loads(settings.state_path.read_text())
    assert state["workspaces"][WS]["uid"] == uid
    assert oct(settings.state_path.stat().st_mode & 0o777) == "0o600"
    agent.runtime.release(WS)
    _, same = isolated(agent, emulated, shared_python, requestid="req-again")
    assert same == uid
    # A destroy that keeps the home, then a new start: the home's owner again.
    agent.runtime.destroy(WS, keep_home=True)
    _, kept = isolated(agent, emulated, shared_python, requestid="req-after-destroy")
    assert kept == uid


def test_pip_installs_into_the_home_as_the_workspaces_user(
    agent: Agent, emulated: Emulated, shared_python: str
) -> None:
    """The home's venv belongs to the workspace's user, so ``%pip install`` works as that
    user, lands in the home, is there after a pause and a resume on another profile (the
    kernel's state restored, as that user), and the other workspace cannot import it (nor
    read the home it is in)."""
    wheel = _wheel(agent.settings.data_dir)  # pytest's tmp_path is root's alone
    os.chmod(wheel, 0o644)
    ws, uid = isolated(agent, emulated, shared_python)
    kernel = ws.open_notebook("install.ipynb")
    installed = ws.run(kernel, f"%pip install --no-index --no-deps {wheel}\n", timeout=180)
    assert installed["status"] == "ok" and "Successfully installed" in installed["stdout"], \
        installed["stdout"]
    seen = ws.run(kernel, IMPORT_PROBE)
    where = Path(seen["stdout"].split()[-1])
    home = agent.settings.home(WS)
    assert where.is_relative_to(home / ".venv") and where.stat().st_uid == uid, seen

    ws.run(kernel, "kept = 'a variable of the workspace'")

    # Pause (a kernel snapshot) and resume on another profile: the kernel's state and the
    # package both come back, the restored kernel running as the workspace's user.
    spec = spec_for(emulated, "req-pause", environment=env_of(shared_python))
    agent.runtime.snapshot(spec, "snap-user")
    anchor = emulated.events.wait_for("snapshot.finished", snapshot_id="snap-user").payload
    assert anchor.succeeded, anchor.error
    agent.runtime.release(WS)
    other = {**CPU_SMALL, "id": "cpu-other", "memory": "3Gi", "memory_bytes": 3 * 2**30}
    agent.runtime.restore(replace(spec, requestid="req-resume", profile=other), "snap-user",
                          manifest_sha256=anchor.manifest_sha256)
    emulated.events.wait_for("workspace.ready", kernels_restored=1)
    ws = Workspace.of(agent)
    (restored,) = [k["id"] for k in ws.api("GET", "/api/kernels")]
    back = ws.run(restored, "import os\nprint(os.getuid(), kept)")
    assert back["stdout"].split(maxsplit=1) == [str(uid), "a variable of the workspace\n"], back
    after = ws.run(ws.open_notebook("after.ipynb"), IMPORT_PROBE)
    assert after["stdout"].startswith("installed by the researcher"), after

    theirs, _ = isolated(agent, emulated, shared_python, OTHER, "req-other")
    unseen = theirs.run(theirs.open_notebook("probe.ipynb"), IMPORT_PROBE)
    assert unseen.get("ename") == "ModuleNotFoundError", unseen


def test_an_adopted_warm_server_runs_as_the_workspaces_user(
    agent: Agent, emulated: Emulated, shared_python: str
) -> None:
    """The warm process waits as the agent's user; adopted, it and its kernels are the
    workspace's user (setgroups, setgid, setuid before it reads anything of the home)."""
    answer = requests.put(f"{agent.url}/pools", timeout=10, headers=agent.headers, json={
        "environments": [{**env_of(shared_python), "warm_pool": 1}]})
    assert answer.status_code == 200, answer.text
    (warm,) = _warm_pids(agent)
    assert psutil.Process(warm).uids().real == 0
    ready = provision(agent, emulated, environment={**env_of(shared_python), "warm_pool": 1})
    assert ready.payload.runtime_handle == f"local:{warm}"  # adopted, not started cold
    uid = int(agent.get(f"/workspaces/{WS}").json()["uid"])
    assert psutil.Process(warm).uids() == (uid, uid, uid)
    assert psutil.Process(warm).gids().real == uid
    ws = Workspace.of(agent)
    seen = ws.run(ws.open_notebook("warm.ipynb"), "import os\nprint(os.getuid(), os.getcwd())")
    assert seen["stdout"].split() == [str(uid), str(agent.settings.home(WS))], seen


def test_a_claimed_warm_kernel_runs_as_the_workspaces_user_on_its_allow_list(
    agent: Agent, emulated: Emulated, shared_python: str
) -> None:
    """Root's until handed over; then the workspace's uid, gid, home, and the allow-list
    environment (no emulator host), and it is the workspace's first kernel."""
    environment = env_of(shared_python)
    _pools(agent, environment, kernels=1)
    (warm,) = _warm_kernels(agent)
    assert psutil.Process(warm).uids().real == 0  # the agent's user until handed over
    provision(agent, emulated, environment=environment)
    status = agent.get(f"/workspaces/{WS}").json()
    assert status["isolated"] is True, status
    uid = int(status["uid"])
    assert psutil.Process(warm).uids() == (uid, uid, uid)
    assert psutil.Process(warm).gids().real == uid
    ws = Workspace.of(agent)
    seen = _probe(ws, ws.open_notebook("a.ipynb"))
    assert (seen["pid"], seen["uid"], seen["cwd"]) == (warm, uid, str(agent.settings.home(WS)))
    assert not {"PUBSUB_EMULATOR_HOST", "STORAGE_EMULATOR_HOST", "STASIS_PROJECT"} & \
        set(seen["env"]), seen["env"]


def test_isolation_required_is_refused_where_a_workspace_cannot_have_its_own_user(
    agent: Agent, emulated: Emulated
) -> None:
    """The agent's own venv interpreter lives under /root: a workspace user cannot run it,
    so a workspace on it shares the agent's user (and says so) and one whose team requires
    isolation is refused with that reason."""
    provision(agent, emulated)
    status = agent.get(f"/workspaces/{WS}").json()
    assert status["isolated"] is False and status["uid"] is None
    with pytest.raises(RuntimeRefused, match=r"team team require.*cannot give"):
        provision(agent, emulated, requestid="req-required", workspace_id=OTHER,
                  name="other", extra={"isolation_required_by": ["team team"]})


def test_an_agent_that_is_not_root_is_single_tenant(shared_python: str) -> None:
    """The real capability check, as uid 65534: it says why, and refuses to isolate."""
    code = ("import json; from runtime.local import tenancy; "
            "t = tenancy.detect(); print(json.dumps(t.describe()))")
    done = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
         shared_python, "-c", code], capture_output=True, text=True, timeout=60, cwd="/",
        env={"PYTHONPATH": str(Path(tenancy.__file__).resolve().parents[2]),
             "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["mode"] == "single-tenant"
    assert "runs as uid 65534, not root" in seen["reason"]


def test_a_restarted_agent_gives_the_workspace_the_uid_it_had(
    agent_settings: AgentSettings, emulated: Emulated, shared_python: str
) -> None:
    """The uid is the agent's state, not its memory: an agent started after another gives
    the workspace the same user again, and its home is still that user's."""
    spec = spec_to_json(spec_for(emulated, "req-1", environment=env_of(shared_python)))
    other = spec_to_json(spec_for(emulated, "req-0", environment=env_of(shared_python),
                                  workspace_id=OTHER, name="other",
                                  snapshot_prefix=f"snapshots/team/{OTHER}"))
    first = NodeAgent(agent_settings, RecordingPublisher())
    first.start()
    try:
        first.provision(OTHER, other)  # takes the lowest uid, so WS gets the next one
        first.publisher.wait_for("workspace.ready", timeout=120)  # type: ignore[attr-defined]
        first.provision(WS, spec)
        first.publisher.wait_for("workspace.ready", timeout=120)  # type: ignore[attr-defined]
        uid = first.status(WS)["uid"]
        first.destroy(OTHER, keep_home=False)  # the lowest uid is free again
        first.release(WS)
    finally:
        first.close()
    assert uid == tenancy.UID_BASE + 1
    # Only the state says whose it was: a home handed back as root's (restored elsewhere).
    subprocess.run(["chown", "-R", "0:0", str(agent_settings.home(WS))], check=True)
    again = NodeAgent(agent_settings, RecordingPublisher())
    again.start()
    try:
        again.provision(WS, {**spec, "requestid": "req-2"})
        again.publisher.wait_for("workspace.ready", timeout=120)  # type: ignore[attr-defined]
        status = again.status(WS)
        assert (status["uid"], status["isolated"]) == (uid, True)
        assert psutil.Process(status["pid"]).uids().real == uid
        assert agent_settings.home(WS).stat().st_uid == uid
    finally:
        again.destroy(WS, keep_home=False)
        again.close()
