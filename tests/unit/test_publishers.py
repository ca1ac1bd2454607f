"""Who may publish what (``functions.domain.publishers``, ``functions/routes.py``'s PUBLISHERS)
and what the handlers make of an event's origin.

The table is checked against the code: every component may publish only events its own
code constructs (an AST scan of the modules that make its events), and a runtime constructs
nothing it may not send. Then the refusals the issue asked for: a chat-originated delete of
another team's workspace is refused by the lifecycle with the reason and audited; the
delivery guard's refusal of a snapshot.finished from the chat origin runs against the
emulators (tests/integration/test_delivery.py).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from store_fakes import MemoryDb, handler_deps

from events import (
    CATALOG,
    WorkspaceDeleteRequested,
    WorkspaceReady,
    WorkspaceRequested,
    new_event,
    to_pubsub,
)
from functions.adapters.pubsub_bus import PubSubBus
from functions.domain import publishers
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import Reason, State
from functions.handlers import lifecycle
from functions.origin import current, serving
from functions.routes import FUNCTIONS, PUBLISHERS
from runtime.local import publisher as runtime_publisher

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Catalog.from_config(yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text()))

_LIFECYCLE = ("functions/domain/lifecycle.py", "functions/handlers/commands.py",
              "functions/handlers/scheduler.py")
_SANDBOXES = ("functions/domain/sandboxes.py", "functions/handlers/commands.py",
              "functions/kubernetes/sandboxes.py")
_JOBS = ("functions/domain/jobs.py", "functions/handlers/commands.py")
#: Where each component's events are made: its handler (or front door), what its outbox's
#: executors report, and its family's state changes.
EVIDENCE: dict[str, tuple[str, ...]] = {
    **{name: _LIFECYCLE for name, f in FUNCTIONS.items()
       if getattr(f, "handler", None) is lifecycle.handle},
    "on_idle_detected": ("functions/handlers/idle.py",),
    "on_snapshot_expired": ("functions/handlers/janitor.py",),
    "notify_chat": ("functions/chatops/notify.py",),
    "notify_chat_sandbox": ("functions/chatops/notify.py",),
    "notify_chat_sandbox_suspended": ("functions/chatops/notify.py",),
    **{name: _SANDBOXES for name in FUNCTIONS if name.startswith("on_sandbox_")},
    "on_job_submitted": _JOBS,
    "on_job_finished": _JOBS,
    "on_monitoring": ("functions/domain/monitoring.py",),
    "chat": ("functions/chatops/service.py",),
    "cli": ("functions/portal/api.py",),
    "workspace_api": ("functions/handlers/workspace_api.py",),
    "alertmanager": ("functions/handlers/monitoring.py",),
    "dashboard": ("functions/dashboard/web.py",),
    "portal": ("functions/portal/web.py", "functions/proxy/issuer.py"),
    "proxy": ("functions/proxy/access.py", "functions/proxy/sandboxes.py"),
    "links": ("functions/proxy/issuer.py",),
    # its repairs and scheduler pass, and the outboxes its relay sends for the event functions
    "reconcile": tuple(sorted({"functions/domain/reconcile.py", *_LIFECYCLE, *_SANDBOXES,
                               *_JOBS})),
    "idle_sweep": ("functions/handlers/idle.py",),
    "janitor": ("functions/handlers/janitor.py",),
    "cost_rollup": ("functions/handlers/cost.py",),
    publishers.OPERATOR: ("stasis_cli/sandboxes.py", "stack/persistence.py", "harness/demo.py"),
    publishers.IDE_PROXY: ("functions/ideproxy/app.py",),
    publishers.WORKSPACE: ("stasis/control_plane.py",),
    publishers.MONITOR: tuple(str(p.relative_to(ROOT))
                              for p in sorted((ROOT / "runtime" / "kubernetes").glob("*.py"))),
    publishers.NODE_AGENT: tuple(str(p.relative_to(ROOT))
                                 for p in sorted((ROOT / "runtime" / "local").glob("*.py"))),
    publishers.NULL_RUNTIME: ("functions/adapters/null_runtime.py",
                              "functions/adapters/sandbox_runtime.py"),
}
_BY_CLASS = {spec.payload.__name__: name for name, spec in CATALOG.items()}


def _constructed(paths: tuple[str, ...]) -> set[str]:
    """The events whose payload class these modules call, or hand to a call that builds
    it (``_payload(WorkspaceRequested, ...)``); an annotation or an import is no evidence."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if not isinstance(node, ast.Call):
                continue
            for ref in (node.func, *node.args):
                name = ref.id if isinstance(ref, ast.Name) else getattr(ref, "attr", "")
                if name in _BY_CLASS:
                    found.add(_BY_CLASS[name])
    return found


