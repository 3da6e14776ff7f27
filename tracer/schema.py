"""The spectrace trace store schema, version 1: the single definition.

Writers (:mod:`spectrace.tracer.store`), readers and ``spectrace schema`` all read this module;
nothing else spells out a dataset name or dtype. Layout (one HDF5 file per engine process)::

    /                 attrs: format, format_version, status, writer, created_utc
    /meta             scalar UTF-8 string: one JSON document (see META_KEYS)
    /requests/<col>   one row per request (REQUEST_COLUMNS)
    /blocks/<col>     one row per draft block (BLOCK_COLUMNS)
    /phases/<col>     one row per recorded per-step timing (PHASE_COLUMNS); names in attr ``names``

Every table is a group of equal-length, chunked, unlimited-length datasets. Draft matrices are
fixed width with a ``-1`` sentinel; their width grows (resize of axis 1) when a wider block
arrives. Minor versions only add optional columns; readers ignore columns they do not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

FORMAT = "spectrace.trace"
FORMAT_VERSION = "1.2"
MAJOR_VERSION = 1

#: File status attribute values. ``recording`` stays when a writer died before ``close()``.
STATUS_RECORDING: Final = "recording"
STATUS_COMPLETE: Final = "complete"
#: A trace's status: every file closed cleanly, or a writer had not closed one.
Status = Literal["complete", "recording"]

#: Suffix of a file that is still being written (renamed away on clean close).
PARTIAL_SUFFIX = ".partial"

#: Sentinel for "no id" in padded draft matrices and "unknown" in count columns.
PAD = -1


def pad_to(mat: np.ndarray, w: int, fill: int | float = PAD) -> np.ndarray:
    """``mat`` [n, m] cut or padded with ``fill`` to ``w`` columns (no copy when m >= w)."""
    if mat.shape[1] >= w:
        return mat[:, :w]
    return np.pad(mat, ((0, 0), (0, w - mat.shape[1])), constant_values=fill)


@dataclass(frozen=True)
class Column:
    """One column of a table.

    ``width`` is ``None`` for a 1-D column, ``"k"`` for a ``[n, kmax]`` draft matrix and
    ``"k+1"`` for a ``[n, kmax+1]`` emitted matrix. ``vlen`` marks a ragged column (one
    variable-length array per row); ``str`` dtype means a UTF-8 variable-length string.
    """

    name: str
    dtype: str
    doc: str
    width: str | None = None
    vlen: bool = False
    fill: int | float = 0
    #: Optional columns (minor-version additions) may be absent; readers fill them.
    optional: bool = False
    #: Computed by the writer from other columns (callers never pass it).
    derived: bool = False

    @property
    def np_dtype(self) -> np.dtype:
        """The numpy dtype of one element (``object`` for strings)."""
        return np.dtype(object) if self.dtype == "str" else np.dtype(self.dtype)


REQUEST_COLUMNS: tuple[Column, ...] = (
    Column("req_id", "str", "engine request id (internal vLLM ids keep their suffix)"),
    Column("prompt_ids", "int32", "prompt token ids (ragged; empty when unknown)", vlen=True),
    Column(
        "output_ids",
        "int32",
        "output token ids as returned to the user, trimmed at "
        "stop/max_tokens (ragged; empty when unknown)",
        vlen=True,
    ),
    Column("finish_reason", "str", "length | stop | abort | unfinished | '' when unknown"),
)

BLOCK_COLUMNS: tuple[Column, ...] = (
    Column("request", "int32", "row index into /requests"),
    Column("step", "int32", "engine step that proposed this block (0-based, per process)"),
    Column("position", "int32", "absolute index of the anchor in prompt + output (tokens)"),
    Column("anchor", "int32", "anchor token id (the last verified / bonus token)"),
    Column("k", "int16", "number of proposed ids in this block (may be < configured k)"),
    Column(
        "proposed",
        "int32",
        "ids the drafter proposed, for positions position+1..; -1 pad",
        width="k",
        fill=PAD,
    ),
    Column("num_verified", "int16", "number of drafts the target verified; -1 unknown", fill=PAD),
    Column("verified", "int32", "ids the target actually consumed; -1 pad", width="k", fill=PAD),
    Column("accepted", "int16", "accepted drafts as recorded by the engine; -1 unknown", fill=PAD),
    Column(
        "num_emitted",
        "int16",
        "tokens the target emitted in this block (accepted + 1 bonus/correction); -1 unknown",
        fill=PAD,
    ),
    Column("emitted", "int32", "emitted ids; -1 pad", width="k+1", fill=PAD),
    Column("t_ns", "int64", "wall-clock time the block was recorded (ns since the epoch)"),
    Column(
        "batch_row",
        "int16",
        "row of the request in the proposing step's batch; -1 unknown",
        fill=PAD,
        optional=True,
    ),
    Column(
        "batch_size",
        "int16",
        "rows in the proposing step's batch; -1 unknown",
        fill=PAD,
        optional=True,
    ),
    Column(
        "proposal_source",
        "int8",
        "where `proposed` comes from: 1 the drafter's output, "
        "0 a copy of `verified` (the engine printed no proposal), -1 unknown",
        fill=PAD,
        optional=True,
    ),
    Column(
        "draft_margin",
        "float32",
        "drafter's top-1 minus top-2 logit (or log-probability) per slot, the confidence "
        "of each proposed id; NaN unknown (1.2)",
        width="k",
        fill=float("nan"),
        optional=True,
    ),
    Column(
        "target_margin",
        "float32",
        "target's top-1 minus top-2 logit where it sampled the anchor; NaN unknown (1.2)",
        fill=float("nan"),
        optional=True,
    ),
    Column(
        "verified_same",
        "int8",
        "1 when the stored `verified` row equals the `proposed` "
        "row slot for slot (-1 pads included), else 0; written by the store itself so "
        "that readers can skip reading `verified` (1.1)",
        optional=True,
        derived=True,
    ),
)

#: ``/meta`` ``source`` of a trace written by ``spectrace replay`` (one block per position).
SOURCE_REPLAY = "replay"

#: Values of the ``proposal_source`` block column.
PROPOSAL_FROM_DRAFTER = 1
PROPOSAL_COPIED_FROM_VERIFIED = 0

PHASE_COLUMNS: tuple[Column, ...] = (
    Column("step", "int32", "engine step the timing belongs to"),
    Column("name", "int16", "index into the table's `names` attribute (e.g. backbone)"),
    Column("ms", "float32", "duration in milliseconds"),
    Column("level", "int8", "trace level that produced it (1: host enqueue time, 2+: synced)"),
)

TABLES: dict[str, tuple[Column, ...]] = {
    "requests": REQUEST_COLUMNS,
    "blocks": BLOCK_COLUMNS,
    "phases": PHASE_COLUMNS,
}

#: Keys of the /meta JSON document. All optional; unknown keys are kept and shown as is.
META_KEYS: dict[str, str] = {
    "engine": "engine name (vllm, vllm.cpp, spectrace-reference)",
    "engine_version": "engine version string",
    "engine_commit": "engine commit, if known",
    "backends": "object: backend name -> version (torch, FlashInfer, ...)",
    "method": "dspark | dflash | eagle3 | mtp | draft_model | ngram | ...",
    "k": "num_speculative_tokens as configured",
    "layout": "object: sample_from_anchor, query slots per request",
    "draft_vocab_size": "draft vocabulary size, if reduced",
    "d2t": "true when a draft-to-target id mapping is applied",
    "target_model": "target model path or id",
    "draft_model": "draft model path or id",
    "tokenizer": "tokenizer path (a directory or tokenizer.json)",
    "sampling": "object: temperature, top_p, seed, penalties as applied",
    "max_num_seqs": "engine batch limit",
    "tp_rank / tp_size / dp_rank": "ranks of the writing process",
    "source": "vllm-hook | vt_spec_trace | reference | replay (written by `spectrace replay`)",
    "replay": 'object (replay traces): {"reference": path, "engine": reference|vllm|cmd, '
    '"positions": all|blocks|N, "sites": int, "anchor_mismatches": int, '
    '"first_anchor_mismatch": {"request", "position"} | null}',
    "trace_level": "VT_SPEC_TRACE level or hook level",
    "command": "command line that produced the trace",
    "import": "object: parser statistics (lines, malformed line numbers, ...); "
    "requests_check: how the requests file matched the log (missing, unmatched, short)",
    "checks": "object: cross-checks against the engine's own counters",
    "capture": 'object: how the captured command ended: {"ended": CAPTURE_END value or '
    'null, "exit_status": int|null, "signal": int|null, "timeout_s"?, "error"?}',
    "exit_status": "captured command's exit status (128+N: signal N); kept for older readers",
    "killed_by_signal": "signal number that killed the captured command; kept for older readers",
    "interrupted": "true when spectrace forwarded a Ctrl-C/SIGTERM; kept for older readers",
    "requests_error": "why the requests file of a capture could not be used",
    "aborted": "what stopped a capture early when its .partial file was kept",
}

#: ``meta["capture"]["ended"]`` values (written by ``spectrace capture`` / ``capture vllm``):
#: ``clean`` exit 0; ``engine-exit`` nonzero exit (``exit_status``); ``engine-signal`` the
#: command was killed by signal ``signal`` (not forwarded by spectrace); ``interrupted``
#: spectrace got SIGINT/SIGTERM (``signal``) and forwarded it; ``timeout`` ``capture vllm
#: --timeout`` stopped it (``signal``: the last signal sent); ``capture-failed`` spectrace
#: stopped it (strict parse error or a bug; ``error``); None while recording, so a file left
#: with status ``recording`` and ``ended`` None comes from a capture that was killed itself
#: (or still runs): ``capture-killed`` is what :func:`capture_end` reports for it.
CAPTURE_END = (
    "clean",
    "engine-exit",
    "engine-signal",
    "interrupted",
    "timeout",
    "capture-failed",
    "capture-killed",
)


def capture_end(meta: dict, status: str = STATUS_COMPLETE) -> dict | None:
    """How a captured command ended, from /meta (also for traces of older writers).

    Args:
        meta: the /meta document; ``status`` the file status (``recording`` for a .partial).
    Returns:
        ``{"ended": one of CAPTURE_END, "exit_status": int | None, "signal": int | None}``
        (plus ``timeout_s`` / ``error`` when recorded), or None for a trace that was not
        captured (an import, the vLLM plugin without ``capture vllm``).
    """
    cap = meta.get("capture")
    if isinstance(cap, dict):
        out = dict(cap)
        # A file never closed was not a clean capture, whatever /meta says: the supervisor
        # writes ``capture`` before the writer's close, which a kill can fall between.
        if out.get("ended") in (None, "clean") and status == STATUS_RECORDING:
            out["ended"] = "capture-killed"
        return out
    if "exit_status" not in meta:
        return None
    code, sig = meta.get("exit_status"), meta.get("killed_by_signal")
    if meta.get("interrupted"):
        ended = "interrupted"
    elif sig is not None:
        ended = "engine-signal"
    elif code is None:
        ended = "capture-killed" if status == STATUS_RECORDING else "capture-failed"
    else:
        ended = "clean" if code == 0 else "engine-exit"
    if ended == "clean" and status == STATUS_RECORDING:
        ended = "capture-killed"
    return {"ended": ended, "exit_status": code, "signal": sig}


#: JSON types of the /meta keys that code reads (``None`` is always allowed: unknown). Other
#: keys keep any JSON value. ``"int"`` excludes booleans; ``"object"`` is a JSON object.
META_TYPES: dict[str, tuple[str, ...]] = {
    "engine": ("str",),
    "engine_version": ("str",),
    "method": ("str",),
    "source": ("str",),
    "k": ("int",),
    "tp_rank": ("int",),
    "tp_size": ("int",),
    "dp_rank": ("int",),
    "max_num_seqs": ("int",),
    "vocab_size": ("int",),
    "draft_vocab_size": ("int",),
    "d2t": ("bool",),
    "trace_level": ("int", "str"),
    "target_model": ("str",),
    "draft_model": ("str",),
    "tokenizer": ("str",),
    "command": ("str", "list"),
    "backends": ("object",),
    "layout": ("object",),
    "sampling": ("object",),
    "import": ("object",),
    "checks": ("object",),
    "replay": ("object",),
    "capture": ("object",),
    # the older capture items (hooks/child.py), read by findings/capture.py capture_end:
    # "false" is truthy and 0.5 no exit status, so a wrong type would flip the verdict
    "exit_status": ("int",),
    "killed_by_signal": ("int",),
    "interrupted": ("bool",),
    "aborted": ("str",),
}

#: The smallest valid value of the /meta integers that count or index something (a rank
#: below 0 names no process: ``hooks.vllm.common.dp_rank_of`` never gives one).
META_MINIMUM: dict[str, int] = {"k": 0, "tp_rank": 0, "tp_size": 1, "dp_rank": 0,
                                "vocab_size": 1, "draft_vocab_size": 1, "max_num_seqs": 1,
                                "exit_status": 0, "killed_by_signal": 1}  # fmt: skip

#: The largest valid value of the /meta integers that size something. ``k`` is vLLM's
#: ``num_speculative_tokens``: a handful in practice (EAGLE, MTP, n-gram and block drafters
#: are run with 1 to about 16), and every draft matrix of the trace is k wide in every block
#: row, so a k far past any drafter (``--meta k=40000`` built 40000-wide columns, 1.3 GB for
#: a 139-block log; one past int64 broke HDF5's chunking and the k-size detector) is a typo,
#: not a config. 1024 is 64x the widest of those and keeps one matrix row at 4 KiB.
#: Ranks and sizes are int32 wherever they land (the exported tables, vLLM's own config), so
#: a rank past that is damage, not a deployment; so is a vocabulary past int32 token ids.
#: An exit status is 0..255 and a signal 1..255 (POSIX wait status).
META_MAXIMUM: dict[str, int] = {"k": 1024, "tp_rank": 2**31 - 1, "tp_size": 2**31 - 1,
                                "dp_rank": 2**31 - 1, "vocab_size": 2**31 - 1,
                                "draft_vocab_size": 2**31 - 1, "max_num_seqs": 2**31 - 1,
                                "exit_status": 255, "killed_by_signal": 255}  # fmt: skip

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "list": (list,),
    "object": (dict,),
}


_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "bool": "true or false",
    "list": "a JSON list",
    "object": "a JSON object",
}


def meta_type_error(key: str, value: object) -> str | None:
    """Why ``value`` is not a valid /meta ``key`` (``"expected an int"``, an integer outside
    :data:`META_MINIMUM` .. :data:`META_MAXIMUM`), or None when it is (keys outside
    :data:`META_TYPES` take any value; ``None`` means unknown)."""
    kinds = META_TYPES.get(key)
    if kinds is None or value is None:
        return None
    for kind in kinds:
        if isinstance(value, _JSON_TYPES[kind]) and (kind == "bool" or not isinstance(value, bool)):
            low = META_MINIMUM.get(key)
            if kind == "int" and low is not None and value < low:  # type: ignore[operator]
                return f"expected an integer >= {low}"
            high = META_MAXIMUM.get(key)
            if kind == "int" and high is not None and value > high:  # type: ignore[operator]
                return f"expected an integer <= {high}"
            sub = _OBJECT_CHECKS.get(key)
            return sub(value) if sub is not None and isinstance(value, dict) else None
    return "expected " + " or ".join(_TYPE_WORDS[k] for k in kinds)


def _capture_error(cap: dict) -> str | None:
    """Why a /meta ``capture`` object is not one :func:`capture_end` can read, or None: its
    ``ended`` must be a :data:`CAPTURE_END` value (or null: still recording), its
    ``exit_status`` and ``signal`` integers or null."""
    ended = cap.get("ended")
    if ended is not None and ended not in CAPTURE_END:
        return "capture.ended: expected one of " + ", ".join(CAPTURE_END)
    for name in ("exit_status", "signal"):
        v = cap.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            return f"capture.{name}: expected an integer"
    return None


def _checks_error(checks: dict) -> str | None:
    """Why a /meta ``checks`` object is not one ``capture_incomplete`` can read, or None: its
    ``status`` a string, its ``trace`` an object whose ``blocks`` (the rows the vLLM
    recorder counted at close, hooks/vllm/crosscheck.py ``file_totals``) is an integer >= 0
    (a count of 143.0 or "143" would silence the recorder-count check)."""
    status = checks.get("status")
    if status is not None and not isinstance(status, str):
        return "checks.status: expected a string"
    trace = checks.get("trace")
    if trace is None:
        return None
    if not isinstance(trace, dict):
        return "checks.trace: expected a JSON object"
    n = trace.get("blocks")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
        return "checks.trace.blocks: expected an integer >= 0"
    return None


#: The /meta objects whose items are checked too (their readers trust them).
_OBJECT_CHECKS = {"capture": _capture_error, "checks": _checks_error}


def describe() -> str:
    """Return the schema as human-readable text (what ``spectrace schema`` prints).

    Returns:
        A multi-line string listing every table, column, dtype, shape and meaning.
    """
    lines = [
        f"spectrace trace store, format {FORMAT!r}, version {FORMAT_VERSION}",
        "",
        "/ attrs: format, format_version, status (recording|complete), writer, created_utc",
        "/meta   UTF-8 JSON document with keys:",
    ]
    lines += [f"    {key:<20} {doc}" for key, doc in META_KEYS.items()]
    for table, cols in TABLES.items():
        lines += ["", f"/{table}   (equal-length columns, chunked, unlimited)"]
        for c in cols:
            shape = {None: "[n]", "k": "[n, kmax]", "k+1": "[n, kmax+1]"}[c.width]
            if c.vlen:
                shape = "[n][*]"
            opt = " (optional)" if c.optional else ""
            lines.append(f"    {c.name:<15} {c.dtype:<8} {shape:<12} {c.doc}{opt}")
    lines += [
        "",
        "Replay traces (/meta source = replay, `spectrace replay`): the requests hold the",
        "reference sequences; one block per replayed (request, position): the engine was given",
        "the prefix sequence[:position], `anchor` is the token its target sampled there (it",
        "differs from the sequence's token where the targets disagree), `proposed` its k drafts",
        "after it; verified/accepted/emitted are teacher-forced: the drafts checked against",
        "the reference continuation (num_verified < k only where the reference ends).",
        "target_margin there is the target's top-1 minus top-2 logit at that position.",
    ]
    lines += [
        "",
        "Conventions: acceptance rate = accepted / verified drafts; mean acceptance length =",
        "1 + accepted / verified blocks (counts the bonus token, as vLLM does); per-position",
        "acceptance at slot i = share of verified blocks with accepted > i (vLLM's survival",
        "curve).",
        "",
        "Python: write with spectrace.tracer.store.TraceWriter, read with open_trace (Trace:",
        ".meta, .requests, .blocks columns as above). Compared: spectrace.tracer.align.align,",
        "then spectrace.tracer.diff.diff_traces -> DiffResult (typed dataclasses in",
        "spectrace.tracer.diff_result, per-slot comparisons from spectrace.tracer.compare);",
        "`spectrace schema --diff` prints the JSON Schema generated from those types.",
    ]
    return "\n".join(lines)
