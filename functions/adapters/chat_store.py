"""Firestore for the chat front door: the reads a slash command needs, the request records
(``chat_requests/{requestid}``) and the sent-notification marks (``chat_notified/{key}``).

Both collections carry an ``expire_at`` field for a Firestore TTL policy (7 days): a record
is only useful while its request is in flight and Slack's response_url lives 30 minutes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from functions.adapters.firestore_store import FirestoreStore
from functions.chatops.replies import RESPONSE_URL_TTL, RESPONSE_URL_USES

REQUESTS = "chat_requests"
NOTIFIED = "chat_notified"
MARK_TTL = timedelta(days=7)


class ChatStore(FirestoreStore):
    """The workspace store plus what chat keeps of its own (ChatReads and ChatRecords)."""

    def snapshots(self, workspace_id: str) -> list[dict[str, Any]]:
        query = self.db.collection("snapshots").where(
            filter=firestore.FieldFilter("workspace", "==", workspace_id))
        rows = [{"id": d.id, **(d.to_dict() or {})} for d in query.limit(200).stream()]
        return sorted(rows, key=lambda r: str(r.get("created_at") or ""))

    def list_sandboxes(self, team: str, limit: int = 200) -> list[dict[str, Any]]:
        query = self.db.collection("sandboxes").where(
            filter=firestore.FieldFilter("team", "==", team))
        return [d.to_dict() or {} for d in query.limit(limit).stream()]

    def remember(self, requestid: str, record: Mapping[str, Any]) -> None:
        # create(), not set(): a retry of the same request must not reset the use count.
        with contextlib.suppress(gexc.AlreadyExists):
            self.db.collection(REQUESTS).document(requestid).create(dict(record))

    def recall(self, requestid: str) -> dict[str, Any] | None:
        return self.get(REQUESTS, requestid)

    def use_response_url(self, requestid: str, now: datetime) -> bool:
        ref = self.db.collection(REQUESTS).document(requestid)

        @firestore.transactional
        def claim(transaction: Any) -> bool:
            snap = ref.get(transaction=transaction)
            if not snap.exists:
                return False
            doc = snap.to_dict() or {}
            uses = int(doc.get("response_url_uses") or 0)
            issued = doc.get("issued_at")
            if (not doc.get("response_url") or uses >= RESPONSE_URL_USES
                    or not isinstance(issued, datetime) or now - issued >= RESPONSE_URL_TTL):
                return False
            transaction.update(ref, {"response_url_uses": uses + 1})
            return True

        return bool(claim(self.db.transaction()))

    def notified(self, key: str) -> bool:
        return self.db.collection(NOTIFIED).document(key).get().exists

    def claim_notification(self, key: str, detail: Mapping[str, Any], now: datetime) -> bool:
        try:
            self.db.collection(NOTIFIED).document(key).create(
                {**detail, "claimed_at": now, "expire_at": now + MARK_TTL})
        except gexc.AlreadyExists:
            return False
        return True

    def release_notification(self, key: str) -> None:
        self.db.collection(NOTIFIED).document(key).delete()

    def mark_notified(self, key: str, detail: Mapping[str, Any], now: datetime) -> None:
        self.db.collection(NOTIFIED).document(key).set(
            {**detail, "sent_at": now, "expire_at": now + MARK_TTL})
