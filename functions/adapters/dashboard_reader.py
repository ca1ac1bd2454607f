"""The dashboard's reads on Firestore: bounded pages and aggregation queries.

Implements ``functions.dashboard.reads.Reader``. A page reads ``limit + 1`` documents (the
extra one only says whether there is a next page) and starts after the cursor's document
snapshot, which carries the order's values and breaks ties by document name. Counts and
sums are aggregation queries (``count()``, ``sum()``: Firestore bills one read per 1,000
index entries matched and returns no documents), run concurrently on a small shared pool
because a page asks for a few dozen of them.

The queries that need a composite index are declared by the pages
(``functions/dashboard/pages.py`` ``QUERIES``), and Terraform's indexes are derived from them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from google.cloud import firestore

from functions.adapters.firestore_query import query as firestore_query
from functions.dashboard.reads import (
    MAX_PAGE,
    Aggregation,
    CursorGone,
    Page,
    PageQuery,
    ReadStats,
)

_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="dashboard-agg")


class FirestoreReader:
    """The reads of one request; ``stats`` counts documents, queries and aggregations."""

    def __init__(self, db: firestore.Client) -> None:
        self.db = db
        self.stats = ReadStats()

    def document(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        snap = self.db.collection(collection).document(doc_id).get()
        self.stats.add_query(collection, 1)
        return {**(snap.to_dict() or {}), "id": snap.id} if snap.exists else None

    def documents(self, collection: str, doc_ids: Sequence[str]
                  ) -> dict[str, dict[str, Any] | None]:
        if len(doc_ids) > MAX_PAGE:
            raise ValueError(f"at most {MAX_PAGE} documents at once")
        found: dict[str, dict[str, Any] | None] = dict.fromkeys(doc_ids)
        if not doc_ids:
            return found
        refs = [self.db.collection(collection).document(i) for i in doc_ids]
        for snap in self.db.get_all(refs):
            if snap.exists:
                found[snap.id] = {**(snap.to_dict() or {}), "id": snap.id}
        self.stats.add_query(collection, len(doc_ids))
        return found

    def page(self, query: PageQuery) -> Page:
        q = firestore_query(self.db, query.collection, query.where, query.order_by)
        if query.fields:
            q = q.select(list(query.fields))
        if query.after is not None:
            cursor = self.db.collection(query.collection).document(query.after).get()
            self.stats.add_query(query.collection, 1)
            if not cursor.exists:
                raise CursorGone(query.after)
            q = q.start_after(cursor)
        snaps = list(q.limit(query.limit + 1).stream())
        self.stats.add_query(query.collection, len(snaps))
        more = len(snaps) > query.limit
        snaps = snaps[:query.limit]
        docs = [{**(s.to_dict() or {}), "id": s.id} for s in snaps]
        return Page(docs, snaps[-1].id if more and snaps else None)

    def aggregate(self, queries: Sequence[Aggregation]) -> list[Mapping[str, float]]:
        self.stats.aggregations += len(queries)
        return list(_POOL.map(self._aggregate_one, queries))

    def _aggregate_one(self, query: Aggregation) -> Mapping[str, float]:
        agg = firestore_query(self.db, query.collection, query.where).count(alias="count")
        for name in query.sums:
            agg = agg.sum(name, alias=f"sum_{name}")
        result: dict[str, float] = {"count": 0}
        for row in agg.get():
            for item in row:
                key = ("count" if item.alias == "count"
                       else "sum:" + str(item.alias).removeprefix("sum_"))
                result[key] = item.value or 0
        return result
