"""Content drift: requests of the two sides whose prompts differ but share most of their
tokens (the alignment's :class:`~spectrace.tracer.align.PromptDrift` pairs, e.g. the same
user text under another chat template or system prompt).

Their drafts are not compared: the contexts differ, so anchor positions do not line up and
equal drafts are not expected. The finding says how the prompts differ instead.
"""

from __future__ import annotations

import numpy as np

from ..align import Alignment
from ..fmt import pct
from ..similar import DRIFT_MIN_TOKENS, DRIFT_SHARE, PromptDrift
from ..tokens import Decoder, show
from .evidence import DriftRef, PromptDriftEvidence
from .model import Finding, tok

#: Tokens of each differing part kept in the evidence; characters of decoded text shown.
PART_TOKENS = 16
TEXT_CHARS = 60
#: Drift pairs listed in the evidence.
LISTED = 10


def drift_ref(al: Alignment, d: PromptDrift) -> DriftRef:
    """One drift pair for the evidence (request ids, lengths, shared head, tail and run)."""
    return DriftRef(
        ours_request=al.a.requests.req_id[d.req_a],
        theirs_request=al.b.requests.req_id[d.req_b],
        first_difference=d.first_difference,
        ours_len=d.ours_len,
        theirs_len=d.theirs_len,
        common_prefix=d.common_prefix,
        common_suffix=d.common_suffix,
        common_run=d.common_run,
        run_ours=d.run_ours,
        run_theirs=d.run_theirs,
    )


def _outside(x: np.ndarray, start: int, run: int) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of prompt ``x`` before and after its common run."""
    return x[:start], x[start + run :]


def _text(dec: Decoder, ids: np.ndarray) -> str:
    """Decoded ``ids``, visible whitespace, cut to :data:`TEXT_CHARS`."""
    s = show(dec.text([int(i) for i in ids]))
    return s if len(s) <= TEXT_CHARS else s[: TEXT_CHARS - 2] + ".."


def _decoded(dec: Decoder | None, x: np.ndarray, y: np.ndarray, d: PromptDrift) -> str:
    """``; decoded: ours 'A'+run+'B', theirs 'C'+run+'D'`` (empty without a tokenizer)."""
    if dec is None:
        return ""
    parts = []
    for name, p, start in (("ours", x, d.run_ours), ("theirs", y, d.run_theirs)):
        before, after = _outside(p, start, d.common_run)
        parts.append(f"{name} '{_text(dec, before)}' + common + '{_text(dec, after)}'")
    return "; decoded: " + ", ".join(parts)


def prompts(al: Alignment, dec: Decoder | None = None) -> Finding | None:
    """prompt_drift (error): requests whose prompts differ but share a long run of tokens.

    Located at our first drift request and the first differing prompt token. The evidence
    counts the pairs and gives, for the first, both lengths, the common prefix, suffix and
    run, and the tokens outside the run on each side (``id:text`` with a tokenizer).
    """
    if not al.drift:
        return None
    d = al.drift[0]
    x = np.asarray(al.a.requests.prompt_ids[d.req_a], np.int64)
    y = np.asarray(al.b.requests.prompt_ids[d.req_b], np.int64)
    xb, xa = _outside(x, d.run_ours, d.common_run)
    yb, ya = _outside(y, d.run_theirs, d.common_run)
    ref = drift_ref(al, d)
    n = len(al.drift)
    share = d.common_run / min(d.ours_len, d.theirs_len)
    return Finding(
        "prompt_drift",
        "error",
        side="both",
        request=ref["ours_request"],
        position=d.first_difference,
        message=(
            f"{n} request pair{'s share' if n > 1 else ' shares'} most of the prompt but not "
            f"all of it (first: ours {ref['ours_request']} vs theirs {ref['theirs_request']}: the "
            f"prompts differ from token {d.first_difference}; {d.ours_len} vs {d.theirs_len} "
            f"tokens, common prefix {d.common_prefix}, suffix {d.common_suffix}, a common run "
            f"of {d.common_run} ({pct(share, 0)} of the shorter) at ours {d.run_ours} / "
            f"theirs {d.run_theirs}{_decoded(dec, x, y, d)}): a chat template, system "
            f"prompt or truncation differs; their drafts are not compared (the contexts differ)"
        ),
        evidence=PromptDriftEvidence(
            requests=n,
            min_common_run=DRIFT_MIN_TOKENS,
            min_share=DRIFT_SHARE,
            first=ref,
            ours_before=tok(dec, xb[-PART_TOKENS:]),
            ours_after=tok(dec, xa[:PART_TOKENS]),
            theirs_before=tok(dec, yb[-PART_TOKENS:]),
            theirs_after=tok(dec, ya[:PART_TOKENS]),
            pairs=[drift_ref(al, p) for p in al.drift[:LISTED]],
        ),
    )
