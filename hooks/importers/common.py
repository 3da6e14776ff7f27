"""What the file importers share: counted problems with their first location, JSON with line
numbers, and writing one trace that a failed import leaves no ``.partial`` of.

Every importer is lenient by default: a problem is counted per class with its first
``FILE:LINE`` and one sentence, and the import goes on; with ``strict`` the first problem
raises :class:`~spectrace.tracer.errors.ParseError` as ``FILE:LINE: what (field=..,
value=..)`` (the CLI prints it as one ``spectrace: error:`` line, exit 2).
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from json.decoder import JSONObject  # type: ignore[attr-defined]
from json.scanner import py_make_scanner  # type: ignore[attr-defined]
from pathlib import Path

from spectrace.hooks.vt.importer import discard_failed, new_writer
from spectrace.tracer.errors import InputError, ParseError
from spectrace.tracer.store import TraceWriter

#: Token ids are int32 in the trace: a larger id is a problem, never clamped.
ID_MAX = 2**31 - 1


class Located(dict):
    """A JSON object that knows the line its ``{`` is on (1-based)."""

    line: int = 0


@dataclass
class Problem:
    """One class of problem: how often it occurred and where it first did."""

    count: int
    where: str
    what: str


@dataclass
class Problems:
    """Counted problems of one import, by class (``anchor_mismatch``, ``bad_json``, ...).

    Attributes:
        source: the input's name, used in every location (``FILE:LINE``).
        strict: raise on the first problem instead of counting it.
        classes: class -> :class:`Problem`, in the order first seen.
    """

    source: str
    strict: bool = False
    classes: dict[str, Problem] = field(default_factory=dict)

    def add(
        self,
        cls: str,
        line: int | Callable[[], int],
        what: str,
        fld: str | None = None,
        value: object = None,
    ) -> None:
        """Count one problem of class ``cls`` at ``line`` of the source (an int, or a
        function computing it: called only for the first problem of a class).

        Raises:
            ParseError: in strict mode, ``FILE:LINE: what (field=.., value=..)``.
        """
        hit = self.classes.get(cls)
        if hit is not None and not self.strict:
            hit.count += 1
            return
        detail = f" (field={fld}, value={value!r})" if fld is not None else ""
        where = f"{self.source}:{line() if callable(line) else line}"
        if self.strict:
            raise ParseError(f"{where}: {what}{detail}")
        self.classes[cls] = Problem(1, where, f"{what}{detail}")

    @property
    def total(self) -> int:
        """Problems counted over every class."""
        return sum(p.count for p in self.classes.values())

    def lines(self) -> list[str]:
        """One line per class: ``N CLASS (first at FILE:LINE: what)``."""
        return [f"{p.count} {c} (first at {p.where}: {p.what})" for c, p in self.classes.items()]

    def first_of(self, classes: tuple[str, ...]) -> str | None:
        """``FILE:LINE: what`` of the problem of ``classes`` on the earliest line (each
        class keeps its first), or None when none of them occurred."""
        hits = [p for c, p in self.classes.items() if c in classes]
        first = min(hits, key=lambda p: int(p.where.rsplit(":", 1)[1]), default=None)
        return f"{first.where}: {first.what}" if first else None

    def to_meta(self) -> dict:
        """``{class: {"count", "first", "what"}}``, JSON-ready (in ``meta["import"]``)."""
        return {
            c: {"count": p.count, "first": p.where, "what": p.what} for c, p in self.classes.items()
        }


def read_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of an input file.

    Raises:
        InputError: missing, unreadable, empty or binary (``what`` names the kind of file).
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} ({exc})") from None
    if not data.strip():
        raise InputError(f"{path}: empty {what}")
    if b"\x00" in data:
        raise InputError(f"{path}: binary file, not a {what}")
    return data.decode("utf-8", errors="replace")


class JsonLines:
    """The line numbers of a JSON document's objects, found only when first asked for (the
    pure-Python parse that records them is about ten times slower than ``json.loads``).

    Raises (from :meth:`line`): InputError as :func:`load_located_json`.
    """

    def __init__(self, text: str, source: str) -> None:
        self._text, self._source = text, source
        self._doc: object = None

    def line(self, *path: str | int) -> int:
        """The line of the object at ``path`` (keys and indexes from the root); where there
        is no object there (a number in place of a record), the line of the nearest object
        around it; 0 when the document is no object."""
        if self._doc is None:
            self._doc = load_located_json(self._text, self._source)
        node, line = self._doc, 0
        for key in path:
            if isinstance(node, Located):
                line = node.line
            try:
                node = node[key]  # type: ignore[index]
            except (KeyError, IndexError, TypeError):
                return line
        return node.line if isinstance(node, Located) else line


def load_json(text: str, source: str) -> object:
    """Parse one JSON document (the fast parser).

    Raises:
        InputError: ``FILE:LINE: not JSON (...)``.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}:{exc.lineno}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{source}: JSON nested too deeply") from None


def load_located_json(text: str, source: str) -> object:
    """Parse one JSON document; every object comes back as a :class:`Located` dict.

    Raises:
        InputError: ``FILE:LINE: not JSON (...)``.
    """
    newlines = [i for i, ch in enumerate(text) if ch == "\n"]
    decoder = json.JSONDecoder()

    def parse_object(s_and_end, *args):
        start = s_and_end[1] - 1
        obj, end = JSONObject(s_and_end, *args)
        out = Located(obj)
        out.line = bisect.bisect_right(newlines, start) + 1
        return out, end

    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    # the C scanner ignores parse_object
    decoder.scan_once = py_make_scanner(decoder)  # type: ignore[attr-defined]
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}:{exc.lineno}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{source}: JSON nested too deeply") from None


def jsonl_objects(text: str, source: str, problems: Problems) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of each non-blank line of a JSONL text; a line that is not
    a JSON object is a ``bad_json`` problem (skipped)."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            problems.add("bad_json", n, f"not JSON ({exc})")
            continue
        if not isinstance(obj, dict):
            problems.add("bad_json", n, "not a JSON object", "line", type(obj).__name__)
            continue
        yield n, obj


def is_int(v: object, lo: int = 0, hi: int = ID_MAX) -> bool:
    """``v`` is a JSON integer (not a bool) within ``[lo, hi]``."""
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def id_list(v: object) -> list[int] | None:
    """``v`` as a list of token ids (ints in int32), or None when it is not one."""
    if not isinstance(v, list) or not all(is_int(t) for t in v):
        return None
    return v


def write_trace(out: str | os.PathLike, meta: dict, fill: Callable[[TraceWriter], dict]) -> None:
    """Write one trace: ``fill(writer)`` records it and returns /meta items to merge last.

    A failure inside ``fill`` removes the ``.partial`` file (the message says so); an
    interrupt keeps it (every block recorded so far) and re-raises.

    Raises:
        InputError / ParseError: from ``fill``, with `` (partial trace FILE removed)``.
    """
    writer = new_writer(out, meta, flush_interval=0)
    try:
        writer.update_meta(**fill(writer))
        writer.close()  # its last flush writes the blocks: a failure there is a failure
    except Exception as exc:
        raise discard_failed(writer, exc) from None
    except BaseException:
        writer.close(complete=False)
        raise