def _emitters() -> dict[str, set[str]]:
    emitted: dict[str, set[str]] = {}
    for event, senders in PUBLISHERS.items():
        for component in senders:
            emitted.setdefault(component, set()).add(event)
    return emitted


def test_every_component_has_its_evidence() -> None:
    assert set(EVIDENCE) == {*FUNCTIONS, *publishers.EXTERNAL}


@pytest.mark.parametrize("component", sorted(EVIDENCE))
def test_no_component_may_publish_an_event_it_never_emits(component: str) -> None:
    granted = _emitters().get(component, set())
    never = granted - _constructed(EVIDENCE[component])
    assert not never, f"{component} may publish {sorted(never)}, which its code never makes"


@pytest.mark.parametrize("component", sorted(set(publishers.EXTERNAL) - {publishers.OPERATOR}))
def test_a_runtime_or_outside_door_makes_nothing_it_may_not_send(component: str) -> None:
    made = _constructed(EVIDENCE[component])
    assert made <= publishers.EXTERNAL[component], sorted(made - publishers.EXTERNAL[component])


def test_the_runtimes_report_outcomes_and_the_front_doors_only_request() -> None:
    for runtime in (publishers.MONITOR, publishers.NODE_AGENT, publishers.NULL_RUNTIME):
        assert publishers.EXTERNAL[runtime] <= publishers.RUNTIME_OUTCOMES
    for door in ("chat", "portal", "cli"):
        assert FUNCTIONS[door].emits <= publishers.REQUESTS | {"link.created", "link.revoked"}
    assert publishers.EXTERNAL[publishers.OPERATOR] == publishers.REQUESTS
    # the public chat function cannot send what the runtime reports
    for outcome in ("snapshot.finished", "sandbox.finished", "workspace.ready"):
        assert "chat" not in PUBLISHERS[outcome] and "proxy" not in PUBLISHERS[outcome]


def test_a_table_that_lets_a_front_door_report_an_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match="operator may emit only its kind of event"):
        publishers.publishers({}, {publishers.OPERATOR: {"snapshot.finished"}})
    with pytest.raises(ValueError, match="both a function and an outside component"):
        publishers.publishers({"operator": set()})


def test_every_event_someone_consumes_has_a_sender() -> None:
    consumed = {f.event for f in FUNCTIONS.values() if getattr(f, "event", None)}
    assert consumed <= set(PUBLISHERS), sorted(consumed - set(PUBLISHERS))


def test_the_runtime_publishers_name_the_table_s_components() -> None:
    assert runtime_publisher.NODE_AGENT == publishers.NODE_AGENT
    assert runtime_publisher.MONITOR == publishers.MONITOR


def test_origin_refusal_names_who_may_send() -> None:
    senders = PUBLISHERS["snapshot.finished"]
    assert publishers.origin_refusal("snapshot.finished", "monitor", senders) is None
    refusal = publishers.origin_refusal("snapshot.finished", "chat", senders)
    assert refusal is not None and refusal.startswith(
        "snapshot.finished from chat, which may not send it (only monitor, node_agent")
    assert "carries no origin" in str(publishers.origin_refusal("snapshot.finished", "", senders))


# --- the origin on the wire ---------------------------------------------------------------------
class _Client:
    """Pub/Sub's publisher client as far as PubSubBus uses it."""

    def __init__(self) -> None:
        self.sent: list[dict[str, str]] = []

    def topic_path(self, project: str, topic: str) -> str:
        return f"projects/{project}/topics/{topic}"

    def publish(self, topic: str, data: bytes, ordering_key: str = "", **attrs: str) -> Any:
        self.sent.append(attrs)
        return _Done()


class _Done:
    def result(self, timeout: float) -> str:
        return "m-1"


