"""Deployed entry points: one decorated function each, one line each.

Nothing is built at import time (cold start): ``bootstrap`` builds the adapters on the
first call. Which event each function takes is in ``functions/routes.py``.
"""

import functions_framework

from functions import bootstrap


@functions_framework.cloud_event
def on_workspace_requested(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_workspace_requested", cloud_event)


@functions_framework.cloud_event
def on_workspace_ready(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_workspace_ready", cloud_event)


@functions_framework.cloud_event
def on_runtime_failed(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_runtime_failed", cloud_event)


@functions_framework.cloud_event
def on_pause_requested(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_pause_requested", cloud_event)


@functions_framework.cloud_event
def on_snapshot_finished(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_snapshot_finished", cloud_event)


@functions_framework.cloud_event
def on_resume_requested(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_resume_requested", cloud_event)


@functions_framework.cloud_event
def on_delete_requested(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_delete_requested", cloud_event)


@functions_framework.http
def reconcile(request):  # type: ignore[no-untyped-def]
    return bootstrap.reconcile(request)


@functions_framework.http
def chat(request):  # type: ignore[no-untyped-def]
    return bootstrap.chat(request)


@functions_framework.cloud_event
def notify_chat(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("notify_chat", cloud_event)


@functions_framework.cloud_event
def notify_chat_sandbox(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("notify_chat_sandbox", cloud_event)


@functions_framework.cloud_event
def notify_chat_sandbox_suspended(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("notify_chat_sandbox_suspended", cloud_event)


@functions_framework.http
def proxy(request):  # type: ignore[no-untyped-def]
    return bootstrap.proxy(request)


@functions_framework.http
def links(request):  # type: ignore[no-untyped-def]
    return bootstrap.links(request)


@functions_framework.cloud_event
def on_idle_detected(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_idle_detected", cloud_event)


@functions_framework.cloud_event
def on_snapshot_expired(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_snapshot_expired", cloud_event)


@functions_framework.cloud_event
def on_sandbox_requested(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_sandbox_requested", cloud_event)


@functions_framework.cloud_event
def on_sandbox_finished(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_sandbox_finished", cloud_event)


@functions_framework.cloud_event
def on_sandbox_suspended(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_sandbox_suspended", cloud_event)


@functions_framework.cloud_event
def on_sandbox_resume_requested(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_sandbox_resume_requested", cloud_event)


@functions_framework.cloud_event
def on_sandbox_idle_detected(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_sandbox_idle_detected", cloud_event)


@functions_framework.http
def idle_sweep(request):  # type: ignore[no-untyped-def]
    return bootstrap.idle_sweep(request)


@functions_framework.http
def janitor(request):  # type: ignore[no-untyped-def]
    return bootstrap.janitor(request)


@functions_framework.http
def cost_rollup(request):  # type: ignore[no-untyped-def]
    return bootstrap.cost_rollup(request)


@functions_framework.http
def dashboard(request):  # type: ignore[no-untyped-def]
    return bootstrap.dashboard(request)


@functions_framework.cloud_event
def on_job_submitted(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_job_submitted", cloud_event)


@functions_framework.cloud_event
def on_job_finished(cloud_event):  # type: ignore[no-untyped-def]
    bootstrap.deliver("on_job_finished", cloud_event)
