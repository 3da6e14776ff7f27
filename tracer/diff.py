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
from .detect import detect_pair, prepare
from .findings import Finding
from .metrics import (CONVENTIONS, acceptance, drafts_checked, leading_true,
                      recompute_accepted)
from .store import Trace

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


def _padded(mat: np.ndarray, w: int) -> np.ndarray:
    if mat.shape[1] >= w:
        return mat[:, :w]
    return np.pad(mat, ((0, 0), (0, w - mat.shape[1])), constant_values=-1)


def slot_agreement(pa: np.ndarray, pb: np.ndarray, ka: np.ndarray, kb: np.ndarray) -> dict:
    """Compare paired proposals slot by slot.

    Args:
        pa, pb: int32 [P, w] proposals of the paired blocks (-1 padded).
        ka, kb: int [P] proposal lengths (tokens).
    Returns:
        dict with ``eq`` bool [P, w] (slot j equal, both present), ``both`` bool [P, w]
        (slot j present on both sides), ``exact`` bool [P] (same k and all slots equal),
        ``prefix`` int64 [P] (common-prefix length), and the shift agreements
        ``shift_plus``/``shift_minus`` [P, w-1] (ours[j] == theirs[j+1] / ours[j+1] == theirs[j]).
    """
    w = pa.shape[1]
    slots = np.arange(w)
    both = (slots < np.minimum(ka, kb)[:, None])
    eq = both & (pa == pb)
    exact = (ka == kb) & (eq.sum(axis=1) == ka)
    prefix = leading_true(eq)
    both_sh = both[:, 1:]
    return {"eq": eq, "both": both, "exact": exact, "prefix": prefix,
            "shift_plus": both_sh & (pa[:, :-1] == pb[:, 1:]),
            "shift_minus": both_sh & (pa[:, 1:] == pb[:, :-1])}


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
    w = max(a.blocks.proposed.shape[1], b.blocks.proposed.shape[1])
    pa, pb = _padded(a.blocks.proposed[ia], w), _padded(b.blocks.proposed[ib], w)
    ka, kb = a.blocks.k[ia].astype(np.int64), b.blocks.k[ib].astype(np.int64)
    s = slot_agreement(pa, pb, ka, kb)
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
        "per_position": _share(s["eq"].sum(0), s["both"].sum(0)),
        "per_position_blocks": s["both"].sum(0).tolist(),
        "shift_plus_one": _share(s["shift_plus"].sum(0), s["both"][:, 1:].sum(0)),
        "shift_minus_one": _share(s["shift_minus"].sum(0), s["both"][:, 1:].sum(0)),
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
    acc = {"ours": _acceptance(a, al.comparable_a, kmax),
           "theirs": _acceptance(b, al.comparable_b, kmax)}
    reasons = []
    if bad.any():
        reasons.append(f"{int(bad.sum())} of {P} paired blocks differ")
    if P == 0 and na and nb:
        reasons.append("no comparable blocks: nothing could be paired")
    found = detect_pair(al, {"pa": pa, "pb": pb, "ka": ka, "kb": kb, "eq": s["eq"],
                             "both": s["both"], "exact": s["exact"],
                             "anchor_eq": anchor_eq}, decoder)
    errors = [f for f in found if f.severity == "error"]
    if errors:
        reasons.insert(0, f"{len(errors)} error finding{'s' if len(errors) > 1 else ''}, "
                          f"first: {errors[0].kind}")
    return DiffResult(
        ours=_side(a), theirs=_side(b),
        requests=_requests(al), coverage=coverage, agreement=agreement,
        acceptance=acc, content=_content(al), examples=_examples(al, pa, pb, ka, kb, s,
                                                                 anchor_eq, bad, examples),
        diverged=bool(reasons), reasons=reasons, findings=found)


def _acceptance(t: Trace, comparable: np.ndarray, kmax: int) -> dict:
    _, checked = drafts_checked(t)
    rec, recomp = t.blocks.accepted, recompute_accepted(t)
    return {
        "matched_content": {"recorded": acceptance(rec[comparable], checked[comparable], kmax),
                            "recomputed": acceptance(recomp[comparable], checked[comparable],
                                                     kmax)},
        "all_content": {"recorded": acceptance(rec, checked, kmax),
                        "recomputed": acceptance(recomp, checked, kmax)},
    }


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


def _examples(al: Alignment, pa, pb, ka, kb, s, anchor_eq, bad, n: int) -> list[dict]:
    out = []
    for x in np.flatnonzero(bad)[:n]:
        i, j = int(al.ia[x]), int(al.ib[x])
        first = np.flatnonzero(~s["eq"][x, :max(ka[x], kb[x])])
        out.append({
            "ours_req": al.a.requests.req_id[al.a.blocks.request[i]],
            "theirs_req": al.b.requests.req_id[al.b.blocks.request[j]],
            "position": int(al.a.blocks.position[i]),
            "anchor_ours": int(al.a.blocks.anchor[i]), "anchor_theirs": int(al.b.blocks.anchor[j]),
            "anchor_equal": bool(anchor_eq[x]),
            "ours": pa[x, :ka[x]].tolist(), "theirs": pb[x, :kb[x]].tolist(),
            "first_differing_slot": int(first[0]) if len(first) else None,
        })
    return out
