"""Every Firestore query the tests run must have its composite index declared.

The emulator answers any query without an index; a deployment refuses one that needs a
composite index it lacks, and Terraform creates only the indexes of the declared queries
(``functions/queries.py``, gathered by ``deploy/indexes.py``). So once the emulators are up
(``tests/conftest.py`` installs this), every query the Firestore client of this process
sends is read back from the client's own query object (collection, filters, explicit order)
and checked: one that needs a composite index and is none of the declared queries fails the
test that ran it, with what it was. Watching, not mocking: the query runs as it would.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from functions.queries import Direction, IndexedQuery, admitted

#: The client's operators, as functions/queries.py spells them.
_OPS = {"EQUAL": "==", "IN": "in", "ARRAY_CONTAINS": "array-contains",
        "ARRAY_CONTAINS_ANY": "array-contains-any", "IS_NULL": "==", "IS_NAN": "==",
        "LESS_THAN": "<", "LESS_THAN_OR_EQUAL": "<=", "GREATER_THAN": ">",
        "GREATER_THAN_OR_EQUAL": ">=", "NOT_EQUAL": "!=", "NOT_IN": "not-in",
        "IS_NOT_NULL": "!=", "IS_NOT_NAN": "!="}

_lock = threading.Lock()
_undeclared: list[str] = []
_installed = False


@functools.cache
def _declared() -> tuple[IndexedQuery, ...]:
    from deploy.indexes import declared

    return tuple(q for queries in declared().values() for q in queries)


def shape(query: Any) -> tuple[str, list[tuple[str, str]], list[tuple[str, Direction]]]:
    """(collection, ``(field, op)`` filters, explicit order) of a client query."""
    filters: list[tuple[str, str]] = []
    pending = list(query._field_filters)
    while pending:
        pb = pending.pop(0)
        if hasattr(pb, "filters"):  # a composite filter (and / or): each of its parts
            pending += [getattr(f, f.__class__.pb(f).WhichOneof("filter_type"))
                        for f in pb.filters]
            continue
        filters.append((pb.field.field_path, _OPS[pb.op.name]))
    order: list[tuple[str, Direction]] = [
        (o.field.field_path, "desc" if o.direction.name == "DESCENDING" else "asc")
        for o in query._orders]
    return query._parent.id, filters, order


def check(query: Any) -> str | None:
    """What is wrong with a client query (None: nothing)."""
    collection, filters, order = shape(query)
    if admitted(_declared(), collection, filters, order):
        return None
    return (f"{collection} filtered on {filters} ordered by {order} needs a composite index "
            "that no module declares (add an IndexedQuery to its QUERIES: functions/queries.py)")


def install() -> None:
    """Watch every query of ``google.cloud.firestore_v1`` in this process (idempotent)."""
    global _installed
    from google.cloud.firestore_v1 import base_query

    with _lock:
        if _installed:
            return
        original = base_query.BaseQuery._to_protobuf

        @functools.wraps(original)
        def _to_protobuf(self: Any) -> Any:
            problem = check(self)
            if problem:
                with _lock:
                    _undeclared.append(problem)
            return original(self)

        base_query.BaseQuery._to_protobuf = _to_protobuf  # type: ignore[method-assign]
        _installed = True


def take() -> list[str]:
    """The undeclared queries seen since the last call, once each."""
    with _lock:
        found = list(dict.fromkeys(_undeclared))
        _undeclared.clear()
    return found
