"""Firestore's composite indexes, derived from the queries the code declares.

Every module of ``functions`` that runs a query needing a composite index declares it in its
``QUERIES`` (:class:`functions.queries.IndexedQuery`, used by the code that runs it). This
gathers them, importing every module of the package (a new store needs no registration
here), and gives Terraform one list, ``firestore_indexes`` (``terraform/modules/firestore``),
each field spelled ``"name"`` (ascending) or ``"name:desc"``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from functions.queries import IndexedQuery


def declared(package: str = "functions") -> dict[str, tuple[IndexedQuery, ...]]:
    """Module name -> the queries it declares, for every module of ``package``."""
    root = importlib.import_module(package)
    found: dict[str, tuple[IndexedQuery, ...]] = {}
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        queries = getattr(importlib.import_module(info.name), "QUERIES", ())
        if queries and all(isinstance(q, IndexedQuery) for q in queries):
            found[info.name] = tuple(queries)
    return found


def composite_indexes(queries: list[IndexedQuery]) -> list[dict[str, Any]]:
    """Every index the queries need, once, sorted: ``{"collection", "fields"}``."""
    indexes = {
        (q.collection, tuple(name + ("" if d == "asc" else ":desc") for name, d in fields))
        for q in queries
        for fields in q.indexes()
    }
    return [{"collection": c, "fields": list(f)} for c, f in sorted(indexes)]
