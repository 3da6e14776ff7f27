"""The findings vocabulary: kinds, their evidence types, JSON and the generated schema."""

from __future__ import annotations

import jsonschema
import pytest

from spectrace.tracer.findings import KINDS, Finding, sort_findings
from spectrace.tracer.findings.evidence import EVIDENCE
from spectrace.tracer.typed_json import json_schema


def _k_mismatch(**evidence) -> Finding:
    return Finding(
        "k_mismatch", "error", "k differs", side="ours", request="r", position=4, evidence=evidence
    )


def test_every_kind_has_an_evidence_type():
    assert list(EVIDENCE) == list(KINDS)


def test_finding_json_round_trip_and_validation():
    f = _k_mismatch(blocks=3, typical_difference=-1, ours_k=[3], theirs_k=[4])
    doc = f.to_json()
    assert doc == {
        "kind": "k_mismatch",
        "severity": "error",
        "message": "k differs",
        "side": "ours",
        "request": "r",
        "position": 4,
        "slot": None,
        "evidence": {"blocks": 3, "typical_difference": -1, "ours_k": [3], "theirs_k": [4]},
    }
    assert Finding.from_json(doc) == f
    with pytest.raises(ValueError):
        Finding.from_json(doc | {"side": "neither"})


def test_schema_checks_the_evidence_of_the_kind():
    schema = json_schema(Finding)
    good = _k_mismatch(blocks=3, typical_difference=-1, ours_k=[3], theirs_k=[4]).to_json()
    jsonschema.validate(good, schema)
    missing = _k_mismatch(blocks=3, ours_k=[3], theirs_k=[4]).to_json()
    with pytest.raises(jsonschema.ValidationError, match="typical_difference"):
        jsonschema.validate(missing, schema)
    wrong = _k_mismatch(blocks="3", typical_difference=-1, ours_k=[3], theirs_k=[4]).to_json()
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good | {"position": -1}, schema)


def test_sort_findings_by_severity_kind_position():
    w = Finding("draft_mismatch", "warning", "w", position=1)
    e_late = Finding("draft_mismatch", "error", "e", position=9)
    e_kind = Finding("layout_shift", "error", "l", position=50)
    e_none = Finding("draft_mismatch", "error", "n")
    # layout_shift precedes draft_mismatch in KINDS; no position sorts first (-1).
    assert sort_findings([w, e_late, e_kind, e_none]) == [e_kind, e_none, e_late, w]
