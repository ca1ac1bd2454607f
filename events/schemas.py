"""Load the JSON Schemas of schemas/ and validate documents and payloads against them.

The schema files are the published contract (Terraform, other languages, the dashboard
read them); this module is the one place Python checks data against them.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

# jsonschema imports rfc3987_syntax when it is installed (jupyter-events asks for
# jsonschema[format-nongpl]) only to check the "iri" and "iri-reference" formats, which
# no schema here uses and which these validators do not check anyway (they get no format
# checker). That import compiles a Lark grammar: 1.4 s of CPU (-X importtime, quiet
# machine) in every process that loads this module (the `stasis` CLI, each function
# worker, the node agent's publisher), against 0.1 s for the rest of jsonschema. Marked
# absent before jsonschema is imported, it is skipped as jsonschema skips it where it is
# not installed (tests/unit/test_schemas.py). Jupyter's own processes never import this.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

from jsonschema import Draft202012Validator, ValidationError, validators  # noqa: E402
from jsonschema.protocols import Validator  # noqa: E402

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


@cache
def _ecma_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` as JSON Schema (ECMA-262) reads it: ``$`` is the end of the string.

    Python's ``$`` also matches before a final newline, so jsonschema's own check lets
    "ml-a--ws\\n" pass "^...$". Our patterns use ``$`` only as an unescaped anchor.
    """
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern))


def _pattern(validator: Validator, pattern: str, instance: Any,
             schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _ecma_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_StrictPatterns = validators.extend(Draft202012Validator, {"pattern": _pattern})


@cache
def _validator(relative: str) -> Validator:
    schema = json.loads((SCHEMA_DIR / relative).read_text())
    Draft202012Validator.check_schema(schema)
    validator: Validator = _StrictPatterns(schema)
    return validator


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
