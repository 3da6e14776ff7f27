"""k_mismatch: the two engines propose different numbers of drafts per block, and why.

A difference of one draft is the signature of one side counting the anchor in k (proposing
k - 1, fault ``k_minus_one``) or of runs configured with k and k + 1; a larger difference
cannot come from the anchor (it is one token) and means the runs were configured with
different k (``num_speculative_tokens``). The trace's ``/meta`` ``k`` decides between the
two when it shows a side proposing fewer drafts than its own configured k.
"""

from __future__ import annotations

import numpy as np

from .data import PairData, SideInput
from .evidence import KEvidence
from .model import Finding
from .thresholds import MIN_BLOCKS, SYSTEMATIC

#: Words of /meta ``method`` for drafters whose proposal length varies by design: prompt
#: lookup (n-gram) drafts only where the context matches, suffix decoding as far as its tree
#: reaches. Every other method (a model drafter: draft_model, EAGLE, MTP, DSpark) proposes
#: k ids at every step (vLLM's ``SpecDecodeBaseProposer.propose`` returns [batch, k]).
VARIABLE_K_WORDS = ("ngram", "n-gram", "lookup", "suffix")


def drafts_every_step(meta: dict) -> bool:
    """Whether the trace's drafter proposes k ids for every running request each step: its
    /meta ``method`` names a model drafter (none of :data:`VARIABLE_K_WORDS`), or, with no
    method named, it is an oracle-capture golden (``source`` golden: the gate's recorder
    wraps a model speculator's ``propose``, e.g. ``DFlashSpeculator.propose``) or its VT
    import saw ``[spec-propose]`` lines (only a model drafter prints them)."""
    method = meta.get("method")
    if isinstance(method, str) and method:
        return not any(w in method.lower() for w in VARIABLE_K_WORDS)
    if meta.get("source") == "golden":
        return True
    imp = meta.get("import")
    families = imp.get("families") if isinstance(imp, dict) else None
    return isinstance(families, dict) and bool(families.get("spec-propose"))


def _systematic(bad: np.ndarray) -> bool:
    """Whether the k difference ``bad`` (bool [n]) holds in at least
    :data:`~.thresholds.MIN_BLOCKS` and :data:`~.thresholds.SYSTEMATIC` of the blocks."""
    return bool(bad.sum() >= MIN_BLOCKS and bad.mean() >= SYSTEMATIC)


def _typical(d: np.ndarray) -> int:
    """The most frequent k difference of ``d`` (int [n], n >= 1)."""
    vals, cnt = np.unique(d, return_counts=True)
    return int(vals[cnt.argmax()])


def config_difference(a: dict, b: dict) -> str | None:
    """Why two runs' drafts need not agree, by their recorded configuration alone (/meta of
    ours ``a`` and theirs ``b``): methods that differ, or n-gram lookup settings that differ
    (the vLLM hook's /meta ``ngram``: vLLM's ``prompt_lookup_min``/``max``); one clause, or
    None when both record the same or either records nothing. k is :func:`k_reason`'s."""
    ma, mb = a.get("method"), b.get("method")
    if isinstance(ma, str) and isinstance(mb, str) and ma and mb and ma.lower() != mb.lower():
        return (
            f"the runs use different methods (ours {ma}, theirs {mb}): their drafts need not agree"
        )
    ga, gb = a.get("ngram"), b.get("ngram")
    if isinstance(ga, dict) and isinstance(gb, dict):
        diff = [
            f"{key} {ga[key]} vs {gb[key]}"
            for key in sorted(ga.keys() & gb.keys())
            if ga[key] != gb[key]
        ]
        if diff:
            return (
                f"the runs' n-gram settings differ ({', '.join(diff)}): their drafts need not agree"
            )
    return None


def drafter_name(meta: dict) -> str:
    """``"draft_model drafter"`` (the /meta method's words), or ``"drafter"`` when none is
    recorded."""
    method = meta.get("method")
    return f"{method} drafter" if isinstance(method, str) and method else "drafter"


def meta_k(meta: dict) -> int | None:
    """The configured k in /meta (vLLM's ``speculative_config.num_speculative_tokens``, as
    the vLLM hook and the importers record it): an int >= 1 (drafts per block), or None
    when unknown, 0 or not an integer."""
    k = meta.get("k")
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else None


def meta_k_limit(meta: dict) -> int | None:
    """The most drafts /meta allows a block: :func:`meta_k`, or 0 where /meta k is 0 (a
    vanilla run: ``num_speculative_tokens`` unset); None when unknown."""
    k = meta.get("k")
    return 0 if type(k) is int and k == 0 else meta_k(meta)


