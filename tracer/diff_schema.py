"""JSON Schema (draft 2020-12) of ``spectrace diff --format json``: ``spectrace.diff/1``.

Generated from the types of :class:`~spectrace.tracer.diff_result.DiffResult` (field types,
Optional as null, list items, nested dataclasses, attribute docs as descriptions) by
:func:`~spectrace.tracer.typed_json.json_schema`. Printed by ``spectrace schema --diff``;
tests validate real diff output against it. Minor additions keep the ``/1`` id (new keys are
allowed); a breaking change bumps it.
"""

from __future__ import annotations

from .diff_result import SCHEMA as SCHEMA_ID
from .diff_result import DiffResult
from .typed_json import json_schema


def diff_schema() -> dict:
    """The JSON Schema of a ``spectrace.diff/1`` document, generated from the types."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "spectrace diff report",
    } | json_schema(DiffResult)


SCHEMA: dict = diff_schema()
