"""Firestore and Cloud Storage for the portal (``functions.portal.ports.PortalStore``).

Every read is a document get, a batched get or an equality query (served by Firestore's
single-field indexes), except a team's page of workspaces and a page's audit entries this
month (read again only for a workspace whose version moved): both declared in
:data:`QUERIES` (composite indexes).
The only writes are the one-time sign-in records (``portal_signins/{sha256}``), one when a
link is issued and one transaction when it is used: everything else the portal changes goes
through an event or the links function's issuer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from google.cloud import firestore

from events import Event
from functions.adapters.chat_store import ChatStore
from functions.adapters.firestore_query import declared
from functions.adapters.firestore_store import workspace_from_doc
from functions.adapters.fleet_store import FleetStore
from functions.adapters.sandbox_results import FirestoreSandboxResults
from functions.domain.lifecycle import State, Workspace
from functions.portal.signin import COLLECTION as SIGNINS
from functions.portal.signin import Verdict
from functions.ports import ledger_key
from functions.queries import IndexedQuery
from functions.routes import consumer_of

#: The queries of this store that need a composite index (``deploy/indexes.py``).
TEAM_PAGE = IndexedQuery("workspaces", equal=("team",), order=(("created_at", "desc"),))
WORKSPACES_AUDIT = IndexedQuery("audit", equal=("target",), ranges=("time",))
QUERIES = (TEAM_PAGE, WORKSPACES_AUDIT)

#: Firestore's limit on the values of one ``in`` filter.
_IN_LIMIT = 30
#: Workspace histories kept per instance (a few entries each).
_HISTORY_SIZE = 20_000


class FirestorePortalStore(ChatStore):
    def __init__(self, client: firestore.Client, storage: Callable[[], Any]) -> None:
        super().__init__(client)
        self._fleet = FleetStore(client)
        self._objects = FirestoreSandboxResults(client, storage)
        self._lock = threading.Lock()
        self._history: OrderedDict[tuple[str, int, datetime], list[dict[str, Any]]] = \
            OrderedDict()

    def owned(self, team: str, owner: str) -> list[Workspace]:
        query = (self.db.collection("workspaces")
                 .where(filter=firestore.FieldFilter("team", "==", team))
                 .where(filter=firestore.FieldFilter("owner", "==", owner)))
        return [workspace_from_doc(d.to_dict()) for d in query.limit(500).stream()]

    def team_page(self, team: str, limit: int,
                  cursor: str | None) -> tuple[list[Workspace], str | None]:
        query = declared(self.db, TEAM_PAGE, (("team", "==", team),))
        if cursor:
            after = self.db.collection("workspaces").document(cursor).get()
            if after.exists:
                query = query.start_after(after)
        docs = list(query.limit(limit + 1).stream())
        more = len(docs) > limit
        return ([workspace_from_doc(d.to_dict()) for d in docs[:limit]],
                docs[limit - 1].id if more else None)

    def workspaces_in(self, states: Sequence[str]) -> list[Workspace]:
        return self._fleet.workspaces_in([State(s) for s in states])

    def teams(self) -> dict[str, dict[str, Any]]:
        return self._fleet.teams()

    def get_many(self, collection: str, doc_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        refs = [self.db.collection(collection).document(i) for i in dict.fromkeys(doc_ids)]
        return {s.id: s.to_dict() or {} for s in self.db.get_all(refs) if s.exists} if refs \
            else {}

    def snapshots_of(self, workspace_ids: Sequence[str]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for chunk in _chunks(workspace_ids):
            query = self.db.collection("snapshots").where(
                filter=firestore.FieldFilter("workspace", "in", chunk))
            rows += [{"id": d.id, **(d.to_dict() or {})} for d in query.stream()]
        return rows

    def audit_of(self, workspaces: Sequence[Workspace],
                 since: datetime) -> list[dict[str, Any]]:
        """Their audit entries since ``since``. A workspace's history changes only with its
        version (the lifecycle writes each entry in the transaction that bumps it), so the
        entries are kept per (workspace, version, since) and only a workspace that moved is
        read again."""
        def key(ws: Workspace) -> tuple[str, int, datetime]:
            return ws.id, ws.version, since

        with self._lock:
            missing = [w for w in workspaces if key(w) not in self._history]
        found: dict[str, list[dict[str, Any]]] = {w.id: [] for w in missing}
        for chunk in _chunks([w.id for w in missing]):
            query = declared(self.db, WORKSPACES_AUDIT, (("target", "in", chunk),
                                                         ("time", ">=", since)))
            for doc in query.select(["target", "action", "outcome", "time", "actor"]).stream():
                entry = doc.to_dict() or {}
                found.setdefault(str(entry.get("target")), []).append(entry)
        with self._lock:
            for ws in missing:
                self._history[key(ws)] = found.get(ws.id, [])
            while len(self._history) > _HISTORY_SIZE:
                self._history.popitem(last=False)
            return [e for w in workspaces for e in self._history.get(key(w), [])]

    def audit_before(self, workspace_id: str, before: datetime,
                     limit: int = 20) -> list[dict[str, Any]]:
        return self._fleet.audit_before(workspace_id, before, limit)

    def sandboxes(self, team: str, requester: str | None) -> list[dict[str, Any]]:
        if requester is None:
            return self.list_sandboxes(team)
        return [dict(d) for d in self._objects.list_sandboxes(team, requester, limit=200)]

    def read_object(self, uri: str, *, limit: int, tail: bool = False) -> tuple[bytes, bool]:
        return self._objects.read_object(uri, limit=limit, tail=tail)

    def handled(self, event: Event[Any]) -> bool:
        return bool(self.db.collection("processed").document(
            self.verdict_key(event)).get().exists)

    def verdict_key(self, event: Event[Any]) -> str:
        return ledger_key(consumer_of(event.name), event)

    def create_signin(self, token_hash: str, doc: Mapping[str, Any]) -> None:
        self.db.collection(SIGNINS).document(token_hash).create(dict(doc))

    def consume_signin(self, token_hash: str,
                       decide: Callable[[dict[str, Any] | None], Verdict]) -> Verdict:
        ref = self.db.collection(SIGNINS).document(token_hash)

        @firestore.transactional
        def run(transaction: Any) -> Verdict:
            snap = ref.get(transaction=transaction)
            verdict = decide(snap.to_dict() if snap.exists else None)
            if verdict.ok:
                transaction.update(ref, {"used_at": firestore.SERVER_TIMESTAMP})
            return verdict

        result: Verdict = run(self.db.transaction())
        return result


def _chunks(ids: Sequence[str]) -> list[list[str]]:
    unique = list(dict.fromkeys(ids))
    return [unique[i:i + _IN_LIMIT] for i in range(0, len(unique), _IN_LIMIT)]
