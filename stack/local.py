"""The embedded local deployment: bring the whole stack up, report on it, take it down.

`up` starts, on 127.0.0.1 only: the Firestore and Pub/Sub emulators and fake-gcs-server
(concurrently), then the topics, push subscriptions and dead-letter topics of
functions/routes.py and the snapshot bucket, then the function host, the Slack sink
(stack/slack_sink.py), the scheduler, the node agent and the IDE access proxy
(concurrently; the last two with the local runtime only), and applies examples/stasis.yaml
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from stack import chat, monitoring, portal, processes
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
    env.update(portal.session_env(settings))  # the portal's (and IDE proxy's) cookies
    env["STASIS_ALERTMANAGER_TOKEN"] = monitoring.alertmanager_token()
    env["STASIS_NODE_AGENT_TOKEN"] = settings.node_agent_token()
    # the functions check the workspaces' identities (workspace_api); the agent mints them
    env["STASIS_WORKSPACE_KEY"] = settings.workspace_key()
    if runtime == "local":
        # A workspace's url is its IDE through the proxy (functions.domain.ide).
        env["STASIS_IDE_PROXY_URL"] = settings.ide_proxy_url
    return env


def host_spec(settings: Settings, runtime: str,
              env: Mapping[str, str] | None = None) -> processes.ServiceSpec:
    """The function host; ``env`` is laid over its environment (the chaos harness puts its
    Firestore and node agent behind fault proxies so)."""
    gunicorn = Path(sys.executable).with_name("gunicorn")
    return processes.ServiceSpec(
        name="functions",
        argv=(
            str(gunicorn),
            "--bind",
            settings.address("functions"),
            "--worker-class",
            "gthread",
            # More than one worker, as Cloud Functions runs more than one instance: a
            # team's concurrent admissions are arbitrated by Firestore's transactions.
            "--workers",
            str(settings.function_workers),
            "--threads",
            "8",
            "--timeout",
            "300",
            "--chdir",
            str(ROOT),
            "stack.host:app",
        ),
        ready_url=f"{settings.functions_url}/",
        data_dir=settings.data_dir,
        env={**_service_env(settings, runtime), **(env or {})},
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


def agent_env(settings: Settings) -> dict[str, str]:
    """The node agent's environment: the stack's addresses and its own credential, none of
    the front doors' secrets (Slack, the portal's sessions, Alertmanager). A workspace's
    server starts from the agent's environment, so what the agent lacks no kernel has."""
    return {
        **settings.emulator_env(),
        "STASIS_RUNTIME": "local",
        "STASIS_DATA_DIR": str(settings.data_dir),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "STASIS_NODE_AGENT_TOKEN": settings.node_agent_token(),
        # Where a resume downloads ahead (runtime.local.settings), when the operator says.
        **{k: v for k, v in os.environ.items() if k == "STASIS_RESTORE_STAGING"},
    }


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
        env=agent_env(settings),
        cwd=ROOT,
    )


def ide_proxy_spec(settings: Settings) -> processes.ServiceSpec:
    """The IDE access proxy (``functions.ideproxy``): every workspace's IDE at
    ``/w/<workspace id>/``, for the portal's signed-in browser."""
    return processes.ServiceSpec(
        name="ide-proxy",
        argv=(sys.executable, "-m", "functions.ideproxy", "--port",
              str(settings.ide_proxy_port)),
        ready_url=f"{settings.ide_proxy_url}/healthz",
        data_dir=settings.data_dir,
        env={**_service_env(settings, "local"),
             "STASIS_PORTAL_URL": portal.portal_url(settings)},
        cwd=ROOT,
    )


def up(
    settings: Settings, *, runtime: str = "local", seed: bool = True, timeout: float = 90.0,
    fresh: bool = False, host_env: Mapping[str, str] | None = None,
) -> UpReport:
    """Start everything; ``fresh`` forgets the state the last `down` saved; ``host_env``
    is laid over the function host's environment (:func:`host_spec`)."""
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
    specs = [host_spec(settings, runtime, host_env), chat.sink_spec(settings),
             scheduler_spec(settings)]
    if runtime == "local":
        specs += [agent_spec(settings), ide_proxy_spec(settings)]
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
        elif runtime == "local":  # a restarted agent learns the warm pools' sizes again
            admin.push_warm_pools(settings, admin.current(settings).get("environments") or [])
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
        headers = settings.node_agent_headers()
        listing = requests.get(f"{settings.node_agent_url}/workspaces", headers=headers,
                               timeout=5).json()
        for ws in listing.get("workspaces", listing if isinstance(listing, list) else []):
            ws_id = ws.get("workspace_id") or ws.get("id")
            if ws_id:
                requests.post(f"{settings.node_agent_url}/workspaces/{ws_id}/release",
                              headers=headers, timeout=60)
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
    """Every recorded service of the stack: its state, address, URL and health."""
    return [
        {
            "name": svc.name,
            "state": svc.state,
            "address": svc.address,
            "url": f"http://{svc.address}" if svc.address else None,
            "pid": svc.pid,
            "healthy": bool(svc.ready),
            "log": str(svc.log_path) if svc.log_path else None,
        }
        for svc in processes.status_all(settings.data_dir, probe=True)
    ]


def warm_pools(settings: Settings) -> dict[str, Any] | None:
    """The node agent's warm pool (per environment: wanted size, servers waiting), or None
    when no agent answers."""
    try:
        response = requests.get(f"{settings.node_agent_url}/pools",
                                headers=settings.node_agent_headers(), timeout=3)
        return dict(response.json()) if response.ok else None
    except (requests.RequestException, ValueError):
        return None


def tenancy(settings: Settings) -> dict[str, Any] | None:
    """The node agent's tenancy (``runtime.local.tenancy``): ``{"mode":
    "per-workspace-users" | "single-tenant", "reason"}``, or None when no agent answers."""
    try:
        response = requests.get(f"{settings.node_agent_url}/capabilities",
                                headers=settings.node_agent_headers(), timeout=3)
        found = response.json().get("tenancy") if response.ok else None
        return dict(found) if isinstance(found, dict) else None
    except (requests.RequestException, ValueError, AttributeError):
        return None


def endpoints(settings: Settings) -> dict[str, dict[str, Any]]:
    """Every HTTP function of ``functions/routes.py``: its URL on the function host, who
    may call it in a deployment (public, iap, scheduler) and its cron, if scheduled."""
    from functions.routes import HTTP_FUNCTIONS

    return {name: {"url": f"{settings.functions_url}/{name}/",
                   "exposure": str(http.exposure), "schedule": http.schedule}
            for name, http in HTTP_FUNCTIONS.items()}
