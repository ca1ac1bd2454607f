"""Agent sandboxes for real: git working copies, the trampoline's isolation and limits, the
monitor's watchdog, fake-gcs-server for patches and logs, and (for admission) the Firestore
emulator with the handler, the node agent's endpoints on a real HTTP server, and
sandbox.finished fed back to the handler as Pub/Sub push would.

Every test ends with no sandbox process left (checked with psutil).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import yaml
from flask import Flask, jsonify
from google.auth.credentials import AnonymousCredentials
from google.cloud import firestore, storage
from werkzeug.serving import make_server

from events import Event, SandboxRequested, SandboxResumeRequested, new_event
from functions.adapters.firestore_store import FirestoreStore
from functions.adapters.sandbox_runtime import LocalSandboxRuntime
from functions.adapters.sandbox_store import FirestoreSandboxStore
from functions.domain.catalog import Catalog
from functions.handlers import sandboxes as handler
from functions.handlers.deps import Deps
from functions.handlers.sandbox_ports import SandboxDeps
from functions.routes import ROUTES
from runtime.local.node import AgentError
from runtime.local.publisher import RecordingPublisher
from runtime.local.sandboxes import (
    UID_BASE,
    UID_COUNT,
    SandboxRunner,
    candidate_roots,
    register_sandboxes,
)
from runtime.local.settings import AgentSettings
from runtime.supervisor import free_port

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "GOOGLE_APPLICATION_CREDENTIALS": "/very/secret/adc.json",
    "SLACK_BOT_TOKEN": "xoxb-very-secret-token",
    "STASIS_SLACK_SIGNING_SECRET": "very-secret-signing",
    "AWS_SECRET_ACCESS_KEY": "very-secret-aws-key",
    "SSH_AUTH_SOCK": "/tmp/very-secret-ssh-agent.sock",
    "GITHUB_TOKEN": "ghp_verysecret",
}
LIMITS = {"cpu_seconds": 60, "memory_bytes": 1 << 30, "wall_clock_seconds": 60, "processes": 128}

CALC_BUG = "def add(a, b):\n    return a - b\n"
TEST_CALC = ("import unittest\n\nfrom calc import add\n\n\n"
             "class AddTest(unittest.TestCase):\n"
             "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
FIX = "python3 -m unittest -q && exit 3; sed -i 's/a - b/a + b/' calc.py && python3 -m unittest"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], capture_output=True, text=True, check=True)
    return done.stdout


def unittest_passes(repo: Path) -> bool:
    return subprocess.run(["python3", "-m", "unittest", "-q"], cwd=repo, capture_output=True,
                          check=False).returncode == 0


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository whose one test fails: add() subtracts."""
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text(CALC_BUG)
    (path / "test_calc.py").write_text(TEST_CALC)
    (path / ".gitignore").write_text("__pycache__/\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "add() with a bug")
    assert not unittest_passes(path)
    return path


@dataclass
class Env:
    project: str
    bucket: str
    gcs: storage.Client
    environ: dict[str, str]

    def read(self, uri: str) -> bytes:
        bucket, _, name = uri.removeprefix("gs://").partition("/")
        data: bytes = self.gcs.bucket(bucket).blob(name).download_as_bytes()
        return data


@pytest.fixture
def env(emulator_env: dict[str, str], gcs_emulator: Any) -> Env:
    project = emulator_env["STASIS_PROJECT"]
    gcs = storage.Client(project=project, credentials=AnonymousCredentials(),
                         client_options={"api_endpoint": gcs_emulator.url})
    bucket = emulator_env["STASIS_SNAPSHOT_BUCKET"]
    gcs.create_bucket(bucket)
    return Env(project, bucket, gcs, {**os.environ, **SECRETS})


def sandbox_processes(root: Path) -> list[psutil.Process]:
    """Live processes of sandboxes: their users' (200000+), or running in their dirs."""
    found = []
    for proc in psutil.process_iter(["uids", "cwd", "cmdline"]):
        try:
            uid = proc.info["uids"].real
            cwd = proc.info["cwd"] or ""
            if (UID_BASE <= uid < UID_BASE + UID_COUNT or cwd.startswith(str(root))) and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, AttributeError):
            continue
    return found


@pytest.fixture
def runner(env: Env, tmp_path: Path) -> Iterator[SandboxRunner]:
    # Under /tmp (traversable), not tmp_path (0700): sandboxes may run as users of their own.
    root = Path(tempfile.mkdtemp(prefix="stasis-test-sandboxes-"))
    run = SandboxRunner(AgentSettings(data_dir=tmp_path / "data", project=env.project),
                        RecordingPublisher(), root=root, environ=env.environ)
    try:
        yield run
    finally:
        release(run)
        run.wait_idle(60)
        deadline = time.monotonic() + 10
        while (left := sandbox_processes(root)) and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(root, ignore_errors=True)
        assert left == [], f"sandbox processes left: {[(p.pid, p.cmdline()) for p in left]}"


def task_file(runner: SandboxRunner, sandbox_id: str, name: str) -> Path:
    """A file of a running sandbox's working copy, as its monitor sees it: the working copy
    lives on the sandbox's disk, a tmpfs only the monitor's mount namespace holds."""
    pid = runner.status(sandbox_id)["pid"]
    work = runner.root / sandbox_id / "disk" / "work" / name
    return Path(f"/proc/{pid}/root{work}") if pid else work


def release(runner: SandboxRunner) -> None:
    """A failed test may leave a sandbox suspended, held for ever: cancel it."""
    for status in runner.list():
        if status["state"] == "suspended":
            runner.cancel(status["sandbox_id"])


_ids = iter(range(10**6))


