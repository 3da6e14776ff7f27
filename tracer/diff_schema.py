"""JSON Schema (draft 2020-12) of ``spectrace diff --format json``: ``spectrace.diff/1``.

Printed by ``spectrace schema --diff``; tests validate real diff output against it. Minor
additions keep the ``/1`` id (new keys are allowed); a breaking change bumps it.
"""

from __future__ import annotations

from .findings import KINDS, SEVERITIES

_RATE = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
_COUNT = {"type": "integer", "minimum": 0}
_IDS = {"type": "array", "items": {"type": ["integer", "string"]}}

_ACCEPTANCE = {
    "type": "object",
    "description": "acceptance of a set of blocks; conventions in the top-level key",
    "required": ["blocks", "verified_tokens", "accepted_tokens", "acceptance_rate",
                 "mean_acceptance_length", "per_position"],
    "properties": {
        "blocks": _COUNT, "verified_tokens": _COUNT, "accepted_tokens": _COUNT,
        "acceptance_rate": _RATE,
        "mean_acceptance_length": {"type": ["number", "null"], "minimum": 1},
        "per_position": {"type": "array", "items": _RATE},
    },
}
_BOTH = {"type": "object", "required": ["recorded", "recomputed"],
         "properties": {"recorded": _ACCEPTANCE, "recomputed": _ACCEPTANCE}}
_ENGINE_ACC = {"type": "object", "required": ["matched_content", "all_content"],
               "properties": {"matched_content": _BOTH, "all_content": _BOTH}}
_SIDE = {
    "type": "object",
    "required": ["files", "engine", "method", "k", "status", "requests", "blocks"],
    "properties": {
        "files": {"type": "array", "items": {"type": "string"}},
        "engine": {"type": ["string", "null"]}, "engine_version": {"type": ["string", "null"]},
        "method": {"type": ["string", "null"]}, "k": {"type": ["integer", "null"]},
        "source": {"type": ["string", "null"]},
        "status": {"enum": ["complete", "recording"]},
        "requests": _COUNT, "blocks": _COUNT,
    },
}
_FINDING = {
    "type": "object",
    "required": ["kind", "severity", "message", "side", "request", "position", "slot",
                 "evidence"],
    "properties": {
        "kind": {"enum": list(KINDS)},
        "severity": {"enum": list(SEVERITIES)},
        "message": {"type": "string", "minLength": 1},
        "side": {"enum": ["ours", "theirs", "both"]},
        "request": {"type": ["string", "null"]},
        "position": {"type": ["integer", "null"], "minimum": 0},
        "slot": {"type": ["integer", "null"], "minimum": 0},
        "evidence": {"type": "object"},
    },
}

SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "spectrace.diff/1",
    "title": "spectrace diff report",
    "type": "object",
    "required": ["schema", "diverged", "reasons", "findings", "ours", "theirs", "requests",
                 "coverage", "agreement", "acceptance", "content_divergence", "examples",
                 "conventions"],
    "properties": {
        "schema": {"const": "spectrace.diff/1"},
        "diverged": {"type": "boolean",
                     "description": "true: exit status 1 (an error finding or a differing "
                                    "paired block, or nothing comparable)"},
        "reasons": {"type": "array", "items": {"type": "string"}},
        "findings": {"type": "array", "items": _FINDING,
                     "description": "most severe first; the first error names the bug"},
        "ours": _SIDE, "theirs": _SIDE,
        "requests": {
            "type": "object",
            "required": ["matched", "matched_by", "unmatched_ours", "unmatched_theirs",
                         "content_diverged", "content_unknown"],
            "properties": {
                "matched": _COUNT,
                "matched_by": {"type": "object", "properties": {
                    "prompt": _COUNT, "req_id": _COUNT, "order": _COUNT}},
                "unmatched_ours": {"type": "array", "items": {"type": "string"}},
                "unmatched_theirs": {"type": "array", "items": {"type": "string"}},
                "content_diverged": _COUNT, "content_unknown": _COUNT,
            },
        },
        "coverage": {
            "type": "object",
            "required": ["ours_blocks", "theirs_blocks", "ours_on_matched_content",
                         "theirs_on_matched_content", "paired", "ours_coverage",
                         "theirs_coverage"],
            "properties": {"paired": _COUNT, "ours_coverage": _RATE, "theirs_coverage": _RATE},
        },
        "agreement": {
            "type": "object",
            "required": ["paired_blocks", "anchor_mismatches", "exact_matches",
                         "exact_match_rate", "k_mismatches", "mean_common_prefix",
                         "per_position", "per_position_blocks", "shift_plus_one",
                         "shift_minus_one"],
            "properties": {
                "paired_blocks": _COUNT, "anchor_mismatches": _COUNT, "exact_matches": _COUNT,
                "exact_match_rate": _RATE, "k_mismatches": _COUNT,
                "mean_common_prefix": {"type": ["number", "null"], "minimum": 0},
                "per_position": {"type": "array", "items": _RATE},
                "per_position_blocks": {"type": "array", "items": _COUNT},
                "shift_plus_one": {"type": "array", "items": _RATE},
                "shift_minus_one": {"type": "array", "items": _RATE},
            },
        },
        "acceptance": {"type": "object", "required": ["ours", "theirs"],
                       "properties": {"ours": _ENGINE_ACC, "theirs": _ENGINE_ACC}},
        "content_divergence": {
            "type": "array",
            "items": {"type": "object",
                      "required": ["ours_req", "theirs_req", "position", "prompt_len",
                                   "ours_token", "theirs_token"],
                      "properties": {"position": _COUNT, "prompt_len": _COUNT}},
        },
        "examples": {
            "type": "array",
            "items": {"type": "object",
                      "required": ["ours_req", "theirs_req", "position", "anchor_ours",
                                   "anchor_theirs", "anchor_equal", "ours", "theirs",
                                   "first_differing_slot"],
                      "properties": {"ours": _IDS, "theirs": _IDS, "position": _COUNT}},
        },
        "conventions": {"type": "string"},
    },
}
