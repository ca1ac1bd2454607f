"""The event contract agrees with itself: payload dataclasses and JSON Schemas, both ways.

For every event in ``events.CATALOG``: each dataclass field is a schema property and each
property a field; ``required`` is exactly the fields without defaults; each field's Python
type is the schema's JSON type; no additional properties; every schema is a valid draft
2020-12 schema. Golden payloads (``tests/data/events/<name>.json``, one per event, every
field set) validate and survive a round trip through their dataclass.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from events import CATALOG, EventSpec, InvalidEvent, new_event, spec_for
from events.payloads import CE_TYPE_PREFIX
from events.schemas import SCHEMA_DIR, event_schema, validate_payload

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = ROOT / "tests" / "data" / "events"
NAMES = sorted(CATALOG)

#: The event table of docs/DESIGN.md ("Events"): each must exist in the catalog.
DESIGN_EVENTS = (
    "workspace.requested",
    "workspace.ready",
    "workspace.pause_requested",
    "workspace.idle_detected",
    "snapshot.finished",
    "workspace.resume_requested",
    "workspace.delete_requested",
    "workspace.state_changed",
    "link.created",
    "link.revoked",
    "sandbox.requested",
    "sandbox.finished",
    "snapshot.expired",
)

_JSON_TYPE: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
    type(None): "null",
}


def _json_types(annotation: Any) -> set[str]:
    """The JSON types a Python annotation allows (``X | None`` -> {X's, "null"})."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return set().union(*(_json_types(arg) for arg in typing.get_args(annotation)))
    origin = typing.get_origin(annotation) or annotation
    if origin not in _JSON_TYPE:
        raise AssertionError(f"{annotation!r} is not a JSON type")
    return {_JSON_TYPE[origin]}


def _value_type(value: Any) -> str:
    # bool before int: True is an int to Python, a boolean to JSON.
    for python, json_type in ((bool, "boolean"), (int, "integer"), (float, "number"),
                              (str, "string"), (type(None), "null"), (list, "array"),
                              (dict, "object")):
        if isinstance(value, python):
            return json_type
    raise AssertionError(f"{value!r} is not a JSON value")


def _schema_types(prop: dict[str, Any]) -> set[str]:
    """The JSON types a property allows, by ``type`` or (an enum) by its values."""
    if "type" in prop:
        declared = prop["type"]
        return {declared} if isinstance(declared, str) else set(declared)
    assert "enum" in prop, f"property without type or enum: {prop}"
    return {_value_type(v) for v in prop["enum"]}


def _hints(spec: EventSpec) -> dict[str, Any]:
    return typing.get_type_hints(spec.payload)


def _golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
    return data


# -- the schema files --------------------------------------------------------------------


def test_every_event_has_a_schema_and_every_schema_an_event() -> None:
    files = {p.name.removesuffix(".json") for p in (SCHEMA_DIR / "events").glob("*.json")}
    assert files == set(CATALOG)


@pytest.mark.parametrize("name", NAMES)
def test_schema_is_valid_draft_2020_12(name: str) -> None:
    schema = json.loads((SCHEMA_DIR / "events" / f"{name}.json").read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith(f"/events/{name}.json")
    assert schema["type"] == "object"
    assert schema["title"] == CATALOG[name].payload.__name__


@pytest.mark.parametrize("name", NAMES)
def test_schema_forbids_additional_properties(name: str) -> None:
    assert event_schema(name)["additionalProperties"] is False


# -- dataclass <-> schema, both ways -------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_field_is_a_property(name: str) -> None:
    missing = set(CATALOG[name].field_names()) - set(event_schema(name)["properties"])
    assert not missing, f"{name}: fields without a schema property: {sorted(missing)}"


@pytest.mark.parametrize("name", NAMES)
def test_every_property_is_a_field(name: str) -> None:
    extra = set(event_schema(name)["properties"]) - set(CATALOG[name].field_names())
    assert not extra, f"{name}: schema properties without a field: {sorted(extra)}"


@pytest.mark.parametrize("name", NAMES)
def test_required_is_exactly_the_fields_without_defaults(name: str) -> None:
    without_default = {
        f.name for f in dataclasses.fields(CATALOG[name].payload)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    required = event_schema(name)["required"]
    assert len(required) == len(set(required)), f"{name}: duplicates in required"
    assert set(required) == without_default


@pytest.mark.parametrize("name", NAMES)
def test_field_types_are_the_schema_types(name: str) -> None:
    properties = event_schema(name)["properties"]
    for field_name, annotation in _hints(CATALOG[name]).items():
        assert _schema_types(properties[field_name]) == _json_types(annotation), (
            f"{name}.{field_name}: schema {properties[field_name]} vs {annotation}")


@pytest.mark.parametrize("name", NAMES)
def test_item_types_of_lists_are_the_schema_item_types(name: str) -> None:
    properties = event_schema(name)["properties"]
    for field_name, annotation in _hints(CATALOG[name]).items():
        if typing.get_origin(annotation) is not list:
            continue
        (item,) = typing.get_args(annotation)
        assert _schema_types(properties[field_name]["items"]) == _json_types(item), (
            f"{name}.{field_name}")


@pytest.mark.parametrize("name", NAMES)
def test_defaults_are_valid_values(name: str) -> None:
    """A payload built with only its required fields is valid: no default breaks the schema."""
    golden = _golden(name)
    minimal = {k: golden[k] for k in event_schema(name)["required"]}
    payload = CATALOG[name].payload(**minimal)
    assert validate_payload(name, dataclasses.asdict(payload)) is None


def test_the_type_mapping_itself() -> None:
    assert _json_types(str | None) == {"string", "null"}
    assert _json_types(float | None) == {"number", "null"}
    assert _json_types(list[dict[str, Any]]) == {"array"}
    assert _json_types(dict[str, Any]) == {"object"}
    assert _schema_types({"enum": ["a", None]}) == {"string", "null"}
    assert _schema_types({"type": ["integer", "null"]}) == {"integer", "null"}
    with pytest.raises(AssertionError):
        _json_types(bytes)


# -- the catalog ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", DESIGN_EVENTS)
def test_every_event_of_the_design_is_in_the_catalog(name: str) -> None:
    assert name in CATALOG


@pytest.mark.parametrize("name", NAMES)
def test_ce_type_and_lookups(name: str) -> None:
    spec = CATALOG[name]
    assert spec.name == name
    assert spec.ce_type == f"dev.stasis.{name}"
    assert spec.ce_type.startswith(CE_TYPE_PREFIX)
    assert spec_for(name) is spec
    assert spec_for(spec.ce_type) is spec
    assert spec_for(spec.payload) is spec


def test_topics_are_unique_and_long_enough() -> None:
    topics = [spec.topic for spec in CATALOG.values()]
    assert len(set(topics)) == len(topics)
    for topic in topics:
        # Pub/Sub: 3-255 chars, a letter first, no "goog" prefix.
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}", topic), topic
        assert not topic.startswith("goog")


def test_payload_classes_are_frozen_and_distinct() -> None:
    payloads = [spec.payload for spec in CATALOG.values()]
    assert len(set(payloads)) == len(payloads)
    for cls in payloads:
        assert dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]


def test_unknown_names_are_key_errors() -> None:
    with pytest.raises(KeyError):
        spec_for("workspace.exploded")
    with pytest.raises(KeyError):
        spec_for(dict)


# -- golden payloads -----------------------------------------------------------------------


def test_one_golden_payload_per_event() -> None:
    assert {p.name.removesuffix(".json") for p in GOLDEN_DIR.glob("*.json")} == set(CATALOG)


@pytest.mark.parametrize("name", NAMES)
def test_golden_payload_validates(name: str) -> None:
    assert validate_payload(name, _golden(name)) is None


@pytest.mark.parametrize("name", NAMES)
def test_golden_payload_sets_every_field(name: str) -> None:
    """So the round trip below exercises every field, not just the defaults."""
    assert set(_golden(name)) == set(CATALOG[name].field_names())


@pytest.mark.parametrize("name", NAMES)
def test_golden_payload_round_trips_through_its_dataclass(name: str) -> None:
    golden = _golden(name)
    payload = CATALOG[name].payload(**golden)
    assert dataclasses.asdict(payload) == golden
    # and through JSON, as it travels
    assert json.loads(json.dumps(dataclasses.asdict(payload))) == golden
    assert new_event(payload).payload == payload


@pytest.mark.parametrize("name", NAMES)
def test_golden_payload_with_an_unknown_field_is_refused(name: str) -> None:
    problem = validate_payload(name, {**_golden(name), "surprise": 1})
    assert problem is not None
    assert "surprise" in problem


@pytest.mark.parametrize("name", NAMES)
def test_golden_payload_without_a_required_field_is_refused(name: str) -> None:
    for field_name in event_schema(name)["required"]:
        data = {k: v for k, v in _golden(name).items() if k != field_name}
        problem = validate_payload(name, data)
        assert problem is not None and field_name in problem, (name, field_name)


@pytest.mark.parametrize("value", ["ml-a--ws\n", "ml-a--ws\n\n", "\nml-a--ws", "ml-a--WS",
                                   "ml-a-ws", "ml-a---ws", "m--ws", ""])
def test_workspace_ids_are_anchored_slugs(value: str) -> None:
    """Patterns are read as JSON Schema (ECMA-262) reads them: ``$`` is the end of the
    string, so a trailing newline, which Python's ``re`` lets ``$`` skip, is refused."""
    problem = validate_payload("workspace.ready",
                               {"workspace_id": value, "url": "u", "runtime_handle": "h"})
    assert problem is not None and "/workspace_id" in problem
    with pytest.raises(InvalidEvent):
        spec = spec_for("workspace.ready")
        new_event(spec.payload(workspace_id=value, url="u", runtime_handle="h"))


def test_patterns_still_match_what_they_should() -> None:
    assert validate_payload("workspace.ready", {
        "workspace_id": "ml-a--ws-2", "url": "u", "runtime_handle": "h"}) is None
    assert validate_payload("workspace.resume_requested", {
        "workspace_id": "ml-a--ws", "actor": "a", "profile": None}) is None


def test_no_schema_asks_for_a_format_that_needs_rfc3987_syntax() -> None:
    """events.schemas keeps rfc3987_syntax out (it only backs the iri formats): a schema
    that asked for one would lose its check silently."""
    formats = {m for path in SCHEMA_DIR.rglob("*.json")
               for m in re.findall(r'"format"\s*:\s*"([^"]+)"', path.read_text())}
    assert formats and not formats & {"iri", "iri-reference"}, formats


def test_a_function_worker_validates_events_without_importing_rfc3987_syntax() -> None:
    """What every function worker loads (the routes, the events) leaves rfc3987_syntax and
    its lark grammar out, and a payload that breaks its schema is still refused."""
    import subprocess
    import sys

    code = """
import sys
import functions.routes
from events.schemas import validate_payload
print(validate_payload("workspace.requested", {"team": "ml-a", "owner": "dev",
                                               "name": "My_NB", "profile": "cpu-small"}))
print(sorted({m.split(".")[0] for m, v in sys.modules.items() if v} &
             {"rfc3987_syntax", "lark", "jsonschema"}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=True)
    refusal, loaded = done.stdout.splitlines()[-2:]
    assert "/name: 'My_NB' does not match" in refusal
    assert loaded == "['jsonschema']"