def run(runner: SandboxRunner, env: Env, repo: Path, command: str, *,
        limits: dict[str, int] | None = None, allowed: list[str] | None = None,
        sandbox_id: str | None = None, timeout: float = 90,
        allow_unisolated: bool = False) -> Any:
    """Start one sandbox and wait for its sandbox.finished payload."""
    sandbox_id = sandbox_id or f"sbx-test-{next(_ids)}"
    runner.start(sandbox_id, {
        "sandbox_id": sandbox_id, "team": "ml-a", "repository": str(repo), "base_ref": "main",
        "command": command, "limits": {**LIMITS, **(limits or {})},
        "allowed_network": allowed or [], "requestid": f"req-{sandbox_id}",
        "bucket": env.bucket, "prefix": f"sandboxes/ml-a/{sandbox_id}",
        "allow_unisolated": allow_unisolated})
    publisher: RecordingPublisher = runner.publisher  # type: ignore[assignment]
    return publisher.wait_for("sandbox.finished", timeout=timeout,
                              sandbox_id=sandbox_id).payload


# -- a task returns a patch ------------------------------------------------------------------


def test_a_task_that_fixes_the_failing_test_returns_a_patch_that_makes_it_pass(
        runner: SandboxRunner, env: Env, repo: Path, tmp_path: Path) -> None:
    result = run(runner, env, repo, FIX)
    assert result.succeeded and result.termination == "exited" and result.exit_status == 0
    assert result.files_changed == ["calc.py"]
    assert result.base_sha == git(repo, "rev-parse", "main").strip()
    assert result.patch_uri == f"gs://{env.bucket}/sandboxes/ml-a/{result.sandbox_id}/patch.diff"
    log = env.read(result.log_uri).decode()
    # The test failed before the fix and passed after it, in the sandbox.
    assert log.index("FAILED (failures=1)") < log.rindex("\nOK\n")

    # Never applied on its own: the source repository is untouched.
    assert (repo / "calc.py").read_text() == CALC_BUG and git(repo, "status", "--short") == ""
    review = tmp_path / "review"
    subprocess.run(["git", "clone", "-q", str(repo), str(review)], check=True)
    assert not unittest_passes(review)
    patch = tmp_path / "fix.patch"
    patch.write_bytes(env.read(result.patch_uri))
    git(review, "apply", "--binary", str(patch))
    assert unittest_passes(review)


def test_new_and_deleted_and_binary_files_are_in_the_patch(
        runner: SandboxRunner, env: Env, repo: Path, tmp_path: Path) -> None:
    command = ("printf '\\000\\001\\002' > blob.bin && echo hi > notes/new.txt || "
               "(mkdir notes && echo hi > notes/new.txt && printf '\\000\\001' > blob.bin) "
               "&& git rm -q test_calc.py")
    result = run(runner, env, repo, command)
    assert result.succeeded, result.error
    assert sorted(result.files_changed) == ["blob.bin", "notes/new.txt", "test_calc.py"]
    review = tmp_path / "review"
    subprocess.run(["git", "clone", "-q", str(repo), str(review)], check=True)
    patch = tmp_path / "p.patch"
    patch.write_bytes(env.read(result.patch_uri))
    git(review, "apply", "--binary", str(patch))
    assert (review / "blob.bin").read_bytes() == b"\x00\x01"
    assert (review / "notes" / "new.txt").read_text() == "hi\n"
    assert not (review / "test_calc.py").exists()


