"""The dashboard's read port: bounded page queries and aggregation queries, as plain data.

Pages describe what they want to read (:class:`PageQuery`, :class:`Aggregation`) and an
adapter runs it (``functions/adapters/dashboard_reader.py`` on Firestore; a fake in the
unit tests). The port itself enforces the dashboard's promise: no query without a limit,
no limit above :data:`MAX_PAGE`, counts and sums only as aggregations, and no query that
needs a composite index unless it is one of the declared ones (``functions/queries.py``:
made with :meth:`PageQuery.of` / :meth:`Aggregation.of`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from functions.queries import Direction, IndexedQuery, needs_index

#: The most documents one query may return.
MAX_PAGE = 500

Op = Literal["==", "!=", "<", "<=", ">", ">=", "in", "not-in", "array-contains"]
Where = tuple[tuple[str, Op, Any], ...]


def _check_index(collection: str, where: Where, order: tuple[tuple[str, Direction], ...],
                 index: IndexedQuery | None) -> None:
    filters = [(name, op) for name, op, _ in where]
    if index is not None:
        why = index.problem(collection, filters, order)
        if why:
            raise ValueError(f"not the declared query {index}: {why}")
    elif needs_index(filters, order):
        raise ValueError(f"a {collection} query filtered on {filters} and ordered by {order} "
                         "needs a composite index: declare it (functions/queries.py)")


@dataclass(frozen=True)
class PageQuery:
    """One page of a collection: filters, order, a limit, and the cursor of the last page.

    ``after`` is the id of the last document of the previous page (the adapter starts after
    that document, which also breaks ties in the order). ``fields`` projects the documents
    to those fields (empty: whole documents). ``index``: the declared query this is.
    """

    collection: str
    where: Where = ()
    order_by: tuple[tuple[str, Direction], ...] = ()
    limit: int = 50
    after: str | None = None
    fields: tuple[str, ...] = ()
    index: IndexedQuery | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_PAGE:
            raise ValueError(f"a dashboard query reads 1..{MAX_PAGE} documents, "
                             f"not {self.limit}")
        if self.after is not None and not self.order_by:
            raise ValueError("a cursor needs an order")
        _check_index(self.collection, self.where, self.order_by, self.index)

    @classmethod
    def of(cls, index: IndexedQuery, where: Where, limit: int = 50, after: str | None = None,
           fields: tuple[str, ...] = ()) -> PageQuery:
        """A page of the declared query ``index`` (its collection and order)."""
        return cls(index.collection, where, index.order, limit, after, fields, index)


class CursorGone(LookupError):
    """The document a cursor names no longer exists: the page must start over."""


@dataclass(frozen=True)
class Page:
    """Documents (each with its ``id``) and the cursor of the next page (None: last page)."""

    docs: list[dict[str, Any]]
    cursor: str | None = None


@dataclass(frozen=True)
class Aggregation:
    """``count`` (always) and the ``sum`` of ``sums`` over the documents matching ``where``.

    The result maps ``"count"`` and ``"sum:<field>"`` to numbers.
    """

    collection: str
    where: Where = ()
    sums: tuple[str, ...] = ()
    index: IndexedQuery | None = None

    def __post_init__(self) -> None:
        _check_index(self.collection, self.where, (), self.index)

    @classmethod
    def of(cls, index: IndexedQuery, where: Where, sums: tuple[str, ...] = ()) -> Aggregation:
        """An aggregation over the declared query ``index`` (which has no order)."""
        return cls(index.collection, where, sums, index)


@dataclass
class ReadStats:
    """What one page load read: documents, queries and aggregations (shown in the footer)."""

    documents: int = 0
    queries: int = 0
    aggregations: int = 0
    by_collection: dict[str, int] = field(default_factory=dict)

    def add_query(self, collection: str, documents: int) -> None:
        self.queries += 1
        self.documents += documents
        self.by_collection[collection] = self.by_collection.get(collection, 0) + documents


class Reader(Protocol):
    """Reads for one request; ``stats`` counts what was read."""

    stats: ReadStats

    def document(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        """One document by id (with its ``id``), or None."""

    def documents(self, collection: str, doc_ids: Sequence[str]
                  ) -> dict[str, dict[str, Any] | None]:
        """Several documents by id in one round trip (at most :data:`MAX_PAGE`)."""

    def page(self, query: PageQuery) -> Page:
        """One page of ``query``: at most ``query.limit`` documents."""

    def aggregate(self, queries: Sequence[Aggregation]) -> list[Mapping[str, float]]:
        """Every aggregation's result, in order (the adapter may run them concurrently)."""