def k_reason(ka: int, kb: int, meta_ka: int | None, meta_kb: int | None) -> str:
    """Why ours proposes ``ka`` drafts and theirs ``kb`` (``ka != kb``), given each side's
    configured k from /meta (None unknown). One clause, e.g. ``the runs are configured with
    different k ...``."""
    cfg = (
        f" (/meta k: ours {meta_ka if meta_ka is not None else '?'}, theirs "
        f"{meta_kb if meta_kb is not None else '?'})"
    )
    if meta_ka is not None and meta_ka == meta_kb:  # configured alike: one side drafts less
        name, k = ("ours", ka) if ka < kb else ("theirs", kb)
        if k >= meta_ka:  # the other side proposes more than configured
            name, k = ("ours", ka) if ka > kb else ("theirs", kb)
            return (
                f"both runs are configured with k={meta_ka}, but {name} proposes {k}: more "
                f"drafts than configured (its drafter does not read num_speculative_tokens)"
            )
        return _counts_anchor(ka, kb, meta_ka, meta_kb) or (
            f"both runs are configured with k={meta_ka}, but {name} proposes {k}: its drafter "
            f"proposes fewer drafts than configured (0: none installed; else dropped or "
            f"trimmed before verification), not a k setting"
        )
    if abs(ka - kb) >= 2:
        return (
            f"the runs draft {min(ka, kb)} and {max(ka, kb)} tokens per block{cfg}: they are "
            f"configured with different k (num_speculative_tokens), not off by the anchor "
            f"(that shifts k by one); compare runs of one k"
        )
    return _counts_anchor(ka, kb, meta_ka, meta_kb) or (
        f"a difference of one draft{cfg}: either one side counts the anchor in k (k - 1 "
        f"drafts) or the runs are configured with k={min(ka, kb)} and k={max(ka, kb)}"
    )


def _counts_anchor(ka: int, kb: int, meta_ka: int | None, meta_kb: int | None) -> str:
    """The clause for a side proposing k - 1 drafts of its configured k ("" if neither)."""
    for name, k, cfg_k in (("ours", ka, meta_ka), ("theirs", kb, meta_kb)):
        if cfg_k is not None and k == cfg_k - 1:
            return (
                f"{name} proposes {k} = k - 1 drafts although configured with k={cfg_k}: it "
                f"counts the anchor in k"
            )
    return ""


def k_pairs(pd: PairData) -> Finding | None:
    """k_mismatch: the number of proposed ids differs between paired blocks in at least
    :data:`~.thresholds.MIN_BLOCKS` and :data:`~.thresholds.SYSTEMATIC` of them; located
    at the first, explained by :func:`k_reason`."""
    bad = pd.ka != pd.kb
    if not _systematic(bad):
        return None
    first = int(np.flatnonzero(bad)[0])
    typical = _typical(pd.ka[bad] - pd.kb[bad])
    ka, kb = int(pd.ka[first]), int(pd.kb[first])
    why = k_reason(ka, kb, meta_k(pd.al.a.meta), meta_k(pd.al.b.meta))
    return Finding(
        "k_mismatch",
        "error",
        side="ours",
        **pd.at(first),
        message=(
            f"k differs in {int(bad.sum())} of {len(bad)} paired blocks: ours proposes "
            f"{abs(typical)} {'fewer' if typical < 0 else 'more'} draft "
            f"id{'s' if abs(typical) != 1 else ''} than theirs (ours k={ka}, theirs k={kb} "
            f"at the first); {why}"
        ),
        evidence=KEvidence(
            blocks=int(bad.sum()),
            typical_difference=typical,
            ours_k=np.unique(pd.ka).tolist(),
            theirs_k=np.unique(pd.kb).tolist(),
        ),
    )


def k_configured(s: SideInput) -> Finding | None:
    """k_mismatch of one trace: a model drafter (:func:`drafts_every_step`) whose blocks propose
    another number of ids than its /meta k in at least :data:`~.thresholds.MIN_BLOCKS` and
    :data:`~.thresholds.SYSTEMATIC` of them (k=0 everywhere: the drafts were never installed);
    located at the first. In a diff whose paired blocks differ in k, :func:`k_pairs` names it
    between the runs instead."""
    td = s.td
    cfg_k, k = meta_k(td.t.meta), td.t.blocks.k
    if cfg_k is None or not drafts_every_step(td.t.meta) or not len(k):
        return None
    bad = (k >= 0) & (k != cfg_k)
    if not _systematic(bad) or _pairs_differ(s):
        return None
    first = int(np.flatnonzero(bad)[0])
    typical = _typical(k[bad].astype(np.int64) - cfg_k)
    kf = int(k[first])
    if not k[bad].any():
        what, why = "no draft", ": its drafts were never installed"
    else:
        what = f"{kf} draft{'s' if kf != 1 else ''} (the first)"
        why = ": dropped or trimmed before verification" if kf < cfg_k else ""
    return Finding(
        "k_mismatch",
        "error",
        side=td.side,
        **td.at(first),
        message=(
            f"{td.side}: {int(bad.sum())} of {len(k)} blocks propose {what} although its "
            f"{drafter_name(td.t.meta)} is configured with k={cfg_k} and proposes k "
            f"at every step{why}"
        ),
        evidence=KEvidence(
            blocks=int(bad.sum()),
            typical_difference=typical,
            ours_k=np.unique(k).tolist(),
            theirs_k=[cfg_k],
        ),
    )


def _pairs_differ(s: SideInput) -> bool:
    """In a diff, whether the paired blocks' k differ as :func:`k_pairs` requires (it then
    names the difference between the runs)."""
    al = s.al
    if al is None or not len(al.ia):
        return False
    return _systematic(al.a.blocks.k[al.ia] != al.b.blocks.k[al.ib])
