"""Which function consumes which event, and with which handler.

The single table that main.py, the local stack (push subscriptions) and Terraform (one
trigger per entry) are derived from. A function name is also its consumer name: the ledger,
the failure counts and the dead-letter topic are per consumer.
"""

from __future__ import annotations

from dataclasses import dataclass

from events import spec_for
from functions.chatops import notify
from functions.delivery import Handler
from functions.handlers import idle, janitor, lifecycle
from functions.handlers import jobs as job_handler
from functions.handlers import sandboxes as sandbox_handler


@dataclass(frozen=True)
class Route:
    function: str
    event: str
    handler: Handler

    @property
    def topic(self) -> str:
        return spec_for(self.event).topic


ROUTES: dict[str, Route] = {
    route.function: route
    for route in (
        Route("on_workspace_requested", "workspace.requested", lifecycle.handle),
        Route("on_workspace_ready", "workspace.ready", lifecycle.handle),
        Route("on_runtime_failed", "workspace.runtime_failed", lifecycle.handle),
        Route("on_pause_requested", "workspace.pause_requested", lifecycle.handle),
        Route("on_snapshot_finished", "snapshot.finished", lifecycle.handle),
        Route("on_resume_requested", "workspace.resume_requested", lifecycle.handle),
        Route("on_delete_requested", "workspace.delete_requested", lifecycle.handle),
        Route("on_idle_detected", "workspace.idle_detected", idle.handle),
        Route("on_snapshot_expired", "snapshot.expired", janitor.handle_expired),
        Route("notify_chat", "workspace.state_changed", notify.handle),
        Route("notify_chat_sandbox", "sandbox.finished", notify.handle_sandbox),
        Route("notify_chat_sandbox_suspended", "sandbox.suspended",
              notify.handle_sandbox_suspended),
        Route("on_sandbox_requested", "sandbox.requested", sandbox_handler.handle),
        Route("on_sandbox_finished", "sandbox.finished", sandbox_handler.handle),
        Route("on_sandbox_suspended", "sandbox.suspended", sandbox_handler.handle),
        Route("on_sandbox_resume_requested", "sandbox.resume_requested",
              sandbox_handler.handle),
        Route("on_sandbox_idle_detected", "sandbox.idle_detected", sandbox_handler.handle),
        Route("on_job_submitted", "job.submitted", job_handler.handle),
        Route("on_job_finished", "job.finished", job_handler.handle),
    )
}

#: HTTP functions (Cloud Scheduler, chat, dashboard, proxy), by name.
HTTP_FUNCTIONS: tuple[str, ...] = ("reconcile", "chat", "proxy", "links", "idle_sweep",
                                   "janitor", "cost_rollup", "dashboard")
