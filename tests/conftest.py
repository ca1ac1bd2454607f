"""Shared pytest fixtures: the real emulators, per-test isolation, and the tier markers.

Owns:

- the tier markers: every test under tests/unit, tests/integration, tests/e2e gets the
  `unit`, `integration` or `e2e` marker from its path (select with `-m integration`);
- the session emulators `firestore_emulator`, `pubsub_emulator`, `gcs_emulator` (each a
  `stack.processes.RunningService` with `.host` = "127.0.0.1:PORT" and `.url` =
  "http://127.0.0.1:PORT"), started lazily through the same supervisor as `stasis up`, on
  free ports away from the stack's defaults, in a temporary data dir, once per session;
  `emulators` starts the three concurrently (`Emulators`: `.firestore`, `.pubsub`, `.gcs`);
- per-test isolation: `project_id` (a unique project id per test; the Firestore and Pub/Sub
  emulators keep data per project id) and `emulator_env` (sets the client variables for
  that project with monkeypatch and yields them);
- `isolated_settings`: `stack.settings.Settings` on free ports in the test's tmp dir, for
  tests that start services of their own;
- the index guard: once a session starts the emulators, a test fails when it ran a
  Firestore query that needs a composite index nobody declared (`tests/index_guard.py`).

Nothing leaks a JVM: the session fixture stops every emulator in a `finally`, an atexit
hook and SIGTERM/SIGHUP handlers repeat that if the session is cut short, and each session
first stops emulators left behind by an earlier session whose pytest process died
(SIGKILL leaves no chance to clean up). Each session's dir lives under
`$TMPDIR/stasis-test-emulators-<user>/`, and logs of the last session stay there.

`STASIS_TEST_CONTAINERS=1` asks for testcontainers instead of local processes. That
variant is not implemented: the emulator fixtures then fail with a message saying so (and
whether Docker is reachable), rather than silently running the local emulators.
"""

from __future__ import annotations

import atexit
import contextlib
import getpass
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import index_guard
import psutil
import pytest

from stack.processes import (
    RunningService,
    ServiceError,
    ServiceSpec,
    firestore_spec,
    gcs_spec,
    load_all,
    on_free_ports,
    pubsub_spec,
    start_many,
    stop,
    stop_all,
)
from stack.settings import Settings

# `pytester` lets tests/integration/test_processes.py check these fixtures in a fresh session.
pytest_plugins = ("pytester",)

_TESTS_DIR = Path(__file__).resolve().parent
_TIERS = ("unit", "integration", "e2e")
_EMULATOR_START_TIMEOUT = 90.0
_START_ATTEMPTS = 3
# Words in an error or log tail that mean "the port was taken between choosing and binding".
_BIND_RACE = ("already in use", "bindexception", "address in use")


# -- markers ------------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, taken from the directory it lives in."""
    for item in items:
        try:
            relative = Path(item.path).resolve().relative_to(_TESTS_DIR)
        except ValueError:
            continue
        if relative.parts and relative.parts[0] in _TIERS:
            item.add_marker(getattr(pytest.mark, relative.parts[0]))


@pytest.fixture(autouse=True)
def _declared_queries_only() -> Iterator[None]:
    """Fails the test if it ran a query whose composite index is not declared (the guard
    watches only once the emulators have started)."""
    yield
    undeclared = index_guard.take()
    assert not undeclared, "\n".join(undeclared)


# -- the emulator pool --------------------------------------------------------------------


@dataclass(frozen=True)
class Emulators:
    """The three emulators of one test session."""

    firestore: RunningService
    pubsub: RunningService
    gcs: RunningService

    def env(self, project: str) -> dict[str, str]:
        """Client variables pointing at these emulators for `project`."""
        return {
            "FIRESTORE_EMULATOR_HOST": self.firestore.host,
            "PUBSUB_EMULATOR_HOST": self.pubsub.host,
            "STORAGE_EMULATOR_HOST": self.gcs.url,
            "GOOGLE_CLOUD_PROJECT": project,
            "STASIS_PROJECT": project,
        }


_SPEC_BUILDERS: dict[str, Callable[[Settings], ServiceSpec]] = {
    "firestore": firestore_spec,
    "pubsub": pubsub_spec,
    # In memory: tests isolate by bucket name and nothing needs to survive the session.
    "gcs": lambda settings: gcs_spec(settings, memory=True),
}


