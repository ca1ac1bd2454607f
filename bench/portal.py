"""Portal page loads with 1,000 workspaces in the team: p50/p99 per page, in-process.

Starts a Firestore emulator on a free port, applies examples/stasis.yaml, seeds team ml-a
with ``--workspaces`` workspaces (``--mine`` of them alice's, the rest bob's; a mix of
RUNNING, PAUSED with a snapshot, and FAILED), each with this month's audit entries as the
lifecycle writes them, then calls the portal function in-process (the functions-framework
app, as the function host mounts it; the null runtime, so the runtime costs nothing) as
alice, signed in through the portal's own one-time link. Prints JSON: per page, the first
load (which reads the workspaces' audit history; later loads read it again only for a
workspace whose version moved), the latency summary over the ``--runs`` loads after it (ms)
and the size of the page.

    .venv/bin/python bench/portal.py [--workspaces 1000] [--mine 20] [--runs 50]

Pages: ``/`` (alice's workspaces: rows, cost, idle badge, snapshot), ``/?view=team:ml-a``
(an admin's page of 50 of the team's workspaces), one workspace's page (snapshots, links),
and the new-workspace form.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspaces", type=int, default=1000)
    parser.add_argument("--mine", type=int, default=20)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()

    from stack.processes import firestore_spec, free_ports, start_many, stop_all
    from stack.settings import Settings

    data_dir = Path(tempfile.mkdtemp(prefix="stasis-bench-portal-"))
    project = f"bench-portal-{int(time.time())}"
    settings = Settings(project=project, data_dir=data_dir).with_ports(
        {"firestore": free_ports(1)[0]})
    start_many([firestore_spec(settings)], timeout=90)
    try:
        os.environ.update({
            "FIRESTORE_EMULATOR_HOST": settings.firestore_host, "STASIS_PROJECT": project,
            "GOOGLE_CLOUD_PROJECT": project, "STASIS_RUNTIME": "null",
            "STASIS_SESSION_SECRET": "bench-secret",
            # Clients are built, never used: nothing is published or stored in this run.
            "PUBSUB_EMULATOR_HOST": "127.0.0.1:9", "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9",
        })
        seeded = _seed(settings, args.workspaces, args.mine)
        print(json.dumps({"workspaces_in_team": args.workspaces, "mine": args.mine,
                          "runs": args.runs, **seeded, "pages": _measure(args.runs)},
                         indent=2))
    finally:
        stop_all(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def _seed(settings: object, count: int, mine: int) -> dict[str, object]:
    from google.cloud import firestore

    from functions.adapters.firestore_store import workspace_to_doc
    from functions.domain.lifecycle import State, Workspace
    from stack import admin

    started = time.monotonic()
    admin.apply_file(settings, ROOT / "examples" / "stasis.yaml", actor="bench")  # type: ignore[arg-type]
    db = firestore.Client(project=os.environ["STASIS_PROJECT"])
    now = datetime.now(UTC)
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    batch, pending = db.batch(), 0
    states = (State.RUNNING, State.PAUSED, State.PAUSED, State.FAILED)

    def add(collection: str, doc_id: str | None, data: dict[str, object]) -> None:
        nonlocal batch, pending
        ref = db.collection(collection).document(doc_id) if doc_id else \
            db.collection(collection).document()
        batch.set(ref, data)
        pending += 1
        if pending == 400:
            batch.commit()
            batch, pending = db.batch(), 0

    for i in range(count):
        state = states[i % len(states)]
        owner = "alice" if i < mine else "bob"
        created = month + timedelta(minutes=i)
        snap = f"ml-a--ws{i:04d}-v4" if state == State.PAUSED else None
        ws = Workspace(id=f"ml-a--ws{i:04d}", team="ml-a", owner=owner, name=f"ws{i:04d}",
                       profile="cpu-small", state=state, state_reason="paused", version=4,
                       created_at=created, updated_at=created + timedelta(hours=2),
                       current_snapshot=snap, last_activity=created + timedelta(hours=1))
        add("workspaces", ws.id, workspace_to_doc(ws))
        for offset, action, reason in ((0, "workspace.requested", "created"),
                                       (1, "workspace.ready", "ready"),
                                       (60, "workspace.pause_requested", "pause_started"),
                                       (61, "snapshot.finished", "paused")):
            add("audit", None, {"target": ws.id, "team": "ml-a", "action": action,
                                "outcome": f"accepted: {reason}", "actor": owner,
                                "time": created + timedelta(minutes=offset)})
        if snap:
            add("snapshots", snap, {"workspace": ws.id, "team": "ml-a", "owner": owner,
                                    "bytes": 256 * 2**20, "status": "ready", "method": "kernel",
                                    "created_at": created + timedelta(minutes=61),
                                    "expires_at": now + timedelta(days=20)})
    if pending:
        batch.commit()
    return {"seed_seconds": round(time.monotonic() - started, 1)}


def _measure(runs: int) -> dict[str, object]:
    import functions_framework
    from common import summary
    from werkzeug.test import Client

    app = functions_framework.create_app(target="portal",
                                         source=str(ROOT / "functions" / "main.py"),
                                         signature_type="http")
    client = Client(app)
    link = client.post("/signin-links", json={}, headers={"X-Stasis-User": "alice"})
    assert link.status_code == 201, link.get_data(as_text=True)
    url = link.get_json()["url"]
    assert client.get(url[url.index("/signin"):]).status_code == 200
    pages = {}
    for path in ("/", "/?view=team:ml-a", "/workspaces/ml-a--ws0001", "/new"):
        started = time.perf_counter()
        client.get(path)  # the first load: clients, channels, the catalog and history read
        first = (time.perf_counter() - started) * 1000
        times, size = [], 0
        for _ in range(runs):
            started = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (path, response.status_code)
            size = len(response.get_data())
        rows = response.get_data(as_text=True).count("<tr data-workspace=")
        pages[path] = {"first_load_ms": round(first, 1), "ms": summary(times), "bytes": size,
                       "workspace_rows": rows}
    return pages


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    main()
