"""The dashboard's read port: bounded page queries and aggregation queries, as plain data.

Pages describe what they want to read (:class:`PageQuery`, :class:`Aggregation`) and an
adapter runs it (``functions/adapters/dashboard_reader.py`` on Firestore; a fake in the
unit tests). The port itself enforces the dashboard's promise: no query without a limit,
no limit above :data:`MAX_PAGE`, counts and sums only as aggregations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

#: The most documents one query may return.
MAX_PAGE = 500

Op = Literal["==", "!=", "<", "<=", ">", ">=", "in", "not-in", "array-contains"]
Direction = Literal["asc", "desc"]


@dataclass(frozen=True)
class PageQuery:
    """One page of a collection: filters, order, a limit, and the cursor of the last page.

    ``after`` is the id of the last document of the previous page (the adapter starts after
    that document, which also breaks ties in the order). ``fields`` projects the documents
    to those fields (empty: whole documents).
    """

    collection: str
    where: tuple[tuple[str, Op, Any], ...] = ()
    order_by: tuple[tuple[str, Direction], ...] = ()
    limit: int = 50
    after: str | None = None
    fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_PAGE:
            raise ValueError(f"a dashboard query reads 1..{MAX_PAGE} documents, "
                             f"not {self.limit}")
        if self.after is not None and not self.order_by:
            raise ValueError("a cursor needs an order")


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
    where: tuple[tuple[str, Op, Any], ...] = ()
    sums: tuple[str, ...] = ()


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
