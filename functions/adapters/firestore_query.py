"""One Firestore query from plain data: ``(field, op, value)`` filters and ``(field,
"asc"|"desc")`` orders (the dashboard's port), or a declared query of
``functions/queries.py`` with its filters (the stores)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.cloud import firestore

from functions.queries import IndexedQuery


def query(db: firestore.Client, collection: str, where: Iterable[tuple[str, str, Any]],
          order: Iterable[tuple[str, str]] = ()) -> Any:
    q: Any = db.collection(collection)
    for name, op, value in where:
        q = q.where(filter=firestore.FieldFilter(name, op, value))
    for name, direction in order:
        q = q.order_by(name, direction=firestore.Query.DESCENDING if direction == "desc"
                       else firestore.Query.ASCENDING)
    return q


def declared(db: firestore.Client, query_: IndexedQuery,
             where: Iterable[tuple[str, str, Any]]) -> Any:
    """The declared query with these filters, in its collection and order (ValueError if the
    filters are not the declared ones)."""
    where = list(where)
    query_.check((name, op) for name, op, _ in where)
    return query(db, query_.collection, where, query_.order)
