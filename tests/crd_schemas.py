"""The CRD schemas transcribed in tests/data/crds/, made strict the way the tests need them.

An API server prunes fields a CRD does not declare: a manifest with a misspelt field would be
accepted and the field silently lost. :func:`strict` turns that into a validation error
(``additionalProperties: false`` wherever an object declares properties and says nothing).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

CRDS = Path(__file__).resolve().parent / "data" / "crds"


def load(name: str) -> dict[str, Any]:
    """``tests/data/crds/<name>.json``."""
    data: dict[str, Any] = json.loads((CRDS / f"{name}.json").read_text())
    return data


def strict(schema: Any, *, any_metadata: bool = False) -> Any:
    """A copy of ``schema`` that refuses unknown fields; ``any_metadata`` accepts any
    ``metadata`` object (the API server checks it, not the CRD)."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node \
                    and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    if any_metadata:
        schema["properties"]["metadata"] = {"type": "object"}
    return schema


def jobset_schema() -> Any:
    """The strict JobSet (jobset.x-k8s.io/v1alpha2) schema."""
    return strict(load("jobset")["kinds"]["JobSet"]["openAPIV3Schema"])


def validate_kueue(obj: dict[str, Any]) -> None:
    """A Kueue object against the strict Kueue v0.19.2 CRD of its kind (and its scope)."""
    import jsonschema

    crds = load("kueue.x-k8s.io")
    crd = crds["kinds"][obj["kind"]]
    assert obj["apiVersion"] == f"{crds['group']}/{crds['version']}"
    jsonschema.validate(obj, strict(crd["openAPIV3Schema"], any_metadata=True),
                        format_checker=jsonschema.FormatChecker())
    assert ("namespace" in obj["metadata"]) == (crd["scope"] == "Namespaced"), obj["kind"]
