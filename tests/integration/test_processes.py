"""The supervisor of the local stack against real processes: the Firestore and Pub/Sub
emulators (shell launchers around a JVM), fake-gcs-server, and small stand-ins for
children that misbehave. Also the session fixtures of tests/conftest.py.

Every test that starts something checks afterwards that nothing of it is left: no process
of its group, and no process whose command line names its port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from runtime.supervisor import group_members
from stack.processes import (
    RunningService,
    ServiceAlreadyRunning,
    ServiceError,
    ServiceSpec,
    ServiceStartError,
    emulator_specs,
    firestore_spec,
    free_ports,
    gcs_spec,
    load_all,
    pubsub_spec,
    start,
    start_many,
    status,
    status_all,
    stop,
    stop_all,
)
from stack.settings import DEFAULT_PORTS, Settings

START_TIMEOUT = 90.0
REPO_ROOT = Path(__file__).resolve().parents[2]


def _get(url: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as response:
        return response.status, response.read().decode()


def _leftovers(pgid: int, port: int) -> list[str]:
    """Live processes of group `pgid` or whose command line names `port`."""
    marks = (f"--port={port}", f"-port {port}", f":{port}")
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        try:
            pgid_of = os.getpgid(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if pgid_of == pgid or any(mark in cmdline for mark in marks):
            found.append(f"{proc.pid} (pgid {pgid_of}): {cmdline[:200]}")
    return found


def _assert_gone(service: RunningService) -> None:
    assert _leftovers(service.pgid, service.port) == []
    assert not service.pid_path.exists()


# -- each emulator ------------------------------------------------------------------------

SPECS: dict[str, tuple[Callable[[Settings], ServiceSpec], str]] = {
    "firestore": (firestore_spec, "Ok"),
    "pubsub": (pubsub_spec, "Ok"),
    "gcs": (lambda settings: gcs_spec(settings, memory=True), '"kind":"storage#buckets"'),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_emulator_starts_answers_and_stops_as_a_group(name: str, isolated_settings: Settings):
    build, answer = SPECS[name]
    service = start(build(isolated_settings), timeout=START_TIMEOUT)
    try:
        assert service.port not in DEFAULT_PORTS.values()
        assert service.host == f"127.0.0.1:{service.port}"
        code, body = _get(service.ready_url)
        assert code == 200
        assert answer in body
        record = json.loads(service.pid_path.read_text())
        assert record["pid"] == record["pgid"] == service.pid
        assert record["argv"] == list(service.argv)
        assert group_members(service.pgid), "the group should have live members"
        if name == "firestore":
            # The launcher does not exec: the JVM is a second process of the group. This is
            # the case that killing only the parent gets wrong.
            commands = [" ".join(p.cmdline()) for p in group_members(service.pgid)]
            assert any("java" in c for c in commands), commands
            assert len(commands) >= 2, commands
        assert status(name, data_dir=isolated_settings.data_dir, probe=True).ready is True
    finally:
        stopped = stop(service)
    assert stopped is True
    _assert_gone(service)
    assert stop(service) is False, "stopping twice is not an error"
    assert status(name, data_dir=isolated_settings.data_dir).state == "stopped"


def test_start_many_starts_all_three_and_stop_all_stops_them(isolated_settings: Settings):
    services = start_many(emulator_specs(isolated_settings, gcs_memory=True), timeout=START_TIMEOUT)
    try:
        assert [s.name for s in services] == ["firestore", "pubsub", "gcs"]
        assert all(s.startup_s is not None for s in services)
        states = status_all(isolated_settings.data_dir, probe=True)
        assert [(s.name, s.state, s.ready) for s in states] == [
            ("firestore", "running", True),
            ("gcs", "running", True),
            ("pubsub", "running", True),
        ]
    finally:
        stopped = stop_all(isolated_settings.data_dir)
    assert sorted(stopped) == ["firestore", "gcs", "pubsub"]
    for service in services:
        _assert_gone(service)
    assert load_all(isolated_settings.data_dir) == []


def test_gcs_publishes_object_finalize_to_pubsub(
    isolated_settings: Settings, monkeypatch: pytest.MonkeyPatch
):
    from google.cloud import pubsub_v1, storage

    project = isolated_settings.project
    services = start_many(
        [
            pubsub_spec(isolated_settings),
            gcs_spec(isolated_settings, memory=True, event_topic="gcs-events"),
        ],
        timeout=START_TIMEOUT,
    )
    try:
        for name, value in isolated_settings.emulator_env().items():
            monkeypatch.setenv(name, value)
        publisher = pubsub_v1.PublisherClient()
        subscriber = pubsub_v1.SubscriberClient()
        topic = publisher.topic_path(project, "gcs-events")
        subscription = subscriber.subscription_path(project, "gcs-events-test")
        publisher.create_topic(name=topic)
        subscriber.create_subscription(name=subscription, topic=topic)

        bucket = storage.Client(project=project).create_bucket("events-bucket")
        bucket.blob("snapshots/ws-1/manifest.json").upload_from_string(b"{}")

        response = subscriber.pull(subscription=subscription, max_messages=10, timeout=30)
        attributes = [dict(m.message.attributes) for m in response.received_messages]
        assert len(attributes) == 1, attributes
        assert attributes[0]["eventType"] == "OBJECT_FINALIZE"
        assert attributes[0]["bucketId"] == "events-bucket"
        assert attributes[0]["objectId"] == "snapshots/ws-1/manifest.json"
    finally:
        stop_all(isolated_settings.data_dir)
    for service in services:
        _assert_gone(service)


# -- failures -----------------------------------------------------------------------------


def _spec(settings: Settings, argv: tuple[str, ...], **kwargs: object) -> ServiceSpec:
    return ServiceSpec(
        name="child",
        argv=argv,
        ready_url=f"http://127.0.0.1:{settings.functions_port}/",
        data_dir=settings.data_dir,
        **kwargs,  # type: ignore[arg-type]
    )


def test_child_that_exits_at_once_raises(isolated_settings: Settings):
    with pytest.raises(ServiceStartError, match=r"child exited with code 1 before it was ready"):
        start(_spec(isolated_settings, ("false",)), timeout=10)
    assert load_all(isolated_settings.data_dir) == []


def test_start_error_carries_the_log_tail(isolated_settings: Settings):
    argv = ("sh", "-c", "echo starting; echo 'fatal: no config here' >&2; exit 3")
    with pytest.raises(ServiceStartError) as info:
        start(_spec(isolated_settings, argv), timeout=10)
    assert "exited with code 3" in str(info.value)
    assert "fatal: no config here" in str(info.value)
    assert "fatal: no config here" in info.value.log_tail
    assert info.value.name == "child"


def test_missing_executable_raises(isolated_settings: Settings):
    with pytest.raises(ServiceStartError, match="cannot execute"):
        start(_spec(isolated_settings, ("/nonexistent/bin/emulator",)), timeout=10)


def test_readiness_timeout_raises_and_leaves_nothing(isolated_settings: Settings):
    # Runs, never listens: the deadline has to end it.
    argv = (sys.executable, "-c", "import time; print('up, not listening', flush=True); "
            "time.sleep(600)")  # fmt: skip
    before = {p.pid for p in psutil.process_iter()}
    with pytest.raises(ServiceStartError) as info:
        start(_spec(isolated_settings, argv), timeout=1.5)
    assert "not ready within 1.5s" in str(info.value)
    assert "up, not listening" in str(info.value)
    new = [
        p
        for p in psutil.process_iter(["cmdline", "status"])
        if p.pid not in before
        and p.info["status"] != psutil.STATUS_ZOMBIE
        and "up, not listening" in " ".join(p.info["cmdline"] or [])
    ]
    assert new == []
    assert load_all(isolated_settings.data_dir) == []


def test_stop_kills_a_group_whose_child_ignores_sigterm(isolated_settings: Settings, tmp_path):
    # A launcher (sh, no exec) around a server that ignores SIGTERM: the shape of the
    # emulators, made stubborn, so only SIGKILL to the whole group ends it.
    server = tmp_path / "stubborn.py"
    server.write_text(
        textwrap.dedent(
            """
            import http.server, signal, sys
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            handler = http.server.SimpleHTTPRequestHandler
            http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
            """
        )
    )
    port = isolated_settings.functions_port
    argv = ("sh", "-c", f"'{sys.executable}' '{server}' {port}; echo launcher-exited")
    service = start(_spec(isolated_settings, argv, cwd=tmp_path), timeout=30)
    members = group_members(service.pgid)
    assert len(members) == 2, [m.cmdline() for m in members]
    assert stop(service, grace=0.5) is True
    _assert_gone(service)


def test_second_start_of_a_running_service_is_refused(isolated_settings: Settings):
    spec = gcs_spec(isolated_settings, memory=True)
    service = start(spec, timeout=START_TIMEOUT)
    try:
        with pytest.raises(ServiceAlreadyRunning, match="already running"):
            start(spec, timeout=START_TIMEOUT)
        # Another name on the same address: the port check catches it before the probe
        # could mistake the running server for the new one.
        other = ServiceSpec(
            name="gcs-again", argv=spec.argv, ready_url=spec.ready_url, data_dir=spec.data_dir
        )
        with pytest.raises(ServiceError, match="already in use"):
            start(other, timeout=START_TIMEOUT)
        assert service.alive()
    finally:
        stop(service)
    _assert_gone(service)


def test_status_reports_a_crashed_service_as_dead(isolated_settings: Settings):
    service = start(gcs_spec(isolated_settings, memory=True), timeout=START_TIMEOUT)
    os.killpg(service.pgid, signal.SIGKILL)
    service._popen.wait(timeout=10)  # type: ignore[union-attr]
    data_dir = isolated_settings.data_dir
    assert status("gcs", data_dir=data_dir).state == "dead"
    assert stop("gcs", data_dir=data_dir) is False
    assert status("gcs", data_dir=data_dir).state == "stopped"
    # A stale pid file does not block the next start.
    service = start(gcs_spec(isolated_settings, memory=True), timeout=START_TIMEOUT)
    assert stop("gcs", data_dir=data_dir) is True
    _assert_gone(service)


def test_stop_all_stops_services_started_by_another_process(isolated_settings: Settings):
    """What `stasis up` then `stasis down` do: the starter exits, a different process reads
    the pid files and stops every group, JVM included."""
    env = {
        **os.environ,
        "STASIS_DATA_DIR": str(isolated_settings.data_dir),
        **{
            f"STASIS_{name.upper()}_PORT": str(port)
            for name, port in isolated_settings.ports().items()
        },
    }
    starter = textwrap.dedent(
        """
        from stack.processes import firestore_spec, gcs_spec, start_many
        from stack.settings import Settings
        settings = Settings.from_env()
        services = start_many([firestore_spec(settings), gcs_spec(settings)], timeout=90)
        print(" ".join(s.name for s in services))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", starter],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["firestore", "gcs"]

    recorded = load_all(isolated_settings.data_dir)
    assert sorted(s.name for s in recorded) == ["firestore", "gcs"]
    for service in recorded:
        assert not service.owner_alive(), "the starter has exited"
        assert service.alive(), f"{service.name} should outlive its starter"
    # Filesystem backend of the stack: objects go under <data_dir>/gcs.
    assert (isolated_settings.data_dir / "gcs").is_dir()

    assert sorted(stop_all(isolated_settings.data_dir)) == ["firestore", "gcs"]
    for service in recorded:
        _assert_gone(service)
    assert stop_all(isolated_settings.data_dir) == []


