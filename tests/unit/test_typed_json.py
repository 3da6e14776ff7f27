"""Dataclasses <-> JSON and their generated JSON Schema, on small types worked out by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest

from spectrace.tracer.typed_json import Constraint, attribute_docs, from_json, json_schema, to_json


@dataclass
class Inner:
    """A part.

    Attributes:
        n: a count,
            over two lines.
        a, b: two names.
    """

    n: Annotated[int, Constraint(minimum=0)]
    a: str | None
    b: list[int | str]


@dataclass(kw_only=True)
class Outer:
    """The whole."""

    tag: Literal["x/1"] = "x/1"
    parts: list[Inner]
    rate: Annotated[float | None, Constraint(minimum=0, maximum=1)]
    extra: dict[str, int] = field(default_factory=dict)
    hidden: int = field(default=0, metadata={"json": False})


def test_schema_by_hand():
    inner = {
        "type": "object",
        "description": "A part.",
        "required": ["n", "a", "b"],
        "properties": {
            "n": {"type": "integer", "minimum": 0, "description": "a count, over two lines."},
            "a": {"type": ["string", "null"], "description": "two names."},
            "b": {
                "type": "array",
                "items": {"type": ["integer", "string"]},
                "description": "two names.",
            },
        },
    }
    assert json_schema(Outer) == {
        "type": "object",
        "description": "The whole.",
        "required": ["tag", "parts", "rate", "extra"],
        "properties": {
            "tag": {"const": "x/1"},
            "parts": {"type": "array", "items": inner},
            "rate": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
    }


def test_round_trip_keeps_order_and_types():
    value = Outer(parts=[Inner(n=2, a=None, b=[1, "7:x"])], rate=0.5, extra={"q": 3}, hidden=9)
    doc = to_json(value)
    assert doc == {
        "tag": "x/1",
        "parts": [{"n": 2, "a": None, "b": [1, "7:x"]}],
        "rate": 0.5,
        "extra": {"q": 3},
    }
    assert list(doc) == ["tag", "parts", "rate", "extra"]
    back = from_json(Outer, doc)
    assert back == Outer(parts=[Inner(n=2, a=None, b=[1, "7:x"])], rate=0.5, extra={"q": 3})
    assert isinstance(back.parts[0], Inner)


def test_from_json_refuses_missing_and_unknown_keys():
    with pytest.raises(TypeError):
        from_json(Inner, {"n": 1, "a": None})  # b missing
    with pytest.raises(TypeError, match="unknown keys"):
        from_json(Inner, {"n": 1, "a": None, "b": [], "c": 0})


def test_attribute_docs():
    assert attribute_docs(Inner) == {
        "n": "a count, over two lines.",
        "a": "two names.",
        "b": "two names.",
    }
