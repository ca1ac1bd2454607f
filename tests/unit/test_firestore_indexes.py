"""Reading Firestore queries out of the code and the composite indexes they need
(stack/firestore_indexes.py): each shape of code the control plane uses, as a table."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from stack.firestore_indexes import ASC, DESC, Index, missing, queries_in


def _queries(tmp_path: Path, source: str) -> list[tuple[str, list[str]]]:
    (tmp_path / "code.py").write_text(textwrap.dedent(source))
    return sorted(
        (q.collection, sorted(n.hcl() for n in q.needs())) for q in queries_in([tmp_path], tmp_path)
    )


def test_a_chain_with_an_order_needs_equality_then_order(tmp_path: Path) -> None:
    found = _queries(
        tmp_path,
        """
        from google.cloud import firestore
        def f(db, team):
            q = db.collection("audit").where(filter=firestore.FieldFilter("team", "==", team))
            return q.order_by("time", direction=firestore.Query.DESCENDING).limit(5).stream()
    """,
    )
    assert found == [("audit", ['{ collection = "audit", fields = ["team", "time:desc"] }'])]


def test_equality_alone_needs_nothing_and_a_range_on_one_field_neither(tmp_path: Path) -> None:
    found = _queries(
        tmp_path,
        """
        def f(db, a, b, now):
            db.collection("w").where("team", "==", a).where("state", "in", b).stream()
            db.collection("s").where("expires_at", "<", now).order_by("expires_at").stream()
            db.collection("s").document("x").get()
    """,
    )
    assert found == [("s", []), ("w", [])]


def test_steps_under_if_are_merged_into_one_query(tmp_path: Path) -> None:
    found = _queries(
        tmp_path,
        """
        from google.cloud import firestore
        COLLECTION = "links"
        def f(db, team, since):
            query = db.collection(COLLECTION)
            if team:
                query = query.where(filter=firestore.FieldFilter("team", "==", team))
            query = query.where(filter=firestore.FieldFilter("created_at", ">=", since))
            return list(query.stream())
    """,
    )
    assert ("links", ['{ collection = "links", fields = ["team", "created_at"] }']) in found


def test_declarative_queries_with_optional_filters_and_branches(tmp_path: Path) -> None:
    found = _queries(
        tmp_path,
        """
        FILTERS = (("actor", "actor"), ("workspace", "target"))
        def page(ctx, params, status, now):
            chosen = {name: params.get(name) for name, _ in FILTERS}
            where = tuple((field, "==", chosen[name]) for name, field in FILTERS
                          if chosen[name])
            if status == "expired":
                where, order = (*where, ("expires_at", "<=", now)), (("expires_at", "desc"),)
            else:
                order = (("time", "desc"),)
            return ctx.reader.page(PageQuery("audit", where, order, 50))
    """,
    )
    needs = sorted({n for _, ns in found for n in ns})
    assert needs == [
        '{ collection = "audit", fields = ["actor", "expires_at:desc"] }',
        '{ collection = "audit", fields = ["actor", "time:desc"] }',
        '{ collection = "audit", fields = ["target", "expires_at:desc"] }',
        '{ collection = "audit", fields = ["target", "time:desc"] }',
    ]  # one per optional field and order; branches stay apart (no expires_at + time)


def test_a_generic_query_helper_call_is_read(tmp_path: Path) -> None:
    found = _queries(
        tmp_path,
        """
        def f(store, team):
            return store.query("audit", where=[("team", "==", team)], order_by="time",
                               descending=True)
    """,
    )
    assert found == [("audit", ['{ collection = "audit", fields = ["team", "time:desc"] }'])]


@pytest.mark.parametrize(
    ("declared", "ok"),
    [
        ([("team", ASC), ("time", DESC)], True),
        ([("team", ASC), ("time", ASC)], False),  # direction matters
        ([("time", DESC)], False),  # the equality field is missing
        ([("team", ASC), ("time", DESC), ("x", ASC)], True),  # a longer index serves a prefix
        ([("owner", ASC), ("team", ASC), ("time", DESC)], False),  # owner is not always there
    ],
)
def test_which_declared_indexes_satisfy_a_need(
    tmp_path: Path, declared: list[tuple[str, str]], ok: bool
) -> None:
    (tmp_path / "code.py").write_text(
        textwrap.dedent("""
        def f(db, team):
            return db.collection("audit").where("team", "==", team).order_by(
                "time", direction="DESCENDING").stream()
    """)
    )
    queries = queries_in([tmp_path], tmp_path)
    assert (not list(missing(queries, [Index("audit", tuple(declared))]))) is ok


def test_index_spelling_round_trips() -> None:
    index = Index.parse("audit", ["team", "time:desc", "tags:contains"])
    assert index.fields == (("team", ASC), ("time", DESC), ("tags", "CONTAINS"))
