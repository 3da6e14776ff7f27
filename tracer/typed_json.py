"""Dataclasses <-> JSON, and the JSON Schema of a dataclass, from the type annotations.

One walk over the annotations serves three jobs: :func:`to_json` writes a dataclass as a
JSON-ready dict (fields in declaration order), :func:`from_json` rebuilds the typed value
from such a dict, and :func:`json_schema` states the same shape as JSON Schema (draft
2020-12). Supported annotations: ``bool``, ``int``, ``float``, ``str``, ``Any``, ``X | None``,
``list[X]``, ``dict[str, X]`` / ``Mapping[str, X]``, ``Literal[...]``, nested dataclasses, and
``Annotated[X, Constraint(...)]`` for bounds, and ``TypedDict`` (a plain dict at run time).
A field with ``metadata={"json": False}`` is left out of all three; one with
``metadata={"omit_none": True}`` (and a default) is left out of the JSON while None and is
optional in the schema. Descriptions come from the
class docstring's ``Attributes:`` section; a dataclass may add schema keywords of its own
with a ``__json_schema_extra__()`` classmethod.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import re
import types
import typing
from typing import Any


@dataclasses.dataclass(frozen=True)
class Constraint:
    """JSON Schema keywords for an ``Annotated`` type, e.g. ``Constraint(minimum=0)``."""

    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None

    def keywords(self) -> dict:
        """The JSON Schema keywords this constraint adds."""
        out = {"minimum": self.minimum, "maximum": self.maximum, "minLength": self.min_length}
        return {k: v for k, v in out.items() if v is not None}


def _fields(cls: type) -> list[tuple[str, Any]]:
    """``(name, annotation)`` of the serialised fields of dataclass ``cls``, in order."""
    hints = _hints(cls)
    return [
        (f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.metadata.get("json", True)
    ]


@functools.cache
def _omissible(cls: type) -> frozenset[str]:
    """Fields of ``cls`` left out of the JSON while None (``metadata={"omit_none": True}``)."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("omit_none"))


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls, include_extras=True)


