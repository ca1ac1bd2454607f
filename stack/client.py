"""What the CLI reads: workspaces, teams, snapshots, and how a request turned out.

Reads Firestore (and the node agent, for the local owner's token). It never writes: every
change goes through an event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache
from typing import Any

import requests
from google.cloud import firestore

from events import Event
from functions.adapters.firestore_store import ledger_key
from functions.routes import ROUTES
from stack.settings import Settings


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


def list_workspaces(
    *, team: str | None = None, include_deleted: bool = False, limit: int = 500
) -> list[dict[str, Any]]:
    query: Any = _db().collection("workspaces")
    if team:
        query = query.where(filter=firestore.FieldFilter("team", "==", team))
    rows = [d.to_dict() for d in query.limit(limit).stream()]
    return sorted(
        (r for r in rows if include_deleted or r.get("state") != "DELETED"),
        key=lambda r: (r["team"], r["name"]),
    )


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
            agent = requests.get(f"{settings.node_agent_url}/workspaces/{ws_id}", timeout=5)
            if agent.ok:
                doc["token"] = agent.json().get("token")
        except requests.RequestException:
            pass
    return doc


def snapshots(ws_id: str) -> list[dict[str, Any]]:
    query = (
        _db().collection("snapshots").where(filter=firestore.FieldFilter("workspace", "==", ws_id))
    )
    rows = [{"id": d.id, **(d.to_dict() or {})} for d in query.stream()]
    return sorted(rows, key=lambda r: r.get("created_at") or 0)


def outcome(event: Event[Any]) -> dict[str, Any] | None:
    """The consuming function's verdict on ``event``, once it has been processed."""
    consumer = next(r.function for r in ROUTES.values() if r.event == event.name)
    snap = _db().collection("processed").document(ledger_key(consumer, event)).get()
    return (snap.to_dict() or {}).get("outcome") if snap.exists else None


def follow(
    settings: Settings,
    event: Event[Any],
    *,
    until: set[str],
    timeout: float = 600,
    progress: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Wait for the request's verdict, then for the workspace to reach a state in ``until``
    (or FAILED); report each state it passes through."""
    say = progress or (lambda _m: None)
    deadline = time.monotonic() + timeout
    verdict = None
    while verdict is None:
        if time.monotonic() > deadline:
            return {"ok": False, "error": "no verdict yet: is the stack up (`stasis status`)?"}
        verdict = outcome(event)
        time.sleep(0.1) if verdict is None else None
    if not verdict.get("accepted") or verdict.get("state") == "FAILED":
        say(f"refused: {verdict.get('message') or verdict.get('reason')}")
        return {"ok": False, **verdict}
    if verdict.get("message"):
        say(f"note: {verdict['message']}")
    seen = None
    started = time.monotonic()
    shown_progress = 0.0
    while time.monotonic() < deadline:
        doc = workspace(event.subject) or {}
        state = doc.get("state")
        if state in ("PAUSING", "RESUMING") and time.monotonic() - shown_progress > 0.5:
            line = _progress_line(settings, event.subject, time.monotonic() - started)
            if line:
                say(line)
                shown_progress = time.monotonic()
        if state != seen:
            say(
                f"{event.subject}: {state} ({time.monotonic() - started:.1f}s)"
                + (f" — {doc.get('state_message')}" if doc.get("state_message") else "")
            )
            seen = state
        if (
            state in until
            or state == "FAILED"
            or (
                state in {"RUNNING"}
                and "PAUSED" in until
                and doc.get("state_reason") == "snapshot_failed"
            )
        ):
            ok = state in until
            return {"ok": ok, "workspace": _jsonable(doc)}
        time.sleep(0.2)
    return {"ok": False, "error": f"timed out waiting for {sorted(until)}"}


def _progress_line(settings: Settings, ws_id: str, elapsed: float) -> str | None:
    """Bytes moved so far and the rate, from the node agent (local runtime only)."""
    try:
        answer = requests.get(f"{settings.node_agent_url}/workspaces/{ws_id}", timeout=2)
        progress = answer.json().get("progress") if answer.ok else None
    except (requests.RequestException, ValueError):
        return None
    if not progress or not progress.get("total_bytes"):
        return None
    done, total = progress["done_bytes"], progress["total_bytes"]
    return (f"  {done / 2**20:,.0f} / {total / 2**20:,.0f} MiB "
            f"({done / 2**20 / max(elapsed, 1e-3):,.0f} MiB/s)")


def _jsonable(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in doc.items()}
