"""The control plane end to end on the local stack (null runtime): events in, documents out.

Everything is real: the Firestore and Pub/Sub emulators, fake-gcs-server, push
subscriptions delivering to the function host under functions-framework, the CLI.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from types import SimpleNamespace

import psutil
from google.cloud import firestore, pubsub_v1

from events import WorkspaceRequested, new_event
from functions.adapters.firestore_store import ledger_key
from functions.adapters.pubsub_bus import PubSubBus
from stack import local


def _request(stack, name: str, *, team: str = "ml-a", profile: str = "cpu-small",
             requestid: str | None = None):
    return new_event(WorkspaceRequested(team=team, owner="dev", name=name, profile=profile),
                     source="//test", requestid=requestid)


def _audit_for(stack, requestid: str) -> list[dict]:
    query = stack.db.collection("audit").where(
        filter=firestore.FieldFilter("requestid", "==", requestid))
    return [d.to_dict() for d in query.stream()]


def test_requested_workspace_goes_provisioning_then_running(null_stack):
    changes = null_stack.subscribe("stasis-workspace-state-changed")
    data = json.dumps({"team": "ml-a", "owner": "dev", "name": "story", "profile": "cpu-small"})
    out = null_stack.cli("events", "publish", "workspace.requested", "--data", data)
    requestid = json.loads(out.stdout)["requestid"]

    doc = null_stack.wait_for(lambda: (null_stack.workspace("ml-a--story") or {}).get(
        "state") == "RUNNING" and null_stack.workspace("ml-a--story"), what="RUNNING")
    assert doc["url"] == "null://ml-a--story"
    assert doc["first_start_ms"] is not None and doc["version"] == 2

    messages = null_stack.pull(changes, want=2)
    seen = [(json.loads(m.data)["from_state"], json.loads(m.data)["to_state"]) for m in messages
            if json.loads(m.data)["workspace_id"] == "ml-a--story"]
    assert seen == [(None, "PROVISIONING"), ("PROVISIONING", "RUNNING")]
    assert all(m.attributes["ce-requestid"] == requestid for m in messages)
    actions = sorted(a["action"] for a in _audit_for(null_stack, requestid))
    assert actions == ["workspace.ready", "workspace.requested"]


def test_the_same_event_twice_has_one_effect(null_stack):
    bus = PubSubBus(null_stack.settings.project, origin="operator")
    event = _request(null_stack, "twice")
    bus.publish(event)
    bus.publish(event)  # a redelivery: same id
    null_stack.wait_for(lambda: (null_stack.workspace("ml-a--twice") or {}).get("state")
                        == "RUNNING", what="RUNNING")
    retry = _request(null_stack, "twice", requestid=event.requestid)  # new id, same request
    assert retry.id != event.id
    bus.publish(retry)
    # The retry's effect would be an audit entry and a version bump: wait for the ledger
    # to have seen it, then check nothing changed.
    null_stack.wait_for(lambda: len(_audit_for(null_stack, event.requestid)) >= 2,
                        what="audit entries")
    doc = null_stack.workspace("ml-a--twice")
    assert doc["version"] == 2
    audit = _audit_for(null_stack, event.requestid)
    assert sorted(a["action"] for a in audit) == ["workspace.ready", "workspace.requested"]


def test_an_illegal_transition_is_refused_and_changes_nothing(null_stack):
    null_stack.cli("ws", "create", "legal", "--team", "ml-a", "--wait")
    before = null_stack.workspace("ml-a--legal")
    # The CLI's preview (the lifecycle's own decide) refuses it at once: nothing published.
    out = null_stack.cli("ws", "resume", "legal", "--team", "ml-a", "--wait", check=False)
    assert out.returncode == 2
    assert out.stderr.strip() == "Nothing done: legal is RUNNING: already running."
    # Published anyway (as another front door might), the handler refuses it the same way.
    published = json.loads(null_stack.cli(
        "events", "publish", "workspace.resume_requested",
        "--data", json.dumps({"workspace_id": "ml-a--legal", "actor": "dev"})).stdout)
    key = ledger_key("on_resume_requested", SimpleNamespace(**published))  # type: ignore[arg-type]
    verdict = null_stack.wait_for(
        lambda: (null_stack.db.collection("processed").document(key).get().to_dict() or {})
        .get("outcome"), what="the handler's verdict")
    assert not verdict["accepted"] and "already running" in verdict["message"]
    after = null_stack.workspace("ml-a--legal")
    assert after == before


def test_invalid_messages_are_dead_lettered_with_their_reason(null_stack):
    project = null_stack.settings.project
    publisher = pubsub_v1.PublisherClient()
    topic = publisher.topic_path(project, "stasis-workspace-ready")
    marker = uuid.uuid4().hex
    publisher.publish(topic, b"not json at all", **{
        "ce-type": "dev.stasis.workspace.ready", "ce-id": f"bad-json-{marker}",
        "ce-source": "//test", "ce-specversion": "1.0"}).result()
    publisher.publish(topic, b"{}", **{"ce-type": "dev.stasis.workspace.exploded",
                                       "ce-id": f"unknown-{marker}", "ce-source": "//test"})
    publisher.publish(topic, b"hello", marker=marker).result()  # not a CloudEvent at all
    null_stack.cli("events", "publish", "workspace.requested", "--unchecked",
                   "--data", json.dumps({"team": "ml-a", "name": 7}))

    def dead() -> list[dict]:
        rows = json.loads(null_stack.cli("dlq", "--json").stdout)
        return rows if len(rows) >= 4 else []

    rows = null_stack.wait_for(dead, timeout=30, what="4 dead-lettered messages")
    reasons = {(r["id"] or "none"): r["reason"] for r in rows}
    assert "is not JSON" in reasons[f"bad-json-{marker}"]
    assert "unknown event type 'dev.stasis.workspace.exploded'" in reasons[f"unknown-{marker}"]
    assert any("not a CloudEvent" in r["reason"] for r in rows if r["id"] is None)
    invalid = [r for r in rows if r["consumer"] == "on_workspace_requested"]
    assert "'owner' is a required property" in invalid[0]["reason"]
    assert "/name: 7 is not of type 'string'" in invalid[0]["reason"]
    # Peeking leaves them in place for the next reader.
    assert len(json.loads(null_stack.cli("dlq", "--json").stdout)) == len(rows)


def test_concurrent_creates_never_exceed_the_quota(null_stack):
    # ml-b may run 1 GPU (examples/stasis.yaml); 20 users race for gpu-small at once: one
    # runs, the rest wait QUEUED (the profile queues when full), holding only their slots.
    # The function host runs two workers (two instances, as on Cloud Functions), so no
    # lock of one process orders these admissions: Firestore's transactions do.
    host = next(row for row in local.status(null_stack.settings) if row["name"] == "functions")
    assert len(psutil.Process(host["pid"]).children()) >= 2
    bus = PubSubBus(null_stack.settings.project, origin="operator")
    n = 20
    events_ = [new_event(WorkspaceRequested(team="ml-b", owner="carol", name=f"race-{i}",
                                            profile="gpu-small"), source="//test")
               for i in range(n)]
    threads = [threading.Thread(target=bus.publish, args=(e,)) for e in events_]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def settled() -> list[dict]:
        docs = [null_stack.workspace(f"ml-b--race-{i}") for i in range(n)]
        done = all(d and d["state"] in ("RUNNING", "QUEUED", "FAILED") for d in docs)
        return docs if done and any(d["state"] == "RUNNING" for d in docs) else []

    docs = null_stack.wait_for(settled, timeout=180, what=f"{n} decisions")
    running = [d for d in docs if d["state"] == "RUNNING"]
    queued = [d for d in docs if d["state"] == "QUEUED"]
    failed = [d for d in docs if d["state"] == "FAILED"]
    team = null_stack.db.collection("teams").document("ml-b").get().to_dict()
    quota = team["quotas"]["gpus"]
    assert len(running) == quota == team["usage"]["gpus"]
    # the team may have 4 workspaces: 1 runs, 3 wait, the other 16 are refused their slot
    assert len(queued) == team["quotas"]["workspaces"] - quota
    assert all("uses 1/1 GPUs" in d["state_message"] for d in queued)
    assert len(failed) == n - team["quotas"]["workspaces"]
    assert all("4/4 workspaces" in d["state_message"] for d in failed)
    assert team["usage"]["workspaces"] == team["quotas"]["workspaces"]


def test_down_leaves_no_process_behind(tmp_path):
    from tests.e2e.conftest import start_stack

    gen = start_stack(tmp_path / "s", "null")
    stack = next(gen)
    try:
        rows = local.status(stack.settings)
        pids = [row["pid"] for row in rows]
        groups = {p: psutil.Process(p).children(recursive=True) for p in pids}
        names = {row["name"] for row in rows}
    finally:
        with contextlib.suppress(StopIteration):
            next(gen)  # `stasis down`, even if the checks above failed
    assert {"firestore", "pubsub", "gcs", "functions"} <= names
    leftovers = [p for p in pids if psutil.pid_exists(p) and
                 psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    children = [c.pid for kids in groups.values() for c in kids if c.is_running() and
                c.status() != psutil.STATUS_ZOMBIE]
    assert leftovers == [] and children == []
    assert local.status(stack.settings) == []


