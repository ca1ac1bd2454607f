"""A realistic fleet for the dashboard's tests and benchmark: workspaces in every state,
their snapshots (live, deleted, expired, orphans the janitor found), links (active, expired,
revoked, with uses), audit entries, sandboxes, team usage counters and the cost rollups of
``functions/domain/cost.py``. Deterministic (seeded) and relative to a given ``now``.

``build_fleet(project, now, scale=1)`` returns plain dicts (300 workspaces in 3 teams at
scale 1); ``write_fleet`` applies the catalog and writes everything to Firestore in batches.
"""

from __future__ import annotations

import hashlib
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from functions.adapters.firestore_store import workspace_to_doc
from functions.adapters.link_store import link_to_doc
from functions.domain import cost as cost_model
from functions.domain import quota
from functions.domain.catalog import Catalog
from functions.domain.idle import ACTOR as IDLE_ACTOR
from functions.domain.lifecycle import State, Workspace
from functions.domain.links import Link, Scope, link_id_from
from functions.domain.retention import SnapshotRecord
from functions.domain.sandboxes import Limits, Sandbox, SandboxState
from stack import admin
from stack.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "stasis.yaml"
GIB, MIB = 2**30, 2**20

TEAMS = {"ml-a": 120, "ml-b": 100, "vision": 80}
#: A credential in vision's sandbox tasks: the dashboard must never show it.
VISION_TOKEN = "ghp_visionCIsecret0123"
OWNERS = {"ml-a": ["alice", "bob", "dev", "erin", "frank"], "ml-b": ["carol", "dan"],
          "vision": ["grace", "heidi", "ivan"]}
PROFILE_WEIGHTS = {"cpu-small": 5, "cpu-large": 3, "gpu-small": 3, "tpu-v5e-8": 1}
STATE_WEIGHTS = {State.RUNNING: 34, State.PAUSED: 30, State.DELETED: 12, State.FAILED: 5,
                 State.REQUESTED: 4, State.PROVISIONING: 4, State.PAUSING: 4,
                 State.RESUMING: 4, State.DELETING: 3}
FIRST_START_MS = {"cpu-small": 3500, "cpu-large": 5200, "gpu-small": 42000, "tpu-v5e-8": 95000}
PAUSE_MS = {"cpu-small": 2400, "cpu-large": 4100, "gpu-small": 16000, "tpu-v5e-8": 31000}
RESUME_MS = {"cpu-small": 1900, "cpu-large": 3300, "gpu-small": 12500, "tpu-v5e-8": 27000}
REASONS = {State.REQUESTED: "created", State.PROVISIONING: "created", State.RUNNING: "ready",
           State.PAUSING: "pause_started", State.PAUSED: "paused",
           State.RESUMING: "resume_started", State.DELETING: "delete_started",
           State.DELETED: "deleted", State.FAILED: "provision_failed"}
RAN = {State.RUNNING, State.PAUSING, State.PAUSED, State.RESUMING, State.DELETING,
       State.DELETED}


@dataclass
class Fleet:
    project: str
    now: datetime
    catalog: Catalog
    workspaces: list[dict[str, Any]] = field(default_factory=list)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    links: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)
    sandboxes: list[dict[str, Any]] = field(default_factory=list)
    costs: dict[str, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, quota.Usage] = field(default_factory=dict)

    def ws(self, **where: Any) -> list[dict[str, Any]]:
        return [w for w in self.workspaces if all(w.get(k) == v for k, v in where.items())]


def config() -> dict[str, Any]:
    config = yaml.safe_load(EXAMPLE.read_text())
    a, b = config["teams"]
    a["members"] += [{"user": "erin", "role": "member"}, {"user": "frank", "role": "member"}]
    a["quotas"] = {"workspaces": 150, "gpus": 40, "tpus": 64, "snapshot_bytes": "2Ti"}
    b["members"] += [{"user": "dan", "role": "member"}, {"user": "vic", "role": "viewer"}]
    b["quotas"] = {"workspaces": 120, "gpus": 30, "tpus": 0, "snapshot_bytes": "1Ti"}
    config["teams"].append({
        "id": "vision", "title": "Vision", "contact": "grace",
        "members": [{"user": "grace", "role": "admin"}, {"user": "heidi", "role": "member"},
                    {"user": "ivan", "role": "member"}],
        "quotas": {"workspaces": 100, "gpus": 30, "tpus": 0, "snapshot_bytes": "1Ti"},
        "profiles": ["cpu-small", "cpu-large", "gpu-small"]})
    return config


