"""How a workspace server is started: argv, environment, the limits trampoline, stopping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from runtime.local import servers
from runtime.local.host import Limits
from runtime.local.servers import ServerLaunch, ServerProcess, server_argv, server_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def _launch(tmp_path: Path, **overrides: object) -> ServerLaunch:
    values: dict[str, object] = {
        "workspace_id": "team--ws",
        "home": tmp_path / "homes" / "team--ws",
        "runtime_dir": tmp_path / "run" / "team--ws",
        "log_path": tmp_path / "logs" / "team--ws.log",
        "repo_root": REPO_ROOT,
        "limits": Limits(memory_bytes=2**30, cpus=(0,)),
        "base_env": {
            "PATH": "/usr/bin",
            "JUPYTER_TOKEN": "agent's",
            "JPY_SESSION_NAME": "x",
            "PYTHONPATH": "/opt/lib",
            "STORAGE_EMULATOR_HOST": "http://127.0.0.1:1",
        },
    }
    values.update(overrides)
    return ServerLaunch(**values)  # type: ignore[arg-type]


def test_jupyterlab_argv(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    argv = server_argv(launch, 4321)
    assert argv[:3] == [sys.executable, "-m", "runtime.local.launch"]
    assert argv[3:8] == ["--memory-bytes", str(2**30), "--cpus", "0", "--"]
    assert argv[8:11] == [sys.executable, "-m", "jupyterlab"]
    assert "--ServerApp.ip=127.0.0.1" in argv and "--ServerApp.port=4321" in argv
    assert f"--ServerApp.root_dir={launch.home}" in argv
    # Served under the IDE access proxy's path: the proxy forwards paths unchanged.
    assert "--ServerApp.base_url=/w/team--ws/" in argv
    assert ("--allow-root" in argv) == (os.geteuid() == 0)
    assert not any("token" in a.lower() for a in argv)


def test_environment_points_into_the_home(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    env = server_env(launch, token="s3cret", marker="m1")
    assert env["HOME"] == str(launch.home)
    assert env["PYTHONUSERBASE"] == str(launch.home / ".local")
    assert env["PIP_CACHE_DIR"] == str(launch.home / ".cache" / "pip")
    assert env["JUPYTER_RUNTIME_DIR"] == str(launch.runtime_dir)
    assert env["PYTHONPATH"] == f"{REPO_ROOT}{os.pathsep}/opt/lib"
    assert env["JUPYTER_TOKEN"] == "s3cret" and "PASSWORD" not in env
    assert env["STORAGE_EMULATOR_HOST"] == "http://127.0.0.1:1"
    assert "JPY_SESSION_NAME" not in env
    assert (env[servers.MARKER_VAR], env[servers.WORKSPACE_VAR]) == ("m1", "team--ws")


def test_the_control_planes_credentials_never_reach_a_workspace(tmp_path: Path) -> None:
    secrets = {"STASIS_NODE_AGENT_TOKEN": "a", "STASIS_SLACK_SIGNING_SECRET": "b",
               "STASIS_SLACK_BOT_TOKEN": "c", "STASIS_SESSION_SECRET": "d",
               "STASIS_ALERTMANAGER_TOKEN": "e", "STASIS_SIDECAR_KEY": "f"}
    launch = _launch(tmp_path, base_env={"PATH": "/usr/bin", **secrets})
    env = server_env(launch, token="s3cret", marker="m")
    assert not set(secrets) & set(env)


def test_a_workspace_with_its_own_user_gets_only_the_allow_list(tmp_path: Path) -> None:
    """An isolated workspace's server starts from an allow-list of the agent's environment:
    no emulator host, project, bucket or credential, whatever the agent holds."""
    agent_env = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "xterm",
                 "STORAGE_EMULATOR_HOST": "http://127.0.0.1:1",
                 "PUBSUB_EMULATOR_HOST": "127.0.0.1:2", "FIRESTORE_EMULATOR_HOST": "h:3",
                 "STASIS_PROJECT": "p", "GOOGLE_CLOUD_PROJECT": "p",
                 "STASIS_SNAPSHOT_BUCKET": "b", "STASIS_NODE_AGENT_TOKEN": "a",
                 "STASIS_NODE_AGENT_URL": "http://127.0.0.1:8714", "AWS_SECRET_ACCESS_KEY": "s",
                 "GOOGLE_APPLICATION_CREDENTIALS": "/root/key.json", "SLACK_BOT_TOKEN": "x"}
    launch = _launch(tmp_path, base_env=agent_env, uid=300_007)
    env = server_env(launch, token="s3cret", marker="m")
    assert not {k for k in agent_env if k not in ("PATH", "LANG", "LC_ALL", "TERM")} & set(env)
    assert (env["LANG"], env["LC_ALL"], env["TERM"]) == ("C.UTF-8", "C.UTF-8", "xterm")
    assert (env["USER"], env["LOGNAME"], env["HOME"]) == ("ws300007", "ws300007",
                                                          str(launch.home))
    assert env["JUPYTER_TOKEN"] == "s3cret" and env[servers.WORKSPACE_VAR] == "team--ws"
    argv = server_argv(launch, 4321)
    assert argv[argv.index("--user") + 1] == "300007" and "--allow-root" not in argv
    assert argv.index("--user") < argv.index("--")  # the trampoline drops, then execs


def test_the_node_agent_gets_no_front_door_secret(tmp_path: Path) -> None:
    """The agent's environment is where every workspace's starts from."""
    from stack.local import agent_env
    from stack.settings import Settings

    env = agent_env(Settings(data_dir=tmp_path))
    assert not [k for k in env if k.startswith(("STASIS_SLACK_", "STASIS_SESSION",
                                                "STASIS_ALERTMANAGER"))]
    assert env["STASIS_NODE_AGENT_TOKEN"] == Settings(data_dir=tmp_path).node_agent_token()


def test_vscode_runs_code_server_with_the_password_in_the_environment(tmp_path: Path) -> None:
    launch = _launch(tmp_path, ide="vscode", limits=Limits())
    argv = server_argv(launch, 4321)
    assert argv[argv.index("--bind-addr") + 1] == "127.0.0.1:4321"
    assert argv[argv.index("--auth") + 1] == "password" and argv[-1] == str(launch.home)
    # code-server works relatively behind the proxy's prefix; only /absproxy needs it.
    assert argv[argv.index("--abs-proxy-base-path") + 1] == "/w/team--ws"
    env = server_env(launch, token="s3cret", marker="m")
    assert env["PASSWORD"] == "s3cret" and "JUPYTER_TOKEN" not in env


def test_a_server_is_addressed_under_its_base_path_and_records_it() -> None:
    lab = ServerProcess("team--ws", pid=1, port=4321, token="t", marker="m", create_time=0.0,
                        started_at=0.0, log_path="l", base_path="/w/team--ws/")
    assert lab.base_url == "http://127.0.0.1:4321/w/team--ws"
    assert lab.url == "http://127.0.0.1:4321/w/team--ws/lab"
    assert ServerProcess.from_json("team--ws", lab.to_json()) == lab
    code = ServerProcess("team--ws", pid=1, port=4321, token="t", marker="m", create_time=0.0,
                         started_at=0.0, log_path="l", ide="vscode")
    assert (code.base_url, code.url) == ("http://127.0.0.1:4321", "http://127.0.0.1:4321/")
    # A server recorded before base paths (an older agent's state file) is still found.
    old = {k: v for k, v in lab.to_json().items() if k != "base_path"}
    assert ServerProcess.from_json("team--ws", old).base_url == "http://127.0.0.1:4321"


def test_unknown_interpreter_is_named() -> None:
    assert servers.resolve_python({"id": "py", "python": "default"}) == sys.executable
    assert servers.resolve_python({"id": "py"}) == sys.executable
    with pytest.raises(servers.ServerError, match="environment py-9: interpreter 'nope9'"):
        servers.resolve_python({"id": "py-9", "python": "nope9"})


def test_trampoline_applies_limits_then_becomes_the_command() -> None:
    probe = (
        "import json, os, resource; print(json.dumps([os.getpid(), "
        "resource.getrlimit(resource.RLIMIT_DATA), sorted(os.sched_getaffinity(0))]))"
    )
    cpu = sorted(os.sched_getaffinity(0))[0]
    # exec keeps the pid: the agent's record of the server stays true.
    popen = subprocess.Popen(
        [sys.executable, "-m", "runtime.local.launch", "--memory-bytes", str(2**30),
         "--cpus", str(cpu), "--", sys.executable, "-c", probe],
        stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    out, _ = popen.communicate(timeout=60)
    pid, rlimit, cpus = json.loads(out)
    assert pid == popen.pid
    assert rlimit == [2**30, 2**30]
    assert cpus == [cpu]


def test_stop_ends_the_group_and_escaped_descendants(tmp_path: Path) -> None:
    """A server whose child left its session (as a Jupyter kernel does) is stopped whole."""
    marker = uuid.uuid4().hex
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
        " start_new_session=True)\n"
        "time.sleep(600)\n"
    )
    popen = subprocess.Popen(
        [sys.executable, "-c", script],
        start_new_session=True,
        env={**os.environ, servers.MARKER_VAR: marker},
    )
    server = ServerProcess(
        workspace_id="team--ws",
        pid=popen.pid,
        port=1,
        token="t",
        marker=marker,
        create_time=psutil.Process(popen.pid).create_time(),
        started_at=time.time(),
        log_path=str(tmp_path / "log"),
        popen=popen,
    )
    deadline = time.monotonic() + 30
    while len(servers._tree(server)) < 2:
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.05)
    tree = servers._tree(server)
    servers.stop(server, grace=2)
    assert not server.is_alive()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree)
    servers.stop(server, grace=2)  # idempotent