def test_the_functions_bus_stamps_the_function_being_served_over_any_claim() -> None:
    client = _Client()
    bus = PubSubBus("p", origin=current, publisher=client)  # type: ignore[arg-type]
    claimed = dataclasses.replace(new_event(WorkspaceReady("ml-a--xy", "u", "h")),
                                  origin="monitor")
    with serving("chat"):
        bus.publish(claimed)
    assert client.sent[0]["ce-origin"] == "chat"
    with pytest.raises(RuntimeError, match="no origin"):
        bus.publish(claimed)  # outside any function: nobody to speak for
    data, attributes = to_pubsub(dataclasses.replace(claimed, origin="chat"))
    from events import from_pubsub

    assert from_pubsub(data, attributes).origin == "chat"


# --- the actor, checked again by the lifecycle ------------------------------------------------
def _deps() -> Any:
    db = MemoryDb()
    for team in ("ml-a", "ml-b"):
        db.put("teams", team, {"id": team, "usage": {"workspaces": 0, "gpus": 0, "tpus": 0,
                                                     "snapshot_bytes": 0}})
    return handler_deps(CONFIG, db=db)


def _from(origin: str, payload: Any, requestid: str | None = None) -> Any:
    return dataclasses.replace(new_event(payload, source="//test", requestid=requestid),
                               origin=origin)


def _carols_workspace(deps: Any) -> str:
    lifecycle.handle(_from("chat", WorkspaceRequested("ml-b", "carol", "nb", "cpu-small")),
                     deps, "on_workspace_requested")
    lifecycle.handle(_from("node_agent", WorkspaceReady("ml-b--nb", "http://nb", "h")), deps,
                     "on_workspace_ready")
    assert deps.store.db.get("workspaces", "ml-b--nb")["state"] == State.RUNNING
    return "ml-b--nb"


def test_a_chat_delete_of_another_team_s_workspace_is_refused_and_audited() -> None:
    deps = _deps()
    ws_id = _carols_workspace(deps)
    forged = _from("chat", WorkspaceDeleteRequested(ws_id, actor="alice"))
    decision = lifecycle.handle(forged, deps, "on_delete_requested")
    assert decision is not None and not decision.accepted
    assert decision.reason == Reason.NOT_PERMITTED
    assert decision.message == "alice is not a member of team ml-b, so cannot delete nb."
    assert deps.store.db.get("workspaces", ws_id)["state"] == State.RUNNING
    assert not any(call[0] == "destroy" for call in deps.runtime.calls)
    [entry] = [e for e in deps.store.db.collection("audit").values()
               if e["event_id"] == forged.id]
    assert entry["actor"] == "alice" and entry["team"] == "ml-b"
    assert entry["outcome"] == "refused: not_permitted"


def test_a_member_who_does_not_own_it_is_refused_its_owner_and_an_admin_are_not() -> None:
    deps = _deps()
    lifecycle.handle(_from("portal", WorkspaceRequested("ml-a", "alice", "nb", "cpu-small")),
                     deps, "on_workspace_requested")
    lifecycle.handle(_from("node_agent", WorkspaceReady("ml-a--nb", "http://nb", "h")), deps,
                     "on_workspace_ready")
    by_bob = lifecycle.handle(_from("portal", WorkspaceDeleteRequested("ml-a--nb", "bob")),
                              deps, "on_delete_requested")
    assert by_bob is not None and by_bob.reason == Reason.NOT_PERMITTED
    assert "nb belongs to alice" in by_bob.message
    by_dev = lifecycle.handle(_from("portal", WorkspaceDeleteRequested("ml-a--nb", "dev")),
                              deps, "on_delete_requested")
    assert by_dev is not None and by_dev.accepted  # an admin of ml-a


def test_a_chat_create_for_a_team_the_owner_is_not_in_is_refused() -> None:
    deps = _deps()
    decision = lifecycle.handle(
        _from("chat", WorkspaceRequested("ml-b", "alice", "nb", "cpu-small")), deps,
        "on_workspace_requested")
    assert decision is not None and decision.reason == Reason.NOT_PERMITTED
    assert deps.store.db.get("workspaces", "ml-b--nb") is None
    assert deps.runtime.calls == []