def _pick(rng: random.Random, weights: dict[Any, int]) -> Any:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _ms(rng: random.Random, base: int) -> int:
    return int(base * rng.lognormvariate(0, 0.35))


def _hex(rng: random.Random, n: int = 16) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


def build_fleet(project: str, now: datetime, scale: int = 1) -> Fleet:
    """A deterministic fleet (seed 2025) relative to ``now``: plain dicts, nothing written;
    ``scale`` multiplies the workspaces and links."""
    rng = random.Random(2025)
    catalog = Catalog.from_config(config())
    fleet = Fleet(project, now, catalog)
    snap_no = 0

    def audit(actor: str, action: str, target: str, outcome: str, when: datetime,
              message: str = "") -> None:
        fleet.audit.append({"actor": actor, "action": action, "target": target,
                            "outcome": outcome, "message": message,
                            "event_id": f"ev-{_hex(rng)}", "requestid": f"rq-{_hex(rng)}",
                            "team": target.split("--")[0], "time": when})

    def snapshot(ws: Workspace, created: datetime, status: str, **extra: Any) -> str:
        nonlocal snap_no
        snap_no += 1
        snap_id = f"snap-{snap_no:05d}"
        accel = catalog.profiles[ws.profile].accelerator
        size = (rng.randint(2 * GIB, 24 * GIB) if accel else rng.randint(64 * MIB, 3 * GIB))
        days = catalog.retention_for(ws.team, ws.profile).max_age_days
        fleet.snapshots[snap_id] = {
            "workspace": ws.id, "team": ws.team, "owner": ws.owner, "profile": ws.profile,
            "uri": f"gs://{project}-snapshots/snapshots/{ws.team}/{ws.id}/{snap_id}/",
            "bytes": size, "method": str(catalog.profiles[ws.profile].snapshot.method),
            "accelerator": accel.type if accel else None,
            "accelerator_count": accel.count if accel else 0, "status": status,
            "duration_ms": _ms(rng, PAUSE_MS[ws.profile]), "created_at": created,
            "expires_at": created + timedelta(days=days), "captured": ["model", "df"],
            "skipped": [], **extra}
        return snap_id

    def live_snapshot_time(ws: Workspace) -> datetime:
        """A creation time whose expiry is at least 3 h away and not within 2 h of the
        7-day 'expiring soon' line (so a slow test run cannot flip a count)."""
        days = catalog.retention_for(ws.team, ws.profile).max_age_days
        earliest = now - timedelta(days=days) + timedelta(hours=3)
        created = earliest + (now - timedelta(minutes=10) - earliest) * rng.random()
        gap = created + timedelta(days=days) - (now + timedelta(days=7))
        if abs(gap) < timedelta(hours=2):
            created -= timedelta(hours=4)
        return max(created, earliest)

    for team, count in TEAMS.items():
        allowed = {p: w for p, w in PROFILE_WEIGHTS.items()
                   if p in catalog.teams[team].profiles}
        for i in range(count * scale):
            state = _pick(rng, STATE_WEIGHTS)
            profile = _pick(rng, allowed)
            owner = rng.choice(OWNERS[team])
            created = now - timedelta(hours=rng.uniform(1, 24 * 45))
            ws = Workspace(id=f"{team}--nb-{i:04d}", team=team, owner=owner,
                           name=f"nb-{i:04d}", profile=profile, state=state,
                           version=rng.randint(2, 40), created_at=created)
            updated = created + (now - created) * rng.uniform(0.3, 0.99)
            changes: dict[str, Any] = {"updated_at": updated, "state_reason": REASONS[state]}
            if state in RAN:
                changes["first_start_ms"] = _ms(rng, FIRST_START_MS[profile])
                changes["last_activity"] = updated
            if state == State.RUNNING:
                changes["url"] = f"http://127.0.0.1:9000/ws/{ws.id}/lab"
                changes["last_activity"] = now - timedelta(minutes=rng.uniform(1, 180))
                if rng.random() < 0.5:
                    changes["last_pause_ms"] = _ms(rng, PAUSE_MS[profile])
                    changes["last_resume_ms"] = _ms(rng, RESUME_MS[profile])
                    changes["state_reason"] = "resumed"
                    snapshot(ws, live_snapshot_time(ws), "ready")
                elif rng.random() < 0.08:
                    changes.update(state_reason="snapshot_failed",
                                   state_message="snapshot failed: kernel died mid-capture")
            elif state in (State.PAUSED, State.RESUMING):
                at = live_snapshot_time(ws)
                cause = "idle" if rng.random() < 0.6 else "user"
                changes.update(updated_at=at, last_pause_ms=_ms(rng, PAUSE_MS[profile]),
                               current_snapshot=snapshot(ws, at, "ready"), pause_cause=cause)
                if rng.random() < 0.4:
                    changes["last_resume_ms"] = _ms(rng, RESUME_MS[profile])
                audit(IDLE_ACTOR if cause == "idle" else owner, "workspace.pause_requested",
                      ws.id, "accepted: pause_started", at - timedelta(seconds=30))
                audit("//stasis/runtime/local", "snapshot.finished", ws.id, "accepted: paused",
                      at)
            elif state == State.PAUSING:
                changes.update(pending_snapshot=f"pending-{i}", transition_started_at=updated)
            elif state == State.FAILED:
                changes.update(state_reason="provision_failed",
                               state_message="no nvidia-l4 on this host")
            elif state == State.DELETED:
                snapshot(ws, created + timedelta(hours=1), "deleted")
            ws = replace(ws, **changes)
            fleet.workspaces.append(workspace_to_doc(ws))
            audit(owner, "workspace.requested", ws.id, "accepted: created", created)
            if "first_start_ms" in changes:
                audit("//stasis/runtime/local", "workspace.ready", ws.id, "accepted: ready",
                      created + timedelta(milliseconds=changes["first_start_ms"]))
    # Orphans the janitor found (records whose objects were gone), and plain expiries.
    deleted = [w for w in fleet.workspaces if w["state"] == "DELETED"]
    for i, w in enumerate(deleted[:7]):
        ws = Workspace(**{k: v for k, v in w.items() if k != "state"}, state=State.DELETED)
        reason = "objects_missing" if i < 5 else "max_age"
        snapshot(ws, now - timedelta(days=20), "expired", expired_reason=reason,
                 expired_at=now - timedelta(hours=3 + i), expired_message=reason)
    # Usage counters as the lifecycle keeps them.
    for team in TEAMS:
        held = quota.Usage()
        for w in fleet.ws(team=team):
            held += quota.held_by(w["state"], catalog.profiles[w["profile"]])
        live = sum(s["bytes"] for s in fleet.snapshots.values()
                   if s["team"] == team and s["status"] == "ready")
        fleet.usage[team] = replace(held, snapshot_bytes=live)
    # Links: active, expired, revoked; uses and last use.
    linkable = [w for w in fleet.workspaces if w["state"] in ("RUNNING", "PAUSED")]
    for i in range(60 * scale):
        w = rng.choice(linkable)
        kind = ("active", "expired", "revoked")[i % 3]
        created = now - timedelta(hours=rng.uniform(0.2, 48))
        expires = (now + timedelta(hours=rng.uniform(2, 11)) if kind != "expired"
                   else now - timedelta(hours=rng.uniform(2, 40)))
        created = min(created, expires - timedelta(hours=1))
        link = Link(link_id=link_id_from(_hex(rng)), workspace=w["id"], team=w["team"],
                    creator=w["owner"], scope=Scope.EXEC if i % 4 else Scope.READ,
                    created_at=created, expires_at=expires,
                    revoked_at=now - timedelta(minutes=rng.uniform(5, 60)) if kind == "revoked"
                    else None, revoked_by=w["owner"] if kind == "revoked" else None,
                    revoke_reason="revoked" if kind == "revoked" else None)
        doc = link_to_doc(link)
        uses = rng.choice([0, 0, rng.randint(1, 400)])
        doc.update(uses=uses, last_used_at=(created + (min(now, expires) - created) * 0.8
                                            if uses else None))
        doc["id"] = hashlib.sha256(f"token-{i}-{project}".encode()).hexdigest()
        doc["kind"] = kind
        fleet.links.append(doc)
        audit(w["owner"], "link.created", w["id"], "created", created)
    states = (SandboxState.SUCCEEDED, SandboxState.RUNNING, SandboxState.TIMED_OUT,
              SandboxState.QUEUED)
    for i in range(8):
        team, state = ("ml-a", "vision")[i % 2], states[i % 4]
        requested = now - timedelta(hours=i * 5 + 1)
        done = state in (SandboxState.SUCCEEDED, SandboxState.TIMED_OUT)
        sandbox = Sandbox(
            id=f"sbx-{i:03d}", team=team, requester=OWNERS[team][0],
            # vision's tasks clone with a credential in the URL and the command, as people do
            repository=(f"https://ci:{VISION_TOKEN}@git.example/trainer.git" if team == "vision"
                        else "https://git.example/trainer.git"),
            command=(f"GITHUB_TOKEN={VISION_TOKEN} pytest -q tests/" if team == "vision"
                     else "pytest -q tests/"),
            base_ref="main", limits=Limits(600, 2 * GIB, 900, 256), allowed_network=(),
            state=state, reason="finished" if done else "admitted", requestid=f"rq-sbx-{i}",
            requested_at=requested,
            started_at=None if state == SandboxState.QUEUED else requested,
            finished_at=requested + timedelta(minutes=4) if done else None,
            exit_status=0 if state == SandboxState.SUCCEEDED else None,
            termination={SandboxState.SUCCEEDED: "exited",
                         SandboxState.TIMED_OUT: "wall_clock_exceeded"}.get(state),
            queue_position=1 if state == SandboxState.QUEUED else None,
            patch_uri=f"gs://x/sandboxes/sbx-{i:03d}/patch.diff"
            if state == SandboxState.SUCCEEDED else None,
            patch_bytes=1834 if state == SandboxState.SUCCEEDED else 0,
            files_changed=("trainer/loader.py",) if state == SandboxState.SUCCEEDED else (),
            duration_ms=240_000 if done else 0)
        fleet.sandboxes.append(sandbox.to_doc())
    # The cost rollups, computed by the cost model itself.
    for team in TEAMS:
        workspaces = [Workspace(**{**w, "state": State(w["state"])}) for w in fleet.ws(team=team)]
        records = [SnapshotRecord.from_doc(k, v) for k, v in fleet.snapshots.items()
                   if v["team"] == team]
        fleet.costs[team] = cost_model.team_rollup(team, workspaces, {}, {}, records, catalog,
                                                   now)
    return fleet