def test_free_ports_are_distinct_and_avoid_the_stack(isolated_settings: Settings):
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert not set(ports) & set(DEFAULT_PORTS.values())
    assert not set(isolated_settings.ports().values()) & set(DEFAULT_PORTS.values())


# -- the session fixtures -----------------------------------------------------------------


def test_session_emulators_answer_off_the_default_ports(emulators):
    for service in (emulators.firestore, emulators.pubsub, emulators.gcs):
        assert service.port not in DEFAULT_PORTS.values()
        assert service.url == f"http://{service.host}"
        assert _get(service.ready_url)[0] == 200


def test_single_emulator_fixtures_are_the_session_ones(
    emulators, firestore_emulator, pubsub_emulator, gcs_emulator
):
    assert firestore_emulator is emulators.firestore
    assert pubsub_emulator is emulators.pubsub
    assert gcs_emulator is emulators.gcs


@pytest.mark.parametrize("attempt", [1, 2])
def test_emulator_env_isolates_each_test_by_project(
    attempt: int, emulator_env: dict[str, str], project_id: str, emulators
):
    """Both runs write the same document path and must each find it absent first."""
    from google.cloud import firestore

    assert os.environ["GOOGLE_CLOUD_PROJECT"] == project_id == emulator_env["STASIS_PROJECT"]
    assert os.environ["FIRESTORE_EMULATOR_HOST"] == emulators.firestore.host
    assert os.environ["PUBSUB_EMULATOR_HOST"] == emulators.pubsub.host
    assert os.environ["STORAGE_EMULATOR_HOST"] == emulators.gcs.url
    doc = firestore.Client(project=project_id).collection("isolation").document("probe")
    assert not doc.get().exists
    doc.set({"attempt": attempt})
    assert doc.get().to_dict() == {"attempt": attempt}


