"""``spectrace validate``: the full check of trace files (fsck), one file at a time.

Runs the reader's structural checks (:mod:`spectrace.tracer.store.structure`: format version,
/meta types, column ranks and dtypes, equal lengths), then reads every column (which verifies
the fletcher32 checksums the writer stores) and checks value ranges and the cross-column
invariants of :mod:`spectrace.tracer.schema`:

* ``0 <= k <= width(proposed)``; ``num_verified`` is -1 or ``<= k`` and ``<= width(verified)``;
  ``accepted`` is -1 or ``0 <= accepted <= num_verified`` (``<= k`` when verified is unknown);
* ``num_emitted`` is -1 or ``accepted + 1`` where both are known (fewer at the end of the
  request's prompt + output: a request's last block cut at ``max_tokens`` or a stop, as the
  golden and llama-dump importers record what the output shows), and ``<= width(emitted)``;
* ``blocks/request`` indexes a request of the same file (a live file may point past its
  flushed requests); a verified block's ``position`` lies within the request's prompt +
  output when its output ids are known, and no two verified blocks of one request share a
  position; ids are token ids (``>= 0``) or the ``-1`` pad;
* one row per request id in a file (``TraceWriter.request`` keeps one);
* batch rows within the batch, ``proposal_source`` and ``verified_same`` in their sets, phase
  names within the ``names`` attribute.

Each problem is one :class:`~spectrace.tracer.store.structure.Problem` with its first row and
a count. A file that cannot be opened as a spectrace trace raises :class:`InputError`.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from . import schema
from .findings.values import verified_again
from .store import resolve_paths
from .store.block_arrays import same_rows
from .store.reader import open_h5
from .store.structure import (
    Problem,
    accepted_problems,
    column_problems,
    format_version,
    is_complete,
    length_problems,
    phase_names,
    read_meta,
    request_index_problems,
    text_problems,
    too_wide,
)


def validate_file(path: Path) -> list[Problem]:
    """Every problem of one trace file (empty when it is valid).

    Raises:
        InputError: missing file, a directory, not HDF5, not a spectrace trace or an
            unsupported major version (nothing to check).
    """
    f = open_h5(path)
    with f:
        try:
            return _validate_open(str(path), f)
        except (KeyError, RuntimeError, TypeError, ValueError) as exc:  # damaged headers
            return [Problem(str(path), "/", f"damaged trace file ({_short(exc)})")]


def validate(spec: str | list[str]) -> list[tuple[Path, list[Problem]]]:
    """Validate every file of ``spec`` (files, globs; see ``resolve_paths``), each once (the
    files are checked one at a time, not read as one trace: a file given twice is no error).

    Returns:
        ``(path, problems)`` per file, in order.
    Raises:
        InputError: a path or glob that matches nothing.
    """
    specs = [spec] if isinstance(spec, str) else spec
    paths: dict[Path, Path] = {}
    for item in specs:
        for p in resolve_paths(item):
            paths.setdefault(p.resolve(), p)
    return [(p, validate_file(p)) for p in paths.values()]


def _validate_open(path: str, f: h5py.File) -> list[Problem]:
    _, problems = format_version(path, f)
    if problems:
        raise problems[0].error()
    meta, problems = read_meta(path, f)
    structural = column_problems(path, f)
    problems += structural
    if structural:
        return problems  # columns of the wrong shape or type: their values mean nothing
    complete = is_complete(path, f)
    status = f.attrs.get("status")
    status = status.decode() if isinstance(status, bytes) else status
    if status not in (schema.STATUS_RECORDING, schema.STATUS_COMPLETE):
        # the reader takes it for a file still being written (capture_incomplete)
        what = "unknown file status (expected recording or complete)"
        problems.append(Problem(path, "status", what, status))
    if complete:
        problems += length_problems(path, f)
    tables: dict[str, dict[str, np.ndarray]] = {}
    unreadable: list[Problem] = []
    for table, cols in schema.TABLES.items():
        tables[table], bad = _read_table(path, f[table], table, cols)
        unreadable += bad
    problems += unreadable
    if unreadable:
        return problems
    problems += _block_problems(path, tables["blocks"], tables["requests"], complete, meta)
    problems += _request_problems(path, tables["requests"])
    problems += _phase_problems(path, f["phases"], tables["phases"])
    return problems


def _read_table(
    path: str, g: h5py.Group, table: str, cols: tuple[schema.Column, ...]
) -> tuple[dict[str, np.ndarray], list[Problem]]:
    """Every present column of a table cut to its shortest column (reads verify checksums)."""
    present = [c for c in cols if c.name in g]
    n = min((g[c.name].shape[0] for c in present), default=0)
    out, problems = {}, []
    for c in present:
        try:
            out[c.name] = g[c.name][:n]
        except (OSError, RuntimeError, ValueError) as exc:
            what = f"unreadable data (checksum or filter failure: {_short(exc)})"
            problems.append(Problem(path, f"{table}/{c.name}", what))
    return out, problems


def _block_problems(
    path: str, b: dict[str, np.ndarray], req: dict[str, np.ndarray], complete: bool, meta: dict
) -> list[Problem]:
    nreq = len(req["req_id"])
    problems = request_index_problems(path, b["request"], nreq, complete)
    problems += accepted_problems(path, b["accepted"], b["num_verified"])
    width = {name: b[name].shape[1] for name in ("proposed", "verified", "emitted")}
    k, nv, acc, ne = b["k"], b["num_verified"], b["accepted"], b["num_emitted"]
    known_v, known_a, known_e = nv >= 0, acc >= 0, ne >= 0
    seq, _ = _sequence_lengths(b, req, nreq)
    cut = (seq >= 0) & (b["position"].astype(np.int64) + ne == seq - 1) & (ne <= acc)
    checks: list[tuple[str, str, np.ndarray, np.ndarray]] = [
        ("blocks/k", f"k outside [0, width of proposed = {width['proposed']}]", k,
         (k < 0) | (k > width["proposed"])),
        ("blocks/num_verified", "num_verified > k", nv, known_v & (nv > k)),
        ("blocks/num_verified", f"num_verified > width of verified = {width['verified']}",
         nv, nv > width["verified"]),
        ("blocks/num_verified", "num_verified below -1", nv, nv < -1),
        ("blocks/accepted", "accepted below -1", acc, acc < -1),
        ("blocks/accepted", "accepted > k", acc, known_a & ~known_v & (acc > k)),
        ("blocks/num_emitted", "num_emitted below -1", ne, ne < -1),
        ("blocks/num_emitted", "num_emitted != accepted + 1", ne,
         known_e & known_a & (ne != acc.astype(np.int32) + 1) & ~cut),
        ("blocks/num_emitted", f"num_emitted > width of emitted = {width['emitted']}",
         ne, ne > width["emitted"]),
        ("blocks/position", "negative position", b["position"], b["position"] < 0),
        ("blocks/step", "negative step", b["step"], b["step"] < 0),
        ("blocks/t_ns", "negative time (ns since the epoch; 0 is unknown)", b["t_ns"],
         b["t_ns"] < 0),
        ("blocks/anchor", "token id below the -1 pad", b["anchor"], b["anchor"] < -1),
    ]  # fmt: skip
    for name in ("proposed", "verified", "emitted"):
        checks.append((f"blocks/{name}", "token id below the -1 pad", b[name], b[name] < -1))
    what = "emitted ids are not the accepted verified ids (emitted[:accepted])"
    checks.append(("blocks/emitted", what, acc, _emitted_contradicts(b)))
    if "batch_size" in b and "batch_row" in b:  # optional columns, each on its own
        row, size = b["batch_row"], b["batch_size"]
        bad = (row < -1) | (size < -1) | ((row >= 0) & (size >= 0) & (row >= size))
        checks.append(("blocks/batch_row", "batch_row outside the batch", row, bad))
    if "proposal_source" in b:
        src = b["proposal_source"]
        checks.append(("blocks/proposal_source", "not -1, 0 or 1", src, (src < -1) | (src > 1)))
    for name in ("draft_margin", "target_margin"):
        if name in b:
            what = "finite value beyond the float32 range"
            checks.append((f"blocks/{name}", what, b[name], too_wide(b[name])))
            # top-1 minus top-2 is never below 0 (+inf is real: every other logit masked)
            what = "negative margin (top-1 minus top-2 logit is at least 0)"
            checks.append((f"blocks/{name}", what, b[name], b[name] < 0))
    if "verified_same" in b:
        same = b["verified_same"]
        checks.append(("blocks/verified_same", "not 0 or 1", same, (same < 0) | (same > 1)))
        # check and diff trust the column (it spares them the verified matrix): prove it.
        equal = same_rows(b["proposed"], b["verified"])
        lie = ((same == 1) & ~equal) | ((same == 0) & equal)
        what = "verified_same contradicts verified and proposed (1: the rows are equal)"
        checks.append(("blocks/verified_same", what, same, lie))
    problems += [_rows(path, field, what, v, bad) for field, what, v, bad in checks if bad.any()]
    problems += _position_problems(path, b, req, nreq)
    return problems


def _emitted_contradicts(b: dict[str, np.ndarray]) -> np.ndarray:
    """bool [n]: a slot ``j < min(accepted, num_emitted)`` whose emitted id is not the
    verified id there (the accepted drafts are what the step emitted, before its bonus
    token; vLLM ``RejectionSampler``'s output), where both are recorded."""
    acc, ne = b["accepted"].astype(np.int64), b["num_emitted"].astype(np.int64)
    upto = np.minimum(acc, ne)
    ver, emit = b["verified"], b["emitted"]
    bad = np.zeros(len(acc), bool)
    for j in range(min(ver.shape[1], emit.shape[1])):
        live = (upto > j) & (ver[:, j] >= 0) & (emit[:, j] >= 0)
        bad |= live & (ver[:, j] != emit[:, j])
    return bad


def _position_problems(
    path: str, b: dict[str, np.ndarray], req: dict[str, np.ndarray], nreq: int
) -> list[Problem]:
    """Anchors of verified blocks past the end of their request's prompt + output (output
    known). An unverified block may lie past it: vLLM drafts for a request in the step
    that finishes it, and the returned output is trimmed at stop/max_tokens. Anchors inside
    the prompt (prompt known), before its last token: a block drafts from the last verified
    token, at the earliest the last prompt token (every engine and importer anchors the
    first block on the first output token, at ``len(prompt)``). A second verified block at
    one request position (``findings.values.verified_again``): no engine verifies from an
    anchor twice."""
    seq, prompt = _sequence_lengths(b, req, nreq)
    pos = b["position"]
    past = (seq >= 0) & (b["num_verified"] >= 0) & (pos >= seq)
    before = pos < prompt - 1
    again = verified_again(b["request"], pos, b["num_verified"], b["accepted"])
    out = []
    if again.any():
        what = "a second verified block at one request position (a record written twice?)"
        out.append(_rows(path, "blocks/position", what, pos, again))
    if past.any():
        what = "verified block's position past the end of the request's prompt + output"
        out.append(_rows(path, "blocks/position", what, pos, past))
    if before.any():
        what = "position inside the prompt (before its last token, len(prompt) - 1)"
        out.append(_rows(path, "blocks/position", what, pos, before))
    return out


def _sequence_lengths(
    b: dict[str, np.ndarray], req: dict[str, np.ndarray], nreq: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per block (int64 [n]): its request's prompt + output length (-1: output unknown or
    request out of range) and prompt length (0 when out of range)."""
    r = b["request"]
    ok = (r >= 0) & (r < nreq)
    pairs = list(zip(req["prompt_ids"], req["output_ids"]))
    lengths = np.array([len(p) + len(o) if len(o) else -1 for p, o in pairs], np.int64)
    prompts = np.array([len(p) for p, _ in pairs], np.int64)
    seq, prompt = np.full(len(r), -1, np.int64), np.zeros(len(r), np.int64)
    seq[ok], prompt[ok] = lengths[r[ok]], prompts[r[ok]]
    return seq, prompt


def _request_problems(path: str, req: dict[str, np.ndarray]) -> list[Problem]:
    problems = []
    for name in ("req_id", "finish_reason"):
        problems += text_problems(path, f"requests/{name}", req[name].tolist())
    # One row per request id (TraceWriter.request keeps one): a second row of an id is
    # another request under its name (two runs in one file, or a copied row).
    ids = req["req_id"].tolist()
    first_row: dict[object, int] = {}
    again = [i for i, x in enumerate(ids) if first_row.setdefault(x, i) != i]
    if again:
        rid = ids[again[0]]
        shown = rid.decode(errors="replace") if isinstance(rid, bytes) else str(rid)
        what = "a request id on a second row (one row per request)"
        problems.append(Problem(path, "requests/req_id", what, shown, again[0], len(again)))
    for name in ("prompt_ids", "output_ids"):
        bad = np.array([bool(len(x)) and bool((x < 0).any()) for x in req[name]], dtype=bool)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            value = int(req[name][i][req[name][i] < 0][0])
            what = "negative token id"
            problems.append(Problem(path, f"requests/{name}", what, value, i, int(bad.sum())))
    return problems


def _phase_problems(path: str, g: h5py.Group, ph: dict[str, np.ndarray]) -> list[Problem]:
    names, problems = phase_names(path, g)
    if problems:
        return problems
    code = ph["name"]
    checks = [
        ("phases/name", f"name code outside the {len(names)} names", code,
         (code < 0) | (code >= len(names))),
        ("phases/ms", "not a finite duration", ph["ms"], ~np.isfinite(ph["ms"])),
        ("phases/level", "negative level", ph["level"], ph["level"] < 0),
    ]  # fmt: skip
    return [_rows(path, field, what, v, bad) for field, what, v, bad in checks if bad.any()]


def _rows(path: str, field: str, what: str, values: np.ndarray, bad: np.ndarray) -> Problem:
    """One problem for the rows where ``bad`` holds: the first row, its value and a count."""
    rows = np.flatnonzero(bad.reshape(len(bad), -1).any(axis=1))
    first = values[rows[0]]
    value = first.tolist() if isinstance(first, np.ndarray) else first.item()
    return Problem(path, field, what, value, int(rows[0]), int(rows.size))


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()
    return text[0][:120] if text else type(exc).__name__
