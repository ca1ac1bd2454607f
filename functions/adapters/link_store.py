"""Links in Firestore: ``links/{token_sha256}``, plus the reads the proxy's check needs.

The document id is the SHA-256 of the token: a lookup by token is one document read and the
token itself is never stored. Fields (``schemas/documents/link.json``): link_id, workspace,
team, creator, scope, created_at, expires_at, revoked_at, revoked_by, revoke_reason, uses,
last_used_at, and ``purge_at`` (a Firestore TTL field: a link's record goes 30 days after
it expired; the audit log keeps its history).

Creating a link writes the document and its audit entry in one batch (``create``: an
existing id fails instead of overwriting); revoking reads, decides (the domain) and writes
the revocation with its audit entry in one transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from events import Event
from functions.domain.links import Link, Refused, Scope, Target
from functions.ports import ledger_key
from functions.routes import consumer_of

COLLECTION = "links"
PURGE_AFTER = timedelta(days=30)


def link_to_doc(link: Link) -> dict[str, Any]:
    return {
        "link_id": link.link_id, "workspace": link.workspace, "team": link.team,
        "creator": link.creator, "scope": str(link.scope), "created_at": link.created_at,
        "expires_at": link.expires_at, "revoked_at": link.revoked_at,
        "revoked_by": link.revoked_by, "revoke_reason": link.revoke_reason,
        "incarnation": link.incarnation, "uses": 0, "last_used_at": None,
        "purge_at": link.expires_at + PURGE_AFTER,
    }


def link_from_doc(doc: Mapping[str, Any]) -> Link:
    return Link(link_id=doc["link_id"], workspace=doc["workspace"], team=doc["team"],
                creator=doc["creator"], scope=Scope(doc["scope"]),
                created_at=_aware(doc["created_at"]), expires_at=_aware(doc["expires_at"]),
                revoked_at=_aware(doc.get("revoked_at")), revoked_by=doc.get("revoked_by"),
                revoke_reason=doc.get("revoke_reason"), incarnation=doc.get("incarnation"))


class FirestoreLinkStore:
    def __init__(self, db: firestore.Client) -> None:
        self.db = db

    def _ref(self, token_hash: str) -> Any:
        return self.db.collection(COLLECTION).document(token_hash)

    def get_link(self, token_hash: str) -> Link | None:
        snap = self._ref(token_hash).get()
        return link_from_doc(snap.to_dict()) if snap.exists else None

    def find_link(self, link_id: str) -> tuple[str, Link] | None:
        query = self.db.collection(COLLECTION).where(
            filter=firestore.FieldFilter("link_id", "==", link_id)).limit(1)
        for snap in query.stream():
            return snap.id, link_from_doc(snap.to_dict())
        return None

    def list_links(self, *, workspace: str | None = None, team: str | None = None,
                   creator: str | None = None) -> list[tuple[Link, Mapping[str, Any]]]:
        # One equality filter in the query (no composite index needed), the rest here.
        filters = [("workspace", workspace), ("team", team), ("creator", creator)]
        query: Any = self.db.collection(COLLECTION)
        first = next(((f, v) for f, v in filters if v is not None), None)
        if first is not None:
            query = query.where(filter=firestore.FieldFilter(first[0], "==", first[1]))
        rows = []
        for snap in query.limit(1000).stream():
            doc = snap.to_dict()
            if all(v is None or doc.get(f) == v for f, v in filters):
                rows.append((link_from_doc(doc), {"uses": int(doc.get("uses") or 0),
                                                  "last_used_at": doc.get("last_used_at")}))
        return rows

    def count_active(self, workspace: str, now: datetime) -> int:
        return sum(1 for link, _ in self.list_links(workspace=workspace)
                   if link.status(now) == "active")

    def create_link(self, token_hash: str, link: Link, audit: Mapping[str, Any]) -> None:
        batch = self.db.batch()
        batch.create(self._ref(token_hash), link_to_doc(link))
        batch.set(self.db.collection("audit").document(), dict(audit))
        batch.commit()

    def revoke_link(self, token_hash: str, decide: Callable[[Link | None], Link | Refused],
                    audit: Callable[[Link], Mapping[str, Any]]) -> Link | Refused:
        ref = self._ref(token_hash)

        @firestore.transactional
        def run(transaction: Any) -> Link | Refused:
            snap = ref.get(transaction=transaction)
            result = decide(link_from_doc(snap.to_dict()) if snap.exists else None)
            if isinstance(result, Link):
                transaction.update(ref, {"revoked_at": result.revoked_at,
                                         "revoked_by": result.revoked_by,
                                         "revoke_reason": result.revoke_reason})
                transaction.set(self.db.collection("audit").document(), dict(audit(result)))
            return result

        result: Link | Refused = run(self.db.transaction(max_attempts=5))
        return result

    def team_members(self, team: str) -> list[Mapping[str, Any]] | None:
        snap = self.db.collection("teams").document(team).get()
        if not snap.exists:
            return None
        return list((snap.to_dict() or {}).get("members") or [])

    def target(self, workspace_id: str) -> Target | None:
        snap = self.db.collection("workspaces").document(workspace_id).get()
        if not snap.exists:
            return None
        return _target(workspace_id, snap.to_dict() or {})

    def read_many(self, token_hashes: Sequence[str], teams: Sequence[str],
                  workspaces: Sequence[str]) -> tuple[dict[str, Link | None],
                                                      dict[str, list[Mapping[str, Any]] | None],
                                                      dict[str, Target | None]]:
        refs = ([self._ref(h) for h in token_hashes]
                + [self.db.collection("teams").document(t) for t in teams]
                + [self.db.collection("workspaces").document(w) for w in workspaces])
        found = {snap.reference.path: snap for snap in self.db.get_all(refs)} if refs else {}

        def doc(ref: Any) -> dict[str, Any] | None:
            snap = found.get(ref.path)
            return (snap.to_dict() or {}) if snap is not None and snap.exists else None

        links = {h: (link_from_doc(d) if (d := doc(self._ref(h))) is not None else None)
                 for h in token_hashes}
        members = {t: (list(d.get("members") or []) if (d := doc(
            self.db.collection("teams").document(t))) is not None else None) for t in teams}
        targets = {w: (_target(w, d) if (d := doc(
            self.db.collection("workspaces").document(w))) is not None else None)
            for w in workspaces}
        return links, members, targets

    def record_uses(self, uses: Mapping[str, int], now: datetime) -> None:
        for token_hash, count in uses.items():
            with contextlib.suppress(gexc.NotFound):
                self._ref(token_hash).update({"uses": firestore.Increment(count),
                                              "last_used_at": now})

    def audit(self, entry: Mapping[str, Any]) -> None:
        self.db.collection("audit").document().set(dict(entry))

    def resume_outcome(self, event: Event[Any]) -> Mapping[str, Any] | None:
        snap = self.db.collection("processed").document(
            ledger_key(consumer_of(event.name), event)).get()
        if not snap.exists:
            return None
        outcome: Mapping[str, Any] | None = (snap.to_dict() or {}).get("outcome")
        return outcome


def _target(workspace_id: str, doc: Mapping[str, Any]) -> Target:
    return Target(id=workspace_id, team=str(doc.get("team", "")),
                  owner=str(doc.get("owner", "")), state=str(doc.get("state", "")),
                  version=int(doc.get("version") or 0), incarnation=doc.get("incarnation"))


def _aware(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