def _with_our_conftest(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py in the pytester dir, its helper modules (tests/*.py, such as
    index_guard) importable beside it as they are in tests/."""
    tests = Path(__file__).parents[1]
    pytester.makeconftest((tests / "conftest.py").read_text())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(tests), os.environ.get("PYTHONPATH")) if p))


def test_fixtures_start_lazily_and_mark_tiers(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch):
    """A session that asks only for GCS starts no JVM; tiers come from directories."""
    _with_our_conftest(pytester, monkeypatch)
    pytester.makeini(
        "[pytest]\naddopts = --strict-markers\n"
        "markers =\n    unit: u\n    integration: i\n    e2e: e\n"
    )
    pytester.mkdir("integration")
    pytester.path.joinpath("integration", "test_lazy.py").write_text(
        textwrap.dedent(
            """
            from stack.processes import load_all

            def test_only_gcs(gcs_emulator):
                assert [s.name for s in load_all(gcs_emulator.data_dir)] == ["gcs"]
            """
        )
    )
    pytester.mkdir("unit")
    pytester.path.joinpath("unit", "test_pure.py").write_text("def test_pure():\n    pass\n")

    result = pytester.runpytest_subprocess("-m", "integration", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=1)
    result = pytester.runpytest_subprocess("-m", "unit", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=1)


def test_containers_requested_without_support_fails_loudly(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    _with_our_conftest(pytester, monkeypatch)
    pytester.makepyfile("def test_uses_gcs(gcs_emulator):\n    pass\n")
    monkeypatch.setenv("STASIS_TEST_CONTAINERS", "1")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*STASIS_TEST_CONTAINERS=1*Unset STASIS_TEST_CONTAINERS*"])
