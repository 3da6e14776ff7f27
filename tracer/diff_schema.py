"""JSON Schema (draft 2020-12) of ``spectrace diff --format json``: ``spectrace.diff/1``
(two traces) or ``spectrace.diff-runs/1`` (a golden and several runs).

Generated from the types of :class:`~spectrace.tracer.diff_result.DiffResult` (field types,
Optional as null, list items, nested dataclasses, attribute docs as descriptions) by
:func:`~spectrace.tracer.typed_json.json_schema`. Printed by ``spectrace schema --diff``;
tests validate real diff output against it. Minor additions keep the ``/1`` id (new keys are
allowed); a breaking change bumps it.
"""

from __future__ import annotations

from .diff_result import RUNS_SCHEMA as RUNS_SCHEMA_ID
from .diff_result import SCHEMA as SCHEMA_ID
from .diff_result import DiffResult, RunsResult
from .typed_json import json_schema


def diff_schema() -> dict:
    """The JSON Schema of ``spectrace diff --format json``, generated from the types: a
    ``spectrace.diff/1`` document (two traces), or, for ``diff GOLDEN RUN RUN...``, a
    ``spectrace.diff-runs/1`` document whose ``results`` are ``spectrace.diff/1`` documents
    (referenced as ``#/$defs/diff``)."""
    one = json_schema(DiffResult)
    runs = _with_refs(json_schema(RunsResult), one, {"$ref": "#/$defs/diff"})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "spectrace diff report",
        "$defs": {"diff": one},
        # if/then/else rather than anyOf: an invalid document gets the error of its own kind
        "if": {"required": ["schema"], "properties": {"schema": {"const": RUNS_SCHEMA_ID}}},
        "then": runs,
        "else": {"$ref": "#/$defs/diff"},
    }


def _with_refs(node, target: dict, ref: dict):
    """``node`` with every subtree equal to ``target`` replaced by ``ref``."""
    if node == target:
        return ref
    if isinstance(node, dict):
        return {k: _with_refs(v, target, ref) for k, v in node.items()}
    if isinstance(node, list):
        return [_with_refs(v, target, ref) for v in node]
    return node


SCHEMA: dict = diff_schema()
