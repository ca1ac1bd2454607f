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
