"""Per-anchor comparison of two aligned traces (first version of the diff).

Input: an :class:`~spectrace.tracer.align.Alignment`. Output: a :class:`DiffResult` with
coverage, anchor equality, exact proposal matches, common-prefix lengths, per-position
agreement, shift agreement, acceptance per engine (recorded and recomputed, on matched content
and on all content), content divergence per request and example divergent blocks.
JSON form: ``{"schema": "spectrace.diff/1", ...}``. Vectorised over the paired blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .align import NO_DIVERGENCE, Alignment
from .detect import TraceData, detect_pair, prepare
from .findings import Finding
from .index import drafts_checked
from .metrics import CONVENTIONS, acceptance_counts, acceptance_from_counts, recompute_accepted
from .parallel import each_chunk, in_parallel
from .schema import pad_to
from .store import Trace, open_trace, prefetch

SCHEMA = "spectrace.diff/1"


@dataclass
class DiffResult:
    """The diff of two traces. ``diverged`` decides the exit status (see ``to_json``)."""

    ours: dict
    theirs: dict
    requests: dict
    coverage: dict
    agreement: dict
    acceptance: dict
    content: list[dict]
    examples: list[dict]
    diverged: bool
    reasons: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    #: bool [P]: paired block whose anchor or proposal differs (not in the JSON).
    bad: np.ndarray | None = None

    def to_json(self) -> dict:
        """The ``spectrace.diff/1`` document (JSON-serialisable)."""
        return {
            "schema": SCHEMA,
            "diverged": self.diverged,
            "reasons": self.reasons,
            "findings": [f.to_json() for f in self.findings],
            "ours": self.ours,
            "theirs": self.theirs,
            "requests": self.requests,
            "coverage": self.coverage,
            "agreement": self.agreement,
            "acceptance": self.acceptance,
            "content_divergence": self.content,
            "examples": self.examples,
            "conventions": CONVENTIONS,
        }


def _side(t: Trace) -> dict:
    m = t.meta
    return {
        "files": [str(p) for p in t.paths],
        "engine": m.get("engine"), "engine_version": m.get("engine_version"),
        "method": m.get("method"), "k": m.get("k"), "source": m.get("source"),
        "status": t.status, "requests": len(t.requests), "blocks": len(t.blocks),
    }


def slot_agreement(prop_a: np.ndarray, prop_b: np.ndarray, ia: np.ndarray, ib: np.ndarray,
                   ka: np.ndarray, kb: np.ndarray) -> dict:
    """Compare paired proposals slot by slot (chunked over the paired blocks).

    Args:
        prop_a, prop_b: int32 [blocks, w_a] / [blocks, w_b] proposal matrices (-1 padded).
        ia, ib: int [P] paired block indices into them.
        ka, kb: int [P] proposal lengths of the paired blocks (tokens).
    Returns:
        dict with ``eq`` bool [P, w] (slot j equal and present on both sides), ``exact``
        bool [P] (same k and all slots equal), ``prefix`` int16 [P] (common-prefix length),
        per-slot counts ``eq_count`` and ``both_count`` int64 [w] (blocks with slot j
        present on both sides), and the shift agreements ``shift_plus``/``shift_minus``
        int64 [w-1] (blocks with ours[j] == theirs[j+1] / ours[j+1] == theirs[j], both
        present) over ``both_shift`` [w-1] (blocks with slots j and j+1 present on both).
        w is the wider of the two matrices.
    """
    w = max(prop_a.shape[1], prop_b.shape[1])
    P = len(ia)
    eq_all, prefix = np.empty((P, w), bool), np.empty(P, np.int16)
    kmin_all = np.minimum(ka, kb)

    def part(cs: list[slice]) -> np.ndarray:
        """Fill eq/prefix for chunks ``cs``; returns int64 [3, w] counts (eq, +1, -1)."""
        counts = np.zeros((3, w), np.int64)
        for c in cs:
            pa, pb = pad_to(prop_a[ia[c]], w), pad_to(prop_b[ib[c]], w)
            kmin, eq = kmin_all[c], eq_all[c]
            alive, pref = np.ones(len(kmin), bool), np.zeros(len(kmin), np.int16)
            # Slot-major: 1-D passes count fast, where axis reductions over w=8 columns crawl.
            for j in range(w):
                e = pa[:, j] == pb[:, j]
                e &= kmin > j
                eq[:, j] = e
                counts[0, j] += np.count_nonzero(e)
                alive &= e
                pref += alive
                if j + 1 < w:
                    both_next = kmin > j + 1
                    counts[1, j] += np.count_nonzero(both_next & (pa[:, j] == pb[:, j + 1]))
                    counts[2, j] += np.count_nonzero(both_next & (pa[:, j + 1] == pb[:, j]))
            prefix[c] = pref
        return counts

    counts = sum(each_chunk(P, part), np.zeros((3, w), np.int64))
    # Slots present on both sides: blocks whose shorter proposal reaches past slot j.
    both_count = P - np.cumsum(np.bincount(np.maximum(kmin_all, 0), minlength=w + 1))[:w]
    return {"eq": eq_all, "exact": (ka == kb) & (prefix == ka), "prefix": prefix,
            "eq_count": counts[0], "both_count": both_count, "shift_plus": counts[1, :-1],
            "shift_minus": counts[2, :-1], "both_shift": both_count[1:]}


def open_pair(ours, theirs) -> tuple[Trace, Trace]:
    """Open two traces for :func:`diff_traces` (``spectrace diff``'s first step).

    The block columns the diff reads (``TraceData.COLUMNS``; ``position`` first, ours then
    theirs) start reading on a background thread: alignment overlaps the reads of the large
    draft matrices, and our side's preparation starts while theirs still reads.

    Args:
        ours, theirs: trace specs as :func:`~spectrace.tracer.store.open_trace` takes them.
    Raises:
        InputError, TraceFormatError: as ``open_trace``.
    """
    a, b = open_trace(ours), open_trace(theirs)
    first = ("position", "k", "anchor")
    cols = first + tuple(c for c in TraceData.COLUMNS if c not in first)
    prefetch([a.blocks, b.blocks], cols)
    return a, b


def nothing_compared(al: Alignment) -> str:
    """Why an alignment paired no block (one line): no blocks, no matching request (then the
    target models, when they differ), content diverging first, or no common anchor."""
    a, b = al.a, al.b
    empty = [side for side, t in (("ours", a), ("theirs", b)) if len(t.blocks) == 0]
    if empty:
        return (f"{' and '.join(empty)} {'has' if len(empty) == 1 else 'have'} no draft "
                f"blocks: nothing to compare")
    if al.pairs == 0:
        ta, tb = a.meta.get("target_model"), b.meta.get("target_model")
        models = f"; target models {ta} vs {tb}" if ta and tb and ta != tb else ""
        return (f"no request of ours matches one of theirs (compare the prompts): the traces "
                f"are of different jobs{models}")
    div = al.divergence[al.divergence != NO_DIVERGENCE]
    if len(div):
        return (f"no comparable blocks: the content diverged at position {int(div.min())} "
                f"before any block both engines drafted from")
    return "no comparable blocks: the engines never drafted from the same anchor position"


def _share(num: np.ndarray, den: np.ndarray) -> list:
    return [float(n / d) if d else None for n, d in zip(num, den)]


def diff_traces(al: Alignment, examples: int = 5, decoder=None) -> DiffResult:
    """Compare the paired blocks of an alignment. See the module docstring.

    Args:
        al: the alignment of ours (``al.a``) and theirs (``al.b``).
        examples: how many divergent blocks to include as examples.
        decoder: a :class:`~spectrace.tracer.tokens.Decoder` for examples, or None.
    Returns:
        A :class:`DiffResult`. ``diverged`` is True when a finding of severity ``error``
        exists, a paired block's anchor or proposal differs, or nothing is comparable
        although both traces have blocks.
    """
    a, b = al.a, al.b
    prepare([(a, "ours"), (b, "theirs")])  # reads and derived columns, both sides at once
    ia, ib = al.ia, al.ib
    P = len(ia)
    ka, kb = a.blocks.k[ia].astype(np.int64), b.blocks.k[ib].astype(np.int64)
    s = slot_agreement(a.blocks.proposed, b.blocks.proposed, ia, ib, ka, kb)
    anc_a, anc_b = a.blocks.anchor[ia], b.blocks.anchor[ib]
    anchor_known = (anc_a >= 0) & (anc_b >= 0)
    anchor_eq = ~anchor_known | (anc_a == anc_b)
    bad = ~s["exact"] | ~anchor_eq

    agreement = {
        "paired_blocks": P,
        "anchor_mismatches": int((~anchor_eq).sum()),
        "anchors_unknown": int((~anchor_known).sum()),
        "exact_matches": int(s["exact"].sum()),
        "exact_match_rate": float(s["exact"].mean()) if P else None,
        "k_mismatches": int((ka != kb).sum()),
        "mean_common_prefix": float(s["prefix"].mean()) if P else None,
        "per_position": _share(s["eq_count"], s["both_count"]),
        "per_position_blocks": s["both_count"].tolist(),
        "shift_plus_one": _share(s["shift_plus"], s["both_shift"]),
        "shift_minus_one": _share(s["shift_minus"], s["both_shift"]),
    }
    na, nb = len(a.blocks), len(b.blocks)
    ca, cb = int(al.comparable_a.sum()), int(al.comparable_b.sum())
    coverage = {
        "ours_blocks": na, "theirs_blocks": nb,
        "ours_on_matched_content": ca, "theirs_on_matched_content": cb,
        "paired": P,
        "ours_coverage": P / ca if ca else None,
        "theirs_coverage": P / cb if cb else None,
    }
    kmax = int(max(a.blocks.k.max(initial=0), b.blocks.k.max(initial=0)))
    acc = dict(zip(("ours", "theirs"), in_parallel(
        [lambda: _acceptance(a, al.comparable_a, kmax),
         lambda: _acceptance(b, al.comparable_b, kmax)])))
    reasons = []
    if bad.any():
        reasons.append(f"{int(bad.sum())} of {P} paired blocks differ")
    if P == 0:
        reasons.append(nothing_compared(al))
    found = detect_pair(al, {"ka": ka, "kb": kb, "eq": s["eq"],
                             "exact": s["exact"], "anchor_eq": anchor_eq,
                             "eq_count": s["eq_count"], "both_count": s["both_count"]},
                        decoder)
    errors = [f for f in found if f.severity == "error"]
    if errors:
        reasons.insert(0, f"{len(errors)} error finding{'s' if len(errors) > 1 else ''}, "
                          f"first: {errors[0].kind}")
    return DiffResult(
        ours=_side(a), theirs=_side(b),
        requests=_requests(al), coverage=coverage, agreement=agreement,
        acceptance=acc, content=_content(al), examples=_examples(al, ka, kb, s, anchor_eq,
                                                                 bad, examples),
        diverged=bool(reasons), reasons=reasons, findings=found, bad=bad)


def _acceptance(t: Trace, comparable: np.ndarray, kmax: int) -> dict:
    _, checked = drafts_checked(t)
    out: dict = {"matched_content": {}, "all_content": {}}
    for name, acc in (("recorded", t.blocks.accepted), ("recomputed", recompute_accepted(t))):
        by_acc, ver = acceptance_counts(acc, checked, comparable, 2)  # 1: matched content
        out["matched_content"][name] = acceptance_from_counts(by_acc[1], ver[1], kmax)
        out["all_content"][name] = acceptance_from_counts(by_acc.sum(axis=0), ver.sum(),
                                                          kmax)
    return out


def _requests(al: Alignment) -> dict:
    by = {k: al.matched_by.count(k) for k in ("prompt", "req_id", "order")}
    return {
        "matched": al.pairs, "matched_by": by,
        "unmatched_ours": [al.a.requests.req_id[i] for i in al.unmatched_a],
        "unmatched_theirs": [al.b.requests.req_id[i] for i in al.unmatched_b],
        "content_diverged": int((al.divergence != NO_DIVERGENCE).sum()),
        "content_unknown": int((~al.content_known).sum()),
    }


def _content(al: Alignment) -> list[dict]:
    out = []
    for p in np.flatnonzero(al.divergence != NO_DIVERGENCE):
        i, j, d = int(al.req_a[p]), int(al.req_b[p]), int(al.divergence[p])
        sa, sb = al.a.requests.full_sequence(i), al.b.requests.full_sequence(j)
        out.append({"ours_req": al.a.requests.req_id[i], "theirs_req": al.b.requests.req_id[j],
                    "position": d, "prompt_len": len(al.a.requests.prompt_ids[i]),
                    "ours_token": int(sa[d]), "theirs_token": int(sb[d])})
    return out


def _examples(al: Alignment, ka, kb, s, anchor_eq, bad, n: int) -> list[dict]:
    out = []
    pa, pb = al.a.blocks.proposed, al.b.blocks.proposed
    for x in np.flatnonzero(bad)[:n]:
        i, j = int(al.ia[x]), int(al.ib[x])
        first = np.flatnonzero(~s["eq"][x, :max(ka[x], kb[x])])
        out.append({
            "ours_req": al.a.requests.req_id[al.a.blocks.request[i]],
            "theirs_req": al.b.requests.req_id[al.b.blocks.request[j]],
            "position": int(al.a.blocks.position[i]),
            "anchor_ours": int(al.a.blocks.anchor[i]), "anchor_theirs": int(al.b.blocks.anchor[j]),
            "anchor_equal": bool(anchor_eq[x]),
            "ours": pa[i, :ka[x]].tolist(), "theirs": pb[j, :kb[x]].tolist(),
            "first_differing_slot": int(first[0]) if len(first) else None,
        })
    return out
