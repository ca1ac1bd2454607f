"""The Firestore queries that need a composite index, declared as data beside the code that
runs them.

Firestore answers a query from its automatic single-field indexes when the query filters by
equality only, or filters and orders on one field. Anything else (an equality filter on one
field with an order or a range on another, or two order fields) needs a composite index; a
deployment without it refuses the query (FAILED_PRECONDITION, at its first run), and the
emulator needs none, so no test would notice.

So a module that runs such a query declares it as an :class:`IndexedQuery` in its
``QUERIES`` and builds the query from that declaration (its collection and order; the
filters are checked against it), and ``deploy/indexes.py`` turns every module's ``QUERIES``
into Terraform's composite indexes. :func:`needs_index` says whether a query needs a
declaration at all: the dashboard's query port refuses one that needs it and has none, and
so does the integration tests' watch on the Firestore client (``tests/index_guard.py``).

Which indexes a declaration needs, by Firestore's rules: the *tail* is the order fields,
then the range fields not ordered on; every equality field ``e`` needs ``(e, *tail)``, and
Firestore merges such indexes for any combination of equality filters sharing the tail,
which keeps optional filters (the dashboard's team / state / owner selectors) to one index
per field instead of one per combination. With no equality field always present, a tail of
two or more fields needs ``(*tail)`` as well.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

#: Equality operators, for the index rules (array membership too: its index is CONTAINS).
EQUALITY = frozenset({"==", "in", "array-contains", "array-contains-any"})
RANGE = frozenset({"<", "<=", ">", ">=", "!=", "not-in"})
Direction = Literal["asc", "desc"]
#: One index: its fields in order, each ascending or descending.
IndexFields = tuple[tuple[str, Direction], ...]


def op_name(op: str) -> str:
    """``array_contains`` (the SDK's spelling) -> ``array-contains``."""
    return op.replace("_", "-")


def _tail(filters: Iterable[tuple[str, str]],
          order: Iterable[tuple[str, Direction]]) -> list[tuple[str, Direction]]:
    tail: dict[str, Direction] = {}
    for name, direction in order:
        tail.setdefault(name, direction)
    for name, op in filters:
        if op_name(op) in RANGE:
            tail.setdefault(name, "asc")
    return list(tail.items())


def needs_index(filters: Iterable[tuple[str, str]],
                order: Iterable[tuple[str, Direction]] = ()) -> bool:
    """Whether a query with these ``(field, op)`` filters and this order needs a composite
    index (and so a declaration)."""
    filters = list(filters)
    tail = _tail(filters, order)
    tail_fields = {name for name, _ in tail}
    equal = {name for name, op in filters
             if op_name(op) in EQUALITY and name not in tail_fields}
    return bool(tail) and (bool(equal) or len(tail) > 1)


@dataclass(frozen=True)
class IndexedQuery:
    """A query that needs a composite index: exactly these filters and this order.

    ``equal`` are equality filters it always has, ``optional`` equality filters it may have
    (each alone or with others), ``ranges`` range filters it always has (``<``, ``!=``,
    ``not-in``...), ``order`` its order. Array membership filters are not declarable (none
    needs an index yet).
    """

    collection: str
    equal: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    ranges: tuple[str, ...] = ()
    order: tuple[tuple[str, Direction], ...] = ()

    def __post_init__(self) -> None:
        if not self.indexes():
            raise ValueError(f"{self} needs no composite index: do not declare it")

    def problem(self, collection: str, filters: Iterable[tuple[str, str]],
                order: Iterable[tuple[str, Direction]]) -> str | None:
        """Why a query with these filters and order is not this one (None: it is)."""
        if collection != self.collection:
            return f"it reads {collection}, the declaration {self.collection}"
        seen: set[str] = set()
        for name, raw_op in filters:
            op = op_name(raw_op)
            declared = (self.ranges if op in RANGE
                        else (*self.equal, *self.optional) if op in ("==", "in") else ())
            if name not in declared:
                return f"its filter {name} {op} is not declared"
            seen.add(name)
        missing = sorted({*self.equal, *self.ranges} - seen)
        if missing:
            return f"it lacks the declared filters on {', '.join(missing)}"
        if tuple(order) != self.order:
            return f"it orders by {tuple(order)}, the declaration by {self.order}"
        return None

    def check(self, filters: Iterable[tuple[str, str]]) -> None:
        """Raise ValueError unless a query with these filters (and the declared order) is
        this one."""
        why = self.problem(self.collection, filters, self.order)
        if why:
            raise ValueError(f"not the declared query {self}: {why}")

    def indexes(self) -> list[IndexFields]:
        """The composite indexes Firestore needs for every query this declaration admits."""
        filters = [(name, "==") for name in (*self.equal, *self.optional)]
        tail = _tail([*filters, *((name, "<") for name in self.ranges)], self.order)
        tail_fields = {name for name, _ in tail}
        equal = [n for n in dict.fromkeys((*self.equal, *self.optional)) if n not in tail_fields]
        if not tail or (not equal and len(tail) == 1):
            return []
        found: list[IndexFields] = []
        if not [n for n in self.equal if n not in tail_fields] and len(tail) > 1:
            found.append(tuple(tail))
        found += [((name, "asc"), *tail) for name in equal]
        return found


def admitted(declared: Iterable[IndexedQuery], collection: str,
             filters: Iterable[tuple[str, str]],
             order: Iterable[tuple[str, Direction]]) -> bool:
    """Whether a query needs no composite index, or is one of the ``declared`` ones."""
    filters, order = list(filters), list(order)
    if not needs_index(filters, order):
        return True
    return any(q.problem(collection, filters, order) is None for q in declared)