class _EmulatorPool:
    """Starts emulators on first request, keeps them for the session, stops them all."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.running: dict[str, RunningService] = {}

    def get(self, *names: str) -> list[RunningService]:
        missing = [n for n in names if n not in self.running]
        if missing:
            for service in self._start(missing):
                self.running[service.name] = service
        return [self.running[n] for n in names]

    def _start(self, names: list[str]) -> list[RunningService]:
        for attempt in range(1, _START_ATTEMPTS + 1):
            # Fresh ports per attempt: the only expected failure is a port taken by someone
            # else between choosing it and the emulator binding it.
            settings = on_free_ports(Settings(project="stasis-test", data_dir=self.data_dir))
            try:
                return start_many(
                    [_SPEC_BUILDERS[n](settings) for n in names], timeout=_EMULATOR_START_TIMEOUT
                )
            except ServiceError as exc:
                text = f"{exc} {getattr(exc, 'log_tail', '')}".lower()
                if attempt == _START_ATTEMPTS or not any(w in text for w in _BIND_RACE):
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        stop_all(self.data_dir)
        self.running.clear()


def _emulators_root() -> Path:
    return Path(tempfile.gettempdir()) / f"stasis-test-emulators-{getpass.getuser()}"


def _owner_record() -> dict[str, float]:
    me = psutil.Process()
    return {"pid": me.pid, "create_time": me.create_time()}


def _owner_alive(record: dict[str, float]) -> bool:
    try:
        proc = psutil.Process(int(record["pid"]))
        return bool(abs(proc.create_time() - float(record["create_time"])) < 0.5)
    except (psutil.Error, KeyError, ValueError, TypeError):
        return False


def _sweep_dead_sessions(root: Path) -> None:
    """Stop emulators of earlier sessions whose pytest process is gone, and drop their dirs.
    Sessions still running (another terminal, another xdist worker) are left alone."""
    for session_dir in root.glob("session-*"):
        try:
            owner = json.loads((session_dir / "owner.json").read_text())
        except (OSError, ValueError):
            # A session that has just created its dir may not have written owner.json yet.
            with contextlib.suppress(OSError):
                if time.time() - session_dir.stat().st_mtime < 60:
                    continue
            owner = {}
        if _owner_alive(owner):
            continue
        for service in load_all(session_dir):
            if not service.owner_alive():
                stop(service)
        shutil.rmtree(session_dir, ignore_errors=True)


def _docker_status() -> tuple[bool, str]:
    docker = shutil.which("docker")
    if docker is None:
        return False, "no docker CLI on PATH"
    try:
        result = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"`docker info` failed: {exc}"
    if result.returncode != 0:
        return False, (result.stderr.strip() or result.stdout.strip())[-500:]
    return True, f"Docker {result.stdout.strip()}"


def _install_safety_net(pool: _EmulatorPool) -> Callable[[], None]:
    """atexit plus SIGTERM/SIGHUP handlers that stop the pool, so a session that is cut
    short does not leave JVMs behind. Returns the undo."""
    atexit.register(pool.close)
    previous: dict[signal.Signals, object] = {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(Exception):
            pool.close()
        sig = signal.Signals(signum)
        handler = previous.get(sig, signal.SIG_DFL)
        if callable(handler):
            handler(signum, frame)
        else:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        # ValueError off the main thread: atexit and the fixture's finally still apply.
        with contextlib.suppress(ValueError):
            previous[sig] = signal.signal(sig, on_signal)

    def undo() -> None:
        atexit.unregister(pool.close)
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)  # type: ignore[arg-type]

    return undo


@pytest.fixture(scope="session")
def _emulator_pool() -> Iterator[_EmulatorPool]:
    if os.environ.get("STASIS_TEST_CONTAINERS", "").strip() not in ("", "0"):
        reachable, detail = _docker_status()
        if reachable:
            why = (
                f"a Docker daemon is reachable ({detail}), but the testcontainers variant of "
                "the emulator fixtures is not implemented"
            )
        else:
            why = f"no Docker daemon is reachable ({detail})"
        pytest.fail(
            f"STASIS_TEST_CONTAINERS=1: {why}. Unset STASIS_TEST_CONTAINERS to run the "
            "emulators as local processes.",
            pytrace=False,
        )
    root = _emulators_root()
    root.mkdir(parents=True, exist_ok=True)
    _sweep_dead_sessions(root)
    data_dir = Path(tempfile.mkdtemp(prefix="session-", dir=root))
    (data_dir / "owner.json").write_text(json.dumps(_owner_record()))
    pool = _EmulatorPool(data_dir)
    undo = _install_safety_net(pool)
    index_guard.install()
    try:
        yield pool
    finally:
        try:
            pool.close()
        finally:
            undo()


@pytest.fixture(scope="session")
def firestore_emulator(_emulator_pool: _EmulatorPool) -> RunningService:
    """The Firestore emulator of this session (started on first use)."""
    return _emulator_pool.get("firestore")[0]


@pytest.fixture(scope="session")
def pubsub_emulator(_emulator_pool: _EmulatorPool) -> RunningService:
    """The Pub/Sub emulator of this session (started on first use)."""
    return _emulator_pool.get("pubsub")[0]


@pytest.fixture(scope="session")
def gcs_emulator(_emulator_pool: _EmulatorPool) -> RunningService:
    """fake-gcs-server of this session, in-memory backend (started on first use)."""
    return _emulator_pool.get("gcs")[0]


@pytest.fixture(scope="session")
def emulators(_emulator_pool: _EmulatorPool) -> Emulators:
    """All three emulators, the missing ones started concurrently."""
    firestore, pubsub, gcs = _emulator_pool.get("firestore", "pubsub", "gcs")
    return Emulators(firestore=firestore, pubsub=pubsub, gcs=gcs)


# -- per-test isolation -------------------------------------------------------------------


@pytest.fixture
def project_id() -> str:
    """A project id no other test uses (valid for GCP: lowercase, starts with a letter,
    at most 30 characters)."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def emulator_env(
    emulators: Emulators, project_id: str, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Sets, for this test only, the variables clients read to reach the session's
    emulators under this test's `project_id`, plus `STASIS_SNAPSHOT_BUCKET` naming a bucket
    of its own (fake-gcs-server has one bucket namespace, not one per project). Returns the
    variables set, e.g. to pass on to a subprocess."""
    env = {
        **emulators.env(project_id),
        "STASIS_SNAPSHOT_BUCKET": f"{project_id}-snapshots",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def isolated_settings(tmp_path: Path, project_id: str) -> Settings:
    """Settings for a private stack: every port free and away from the defaults, data dir
    in this test's tmp dir, this test's project id. Nothing is started."""
    return on_free_ports(Settings(project=project_id, data_dir=tmp_path / "stasis"))