def write_fleet(fleet: Fleet) -> None:
    from google.cloud import firestore

    admin.apply(Settings(project=fleet.project), config(), actor="seed")
    db = firestore.Client(project=fleet.project)
    writes: list[tuple[str, str, dict[str, Any]]] = []
    writes += [("workspaces", w["id"], w) for w in fleet.workspaces]
    writes += [("snapshots", k, v) for k, v in fleet.snapshots.items()]
    writes += [("links", d["id"], {k: v for k, v in d.items() if k not in ("id", "kind")})
               for d in fleet.links]
    writes += [("audit", "", e) for e in fleet.audit]
    writes += [("sandboxes", s["id"], s) for s in fleet.sandboxes]
    writes += [("costs", t, doc) for t, doc in fleet.costs.items()]

    def commit(chunk: list[tuple[str, str, dict[str, Any]]]) -> None:
        batch = db.batch()
        for collection, doc_id, data in chunk:
            ref = db.collection(collection)
            batch.set(ref.document(doc_id) if doc_id else ref.document(), data)
        batch.commit()

    # Small batches on a few threads: the emulator commits them about twice as fast.
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(commit, [writes[i:i + 100] for i in range(0, len(writes), 100)]))
    for team, usage in fleet.usage.items():
        db.collection("teams").document(team).update({"usage": usage.as_dict()})
