"""A whole local stack per test module, started as `stasis up` starts it, on free ports.

The stack runs in a private data dir and project, so a developer's running stack (default
ports) is never touched. It is stopped (every process group) even when tests fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.cloud import firestore, pubsub_v1

from stack import local, processes
from stack.scheduler import schedules
from stack.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    settings: Settings
    env: dict[str, str]

    def cli(self, *args: str, check: bool = True, timeout: float = 300,
            user: str = "dev") -> subprocess.CompletedProcess[str]:
        """Run `stasis ARGS` as a user would, against this stack."""
        result = subprocess.run(
            [sys.executable, "-m", "stasis_cli", *args], env={**self.env, "STASIS_USER": user},
            capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        if check and result.returncode != 0:
            raise AssertionError(f"stasis {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    @property
    def db(self) -> firestore.Client:
        return firestore.Client(project=self.settings.project)

    def workspace(self, ws_id: str) -> dict[str, Any] | None:
        snap = self.db.collection("workspaces").document(ws_id).get()
        return snap.to_dict() if snap.exists else None

    def wait_for(self, predicate: Callable[[], Any], *, timeout: float = 60,
                 what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def subscribe(self, topic: str) -> str:
        """A pull subscription on a topic, to see the events the stack emits."""
        subscriber = pubsub_v1.SubscriberClient()
        name = subscriber.subscription_path(self.settings.project,
                                            f"test-{uuid.uuid4().hex[:10]}")
        subscriber.create_subscription(request={
            "name": name, "topic": f"projects/{self.settings.project}/topics/{topic}"})
        return name

    def pull(self, subscription: str, *, want: int, timeout: float = 30) -> list[Any]:
        subscriber = pubsub_v1.SubscriberClient()
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            response = subscriber.pull(request={"subscription": subscription,
                                                "max_messages": 50,
                                                "return_immediately": True}, timeout=10)
            if response.received_messages:
                got.extend(m.message for m in response.received_messages)
                subscriber.acknowledge(request={"subscription": subscription, "ack_ids": [
                    m.ack_id for m in response.received_messages]})
            else:
                time.sleep(0.2)
        return got


def _free_settings(tmp: Path) -> Settings:
    return processes.on_free_ports(Settings(project=f"e2e-{uuid.uuid4().hex[:10]}",
                                            data_dir=tmp))


def start_stack(tmp: Path, runtime: str, *,
                scheduled: dict[str, str] | None = None,
                host_env: Callable[[Settings], Mapping[str, str]] | None = None,
                ) -> Iterator[Stack]:
    """A stack on free ports; ``scheduled``: the scheduled functions that do run, on these
    crons (a sixth field, the last, counts seconds); ``host_env``: what to lay over the function
    host's environment, given the stack's settings."""
    settings = _free_settings(tmp)
    saved = dict(os.environ)
    env_vars = {"STASIS_DATA_DIR": str(settings.data_dir), "STASIS_PROJECT": settings.project,
                **{f"STASIS_{name.upper()}_PORT": str(port)
                   for name, port in settings.ports().items()},
                # No scheduled sweeps under a test: each test calls what it checks.
                **{f"STASIS_SCHEDULE_{name.upper()}": (scheduled or {}).get(name, "")
                   for name in schedules()}}
    os.environ.update(env_vars)
    try:
        local.up(settings, runtime=runtime, host_env=host_env(settings) if host_env else None)
        env = {**os.environ, **settings.emulator_env(), **env_vars}
        yield Stack(settings, env)
    finally:
        local.down(settings, pause=False)  # tests end fast; pausing has tests of its own
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def null_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The control plane with the null runtime (workspaces are ready at once)."""
    yield from start_stack(tmp_path_factory.mktemp("stack"), "null")


@pytest.fixture(scope="module")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The whole local stack with the local runtime: real jupyter-servers and kernels."""
    yield from start_stack(tmp_path_factory.mktemp("stack"), "local")
