"""The composite indexes the code's Firestore queries need, found by reading the code.

The Firestore emulator runs every query without an index; production refuses one that needs
a composite index it does not have (FAILED_PRECONDITION, at the first request that runs it).
So the indexes are checked against the code: this module reads the Python source (never
imports it), finds every query and what it filters and orders on, and says which composite
indexes serve it; ``tests/unit/test_terraform.py`` compares that with
``terraform/modules/firestore``.

Queries are recognised in two forms:

- client chains: ``db.collection("c").where(filter=FieldFilter("f", "==", v)).order_by(...)``,
  also built up in steps (``query = query.where(...)`` under ``if``), ended by ``.stream()``,
  ``.get()``, ``.count()``, ``.sum()`` or ``.avg()``;
- declarative queries: ``PageQuery("c", where, order_by, ...)``, ``Aggregation("c", where)``,
  ``store.query("c", where=[...], order_by="f")``: a call named ``*Query``/``*Aggregation``
  or ``.query`` whose first argument is the collection, with ``("field", "op", value)``
  filters and ``("field", "asc"|"desc")`` orders.

Filters and orders may be built from literals, ``*spread`` tuples, conditional expressions,
branches (``if``/``elif``: each path is its own query) and comprehensions over literal
tables (``tuple((k, "==", v) for k, v in chosen.items() if v)``: each filter optional).
What cannot be followed (a value from a call, a parameter) is ignored, which can only hide a
need, never invent one.

Which queries need a composite index (the rules Firestore documents): equality filters
alone never do (Firestore merges single-field indexes); one field that is both the range
filter and the order does not either. Otherwise every equality field ``e`` needs an index
``(e, <order fields>, <range fields>)`` -- Firestore merges such indexes for any combination
of equality filters sharing that suffix, which is what keeps optional filters (a dashboard's
team / state / owner selectors) to one index per field instead of one per combination.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EQUALITY = frozenset({"==", "in", "array-contains", "array-contains-any"})
RANGE = frozenset({"<", "<=", ">", ">=", "!=", "not-in"})
ASC, DESC, CONTAINS = "ASCENDING", "DESCENDING", "CONTAINS"
_TERMINAL = frozenset({"stream", "get", "count", "sum", "avg"})
_CHAIN = frozenset(
    {
        "where",
        "order_by",
        "select",
        "limit",
        "limit_to_last",
        "offset",
        "start_after",
        "start_at",
        "end_before",
        "end_at",
    }
)
_MAX_WORLDS = 64


# --- values of the small interpreter ---------------------------------------------------------
class _Unknown:
    def __repr__(self) -> str:
        return "?"


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class Seq:
    items: tuple[Any, ...]


@dataclass(frozen=True)
class Mapping_:
    keys: tuple[Any, ...]


@dataclass(frozen=True)
class Filter:
    field: str
    op: str
    optional: bool = False


@dataclass(frozen=True)
class Order:
    field: str
    direction: str = ASC


@dataclass(frozen=True)
class Chain:
    collection: str
    filters: tuple[Filter, ...] = ()
    orders: tuple[Order, ...] = ()


@dataclass(frozen=True)
class Query:
    """One query the code runs: collection, filters (some optional) and order."""

    collection: str
    filters: tuple[Filter, ...]
    orders: tuple[Order, ...]
    where: str  # file:line

    def needs(self) -> list[Need]:
        """The composite indexes this query needs (empty: single-field indexes do)."""
        orders: list[Order] = []
        for order in self.orders:
            if order.field not in {o.field for o in orders}:
                orders.append(order)
        tail = [(o.field, o.direction) for o in orders]
        tail += [
            (f.field, ASC)
            for f in self.filters
            if f.op in RANGE and f.field not in {t[0] for t in tail}
        ]
        tail = list(dict.fromkeys(tail))
        tail_fields = {t[0] for t in tail}
        eq = [f for f in self.filters if f.op in EQUALITY and f.field not in tail_fields]
        required = {f.field for f in eq if not f.optional}
        if not tail or (not eq and len(tail) == 1):
            return []
        found: list[Need] = []
        if not required and len(tail) >= 2:
            found.append(Need(self, None, tuple(tail), frozenset()))
        for f in dict.fromkeys((f.field, f.op) for f in eq):
            mode = CONTAINS if f[1].startswith("array-contains") else ASC
            found.append(Need(self, (f[0], mode), tuple(tail), frozenset(required)))
        return found


@dataclass(frozen=True)
class Need:
    """An index (``field``, *``tail``) -- or one that puts other always-present equality
    fields (``companions``) before the tail as well."""

    query: Query
    field: tuple[str, str] | None
    tail: tuple[tuple[str, str], ...]
    companions: frozenset[str] = field(default_factory=frozenset)

    def satisfied_by(self, indexes: Iterable[Index]) -> bool:
        return any(
            self._fits(index) for index in indexes if index.collection == self.query.collection
        )

    def _fits(self, index: Index) -> bool:
        fields = index.fields
        for split in range(len(fields) + 1):
            prefix, rest = fields[:split], fields[split:]
            if tuple(rest[: len(self.tail)]) != self.tail:
                continue
            names = {f[0] for f in prefix}
            if self.field is None:
                if not prefix:
                    return True
                continue
            if self.field not in prefix:
                continue
            if names <= self.companions | {self.field[0]} and all(
                mode in (ASC, CONTAINS) for _, mode in prefix
            ):
                return True
        return False

    def hcl(self) -> str:
        """How to declare it in terraform/modules/firestore/indexes.tf."""
        fields = ([self.field] if self.field else []) + list(self.tail)
        return (
            f'{{ collection = "{self.query.collection}", fields = ['
            + ", ".join(f'"{_spec(name, mode)}"' for name, mode in fields)
            + "] }"
        )


@dataclass(frozen=True)
class Index:
    """A declared composite index: collection and (field, mode) in order."""

    collection: str
    fields: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, collection: str, specs: Sequence[str]) -> Index:
        """From the Terraform spelling: ``"team"``, ``"created_at:desc"``, ``"tags:contains"``."""
        fields = []
        for spec in specs:
            name, _, mode = spec.partition(":")
            fields.append(
                (name, {"": ASC, "asc": ASC, "desc": DESC, "contains": CONTAINS}[mode.lower()])
            )
        return cls(collection, tuple(fields))


def _spec(name: str, mode: str) -> str:
    return name + {ASC: "", DESC: ":desc", CONTAINS: ":contains"}[mode]


# --- finding the queries ---------------------------------------------------------------------
def queries_in(paths: Iterable[Path], root: Path) -> list[Query]:
    """Every query in the Python files under ``paths``."""
    found: dict[tuple[Any, ...], Query] = {}
    for path in sorted(
        p for base in paths for p in ([base] if base.is_file() else base.rglob("*.py"))
    ):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        for query in _Module(ast.parse(path.read_text(), filename=rel), rel).queries():
            found.setdefault((query.collection, query.filters, query.orders), query)
    return list(found.values())


class _Module:
    def __init__(self, tree: ast.Module, name: str) -> None:
        self.tree = tree
        self.name = name
        self.found: list[Query] = []
        self.globals: dict[str, Any] = {}
        for world in self._run(tree.body, [{}], scan=False):
            self.globals.update({k: v for k, v in world.items() if not isinstance(v, _Unknown)})

    def queries(self) -> list[Query]:
        self._run(self.tree.body, [{}], scan=True)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                params = [
                    *args.posonlyargs,
                    *args.args,
                    *args.kwonlyargs,
                    *(a for a in (args.vararg, args.kwarg) if a),
                ]
                self._run(node.body, [{a.arg: UNKNOWN for a in params}], scan=True)
        return self.found

    # statements: a list of worlds (name -> value), one per path taken so far
    def _run(
        self, body: Sequence[ast.stmt], worlds: list[dict[str, Any]], scan: bool
    ) -> list[dict[str, Any]]:
        for stmt in body:
            worlds = self._stmt(stmt, worlds, scan)
        return worlds

    def _stmt(
        self, stmt: ast.stmt, worlds: list[dict[str, Any]], scan: bool
    ) -> list[dict[str, Any]]:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return worlds  # its own scope (functions are run on their own)
        if isinstance(stmt, ast.If):
            if scan:
                self._scan(stmt.test, worlds)
            then = self._run(stmt.body, [dict(w) for w in worlds], scan)
            other = self._run(stmt.orelse, [dict(w) for w in worlds], scan)
            return _dedupe(then + other)
        if isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
            if scan:
                self._scan(
                    stmt.iter if isinstance(stmt, ast.For | ast.AsyncFor) else stmt.test, worlds
                )
            inner = [dict(w) for w in worlds]
            if isinstance(stmt, ast.For | ast.AsyncFor):
                for w in inner:
                    self._bind(stmt.target, UNKNOWN, w)
            looped = self._run(stmt.body, inner, scan)
            return _dedupe(self._run(stmt.orelse, worlds + looped, scan))
        if isinstance(stmt, ast.With | ast.AsyncWith):
            if scan:
                for item in stmt.items:
                    self._scan(item.context_expr, worlds)
            return self._run(stmt.body, worlds, scan)
        if isinstance(stmt, ast.Try):
            worlds = self._run(stmt.body, worlds, scan)
            for handler in stmt.handlers:
                self._run(handler.body, [dict(w) for w in worlds], scan)
            return self._run(stmt.orelse + stmt.finalbody, worlds, scan)
        if scan:
            self._scan(stmt, worlds)
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            out: list[dict[str, Any]] = []
            for world in worlds:
                for value in self._eval(stmt.value, world):
                    new = dict(world)
                    for target in targets:
                        self._bind(target, value, new)
                    out.append(new)
            return _dedupe(out)
        return worlds

    def _bind(self, target: ast.expr, value: Any, world: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            world[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            items = (
                value.items
                if isinstance(value, Seq) and len(value.items) == len(target.elts)
                else (UNKNOWN,) * len(target.elts)
            )
            for elt, item in zip(target.elts, items, strict=True):
                self._bind(elt, item, world)

    def _scan(self, node: ast.AST, worlds: list[dict[str, Any]]) -> None:
        """Record the queries that ``node`` runs, in every world."""
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            func = call.func
            line = f"{self.name}:{call.lineno}"
            if isinstance(func, ast.Attribute) and func.attr in _TERMINAL:
                for world in worlds:
                    for value in self._eval(func.value, world):
                        if isinstance(value, Chain) and (value.filters or value.orders):
                            self._record(value.collection, value.filters, value.orders, line)
            elif _declarative(call):
                for world in worlds:
                    self._declarative(call, world, line)

    def _declarative(self, call: ast.Call, world: dict[str, Any], line: str) -> None:
        coll = call.args[0]
        assert isinstance(coll, ast.Constant)
        kwargs = {k.arg: k.value for k in call.keywords if k.arg}
        where = call.args[1] if len(call.args) > 1 else kwargs.get("where")
        order = (
            call.args[2] if len(call.args) > 2 else (kwargs.get("order_by") or kwargs.get("order"))
        )
        descending = kwargs.get("descending")
        desc = isinstance(descending, ast.Constant) and descending.value is True
        wheres = self._eval(where, world) if where is not None else [Seq(())]
        orders = self._eval(order, world) if order is not None else [Seq(())]
        for w, o in itertools.islice(itertools.product(wheres, orders), _MAX_WORLDS):
            self._record(coll.value, _filters(w), _orders(o, desc), line)

    def _record(
        self, collection: str, filters: Sequence[Filter], orders: Sequence[Order], line: str
    ) -> None:
        self.found.append(Query(collection, tuple(filters), tuple(orders), line))

    # expressions: each evaluates to its possible values
    def _eval(self, node: ast.expr, world: dict[str, Any]) -> list[Any]:
        if isinstance(node, ast.Constant):
            return [Const(node.value)]
        if isinstance(node, ast.Name):
            if node.id in world:
                return [world[node.id]]
            return [self.globals.get(node.id, UNKNOWN)]
        if isinstance(node, ast.IfExp):
            return self._eval(node.body, world) + self._eval(node.orelse, world)
        if isinstance(node, ast.Tuple | ast.List):
            parts: list[list[tuple[Any, ...]]] = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    parts.append(
                        [
                            v.items if isinstance(v, Seq) else ()
                            for v in self._eval(elt.value, world)
                        ]
                    )
                else:
                    parts.append([(v,) for v in self._eval(elt, world)])
            return [
                Seq(tuple(itertools.chain.from_iterable(combo)))
                for combo in itertools.islice(itertools.product(*parts), _MAX_WORLDS)
            ]
        if isinstance(node, ast.Dict):
            keys = [self._eval(k, world)[0] if k is not None else UNKNOWN for k in node.keys]
            return [Mapping_(tuple(keys))]
        if isinstance(node, ast.DictComp):
            return [Mapping_(tuple(self._comprehension(node.key, node.generators, world)[0]))]
        if isinstance(node, ast.GeneratorExp | ast.ListComp | ast.SetComp):
            items, optional = self._comprehension(node.elt, node.generators, world)
            return [
                Seq(
                    tuple(
                        Filter(i.field, i.op, True) if optional and isinstance(i, Filter) else i
                        for i in (_as_filter(v) or v for v in items)
                    )
                )
            ]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return [
                Seq(a.items + b.items) if isinstance(a, Seq) and isinstance(b, Seq) else UNKNOWN
                for a in self._eval(node.left, world)
                for b in self._eval(node.right, world)
            ][:_MAX_WORLDS]
        if isinstance(node, ast.Attribute):
            if node.attr in (ASC, DESC):
                return [Const(node.attr)]
            return [UNKNOWN]
        if isinstance(node, ast.Call):
            return self._call(node, world)
        return [UNKNOWN]

    def _call(self, node: ast.Call, world: dict[str, Any]) -> list[Any]:
        func = node.func
        name = (
            func.attr
            if isinstance(func, ast.Attribute)
            else (func.id if isinstance(func, ast.Name) else "")
        )
        if name in ("tuple", "list") and len(node.args) == 1:
            return self._eval(node.args[0], world)
        if name == "FieldFilter" and len(node.args) >= 2:
            return [
                _as_filter(Seq(tuple(self._eval(a, world)[0] for a in node.args[:2]))) or UNKNOWN
            ]
        if not isinstance(func, ast.Attribute):
            return [UNKNOWN]
        if name == "collection" and node.args:
            coll = self._eval(node.args[0], world)[0]
            return [
                Chain(coll.value)
                if isinstance(coll, Const) and isinstance(coll.value, str)
                else UNKNOWN
            ]
        if name in ("items", "keys") and not node.args:
            return [
                Seq(tuple(Seq((k, UNKNOWN)) if name == "items" else k for k in v.keys))
                if isinstance(v, Mapping_)
                else UNKNOWN
                for v in self._eval(func.value, world)
            ]
        if name not in _CHAIN:
            return [UNKNOWN]
        out: list[Any] = []
        for base in self._eval(func.value, world):
            if not isinstance(base, Chain):
                out.append(UNKNOWN)
            elif name == "where":
                found = [self._where_arg(node, world)]
                out.append(
                    Chain(
                        base.collection,
                        base.filters + tuple(f for f in found if f is not None),
                        base.orders,
                    )
                )
            elif name == "order_by" and node.args:
                fld = self._eval(node.args[0], world)[0]
                direction = ASC
                for kw in node.keywords:
                    if kw.arg == "direction":
                        d = self._eval(kw.value, world)[0]
                        if isinstance(d, Const) and str(d.value).upper().startswith("DESC"):
                            direction = DESC
                if isinstance(fld, Const) and isinstance(fld.value, str):
                    out.append(
                        Chain(
                            base.collection,
                            base.filters,
                            (*base.orders, Order(fld.value, direction)),
                        )
                    )
                else:
                    out.append(base)
            else:
                out.append(base)
        return out

    def _where_arg(self, node: ast.Call, world: dict[str, Any]) -> Filter | None:
        for kw in node.keywords:
            if kw.arg == "filter":
                value = self._eval(kw.value, world)[0]
                return value if isinstance(value, Filter) else None
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        if len(node.args) >= 2:
            return _as_filter(Seq(tuple(self._eval(a, world)[0] for a in node.args[:2])))
        if "field_path" in kwargs and "op_string" in kwargs:
            return _as_filter(
                Seq(
                    (
                        self._eval(kwargs["field_path"], world)[0],
                        self._eval(kwargs["op_string"], world)[0],
                    )
                )
            )
        return None

    def _comprehension(
        self, elt: ast.expr, generators: Sequence[ast.comprehension], world: dict[str, Any]
    ) -> tuple[list[Any], bool]:
        """(values of ``elt`` for each row of the generators, whether rows may be skipped)."""
        rows: list[dict[str, Any]] = [dict(world)]
        optional = False
        for gen in generators:
            optional |= bool(gen.ifs)
            nxt: list[dict[str, Any]] = []
            for row in rows:
                source = self._eval(gen.iter, row)[0]
                if not isinstance(source, Seq | Mapping_):
                    continue
                for item in source.items if isinstance(source, Seq) else source.keys:
                    new = dict(row)
                    self._bind(gen.target, item, new)
                    nxt.append(new)
            rows = nxt
        return [self._eval(elt, row)[0] for row in rows], optional


def _declarative(call: ast.Call) -> bool:
    func = call.func
    name = (
        func.attr
        if isinstance(func, ast.Attribute)
        else (func.id if isinstance(func, ast.Name) else "")
    )
    if not (name.endswith(("Query", "Aggregation")) or name == "query"):
        return False
    return (
        bool(call.args)
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
    )


def _as_filter(value: Any) -> Filter | None:
    """``("field", "op", ...)`` as a filter, if it is one."""
    if isinstance(value, Filter):
        return value
    if not isinstance(value, Seq) or len(value.items) not in (2, 3):
        return None
    fld, op = value.items[0], value.items[1]
    if not (
        isinstance(fld, Const)
        and isinstance(fld.value, str)
        and isinstance(op, Const)
        and isinstance(op.value, str)
    ):
        return None
    norm = op.value.replace("_", "-")
    if norm not in EQUALITY | RANGE:
        return None
    return Filter(fld.value, norm)


def _filters(value: Any) -> list[Filter]:
    if not isinstance(value, Seq):
        return []
    return [f for f in (_as_filter(item) for item in value.items) if f is not None]


def _orders(value: Any, descending: bool) -> list[Order]:
    if isinstance(value, Const) and isinstance(value.value, str):
        return [Order(value.value, DESC if descending else ASC)]
    if not isinstance(value, Seq):
        return []
    found = []
    for item in value.items:
        if (
            isinstance(item, Seq)
            and len(item.items) == 2
            and all(isinstance(i, Const) and isinstance(i.value, str) for i in item.items)
        ):
            fld, direction = item.items[0].value, item.items[1].value
            found.append(Order(fld, DESC if direction.lower().startswith("desc") else ASC))
    return found


def _dedupe(worlds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for world in worlds:
        seen.setdefault(repr(sorted(world.items(), key=lambda kv: kv[0])), world)
    return list(seen.values())[:_MAX_WORLDS]


def missing(queries: Iterable[Query], indexes: Iterable[Index]) -> Iterator[Need]:
    """The needs no declared index satisfies."""
    declared = list(indexes)
    for query in queries:
        for need in query.needs():
            if not need.satisfied_by(declared):
                yield need
