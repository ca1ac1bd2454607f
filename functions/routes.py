"""Every deployed function: its name, its trigger, its handler. The one table.

An event function (:class:`Route`) is pushed one event type: its topic comes from
``events/``, and its push subscription, dead-letter topic and dead-letter pull subscription
are named after the function. A :class:`Raw` event function is pushed the messages of a
topic Stasis does not write in its own format (cluster monitoring's), named the same way.
An HTTP function (:class:`Http`) says who may call it (:class:`Exposure`: public, behind
IAP, or Cloud Scheduler only, with its cron), its handler as ``"module:function"`` and
which of ``bootstrap``'s dependencies it is given.

Why HTTP handlers are named rather than imported: every function's instance imports this
table (it is ``main.py``'s), and the front doors' modules (pages, templates, the proxy)
would add about 70 ms of CPU to every cold start for code only one function runs. So an
HTTP handler's module is imported on that function's first request; ``tests/unit/
test_routes.py`` resolves every name, so a typo fails the tests, not a deployment.

Each function also says what it publishes (``emits``: an event function's outbox, an HTTP
function's requests or repairs); :data:`PUBLISHERS` derives from that who may publish each
event (``functions.domain.publishers``), for Terraform's per-topic grants and the delivery
guard, which refuses an event from any other origin.

Derived from this table, never written again: the entry points of ``functions/main.py``,
the local stack's push subscriptions (``stack/topology.py``), function host and scheduler
(``stack/scheduler.py``), and what ``stasis bundle`` gives Terraform (``deploy/``). A new
function is one line here plus its handler.

A function name is also its consumer name: the ledger, the failure counts and the
dead-letter topic are per consumer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from events import spec_for
from functions.chatops import notify
from functions.delivery import ORDERED_BY_TEAM, Handler, RawHandler, dead_letter_topic
from functions.domain import publishers
from functions.handlers import idle, janitor, lifecycle, monitoring
from functions.handlers import jobs as job_handler
from functions.handlers import sandboxes as sandbox_handler

#: ``handler(request, deps)`` -> what functions-framework sends back.
HttpHandler = Callable[[Any, Any], Any]


class _Pushed:
    """What an event function's push subscription and dead letters are named after."""

    function: str

    @property
    def subscription(self) -> str:
        """The push subscription on the topic (the function's trigger)."""
        return "stasis-" + self.function.replace("_", "-") + "-push"

    @property
    def dead_letter_topic(self) -> str:
        return dead_letter_topic(self.function)

    @property
    def dead_letter_subscription(self) -> str:
        """The pull subscription ``stasis dlq`` reads."""
        return self.dead_letter_topic + "-pull"


@dataclass(frozen=True)
class Route(_Pushed):
    """An event function: ``handler(event, deps, consumer)`` under the delivery guard."""

    function: str
    event: str
    handler: Handler
    #: The events its outbox may hold (``publishers``: who may publish what).
    emits: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in (self.event, *self.emits):
            try:
                spec_for(name)
            except KeyError:
                raise ValueError(f"{self.function} names {name!r}, which events/ does not "
                                 "define") from None

    @property
    def topic(self) -> str:
        return spec_for(self.event).topic

    @property
    def ordered(self) -> bool:
        """Delivered in order per team (the publisher sets the team as ordering key)."""
        return self.event in ORDERED_BY_TEAM


@dataclass(frozen=True)
class Raw(_Pushed):
    """An event function pushed the raw messages of ``topic`` (Cloud Monitoring's
    notifications, a log sink's entries, relayed webhooks): ``handler(message, deps,
    consumer)`` under the same delivery guard. It takes no Stasis event."""

    function: str
    topic: str
    handler: RawHandler
    emits: frozenset[str] = frozenset()
    event: None = None
    ordered: bool = False


class Exposure(StrEnum):
    """Who may call an HTTP function."""

    PUBLIC = "public"  # anyone: the function verifies the caller (Slack's signature, a token)
    IAP = "iap"  # signed-in people, through Identity-Aware Proxy
    SCHEDULER = "scheduler"  # Cloud Scheduler only (locally stack/scheduler.py)