def test_a_bad_base_ref_fails_to_start_with_the_reason(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    sandbox_id = "sbx-badref"
    runner.start(sandbox_id, {
        "sandbox_id": sandbox_id, "team": "ml-a", "repository": str(repo),
        "base_ref": "no-such-branch", "command": "true", "limits": LIMITS,
        "allowed_network": [], "requestid": "r", "bucket": env.bucket,
        "prefix": f"sandboxes/ml-a/{sandbox_id}"})
    publisher: RecordingPublisher = runner.publisher  # type: ignore[assignment]
    result = publisher.wait_for("sandbox.finished", sandbox_id=sandbox_id, timeout=60).payload
    assert result.termination == "failed_to_start" and not result.succeeded
    assert "no-such-branch" in result.error and result.patch_uri is None
    assert "could not start" in env.read(result.log_uri).decode()


# -- limits ----------------------------------------------------------------------------------


def test_a_task_over_its_memory_is_stopped_with_the_reason(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    # Three processes of ~60 MiB each: every one is under the per-process limit, the
    # sandbox's total is not; the watchdog kills all of them.
    hog = "python3 -c \"import time; x = b'x' * (60 << 20); time.sleep(60)\""
    result = run(runner, env, repo, f"{hog} & {hog} & {hog} & wait",
                 limits={"memory_bytes": 128 << 20})
    assert result.termination == "memory_limit_exceeded" and not result.succeeded
    assert result.peak_memory_bytes > 128 << 20
    assert "memory limit of 134217728 bytes exceeded" in result.error
    # One process asking for more than the limit at once: its allocation fails.
    single = run(runner, env, repo, "python3 -c \"x = b'x' * (512 << 20)\"",
                 limits={"memory_bytes": 128 << 20})
    assert single.termination == "memory_limit_exceeded", single.error


def test_a_task_over_its_wall_clock_is_stopped_with_everything_it_started(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    began = time.monotonic()
    # A daemon that leaves the process group must not survive its sandbox either.
    result = run(runner, env, repo, "setsid sleep 300 & echo started > started.txt; sleep 300",
                 limits={"wall_clock_seconds": 2})
    assert time.monotonic() - began < 20
    assert result.termination == "wall_clock_exceeded" and not result.succeeded
    assert "wall clock limit of 2 s exceeded" in result.error
    assert result.files_changed == ["started.txt"], "a partial patch is still returned"


def test_a_task_over_its_cpu_time_is_stopped_with_the_reason(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    result = run(runner, env, repo, "python3 -c 'while True: pass'",
                 limits={"cpu_seconds": 1})
    assert result.termination == "cpu_time_exceeded", result.error
    assert result.cpu_seconds >= 0.9


# -- what a sandbox can see and reach ---------------------------------------------------------


def test_the_sandbox_environment_holds_no_credentials_of_the_host(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    # The markers are spelled so that the command line in the log's header does not hold
    # them; the output does. PPID is the monitor (the agent's environment).
    command = ("echo ENV''-BEGIN; env; echo ENV''-END; (tr '\\0' '\\n' < /proc/$PPID/environ) "
               "2>&1; (tr '\\0' '\\n' < /proc/1/environ) 2>&1; true")
    result = run(runner, env, repo, command)
    assert result.succeeded, result.error
    log = env.read(result.log_uri).decode()
    seen = log.split("ENV-BEGIN\n")[1].split("ENV-END\n")[0]
    for name, value in SECRETS.items():
        assert value not in log, f"{name}'s value reached the sandbox"
        assert f"{name}=" not in seen, f"{name} is set in the sandbox"
    for name in ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "STORAGE_EMULATOR_HOST",
                 "GOOGLE_CLOUD_PROJECT", "PYTHONPATH", "VIRTUAL_ENV"):
        assert f"\n{name}=" not in seen
    assert f"HOME={runner.root / result.sandbox_id / 'disk' / 'home'}" in seen


@pytest.fixture
def loopback_server() -> Iterator[SimpleNamespace]:
    """A TCP server on the host's loopback, outside any sandbox; counts connections."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    state = SimpleNamespace(port=server.getsockname()[1], accepted=0, stop=False)

    def serve() -> None:
        while not state.stop:
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                state.accepted += 1
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield state
    state.stop = True
    thread.join(5)
    server.close()


def test_without_allowed_network_the_host_loopback_is_out_of_reach(
        runner: SandboxRunner, env: Env, repo: Path, loopback_server: SimpleNamespace) -> None:
    if not runner.isolation.network:
        pytest.skip(f"network isolation is not enforced on this host: "
                    f"{runner.isolation.detail}")
    connect = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
               f"{loopback_server.port}), timeout=3); print('CONNECTED')\"")
    isolated = run(runner, env, repo, connect)
    assert not isolated.succeeded and loopback_server.accepted == 0
    assert "\nCONNECTED\n" not in env.read(isolated.log_uri).decode()
    assert "ConnectionRefusedError" in env.read(isolated.log_uri).decode()
    assert isolated.network.startswith("none: a network namespace with loopback only")
    # The control: with the network allowed, the same connect reaches the server.
    opened = run(runner, env, repo, connect, allowed=["127.0.0.1"])
    assert opened.succeeded and loopback_server.accepted == 1
    assert "does not filter by destination" in opened.network


def _probe_without(capabilities: str, tmp_path: Path) -> Any:
    """The real isolation probe, run without ``capabilities`` (setpriv drops them from the
    bounding set): the namespace or the user drop really fails, as on a locked-down host."""
    from runtime.local.sandboxes import detect_isolation

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to take a capability away")
    wrapper = tmp_path / f"python-without-{capabilities.replace(',', '-')}"
    drop = ",".join(f"-{c}" for c in capabilities.split(","))
    wrapper.write_text(f"#!/bin/sh\nexec setpriv --inh-caps={drop} --bounding-set={drop} "
                       f"{sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return detect_isolation(str(wrapper))


def _runner_with(isolation: Any, env: Env, tmp_path: Path, root: Path,
                 **environ: str) -> SandboxRunner:
    return SandboxRunner(
        AgentSettings(data_dir=tmp_path / "d", project=env.project), RecordingPublisher(),
        root=root, environ={**env.environ, **environ}, isolation=isolation)


def test_a_sandbox_whose_network_namespace_fails_is_refused(
        env: Env, repo: Path, tmp_path: Path) -> None:
    """unshare fails (no CAP_SYS_ADMIN): refused with the reason, nothing run, unless the
    node's admin allows unisolated sandboxes; then the result says NOT ENFORCED."""
    from runtime.local.node import Refused

    isolation = _probe_without("sys_admin", tmp_path)
    assert not isolation.network and isolation.separate_users  # probed separately
    root = Path(tempfile.mkdtemp(prefix="stasis-test-sandboxes-"))
    try:
        runner = _runner_with(isolation, env, tmp_path, root)
        with pytest.raises(Refused) as refused:
            run(runner, env, repo, "touch ran.txt")
        assert "network isolation could not be verified" in str(refused.value)
        assert "unshare (new network namespace): Operation not permitted" in str(refused.value)
        assert list(root.iterdir()) == []  # nothing started, nothing written

        allowed = _runner_with(isolation, env, tmp_path, root,
                               STASIS_SANDBOX_ALLOW_UNISOLATED="1")
        result = run(allowed, env, repo, "true")
        assert result.succeeded
        assert result.network.startswith("NOT ENFORCED on this host (unshare (new network "
                                         "namespace): Operation not permitted")
        allowed.wait_idle(30)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_sandbox_whose_user_drop_fails_is_refused_even_when_allowed(
        env: Env, repo: Path, tmp_path: Path) -> None:
    """setuid fails (no CAP_SETUID): a root agent's task would run as root, so it is
    refused, whatever the admin allowed; the network namespace alone still worked."""
    from runtime.local.node import Refused

    isolation = _probe_without("setuid,setgid", tmp_path)
    assert isolation.network and not isolation.separate_users
    assert "Operation not permitted" in isolation.users_detail
    root = Path(tempfile.mkdtemp(prefix="stasis-test-sandboxes-"))
    try:
        for environ in ({}, {"STASIS_SANDBOX_ALLOW_UNISOLATED": "1"}):
            runner = _runner_with(isolation, env, tmp_path, root, **environ)
            with pytest.raises(Refused) as refused:
                run(runner, env, repo, "touch ran.txt")
            assert "own user could not be verified" in str(refused.value)
            assert "a task never runs as root" in str(refused.value)
        assert list(root.iterdir()) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_task_sees_nothing_of_the_agent_state_other_homes_or_the_kernels_code(
        env: Env, repo: Path) -> None:
    """The agent's data dir (state, tokens, homes, other sandboxes) and the code the kernels
    import are empty, unreadable and read-only to the task; its own working copy is not.
    Everything here is world-readable (or writable), so only the mount namespace stops it."""
    base = Path(tempfile.mkdtemp(prefix="stasis-test-agent-"))
    try:
        data, code = base / "data", base / "site-packages"
        (data / "homes" / "ws-b").mkdir(parents=True)
        (data / "agent").mkdir()
        (data / "homes" / "ws-b" / "notes.txt").write_text("ws-b-private-notes\n")
        (data / "agent" / "state.json").write_text('{"token": "jupyter-token-of-ws-b"}\n')
        code.mkdir()
        for path in (base, data, data / "homes", data / "homes" / "ws-b", data / "agent"):
            path.chmod(0o755)
        code.chmod(0o777)  # as a non-root agent's venv is to a task running as that user
        runner = SandboxRunner(AgentSettings(data_dir=data, project=env.project),
                               RecordingPublisher(), environ={**env.environ,
                                                              "STASIS_SANDBOX_HIDE": str(code)})
        if not runner.isolation.mounts:
            pytest.skip(f"no mount namespace here: {runner.isolation.mounts_detail}")
        assert runner.root == data / "sandboxes"  # its own directory is under a hidden one
        command = (f"cat {data}/agent/state.json; cat {data}/homes/ws-b/notes.txt; "
                   f"ls {data} {data}/homes; head -1 {ROOT}/pyproject.toml; "
                   f"echo 'import os' > {code}/planted.py; ls {runner.root}; "
                   "echo mine > mine.txt && echo WORK''-OK; touch $HOME/h && echo HOME''-OK; "
                   "true")
        result = run(runner, env, repo, command)
        assert result.succeeded, result.error
        log = env.read(result.log_uri).decode()
        assert "jupyter-token-of-ws-b" not in log and "ws-b-private-notes" not in log
        assert "[project]" not in log and "[build-system]" not in log
        assert f"{data}/agent/state.json: No such file or directory" in log
        assert "Read-only file system" in log and not (code / "planted.py").exists()
        assert "WORK-OK" in log and "HOME-OK" in log and result.files_changed == ["mine.txt"]
        assert (data / "agent" / "state.json").exists()  # hidden, not harmed
        runner.wait_idle(30)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_sandbox_whose_mount_namespace_fails_is_refused(
        env: Env, repo: Path, tmp_path: Path) -> None:
    """No CAP_SYS_ADMIN: the mount namespace is probed on its own and fails; a sandbox
    that needs no network namespace (its network allowed by the policy) is still refused,
    with the reason, unless the admin policy allows unisolated sandboxes (its run spec
    says so); a node that says 0 refuses it even then."""
    from runtime.local.node import Refused

    isolation = _probe_without("sys_admin", tmp_path)
    assert not isolation.mounts and isolation.separate_users
    assert "unshare (new mount namespace): Operation not permitted" in isolation.mounts_detail
    root = Path(tempfile.mkdtemp(prefix="stasis-test-sandboxes-"))
    try:
        runner = _runner_with(isolation, env, tmp_path, root)
        with pytest.raises(Refused) as refused:
            run(runner, env, repo, "touch ran.txt", allowed=["127.0.0.1"])
        assert "mount namespace that hides the node agent's state" in str(refused.value)
        assert "unshare (new mount namespace): Operation not permitted" in str(refused.value)
        assert list(root.iterdir()) == []

        strict = _runner_with(isolation, env, tmp_path, root,
                              STASIS_SANDBOX_ALLOW_UNISOLATED="0")
        with pytest.raises(Refused, match="mount namespace"):
            run(strict, env, repo, "touch ran.txt", allowed=["127.0.0.1"],
                allow_unisolated=True)
        assert list(root.iterdir()) == []
        result = run(runner, env, repo, "true", allowed=["127.0.0.1"], allow_unisolated=True)
        assert result.succeeded, result.error
        runner.wait_idle(30)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_task_writing_past_its_disk_quota_gets_enospc_and_its_patch_comes_back(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    """Working copy, home and tmp share one tmpfs of the quota: a write past it fails
    (ENOSPC) there, not on the host's disk, and what the task wrote still comes back."""
    if not (runner.isolation.mounts and os.geteuid() == 0):
        pytest.skip(f"no disk quota here: {runner.isolation.mounts_detail}")
    command = ("echo small > small.txt; stat -f -c FS''=%T .; df -k . | tail -1; "
               "dd if=/dev/zero of=big.bin bs=1M count=64 2>&1 || exit 7")
    result = run(runner, env, repo, command, limits={"disk_bytes": 16 << 20})
    log = env.read(result.log_uri).decode()
    assert "No space left on device" in log and "\nFS=tmpfs\n" in log
    total_kib = int(log.split("FS=tmpfs\n")[1].split()[1])
    assert total_kib <= 16 << 10  # the task's disk is the quota, not the host's
    assert not result.succeeded and result.exit_status == 7
    assert "disk quota of 16777216 bytes is full" in (result.error or "")
    assert result.patch_uri and set(result.files_changed) == {"small.txt", "big.bin"}
    assert b"+small" in env.read(result.patch_uri)


# -- parallel --------------------------------------------------------------------------------


def test_five_sandboxes_in_parallel_all_return_their_patches(
        runner: SandboxRunner, env: Env, repo: Path, tmp_path: Path) -> None:
    began = time.monotonic()
    ids = [f"sbx-par-{i}" for i in range(5)]
    for i, sandbox_id in enumerate(ids):
        runner.start(sandbox_id, {
            "sandbox_id": sandbox_id, "team": "ml-a", "repository": str(repo),
            "base_ref": "main", "command": f"sleep 1; echo {i} > out-{i}.txt",
            "limits": LIMITS, "allowed_network": [], "requestid": f"r-{sandbox_id}",
            "bucket": env.bucket, "prefix": f"sandboxes/ml-a/{sandbox_id}"})
    publisher: RecordingPublisher = runner.publisher  # type: ignore[assignment]
    results = [publisher.wait_for("sandbox.finished", sandbox_id=s, timeout=120).payload
               for s in ids]
    elapsed = time.monotonic() - began
    for i, result in enumerate(results):
        assert result.succeeded, result.error
        assert result.files_changed == [f"out-{i}.txt"]
        assert f"+{i}\n" in env.read(result.patch_uri).decode()
    # They ran side by side: five 1-second tasks in well under five sequential runs.
    sequential = sum(r.duration_ms for r in results) / 1000
    print(f"5 sandboxes in parallel: {elapsed:.1f}s wall, {sequential:.1f}s summed")
    assert elapsed < sequential


def test_a_cancelled_sandbox_is_killed_and_still_returns_its_patch(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    sandbox_id = "sbx-cancel"
    runner.start(sandbox_id, {
        "sandbox_id": sandbox_id, "team": "ml-a", "repository": str(repo), "base_ref": "main",
        "command": "echo half > half.txt; sleep 300", "limits": LIMITS, "allowed_network": [],
        "requestid": "r", "bucket": env.bucket, "prefix": f"sandboxes/ml-a/{sandbox_id}"})
    deadline = time.monotonic() + 30
    while not task_file(runner, sandbox_id, "half.txt").exists():
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.1)
    assert runner.status(sandbox_id)["state"] == "running"
    assert runner.cancel(sandbox_id)["cancelled"] is True
    publisher: RecordingPublisher = runner.publisher  # type: ignore[assignment]
    result = publisher.wait_for("sandbox.finished", sandbox_id=sandbox_id, timeout=30).payload
    assert result.termination == "cancelled" and result.files_changed == ["half.txt"]
    runner.wait_idle(30)
    assert runner.status(sandbox_id)["state"] == "reported"
    assert runner.cancel(sandbox_id)["cancelled"] is False


def test_a_restarted_runner_reports_what_finished_while_it_was_away(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    sandbox_id = "sbx-away"
    run(runner, env, repo, "echo x > x.txt", sandbox_id=sandbox_id)
    marker = runner.root / sandbox_id / "reported"
    # The runner marks the sandbox reported just after publishing: wait for that, then
    # take the mark away, as if the agent had died between the two.
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    marker.unlink()
    later = SandboxRunner(runner.settings, RecordingPublisher(), root=runner.root,
                          environ=env.environ, isolation=runner.isolation)
    again = later.publisher.wait_for("sandbox.finished", sandbox_id=sandbox_id,  # type: ignore[attr-defined]
                                     timeout=30).payload
    assert again.succeeded and again.files_changed == ["x.txt"]
    later.wait_idle(30)


# -- idle: suspended, resumed on demand ------------------------------------------------------


def start(runner: SandboxRunner, env: Env, repo: Path, sandbox_id: str, command: str,
          **limits: int) -> None:
    runner.start(sandbox_id, {
        "sandbox_id": sandbox_id, "team": "ml-a", "repository": str(repo), "base_ref": "main",
        "command": command, "limits": {**LIMITS, **limits}, "allowed_network": [],
        "requestid": f"req-{sandbox_id}", "bucket": env.bucket,
        "prefix": f"sandboxes/ml-a/{sandbox_id}"})


def held_processes(runner: SandboxRunner, sandbox_id: str) -> list[psutil.Process]:
    """The task's processes (the monitor's descendants), once all of them are held."""
    monitor = psutil.Process(runner.status(sandbox_id)["pid"])
    deadline = time.monotonic() + 10
    while True:
        procs = [p for p in monitor.children(recursive=True) if p.status() != "zombie"]
        if procs and all(p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_DISK_SLEEP)
                         for p in procs):
            return procs
        assert time.monotonic() < deadline, [(p.pid, p.status()) for p in procs]
        time.sleep(0.05)


@pytest.mark.parametrize("hold", ["freezer", "sigstop"])
def test_an_idle_task_is_frozen_with_a_checkpoint_and_finishes_after_a_resume(
        runner: SandboxRunner, env: Env, repo: Path, hold: str) -> None:
    if hold == "freezer" and not os.access("/sys/fs/cgroup/freezer", os.W_OK):
        pytest.skip("no writable cgroup v1 freezer here: the monitor holds tasks by SIGSTOP")
    if hold == "sigstop":
        runner.environ["STASIS_SANDBOX_FREEZER"] = ""  # as where no freezer can be made
    sandbox_id = f"sbx-idle-{hold}"
    # Idle after its first write; wall clock 4 s, held for longer than that: suspended
    # time is not run time.
    start(runner, env, repo, sandbox_id, "echo partial > a.txt; sleep 3; echo done > b.txt",
          idle_seconds=1, wall_clock_seconds=4)
    publisher: RecordingPublisher = runner.publisher  # type: ignore[assignment]
    event = publisher.wait_for("sandbox.suspended", sandbox_id=sandbox_id, timeout=60)
    suspended = event.payload
    assert event.requestid == f"req-{sandbox_id}.suspend-1"
    assert suspended.sequence == 1 and suspended.method == "freeze"
    assert suspended.idle_seconds >= 1 and suspended.memory_released is False
    assert "memory stays resident" in suspended.detail
    status = runner.status(sandbox_id)
    assert status["state"] == "suspended" and status["suspension"]["sequence"] == 1
    procs = held_processes(runner, sandbox_id)
    assert any(p.name() == "sleep" for p in procs)
    assert status["suspension"]["method"].startswith(
        "cgroup v1 freezer" if hold == "freezer" else "SIGSTOP")
    if hold == "freezer":
        [cgroup] = Path("/sys/fs/cgroup/freezer/stasis").glob(f"{sandbox_id}-*")
        assert (cgroup / "freezer.state").read_text().strip() == "FROZEN"
        assert {p.pid for p in procs} <= {int(x) for x in
                                           (cgroup / "cgroup.procs").read_text().split()}
    # The checkpoint holds the work so far, not what comes after the resume.
    checkpoint = env.read(suspended.checkpoint_uri).decode()
    assert suspended.files_changed == ["a.txt"] and "+partial" in checkpoint
    assert suspended.checkpoint_bytes == len(checkpoint.encode())
    cpu_before = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    time.sleep(5)
    assert sum(p.cpu_times().user + p.cpu_times().system for p in procs) == cpu_before
    assert runner.status(sandbox_id)["state"] == "suspended"

    asked = time.monotonic()
    assert runner.resume(sandbox_id)["resumed"] is True
    print(f"idle sandbox: suspended {suspended.idle_seconds} s after its last progress, "
          f"{suspended.detail}; resumed in "
          f"{(time.monotonic() - asked) * 1000:.0f} ms")
    assert runner.resume(sandbox_id)["resumed"] is False  # idempotent: it runs again
    seen, deadline = 1, time.monotonic() + 60
    while time.monotonic() < deadline:  # the rest of its sleep may idle it again: resume
        with contextlib.suppress(TimeoutError):
            publisher.wait_for("sandbox.suspended", sandbox_id=sandbox_id, sequence=seen + 1,
                               timeout=0.5)
            seen += 1
            while runner.resume(sandbox_id)["state"] == "suspended":
                time.sleep(0.1)
        finished = [e for e in publisher.events if e.name == "sandbox.finished"]
        if finished:
            break
    result = publisher.wait_for("sandbox.finished", sandbox_id=sandbox_id, timeout=1).payload
    assert result.succeeded and result.termination == "exited", result.error
    assert sorted(result.files_changed) == ["a.txt", "b.txt"]
    log = env.read(result.log_uri).decode()
    assert "suspended (" in log and "resumed after" in log
    assert "s suspended, " in log


def test_a_busy_task_is_never_suspended(runner: SandboxRunner, env: Env, repo: Path) -> None:
    sandbox_id = "sbx-busy"
    start(runner, env, repo, sandbox_id,
          "end=$(($(date +%s) + 3)); while [ $(date +%s) -lt $end ]; do :; done; "
          "echo ok > busy.txt", idle_seconds=1)
    publisher: RecordingPublisher = runner.publisher  # type: ignore[assignment]
    result = publisher.wait_for("sandbox.finished", sandbox_id=sandbox_id, timeout=60).payload
    assert result.succeeded and result.files_changed == ["busy.txt"]
    assert "sandbox.suspended" not in publisher.names()
    assert "suspended" not in env.read(result.log_uri).decode()


def test_a_suspended_sandbox_can_be_cancelled_and_returns_its_patch(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    sandbox_id = "sbx-idle-cancel"
    start(runner, env, repo, sandbox_id, "echo half > half.txt; sleep 300", idle_seconds=1)
    publisher: RecordingPublisher = runner.publisher  # type: ignore[assignment]
    publisher.wait_for("sandbox.suspended", sandbox_id=sandbox_id, timeout=60)
    held_processes(runner, sandbox_id)
    assert runner.cancel(sandbox_id) == {"sandbox_id": sandbox_id, "cancelled": True,
                                         "state": "suspended"}
    result = publisher.wait_for("sandbox.finished", sandbox_id=sandbox_id, timeout=30).payload
    assert result.termination == "cancelled" and result.files_changed == ["half.txt"]
    runner.wait_idle(30)
    assert runner.resume(sandbox_id)["resumed"] is False
    assert not list(Path("/sys/fs/cgroup/freezer/stasis").glob(f"{sandbox_id}-*"))


def test_a_restarted_runner_publishes_a_suspension_left_unpublished(
        runner: SandboxRunner, env: Env, repo: Path) -> None:
    sandbox_id = "sbx-idle-away"
    start(runner, env, repo, sandbox_id, "echo x > x.txt; sleep 300", idle_seconds=1)
    publisher: RecordingPublisher = runner.publisher  # type: ignore[assignment]
    first = publisher.wait_for("sandbox.suspended", sandbox_id=sandbox_id, timeout=60)
    marker = runner.root / sandbox_id / "suspension.reported"
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    marker.unlink()  # as if the agent died between publishing and marking
    later = SandboxRunner(runner.settings, RecordingPublisher(), root=runner.root,
                          environ=env.environ, isolation=runner.isolation)
    again = later.publisher.wait_for("sandbox.suspended",  # type: ignore[attr-defined]
                                     sandbox_id=sandbox_id, timeout=30)
    assert again.requestid == first.requestid and again.payload == first.payload
    assert later.status(sandbox_id)["state"] == "suspended"
    assert later.cancel(sandbox_id)["cancelled"] is True
    deadline = time.monotonic() + 30
    while later.status(sandbox_id)["state"] != "reported":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert later.status(sandbox_id)["result"]["termination"] == "cancelled"
    later.wait_idle(30)


# -- admission: the concurrency cap, through the handler -------------------------------------


@dataclass
class ControlPlane:
    deps: Deps
    db: firestore.Client
    runner: SandboxRunner
    errors: list[BaseException]

    def request(self, sandbox_id: str, command: str, **fields: Any) -> Event[Any]:
        event = new_event(SandboxRequested(
            sandbox_id=sandbox_id, team="ml-a", requester="alice",
            repository=fields.pop("repository"), command=command, base_ref="main", **fields),
            source="//test")
        handler.handle(event, self.deps, "on_sandbox_requested")
        return event

    def doc(self, sandbox_id: str) -> dict[str, Any]:
        return self.db.collection("sandboxes").document(sandbox_id).get().to_dict() or {}

    def resume(self, sandbox_id: str) -> Event[Any]:
        event = new_event(SandboxResumeRequested(sandbox_id=sandbox_id, requester="alice"),
                          source="//test")
        handler.handle(event, self.deps, "on_sandbox_resume_requested")
        return event

    def queue(self) -> dict[str, Any]:
        return self.db.collection("sandbox_queues").document("ml-a").get().to_dict() or {}

    def wait_for(self, sandbox_id: str, state: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (doc := self.doc(sandbox_id)).get("state") != state:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, (sandbox_id, doc.get("state"), state)
            time.sleep(0.1)
        return doc

    def wait(self, sandbox_ids: list[str], timeout: float = 120) -> list[dict[str, Any]]:
        """Until each has ended (or, suspended, waits on nobody but a resume)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            docs = [self.doc(s) for s in sandbox_ids]
            if all(d.get("state") in ("SUCCEEDED", "FAILED", "TIMED_OUT", "KILLED")
                   or (d.get("state") == "SUSPENDED" and not d.get("queue_position"))
                   for d in docs):
                return docs
            assert not self.errors, self.errors
            time.sleep(0.2)
        raise AssertionError(f"not all ended: {[(d.get('id'), d.get('state')) for d in docs]}")


class _PushPublisher(RecordingPublisher):
    """The agent's publisher: delivers sandbox.finished to the handler on a thread of its
    own, as a Pub/Sub push subscription would."""

    def __init__(self) -> None:
        super().__init__()
        self.deps: Deps | None = None
        self.errors: list[BaseException] = []

    def publish(self, event: Event[Any]) -> str:
        super().publish(event)
        # sandbox.state_changed has no consumer here (the chat notifiers): only recorded
        for consumer in [r.function for r in ROUTES.values()
                         if r.event == event.name and r.handler is handler.handle]:
            threading.Thread(target=self._deliver, args=(event, consumer), daemon=True).start()
        return event.id

    def _deliver(self, event: Event[Any], consumer: str) -> None:
        try:
            assert self.deps is not None
            handler.handle(event, self.deps, consumer)
        except BaseException as exc:
            self.errors.append(exc)


@pytest.fixture
def control_plane(env: Env, tmp_path: Path) -> Iterator[ControlPlane]:
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    db = firestore.Client(project=env.project)
    db.collection("catalog").document("current").set(
        {**config, "sandboxes": {"concurrency": 2, "defaults": {"wall_clock_seconds": 60}}})
    publisher = _PushPublisher()
    root = Path(tempfile.mkdtemp(prefix="stasis-test-sandboxes-"))
    settings = AgentSettings(data_dir=tmp_path / "data", project=env.project, port=free_port())
    runner = SandboxRunner(settings, publisher, root=root, environ=env.environ)
    app = Flask("agent")
    # As the agent answers (runtime.local.agent): a refusal is a 409 with its reason.
    app.register_error_handler(AgentError, lambda exc: (jsonify(error=str(exc)), exc.status))
    register_sandboxes(app, settings, publisher)
    app.config["sandboxes"] = lambda: runner
    server = make_server("127.0.0.1", settings.port, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    catalog = Catalog.from_config(config)
    deps = Deps(store=FirestoreStore(db), bus=publisher, runtime=None,  # type: ignore[arg-type]
                snapshots=None, catalog=lambda: catalog,  # type: ignore[arg-type]
                clock=lambda: datetime.now(UTC), snapshot_bucket=env.bucket,
                dead_letters=None,  # type: ignore[arg-type]
                sandboxes=SandboxDeps(FirestoreSandboxStore(db),
                                      LocalSandboxRuntime(settings.url,
                                                          token=settings.control_token())))
    publisher.deps = deps
    try:
        yield ControlPlane(deps, db, runner, publisher.errors)
    finally:
        release(runner)
        runner.wait_idle(60)
        server.shutdown()
        shutil.rmtree(root, ignore_errors=True)
        for other in candidate_roots(settings):  # the app must have used ``runner`` alone
            assert not other.exists(), f"a second runner ran sandboxes in {other}"


def test_the_concurrency_cap_queues_extra_requests_and_runs_them_later(
        control_plane: ControlPlane, repo: Path) -> None:
    ids = [f"sbx-cap-{i}" for i in range(4)]
    for i, sandbox_id in enumerate(ids):
        control_plane.request(sandbox_id, f"sleep 3; echo {i} > cap-{i}.txt",
                              repository=str(repo))
    docs = [control_plane.doc(s) for s in ids]
    assert [d["state"] for d in docs] == ["RUNNING", "RUNNING", "QUEUED", "QUEUED"]
    assert [d["queue_position"] for d in docs] == [None, None, 1, 2]
    assert "position 2 of 2" in docs[3]["message"]
    queue = control_plane.db.collection("sandbox_queues").document("ml-a").get().to_dict()
    assert (queue["running"], queue["queued"]) == (ids[:2], ids[2:])

    ended = control_plane.wait(ids)
    assert [d["state"] for d in ended] == ["SUCCEEDED"] * 4, [d["message"] for d in ended]
    assert all(d["patch_uri"] and d["files_changed"] == [f"cap-{i}.txt"]
               for i, d in enumerate(ended))
    # Never more than two at once, and the queued ones ran after slots were freed.
    spans = [(d["started_at"], d["finished_at"]) for d in ended]
    for moment, _ in spans:
        assert sum(1 for s, f in spans if s <= moment < f) <= 2
    assert min(s for s, _ in spans[2:]) >= min(f for _, f in spans[:2])
    assert all(d["reason"] == "succeeded" and "stasis sandbox show" in d["message"]
               for d in ended)
    assert ended[2]["version"] == 3  # QUEUED, RUNNING (promoted), SUCCEEDED
    queue = control_plane.db.collection("sandbox_queues").document("ml-a").get().to_dict()
    assert (queue["running"], queue["queued"]) == ([], [])
    audit = [a.to_dict() for a in control_plane.db.collection("audit").stream()]
    assert sorted(a["action"] for a in audit) == ["sandbox.finished"] * 4 + \
        ["sandbox.requested"] * 4


def test_a_refused_request_is_recorded_with_what_to_do(
        control_plane: ControlPlane, repo: Path) -> None:
    control_plane.request("sbx-net", "true", repository=str(repo),
                          allowed_network=["pypi.org"])
    control_plane.request("sbx-big", "true", repository=str(repo), limits={"memory": "64Gi"})
    net, big = control_plane.doc("sbx-net"), control_plane.doc("sbx-big")
    assert (net["state"], net["reason"]) == ("FAILED", "network_not_permitted")
    assert "ask alice" in net["message"]
    assert (big["state"], big["reason"]) == ("FAILED", "limit_above_maximum")
    assert "memory 64Gi > 8Gi" in big["message"]
    assert control_plane.runner.list() == []  # nothing was started


def test_the_admin_files_consent_to_unisolated_sandboxes_reaches_the_node(
        control_plane: ControlPlane, repo: Path, tmp_path: Path) -> None:
    """On a host without namespaces (CAP_SYS_ADMIN taken away), a sandbox is FAILED with the
    node's reason; once the team's policy says ``allow_unisolated: true`` it runs."""
    control_plane.runner.isolation = _probe_without("sys_admin", tmp_path)
    catalog = control_plane.db.collection("catalog").document("current")
    control_plane.request("sbx-closed", "true", repository=str(repo))
    [closed] = control_plane.wait(["sbx-closed"], timeout=60)
    assert closed["state"] == "FAILED" and closed["allow_unisolated"] is False
    assert "could not be verified" in closed["message"]
    assert "allow_unisolated: true in the sandboxes section" in closed["message"]
    catalog.update({"sandboxes.teams": {"ml-a": {"allow_unisolated": True}}})
    control_plane.request("sbx-consent", "true", repository=str(repo))
    [consent] = control_plane.wait(["sbx-consent"], timeout=60)
    assert consent["state"] == "SUCCEEDED", consent["message"]
    assert consent["allow_unisolated"] is True and "NOT ENFORCED" in consent["network"]


def test_a_sandbox_the_runtime_refuses_frees_its_slot(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    # The path does not exist on the node: the monitor reports failed_to_start.
    control_plane.request("sbx-nope", "true", repository=str(tmp_path / "missing"))
    [doc] = control_plane.wait(["sbx-nope"], timeout=60)
    assert (doc["state"], doc["reason"]) == ("FAILED", "failed_to_start")
    assert "is not a directory on this host" in doc["message"]
    queue = control_plane.db.collection("sandbox_queues").document("ml-a").get().to_dict()
    assert queue["running"] == []


def test_the_trampoline_isolates_a_normal_user_in_a_user_namespace(
        loopback_server: SimpleNamespace) -> None:
    """An agent that is not root: the network namespace comes with a user namespace."""

    setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
    if os.geteuid() != 0 or setpriv is None or not Path(python).exists():
        pytest.skip("needs root, setpriv and /usr/bin/python3 to act as another user")
    exec_path = ROOT / "runtime" / "local" / "sandbox_exec.py"
    as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-I",
                 str(exec_path)]
    probe = subprocess.run([*as_nobody, "--probe", "--port", str(loopback_server.port)],
                           capture_output=True, text=True, timeout=30, check=False)
    report = __import__("json").loads(probe.stdout)
    if not report.get("network"):
        pytest.skip(f"user namespaces are not available here: {report.get('why')}")
    assert report["uid"] == 65534 and loopback_server.accepted == 0
    ran = subprocess.run([*as_nobody, "--cwd", "/", "--", "/bin/sh", "-c",
                          "cat /proc/self/uid_map"], capture_output=True, text=True, timeout=30,
                         check=False)
    assert ran.returncode == 0 and ran.stdout.split() == ["65534", "65534", "1"]


def test_an_idle_sandbox_gives_its_slot_away_and_resumes_when_one_is_free(
        control_plane: ControlPlane, repo: Path) -> None:
    plane = control_plane
    plane.request("sbx-nap", "echo a > a.txt; sleep 4; echo b > b.txt", repository=str(repo),
                  limits={"idle_seconds": 1})
    plane.request("sbx-long-1", "sleep 300", repository=str(repo))
    plane.request("sbx-long-2", "sleep 300", repository=str(repo))
    assert [plane.doc(s)["state"] for s in ("sbx-nap", "sbx-long-1", "sbx-long-2")] == \
        ["RUNNING", "RUNNING", "QUEUED"]

    # Idle: suspended, and its slot goes to the queued sandbox.
    nap = plane.wait_for("sbx-nap", "SUSPENDED")
    assert nap["reason"] == "suspended_idle" and nap["suspensions"] == 1
    assert nap["checkpoint_uri"].endswith("/sbx-nap/checkpoint-1.diff")
    assert "memory stays resident" in nap["message"]
    assert "stasis sandbox resume sbx-nap" in nap["message"]
    assert plane.wait_for("sbx-long-2", "RUNNING")["reason"] == "promoted"
    queue = plane.queue()
    assert (queue["running"], queue["queued"]) == (["sbx-long-1", "sbx-long-2"], [])

    # Both slots are taken: the resume waits in the queue, with its position.
    plane.resume("sbx-nap")
    nap = plane.doc("sbx-nap")
    assert (nap["state"], nap["reason"], nap["queue_position"]) == \
        ("SUSPENDED", "resume_queued", 1)
    assert plane.runner.status("sbx-nap")["state"] == "suspended"

    # A slot frees: the sandbox is resumed (not started again) and finishes its work.
    assert plane.runner.cancel("sbx-long-1")["cancelled"] is True
    assert plane.wait_for("sbx-nap", "RUNNING")["reason"] == "resumed"
    plane.runner.cancel("sbx-long-2")
    nap, *_ = plane.wait(["sbx-nap", "sbx-long-1", "sbx-long-2"])
    # It may idle again in the rest of its sleep; each time it is resumed the same way.
    while nap["state"] == "SUSPENDED":
        plane.resume("sbx-nap")
        [nap] = plane.wait(["sbx-nap"])
    assert nap["state"] == "SUCCEEDED", nap["message"]
    assert sorted(nap["files_changed"]) == ["a.txt", "b.txt"]
    assert nap["suspended_ms"] > 0 and nap["suspended_at"] is None
    assert plane.runner.status("sbx-nap")["result"]["succeeded"] is True
    queue = plane.queue()
    assert (queue["running"], queue["queued"]) == ([], [])
    actions = [a.to_dict()["action"] for a in plane.db.collection("audit").stream()]
    assert "sandbox.suspended" in actions and "sandbox.resume_requested" in actions