def _strip(tp: Any) -> tuple[Any, list[Constraint]]:
    """The annotation without ``Annotated`` wrappers, and their constraints."""
    extra: list[Constraint] = []
    while typing.get_origin(tp) is typing.Annotated:
        tp, *meta = typing.get_args(tp)
        extra += [m for m in meta if isinstance(m, Constraint)]
    return tp, extra


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def to_json(value: Any) -> Any:
    """A dataclass (or list/dict/scalar of them) as JSON-ready Python values; dataclass
    fields keep their declaration order, fields marked ``json: False`` are left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        omit = _omissible(type(value))
        return {
            name: to_json(getattr(value, name))
            for name, _ in _fields(type(value))
            if not (name in omit and getattr(value, name) is None)
        }
    if isinstance(value, (list, tuple)):
        return [to_json(x) for x in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(tp: Any, doc: Any) -> Any:
    """Rebuild a value of annotation ``tp`` from :func:`to_json`'s output.

    Raises:
        TypeError: ``doc`` lacks a required dataclass field or holds an unknown one.
        ValueError: a dataclass's own validation refuses a value.
    """
    tp, _ = _strip(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        known = dict(_fields(tp))
        unknown = set(doc) - set(known)
        if unknown:
            raise TypeError(f"{tp.__name__}: unknown keys {sorted(unknown)}")
        return tp(**{k: from_json(known[k], v) for k, v in doc.items()})
    if _is_union(tp):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if doc is None or len(inner) > 1:  # unions of scalars (int | str) stay as parsed
            return doc
        return from_json(inner[0], doc)
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [from_json(item, x) for x in doc]
    if origin in _MAPPINGS:
        _, item = typing.get_args(tp)
        return {k: from_json(item, v) for k, v in doc.items()}
    return doc


_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}
#: ``dict[str, X]`` and ``Mapping[str, X]`` are both JSON objects.
_MAPPINGS = (dict, collections.abc.Mapping)


def json_schema(tp: Any) -> dict:
    """The JSON Schema of annotation ``tp`` (a dataclass: an object whose every serialised
    field is required; additional keys stay allowed, so minor additions keep the id)."""
    tp, extra = _strip(tp)
    out = _schema_of(tp)
    for c in extra:
        out |= c.keywords()
    return out


def _schema_of(tp: Any) -> dict:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _object_schema(tp)
    if typing.is_typeddict(tp):
        return _typeddict_schema(tp)
    if _is_union(tp):
        return _union_schema(typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        values = list(typing.get_args(tp))
        return {"const": values[0]} if len(values) == 1 else {"enum": values}
    if origin is list:
        return {"type": "array", "items": json_schema(typing.get_args(tp)[0])}
    if origin in _MAPPINGS:
        item = typing.get_args(tp)[1]
        return (
            {"type": "object"}
            if item is Any
            else {"type": "object", "additionalProperties": json_schema(item)}
        )
    if tp is Any:
        return {}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    raise TypeError(f"no JSON Schema for {tp!r}")


_SIMPLE = {"type", "minimum", "maximum", "minLength"}


def _union_schema(args: tuple) -> dict:
    """``X | None`` as ``{"type": [x, "null"], ...}``, a union of plain scalars as a type
    list, anything else as ``anyOf``."""
    nullable = type(None) in args
    schemas = [json_schema(a) for a in args if a is not type(None)]
    plain = all(set(x) <= _SIMPLE and isinstance(x.get("type"), str) for x in schemas)
    if plain and (len(schemas) == 1 or all(set(x) == {"type"} for x in schemas)):
        merged = {k: v for x in schemas for k, v in x.items() if k != "type"}
        return merged | {"type": [x["type"] for x in schemas] + (["null"] if nullable else [])}
    return {"anyOf": schemas + ([{"type": "null"}] if nullable else [])}


def _object_schema(cls: type) -> dict:
    docs = attribute_docs(cls)
    props = {}
    for name, tp in _fields(cls):
        props[name] = json_schema(tp)
        if name in docs:
            props[name]["description"] = docs[name]
    omit = _omissible(cls)
    required = [name for name in props if name not in omit]
    out = _described(cls) | {"required": required, "properties": props}
    extra = getattr(cls, "__json_schema_extra__", None)
    return out | extra() if extra else out


def _described(cls: type) -> dict:
    """``{"type": "object"}`` with the first paragraph of ``cls``'s docstring."""
    out: dict = {"type": "object"}
    summary = (cls.__doc__ or "").strip().split("\n\n")[0]
    if summary:
        out["description"] = " ".join(summary.split())
    return out


def _typeddict_schema(cls: type) -> dict:
    """A TypedDict: its keys' schemas; the keys of ``total=False`` parts are optional."""
    hints = _hints(cls)
    props = {name: json_schema(tp) for name, tp in hints.items()}
    required = [name for name in hints if name in getattr(cls, "__required_keys__", ())]
    return _described(cls) | {"required": required, "properties": props}


_ATTR = re.compile(r"^(\s+)([a-z_][a-z0-9_, ]*):\s(.*)$")


def attribute_docs(cls: type) -> dict[str, str]:
    """Per attribute, its text in the ``Attributes:`` section of ``cls``'s docstring
    (``name: text`` or ``a, b: text`` lines, continuation lines indented deeper)."""
    doc = cls.__doc__ or ""
    _, sep, section = doc.partition("Attributes:")
    if not sep:
        return {}
    out: dict[str, str] = {}
    names: list[str] = []
    indent = None
    for line in section.splitlines():
        m = _ATTR.match(line)
        if m and (indent is None or len(m.group(1)) == indent):
            indent = len(m.group(1))
            names = [n.strip() for n in m.group(2).split(",")]
            for n in names:
                out[n] = m.group(3).strip()
        elif (
            line.strip()
            and names
            and indent is not None
            and len(line) - len(line.lstrip()) > indent
        ):
            for n in names:
                out[n] += " " + line.strip()
        elif line.strip():
            break
    return out
