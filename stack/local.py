"""The embedded local deployment: bring the whole stack up, report on it, take it down.

`up` starts, on 127.0.0.1 only: the Firestore and Pub/Sub emulators and fake-gcs-server
(concurrently), then the topics, push subscriptions and dead-letter topics of
functions/routes.py and the snapshot bucket, then the function host, the Slack sink
(stack/slack_sink.py) and the node agent (concurrently), and applies examples/stasis.yaml
when no catalog has been applied yet (while the chat function warms up). It waits on
readiness at every step, never on a fixed sleep. `down` pauses the running workspaces
through the control plane and saves the control plane's state (``stack.persistence``),
releases whatever server is left through the node agent (homes stay) and stops every
process group; the next `up` starts from the saved state.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from stack import chat, processes
from stack.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CONFIG = ROOT / "examples" / "stasis.yaml"


@dataclass
class UpReport:
    seconds: dict[str, float] = field(default_factory=dict)
    seeded: bool = False
    restored: bool = False

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def _service_env(settings: Settings, runtime: str) -> dict[str, str]:
    env = {
        **settings.emulator_env(),
        "STASIS_RUNTIME": runtime,
        "STASIS_DATA_DIR": str(settings.data_dir),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    env.update(chat.slack_env(settings))  # chat: signing secret, bot token, the Slack sink
    return env


def host_spec(settings: Settings, runtime: str) -> processes.ServiceSpec:
    gunicorn = Path(sys.executable).with_name("gunicorn")
    return processes.ServiceSpec(
        name="functions",
        argv=(
            str(gunicorn),
            "--bind",
            settings.address("functions"),
            "--worker-class",
            "gthread",
            "--workers",
            "1",
            "--threads",
            "16",
            "--timeout",
            "300",
            "--chdir",
            str(ROOT),
            "stack.host:app",
        ),
        ready_url=f"{settings.functions_url}/",
        data_dir=settings.data_dir,
        env=_service_env(settings, runtime),
        cwd=ROOT,
    )


def scheduler_spec(settings: Settings) -> processes.ServiceSpec:
    """The local Cloud Scheduler (``stack.scheduler``): the scheduled HTTP functions on the
    schedules Terraform gives them."""
    return processes.ServiceSpec(
        name="scheduler",
        argv=(sys.executable, "-m", "stack.scheduler", "--port", str(settings.scheduler_port),
              "--functions-url", settings.functions_url),
        ready_url=f"{settings.url('scheduler')}/",
        data_dir=settings.data_dir,
        env=_service_env(settings, "local"),
        cwd=ROOT,
    )


def agent_spec(settings: Settings) -> processes.ServiceSpec:
    return processes.ServiceSpec(
        name="node-agent",
        argv=(
            sys.executable,
            "-m",
            "runtime.local.agent",
            "--port",
            str(settings.node_agent_port),
            "--data-dir",
            str(settings.data_dir),
        ),
        ready_url=f"{settings.node_agent_url}/healthz",
        data_dir=settings.data_dir,
        env=_service_env(settings, "local"),
        cwd=ROOT,
    )


def up(
    settings: Settings, *, runtime: str = "local", seed: bool = True, timeout: float = 90.0,
    fresh: bool = False,
) -> UpReport:
    """Start everything; ``fresh`` forgets the state the last `down` saved."""
    from stack import persistence

    report = UpReport()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if fresh:
        persistence.forget(settings)
    report.restored = persistence.import_file(settings) is not None
    os.environ.update(settings.emulator_env())
    started = time.monotonic()
    processes.start_many(processes.emulator_specs(settings), timeout=timeout)
    report.seconds["emulators"] = time.monotonic() - started

    from stack import topology

    mark = time.monotonic()
    topology.ensure(settings.project, settings.functions_url)
    topology.ensure_bucket(settings.project, settings.snapshot_bucket)
    report.seconds["topology"] = time.monotonic() - mark

    mark = time.monotonic()
    specs = [host_spec(settings, runtime), chat.sink_spec(settings), scheduler_spec(settings)]
    if runtime == "local":
        specs.append(agent_spec(settings))
    try:
        processes.start_many(specs, timeout=timeout)
    except BaseException:
        processes.stop_all(settings.data_dir)
        raise
    report.seconds["functions_and_agent"] = time.monotonic() - mark
    warming = chat.warm_up(settings)  # the chat function's first ack must beat Slack's 3 s

    if seed:
        mark = time.monotonic()
        from stack import admin

        if admin.current_revision(settings) is None:
            admin.apply_file(settings, EXAMPLE_CONFIG, actor="stasis-up")
            report.seeded = True
        report.seconds["seed"] = time.monotonic() - mark
    warming.join(timeout=60)
    return report


def down(settings: Settings, *, pause: bool = True, pause_timeout: float = 600.0,
         say: Any = None) -> list[str]:
    """Pause the running workspaces (``pause``) and save Firestore, release every workspace
    server left (homes stay), then stop every service group."""
    from stack import persistence

    say = say or (lambda _m: None)
    if _answers(settings, "firestore"):
        if pause and _answers(settings, "functions"):
            try:
                persistence.pause_running(settings, timeout=pause_timeout, say=say)
            except Exception as exc:  # stopping must go on whatever failed
                say(f"could not pause the running workspaces: {exc}")
        try:
            saved = persistence.export(settings)
            say(f"control-plane state saved in {saved}")
        except (requests.RequestException, RuntimeError, OSError) as exc:
            say(f"could not save the control-plane state: {exc}")
    try:
        listing = requests.get(f"{settings.node_agent_url}/workspaces", timeout=5).json()
        for ws in listing.get("workspaces", listing if isinstance(listing, list) else []):
            ws_id = ws.get("workspace_id") or ws.get("id")
            if ws_id:
                requests.post(f"{settings.node_agent_url}/workspaces/{ws_id}/release", timeout=60)
    except (requests.RequestException, ValueError):
        pass  # no agent running: nothing to release
    from stack.sandboxes import stop_running

    stop_running(settings)  # cancelled sandboxes still write their patch and result
    return processes.stop_all(settings.data_dir)


def _answers(settings: Settings, name: str) -> bool:
    try:
        return requests.get(f"{settings.url(name)}/", timeout=3).status_code < 500
    except requests.RequestException:
        return False


def status(settings: Settings) -> list[dict[str, Any]]:
    return [
        {
            "name": svc.name,
            "state": svc.state,
            "address": svc.address,
            "pid": svc.pid,
            "healthy": bool(svc.ready),
            "log": str(svc.log_path) if svc.log_path else None,
        }
        for svc in processes.status_all(settings.data_dir, probe=True)
    ]