@dataclass(frozen=True)
class Http:
    """An HTTP function: ``handler(request, deps)``. ``handler`` is ``"module:function"``;
    ``deps`` names what ``bootstrap`` builds for it (lazily, once per instance):
    ``"control_plane"`` (the handlers' ``Deps``), or a front door's own."""

    function: str
    exposure: Exposure
    handler: str
    deps: str = "control_plane"
    #: Cloud Scheduler's cron (UTC) for a scheduler-only function; None: no job.
    schedule: str | None = None
    #: The events it publishes (``publishers``: who may publish what).
    emits: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in self.emits:
            spec_for(name)  # a KeyError names an event events/ does not define
        if self.schedule is not None and self.exposure is not Exposure.SCHEDULER:
            raise ValueError(f"{self.function}: only a scheduler-only function has a schedule")
        if self.handler.count(":") != 1:
            raise ValueError(f"{self.function}: the handler is 'module:function', "
                             f"not {self.handler!r}")

    def load(self) -> HttpHandler:
        """The handler function (its module imported now)."""
        module, _, name = self.handler.partition(":")
        handler: HttpHandler = getattr(importlib.import_module(module), name)
        return handler


PUBLIC, IAP, SCHEDULER = Exposure.PUBLIC, Exposure.IAP, Exposure.SCHEDULER


def _table(*entries: Route | Raw | Http) -> dict[str, Route | Raw | Http]:
    table: dict[str, Route | Raw | Http] = {}
    for entry in entries:
        if entry.function in table:
            raise ValueError(f"two functions named {entry.function}")
        table[entry.function] = entry
    return table


#: What each family's outbox may hold: its ``<family>.state_changed``, what its executors
#: report when the runtime refuses for good (``handlers/commands.py``) and, for workspaces,
#: the scheduler's verdicts (a ``Schedule`` command runs ``handlers/scheduler.py``).
LIFECYCLE_OUTBOX = frozenset({"workspace.state_changed", "workspace.runtime_failed",
                              "snapshot.finished", "workspace.scheduled"})
SANDBOX_OUTBOX = frozenset({"sandbox.state_changed", "sandbox.finished"})
JOB_OUTBOX = frozenset({"job.state_changed", "job.finished"})
#: What the front doors ask for.
WORKSPACE_REQUESTS = frozenset({"workspace.requested", "workspace.pause_requested",
                                "workspace.resume_requested", "workspace.delete_requested"})
SANDBOX_REQUESTS = frozenset({"sandbox.requested", "sandbox.resume_requested"})
LINKS = frozenset({"link.created", "link.revoked"})


def _lifecycle(function: str, event: str) -> Route:
    return Route(function, event, lifecycle.handle, LIFECYCLE_OUTBOX)


