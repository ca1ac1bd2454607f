"""Load the JSON Schemas of schemas/ and validate documents and payloads against them.

The schema files are the published contract (Terraform, other languages, the dashboard
read them); this module is the one place Python checks data against them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


@cache
def _validator(relative: str) -> Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / relative).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def event_schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = _validator(f"events/{name}.json").schema
    return schema


def errors(relative: str, data: Any) -> list[tuple[str, str]]:
    """Every violation of ``schemas/<relative>`` as (JSON pointer path, message)."""
    found = []
    by_path = sorted(_validator(relative).iter_errors(data), key=lambda e: [str(p) for p in e.path])
    for error in by_path:
        path = "/" + "/".join(str(p) for p in error.absolute_path)
        found.append((path, error.message))
    return found


def validate_payload(name: str, data: Mapping[str, Any]) -> str | None:
    """None when ``data`` fits the event's schema, else a one-line reason."""
    found = errors(f"events/{name}.json", dict(data))
    if not found:
        return None
    return "; ".join(f"{path}: {message}" for path, message in found)
