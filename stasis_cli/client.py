"""What the CLI reads: workspaces, teams, snapshots, and how a request turned out.

Reads Firestore (and the node agent, for the local owner's token). It never writes: every
change goes through an event. Only the Firestore client is imported with it; what
following a request needs (the routes, the ledger's key) is imported when it is followed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, Protocol

import requests
from google.cloud import firestore

from stack.settings import Settings

#: How often a follower reads at first, and at most: it slows down while nothing changes
#: (ten `--wait`s at once must not be a storm of reads), and is quick again after a change.
#: Once the request is accepted, a listener on the workspace's document wakes it at each
#: change, so these bound only how late it may be when the listener is not there.
_FIRST_POLL_S, _MAX_POLL_S = 0.1, 1.0


class Request(Protocol):
    """What following a request needs of it (an ``events.Event``, or the ``cli``
    function's answer, ``stasis_cli.door.Requested``)."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def requestid(self) -> str | None: ...
    @property
    def subject(self) -> str: ...


@cache
def _db() -> firestore.Client:
    import os

    return firestore.Client(project=os.environ.get("STASIS_PROJECT", "stasis-local"))


def teams_of(user: str) -> list[str]:
    query = (
        _db()
        .collection("teams")
        .where(filter=firestore.FieldFilter("member_ids", "array_contains", user))
    )
    return sorted(d.id for d in query.stream())


def workspace(ws_id: str) -> dict[str, Any] | None:
    snap = _db().collection("workspaces").document(ws_id).get()
    return snap.to_dict() if snap.exists else None


def workspace_status(settings: Settings, ws_id: str) -> dict[str, Any] | None:
    doc = workspace(ws_id)
    if doc is None:
        return None
    if doc.get("current_snapshot"):
        snap = _db().collection("snapshots").document(doc["current_snapshot"]).get()
        doc["snapshot_bytes"] = (snap.to_dict() or {}).get("bytes") if snap.exists else None
    if doc.get("state") == "RUNNING":
        try:
            agent = requests.get(f"{settings.node_agent_url}/workspaces/{ws_id}",
                                 headers=settings.node_agent_headers(), timeout=5)
            if agent.ok:
                # The IDE's server itself, for the local owner (scripts, the demo): the
                # workspace's url is its IDE through the access proxy.
                served = agent.json()
                doc["direct_url"], doc["token"] = served.get("url"), served.get("token")
                doc["devices"] = served.get("devices") or None
                doc["declared"] = served.get("declared") or None
        except requests.RequestException:
            pass
    if doc.get("state") == "QUEUED":
        view = queue_outlook(settings, ws_id)
        if view is not None:
            doc["queue"] = view.describe()
            doc["queue_position"] = view.position
            doc["queue_estimate_s"] = (int(view.estimate.total_seconds())
                                       if view.estimate is not None else None)
    return doc


def queue_outlook(settings: Settings, ws_id: str) -> Any:
    """Where the QUEUED workspace ``ws_id`` stands (``scheduling.outlook_of``, on the
    documents read here and the node agent's capabilities)."""
    from datetime import UTC, datetime

    from functions.adapters.firestore_store import workspace_from_doc
    from functions.domain import scheduling
    from functions.domain.catalog import Catalog
    from functions.domain.lifecycle import HOLDS_HARDWARE

    db = _db()
    catalog = Catalog.from_config(db.collection("catalog").document("current").get()
                                   .to_dict() or {})

    def in_states(states: list[str]) -> list[Any]:
        query = db.collection("workspaces").where(
            filter=firestore.FieldFilter("state", "in", states))
        return [workspace_from_doc(d.to_dict()) for d in query.stream()]

    try:
        answer = requests.get(f"{settings.node_agent_url}/capabilities",
                              headers=settings.node_agent_headers(), timeout=5)
        capabilities = answer.json() if answer.ok else {}
    except (requests.RequestException, ValueError):
        capabilities = {}
    teams = {d.id: d.to_dict() or {} for d in db.collection("teams").stream()}
    found = scheduling.outlook_of(catalog, in_states(["QUEUED"]),
                                 in_states(sorted(str(s) for s in HOLDS_HARDWARE)), teams,
                                 capabilities, {ws_id}, datetime.now(UTC))
    return found.get(ws_id)


def snapshots(ws_id: str) -> list[dict[str, Any]]:
    query = (
        _db().collection("snapshots").where(filter=firestore.FieldFilter("workspace", "==", ws_id))
    )
    rows = [{"id": d.id, **(d.to_dict() or {})} for d in query.stream()]
    return sorted(rows, key=lambda r: r.get("created_at") or 0)


def outcome(event: Request) -> dict[str, Any] | None:
    """The consuming function's verdict on ``event``, once it has been processed: read
    under the id the front door answered (``door.Requested.verdict``); for an event
    published directly, the id is computed, which imports the routes (0.7 s of CPU a CLI
    following through the front door does not spend)."""
    key = getattr(event, "verdict", None)
    if not key:
        from functions.ports import ledger_key
        from functions.routes import consumer_of

        key = ledger_key(consumer_of(event.name), event)  # type: ignore[arg-type]
    snap = _db().collection("processed").document(key).get()
    return (snap.to_dict() or {}).get("outcome") if snap.exists else None


def follow(
    settings: Settings,
    event: Request,
    *,
    until: set[str],
    timeout: float = 600,
    progress: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Wait for the request's verdict, then for the workspace to reach a state in ``until``
    (or FAILED); report each state it passes through. Reads back off while nothing changes
    (``_FIRST_POLL_S`` up to ``_MAX_POLL_S``); once accepted, each change of the workspace
    wakes it at once (``_watching``)."""
    say = progress or (lambda _m: None)
    deadline = time.monotonic() + timeout
    verdict = None
    delay = _FIRST_POLL_S
    while verdict is None:
        if time.monotonic() > deadline:
            return {"ok": False, "unavailable": True,
                    "error": "no verdict yet: is the stack up (`stasis status`)?"}
        verdict = outcome(event)
        if verdict is None:
            time.sleep(delay)
            delay = min(delay * 1.5, _MAX_POLL_S)
    if not verdict.get("accepted") or verdict.get("state") == "FAILED":
        say(f"refused: {verdict.get('message') or verdict.get('reason')}")
        return {"ok": False, **verdict}
    if verdict.get("message"):
        say(f"note: {verdict['message']}")
    with _watching(event.subject) as changed:
        return _follow_workspace(settings, event, until, deadline, say, changed)


def _follow_workspace(settings: Settings, event: Request, until: set[str], deadline: float,
                      say: Callable[[str], Any], changed: threading.Event) -> dict[str, Any]:
    seen = None
    started = time.monotonic()
    shown_progress, last_line = 0.0, ""
    delay = _FIRST_POLL_S
    while time.monotonic() < deadline:
        changed.clear()  # a change from now on wakes the wait below
        doc = workspace(event.subject) or {}
        state = doc.get("state")
        if state in ("PROVISIONING", "PAUSING", "RESUMING") and \
                time.monotonic() - shown_progress > 0.5:
            line = _progress_line(settings, event.subject)
            if line and line != last_line:
                say(line)
                shown_progress, last_line = time.monotonic(), line
        if state != seen:
            say(
                f"{event.subject}: {state} ({time.monotonic() - started:.1f}s)"
                + (f" — {doc.get('state_message')}" if doc.get("state_message") else "")
            )
            seen, delay = state, _FIRST_POLL_S
        if (
            state in until
            or state == "FAILED"
            or (
                state in {"RUNNING"}
                and "PAUSED" in until
                and doc.get("state_reason") == "snapshot_failed"
            )
            or (
                state == "PAUSED"
                and "RUNNING" in until
                and doc.get("state_reason") in _resume_kept_paused()
            )
        ):
            ok = state in until
            return {"ok": ok, "workspace": _jsonable(doc)}
        changed.wait(delay)
        # Slower while nothing changes; a transfer's bar still moves twice a second.
        cap = 0.5 if state in ("PROVISIONING", "PAUSING", "RESUMING") else _MAX_POLL_S
        delay = min(delay * 1.5, cap)
    return {"ok": False, "error": f"timed out waiting for {sorted(until)}"}


@contextmanager
def _watching(ws_id: str) -> Iterator[threading.Event]:
    """An event set at every change of the workspace's document (a Firestore listener:
    the change is seen as it is committed, without reading in a loop); never set when the
    listener cannot be had, the follower then reads on its own schedule."""
    changed = threading.Event()
    try:
        watch = _db().collection("workspaces").document(ws_id).on_snapshot(
            lambda *_: changed.set())
    except Exception:  # the follower still works by reading
        watch = None
    try:
        yield changed
    finally:
        if watch is not None:
            watch.unsubscribe()


def _resume_kept_paused() -> frozenset[str]:
    """The reasons a resume ends PAUSED for (the lifecycle's own list)."""
    from functions.domain.lifecycle import RESUME_KEPT_PAUSED

    return RESUME_KEPT_PAUSED


def _progress_line(settings: Settings, ws_id: str) -> str | None:
    """The node agent's progress as a bar: phase, bytes, rate, time left
    (``functions.domain.progress``, the same words as the portal's progress line)."""
    from functions.domain.progress import describe

    try:
        answer = requests.get(f"{settings.node_agent_url}/workspaces/{ws_id}/progress",
                              headers=settings.node_agent_headers(), timeout=2)
        progress = describe(answer.json()) if answer.ok else None
    except (requests.RequestException, ValueError):
        return None
    if progress is None:
        return None
    return f"  {progress.bar()} {progress.line}" if progress.total_bytes else f"  {progress.line}"


def _jsonable(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in doc.items()}