FUNCTIONS = _table(
    _lifecycle("on_workspace_requested", "workspace.requested"),
    _lifecycle("on_workspace_ready", "workspace.ready"),
    _lifecycle("on_runtime_failed", "workspace.runtime_failed"),
    _lifecycle("on_pause_requested", "workspace.pause_requested"),
    _lifecycle("on_snapshot_finished", "snapshot.finished"),
    _lifecycle("on_resume_requested", "workspace.resume_requested"),
    _lifecycle("on_delete_requested", "workspace.delete_requested"),
    _lifecycle("on_workspace_preempted", "workspace.preempted"),
    _lifecycle("on_workspace_scheduled", "workspace.scheduled"),
    _lifecycle("on_runtime_alert", "workspace.runtime_alert"),
    Route("on_idle_detected", "workspace.idle_detected", idle.handle,
          frozenset({"workspace.pause_requested"})),
    Route("on_snapshot_expired", "snapshot.expired", janitor.handle_expired),
    Route("notify_chat", "workspace.state_changed", notify.handle),
    Route("notify_chat_sandbox", "sandbox.state_changed", notify.handle_sandbox),
    Route("notify_chat_sandbox_suspended", "sandbox.state_changed",
          notify.handle_sandbox_suspended),
    Route("on_sandbox_requested", "sandbox.requested", sandbox_handler.handle, SANDBOX_OUTBOX),
    Route("on_sandbox_finished", "sandbox.finished", sandbox_handler.handle, SANDBOX_OUTBOX),
    Route("on_sandbox_suspended", "sandbox.suspended", sandbox_handler.handle, SANDBOX_OUTBOX),
    Route("on_sandbox_resume_requested", "sandbox.resume_requested",
          sandbox_handler.handle, SANDBOX_OUTBOX),
    Route("on_sandbox_idle_detected", "sandbox.idle_detected", sandbox_handler.handle,
          SANDBOX_OUTBOX),
    Route("on_job_submitted", "job.submitted", job_handler.handle, JOB_OUTBOX),
    Route("on_job_finished", "job.finished", job_handler.handle, JOB_OUTBOX),
    Raw("on_monitoring", monitoring.TOPIC, monitoring.handle,
        frozenset({"workspace.idle_detected", "workspace.preempted", "workspace.runtime_alert"})),

    Http("chat", PUBLIC, "functions.chatops.web:serve", deps="chat",
         emits=WORKSPACE_REQUESTS | SANDBOX_REQUESTS),
    Http("alertmanager", PUBLIC, "functions.handlers.monitoring:serve_webhook",
         deps="monitoring_relay"),  # it relays to the raw monitoring topic
    Http("dashboard", IAP, "functions.dashboard.web:handle", deps="dashboard"),
    Http("portal", IAP, "functions.portal.web:handle", deps="portal",
         emits=WORKSPACE_REQUESTS | LINKS),
    Http("cli", IAP, "functions.portal.api:serve", deps="portal", emits=WORKSPACE_REQUESTS),
    # An agent's link resumes its workspace and runs sandboxes (functions/proxy/access.py).
    Http("proxy", IAP, "functions.proxy.wiring:serve_proxy", deps="links",
         emits=frozenset({"workspace.resume_requested"}) | SANDBOX_REQUESTS),
    Http("links", IAP, "functions.proxy.wiring:serve_links", deps="links", emits=LINKS),
    # A workspace's kernel, as its workspace (events.identity): its jobs' events.
    Http("workspace_api", PUBLIC, "functions.handlers.workspace_api:serve",
         deps="control_plane", emits=frozenset({"job.submitted", "job.finished"})),
    Http("reconcile", SCHEDULER, "functions.handlers.scheduled:reconcile",
         schedule="*/10 * * * *",
         # its repairs, and the outboxes its relay sends for the event functions
         emits=frozenset({"workspace.preempted", "workspace.delete_requested"})
         | LIFECYCLE_OUTBOX | SANDBOX_OUTBOX | JOB_OUTBOX),
    Http("idle_sweep", SCHEDULER, "functions.handlers.scheduled:idle_sweep",
         schedule="*/5 * * * *", emits=frozenset({"workspace.idle_detected"})),
    Http("janitor", SCHEDULER, "functions.handlers.scheduled:janitor", schedule="17 * * * *",
         emits=frozenset({"snapshot.expired"})),
    Http("cost_rollup", SCHEDULER, "functions.handlers.scheduled:cost_rollup",
         schedule="41 * * * *"),
)

#: The event functions, by name (a Raw one has no event).
ROUTES: dict[str, Route | Raw] = {n: f for n, f in FUNCTIONS.items()
                                  if isinstance(f, Route | Raw)}


def consumer_of(event_name: str) -> str:
    """The event function that consumes ``event_name``: its ledger entry for a request
    holds the request's verdict (``functions.ports.ledger_key``)."""
    return next(r.function for r in ROUTES.values() if r.event == event_name)


#: The HTTP functions, by name.
HTTP_FUNCTIONS: dict[str, Http] = {n: f for n, f in FUNCTIONS.items() if isinstance(f, Http)}
#: Event name -> the components that may publish it (every function's ``emits``, the
#: front doors and runtimes outside the functions): Terraform's per-topic publishers and
#: the delivery guard's senders.
PUBLISHERS: dict[str, frozenset[str]] = publishers.publishers(
    {n: f.emits for n, f in FUNCTIONS.items()})
