"""Composite indexes from declared queries (functions/queries.py, deploy/indexes.py), the
dashboard's port refusing undeclared ones, and the tests' watch on the Firestore client
(tests/index_guard.py), each as a table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import index_guard
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import firestore

from deploy.indexes import composite_indexes, declared
from functions.adapters import portal_store
from functions.adapters.firestore_query import declared as declared_query
from functions.adapters.fleet_store import AUDIT_BEFORE, AUDIT_SINCE
from functions.dashboard import pages
from functions.dashboard.reads import Aggregation, PageQuery
from functions.queries import IndexedQuery, admitted, needs_index

F = firestore.FieldFilter


def _spelled(query: IndexedQuery) -> list[list[str]]:
    return [[n + ("" if d == "asc" else ":desc") for n, d in fields]
            for fields in query.indexes()]


@pytest.mark.parametrize(
    ("query", "indexes"),
    [
        # Equality, then the order.
        (IndexedQuery("audit", equal=("team",), order=(("time", "desc"),)),
         [["team", "time:desc"]]),
        # Equality, then the range.
        (IndexedQuery("audit", equal=("team",), ranges=("time",)), [["team", "time"]]),
        # A range field that is also the order is one field of the tail.
        (IndexedQuery("snapshots", equal=("status",), ranges=("expires_at",),
                      order=(("expires_at", "asc"),)), [["status", "expires_at"]]),
        # Every equality field gets its own index (Firestore merges them).
        (IndexedQuery("snapshots", equal=("team", "status"), ranges=("expires_at",)),
         [["team", "expires_at"], ["status", "expires_at"]]),
        # Optional filters: one index per field, not per combination.
        (IndexedQuery("audit", optional=("actor", "target"), order=(("time", "desc"),)),
         [["actor", "time:desc"], ["target", "time:desc"]]),
        # No equality always there and two tail fields: the tail alone too.
        (IndexedQuery("links", optional=("team",), ranges=("expires_at",),
                      order=(("created_at", "desc"),)),
         [["created_at:desc", "expires_at"], ["team", "created_at:desc", "expires_at"]]),
    ],
)
def test_a_declaration_gives_its_indexes(query: IndexedQuery, indexes: list[list[str]]) -> None:
    assert _spelled(query) == indexes


def test_a_query_that_needs_no_index_is_not_declared() -> None:
    with pytest.raises(ValueError, match="needs no composite index"):
        IndexedQuery("workspaces", equal=("team", "state"))
    with pytest.raises(ValueError, match="needs no composite index"):
        IndexedQuery("snapshots", ranges=("expires_at",), order=(("expires_at", "asc"),))


@pytest.mark.parametrize(
    ("filters", "order", "needed"),
    [
        ([("team", "=="), ("state", "in")], [], False),  # equality alone
        ([("expires_at", "<")], [("expires_at", "asc")], False),  # one field
        ([], [("created_at", "desc")], False),
        ([("member_ids", "array_contains")], [], False),
        ([("team", "==")], [("time", "desc")], True),
        ([("team", "=="), ("time", ">=")], [], True),
        ([], [("a", "asc"), ("b", "desc")], True),
        ([("revoked_at", "!=")], [("created_at", "desc")], True),
    ],
)
def test_which_queries_need_a_composite_index(filters: list[tuple[str, str]],
                                              order: list[Any], needed: bool) -> None:
    assert needs_index(filters, order) is needed


LINKS = IndexedQuery("links", equal=("revoked_at",), optional=("team", "creator"),
                     ranges=("expires_at",), order=(("expires_at", "asc"),))


@pytest.mark.parametrize(
    ("collection", "filters", "order", "why"),
    [
        ("links", [("revoked_at", "=="), ("expires_at", ">")], [("expires_at", "asc")], None),
        ("links", [("team", "=="), ("creator", "=="), ("revoked_at", "=="),
                   ("expires_at", "<=")], [("expires_at", "asc")], None),
        ("links", [("workspace", "=="), ("revoked_at", "=="), ("expires_at", ">")],
         [("expires_at", "asc")], "filter workspace == is not declared"),
        ("links", [("team", "=="), ("expires_at", ">")], [("expires_at", "asc")],
         "lacks the declared filters on revoked_at"),
        ("links", [("revoked_at", "=="), ("expires_at", ">")], [("expires_at", "desc")],
         "orders by"),
        ("links", [("revoked_at", "<"), ("expires_at", ">")], [("expires_at", "asc")],
         "filter revoked_at < is not declared"),
        ("audit", [("revoked_at", "=="), ("expires_at", ">")], [("expires_at", "asc")],
         "reads audit"),
    ],
)
def test_a_query_is_the_declared_one_or_says_why_not(
    collection: str, filters: list[tuple[str, str]], order: list[Any], why: str | None
) -> None:
    problem = LINKS.problem(collection, filters, order)
    assert (problem is None) if why is None else (why in (problem or ""))
    assert admitted([LINKS], collection, filters, order) is (why is None)


def test_the_dashboard_port_refuses_an_undeclared_composite_query() -> None:
    with pytest.raises(ValueError, match="needs a composite index: declare it"):
        PageQuery("workspaces", (("team", "==", "ml-a"),), (("updated_at", "desc"),))
    with pytest.raises(ValueError, match="needs a composite index"):
        Aggregation("links", (("team", "==", "ml-a"), ("uses", ">", 3)))
    with pytest.raises(ValueError, match="filter owner == is not declared"):
        PageQuery.of(pages.SANDBOXES_PAGE, (("owner", "==", "alice"),))
    PageQuery("workspaces", (("team", "==", "ml-a"), ("state", "==", "RUNNING")))  # no index
    page = PageQuery.of(pages.FLEET_PAGE, (("owner", "==", "alice"),), 25, "cursor")
    assert (page.collection, page.order_by) == ("workspaces", (("created_at", "desc"),))


def test_a_store_builds_its_queries_from_their_declarations() -> None:
    db = firestore.Client(project="p", credentials=AnonymousCredentials())
    query = declared_query(db, AUDIT_BEFORE, (("target", "==", "ml-a--nb"),
                                              ("time", "<", datetime(2026, 1, 1, tzinfo=UTC))))
    assert index_guard.shape(query) == (
        "audit", [("target", "=="), ("time", "<")], [("time", "desc")])
    with pytest.raises(ValueError, match="filter actor == is not declared"):
        declared_query(db, AUDIT_SINCE, (("team", "==", "ml-a"), ("actor", "==", "dev"),
                                         ("time", ">=", 0)))
    with pytest.raises(ValueError, match="lacks the declared filters on time"):
        declared_query(db, portal_store.WORKSPACES_AUDIT, (("target", "in", ["a", "b"]),))


def test_every_module_that_declares_queries_is_gathered() -> None:
    found = declared()
    assert found["functions.dashboard.pages"] == pages.QUERIES
    assert found["functions.adapters.fleet_store"] == (AUDIT_SINCE, AUDIT_BEFORE)
    assert found["functions.adapters.portal_store"] == portal_store.QUERIES
    indexes = composite_indexes([q for qs in found.values() for q in qs])
    assert {"collection": "audit", "fields": ["team", "time"]} in indexes
    keys = [(i["collection"], tuple(i["fields"])) for i in indexes]
    assert keys == sorted(set(keys))  # once each, sorted


def test_the_guard_reads_client_queries_and_flags_undeclared_ones() -> None:
    db = firestore.Client(project="p", credentials=AnonymousCredentials())
    links = (db.collection("links").where(filter=F("team", "==", "ml-a"))
             .where(filter=F("revoked_at", "==", None)).where(filter=F("expires_at", ">", 1)))
    assert index_guard.shape(links) == (
        "links", [("team", "=="), ("revoked_at", "=="), ("expires_at", ">")], [])
    assert index_guard.check(links) is None  # the dashboard's count of active links
    undeclared = db.collection("workspaces").where(filter=F("owner", "==", "a")).order_by(
        "name")
    assert "workspaces filtered on [('owner', '==')]" in (index_guard.check(undeclared) or "")
    either = db.collection("audit").where(filter=firestore.Or(
        [F("actor", "==", "a"), F("target", "==", "b")])).order_by("time")
    assert index_guard.shape(either)[1] == [("actor", "=="), ("target", "==")]
    assert index_guard.check(db.collection("teams").where(
        filter=F("member_ids", "array_contains", "alice"))) is None
