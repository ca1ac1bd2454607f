"""`stasis admin apply`: validate an admin file as a whole, then write it to Firestore.

Two checks, every problem reported with its path: the JSON Schema (schemas/config.schema.json)
and the cross-reference rules of functions/domain/catalog.py. Nothing is written unless both
pass. Then, in one batch: ``catalog/current`` (the whole applied config, which the functions
read), one document per team (entry merged, so the usage counters the functions keep are
never overwritten), and an audit entry naming the revision and what changed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
import yaml
from google.cloud import firestore

from events.schemas import errors as schema_errors
from functions.domain.catalog import Problem, config_documents, validate_config
from functions.domain.sandboxes import policy_problems
from stack.settings import Settings


class ConfigRejected(ValueError):
    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"{p.path or '/'}: {p.message}" for p in problems))


def load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigRejected([Problem("", f"{path} is not valid YAML: {exc}")]) from None


def check(config: Any) -> list[Problem]:
    """Every problem of ``config``: the schema's, then the catalog rules'."""
    problems = [
        Problem(path, message) for path, message in schema_errors("config.schema.json", config)
    ]
    if not isinstance(config, dict):
        return problems
    # Both layers, so that one run shows every problem (neither raises).
    found = problems + [p for p in validate_config(config) if p not in problems]
    return found + [p for p in policy_problems(config.get("sandboxes")) if p not in found]


def _db(settings: Settings) -> firestore.Client:
    return firestore.Client(project=settings.project)


def current_revision(settings: Settings) -> str | None:
    return current(settings).get("revision")


def current(settings: Settings) -> dict[str, Any]:
    """The catalog document last applied ({} before any)."""
    snap = _db(settings).collection("catalog").document("current").get()
    return (snap.to_dict() or {}) if snap.exists else {}


def apply_file(settings: Settings, path: Path, *, actor: str) -> dict[str, Any]:
    return apply(settings, load(path), actor=actor, source=str(path))


def apply(settings: Settings, config: Any, *, actor: str, source: str = "") -> dict[str, Any]:
    problems = check(config)
    if problems:
        raise ConfigRejected(problems)
    now = datetime.now(UTC)
    docs = config_documents(config, applied_at=now, applied_by=actor)
    db = _db(settings)
    previous = db.collection("catalog").document("current").get()
    before = (previous.to_dict() or {}) if previous.exists else {}
    batch = db.batch()
    batch.set(
        db.collection("catalog").document("current"),
        {**config, "revision": docs.revision, "applied_at": now, "applied_by": actor},
    )
    for team_id, team in docs.teams.items():
        ref = db.collection("teams").document(team_id)
        batch.set(ref, team, merge=True)
    summary = _changes(before, config)
    batch.set(
        db.collection("audit").document(),
        {
            "actor": actor,
            "action": "admin.apply",
            "target": "catalog",
            "outcome": "applied",
            "message": f"revision {docs.revision[:12]} from {source}: {summary}",
            "time": now,
            "revision": docs.revision,
        },
    )
    batch.commit()
    _ensure_usage(db, list(docs.teams))
    push_warm_pools(settings, config.get("environments") or [])
    return {"revision": docs.revision, "changes": summary}


def push_warm_pools(
    settings: Settings, environments: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """Tell the local node agent, when one runs, how many warm servers and kernels each
    environment wants (``environments[].warm_pool``, ``warm_kernels``); None when no agent
    answers (the next `stasis up` tells a restarted one)."""
    body = {"environments": [{k: e[k] for k in ("id", "python", "warm_pool", "warm_kernels")
                              if k in e}
                             for e in environments]}
    try:
        response = requests.put(f"{settings.node_agent_url}/pools", json=body,
                                headers=settings.node_agent_headers(), timeout=10)
    except requests.RequestException:
        return None
    return dict(response.json()) if response.ok else None


def _ensure_usage(db: firestore.Client, team_ids: list[str]) -> None:
    """A new team starts with zero usage; an existing one keeps its counters."""
    for team_id in team_ids:
        ref = db.collection("teams").document(team_id)

        @firestore.transactional
        def init(transaction: Any, ref: Any = ref) -> None:
            snap = ref.get(transaction=transaction)
            if "usage" not in (snap.to_dict() or {}):
                transaction.update(
                    ref, {"usage": {"workspaces": 0, "gpus": 0, "tpus": 0, "snapshot_bytes": 0}}
                )

        init(db.transaction())


def _changes(before: dict[str, Any], after: dict[str, Any]) -> str:
    parts = []
    for kind in ("ides", "environments", "profiles", "teams"):
        old = {e["id"]: e for e in before.get(kind, [])}
        new = {e["id"]: e for e in after.get(kind, [])}
        added = sorted(set(new) - set(old))
        removed = sorted(set(old) - set(new))
        changed = sorted(k for k in set(new) & set(old) if new[k] != old[k])
        for label, ids in (("added", added), ("removed", removed), ("changed", changed)):
            if ids:
                parts.append(f"{kind} {label}: {', '.join(ids)}")
    return "; ".join(parts) or "no change"
