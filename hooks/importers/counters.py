"""The golden's own counters (vLLM's spec-decode metrics) against the totals of the blocks
the walk placed: both are reported, and a shortfall is explained where it can be.

vLLM's scheduler (``Scheduler.update_from_output``) counts ``num_accepted_tokens`` from the
sampled ids *before* ``_update_request_with_output`` trims them at a stop (``max_tokens``,
EOS, a stop id): the counters may count accepted drafts the output no longer shows, never
fewer than it shows. Only a placed block whose bonus token falls past the end of the output
(``past_end``: its step was cut) hides any, at most its drafts past the end (``len(drafts) -
accepted``), one per slot from ``accepted`` on. An accepted shortfall outside
``[0, cut drafts]`` (widened by the golden's own extra draft tokens and drafts, which are
already a mismatch), or more accepted than drafted, is missing work: status ``mismatch``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .common import is_int
from .placement import PlacedBlock

#: Our name -> vLLM's counter (``vllm/v1/spec_decode/metrics.py``, the Prometheus names).
GOLDEN_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}


def placed_totals(placed: Sequence[PlacedBlock], k: int | None) -> dict:
    """vLLM's four counters recomputed over the placed blocks that were verified (a
    request's final proposal, ``final``, never was: vLLM counts no step for it).

    Returns:
        ``{"drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos"}``: blocks with
        drafts (vLLM counts a step only when the request had drafts scheduled), drafts
        proposed, drafts accepted, and per slot i the blocks with accepted > i (``k`` slots,
        or the widest block's); and of the blocks cut at the output's end (``past_end``):
        their number (``past_max_tokens``), their drafts past the end (``cut_drafts``: what
        the counters may count on top) and per slot the blocks whose slot i was cut
        (``cut_per_pos``).
    """
    placed = [b for b in placed if not b.final]
    width = k or max((len(b.drafts) for b in placed), default=0)
    return {
        "drafts": sum(1 for b in placed if b.drafts),
        "draft_tokens": sum(len(b.drafts) for b in placed),
        "accepted_tokens": sum(b.accepted for b in placed),
        "accepted_per_pos": [sum(b.accepted > i for b in placed) for i in range(width)],
        "past_max_tokens": sum(b.past_end for b in placed),
        "cut_drafts": sum(len(b.drafts) - b.accepted for b in placed if b.past_end),
        "cut_per_pos": [
            sum(b.accepted <= i < len(b.drafts) for b in placed if b.past_end) for i in range(width)
        ],
    }


def _count(v: object) -> int | None:
    """``v`` as a count: a JSON integer, or an integral float (Prometheus exports counters as
    floats, ``5.0``), within ``[0, 2**62]``; None when it is not one."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and is_int(v, 0, 2**62) else None


def _counter(name: str, v: object) -> int | list[int] | None:
    """A golden counter's value (a count, or a list of counts for the per-position one)."""
    if name != "accepted_per_pos":
        return _count(v)
    if not isinstance(v, list):
        return None
    counts = [_count(x) for x in v]
    return None if None in counts else counts  # type: ignore[return-value]


def unreadable_counter(metrics: object) -> tuple[str, object] | None:
    """The first spec-decode counter the golden's ``metrics`` holds that is not a count
    (``"5"``, ``true``, ``-1``, ``2.5``), as ``(vLLM name, value)``; None when every one
    present reads (a counter left out is fine: it is not compared)."""
    if not isinstance(metrics, dict):
        return None
    for ours, theirs in GOLDEN_COUNTERS.items():
        if theirs in metrics and _counter(ours, metrics[theirs]) is None:
            return theirs, metrics[theirs]
    return None


def _golden_counters(metrics: object) -> dict | None:
    """The golden's counters under our names (None when it has none that read as counts)."""
    if not isinstance(metrics, dict):
        return None
    out: dict = {}
    for ours, theirs in GOLDEN_COUNTERS.items():
        v = _counter(ours, metrics.get(theirs))
        if v is not None:
            out[ours] = v
    return out or None


def counters_check(metrics: object, placed: dict, unplaced: int = 0) -> dict:
    """Compare the golden's counters with the placed totals.

    Returns:
        ``{"golden", "placed", "shortfall", "equal", "message"}``: the two sets of counters
        (``golden`` None without metrics), golden minus placed per counter, whether they
        are equal, and one line saying so (a shortfall names the blocks past
        ``max_tokens``, whose acceptance is only what the output shows, and the ``unplaced``
        golden blocks).
    """
    golden = _golden_counters(metrics)
    past = placed["past_max_tokens"]
    cut = {"tokens": placed["cut_drafts"], "per_pos": placed["cut_per_pos"]}
    placed = {k: v for k, v in placed.items() if k in GOLDEN_COUNTERS}
    out: dict = {"golden": golden, "placed": placed, "past_max_tokens": past, "unplaced": unplaced}
    out["cut_drafts"] = cut["tokens"]
    if golden is None:
        out.update(shortfall=None, equal=None, message="the golden has no spec-decode counters")
        out["unexplained"] = []
        return out
    short = {k: _minus(v, placed[k]) for k, v in golden.items()}
    equal = all(v == 0 or (isinstance(v, list) and not any(v)) for v in short.values())
    text = _message(golden, placed, short, past, equal)
    if not equal and short.get("drafts", 0) > 0 and unplaced:
        text += f"; {unplaced} golden block(s) were not placed"
    why = _unexplained(golden, short, cut)
    text += "".join(f"; {w}" for w in why.values())
    out.update(shortfall=short, equal=equal, message=text, unexplained=list(why))
    return out


def _unexplained(golden: dict, short: dict, cut: dict) -> dict[str, str]:
    """The accepted counters that the trimming at the output's end cannot explain -> why.

    The golden may count more accepted tokens than the placed blocks show by at most the
    drafts cut at the end (``cut["tokens"]``; per slot, ``cut["per_pos"]``), plus its own
    extra draft tokens (per slot: extra drafts), which may hold accepted ones; never fewer,
    and never more accepted than it counts drafted (vLLM accepts only drafts)."""
    out: dict[str, str] = {}
    extra_tokens = max(short.get("draft_tokens", 0), 0)
    if "accepted_tokens" in golden:
        g, s, top = golden["accepted_tokens"], short["accepted_tokens"], cut["tokens"]
        why = _bound_error(g, s, top + extra_tokens, golden.get("draft_tokens"), "draft tokens")
        if why:
            out["accepted_tokens"] = f"accepted tokens: {why}"
    if "accepted_per_pos" in golden:
        slots = cut["per_pos"]
        extra_drafts = max(short.get("drafts", 0), 0)
        theirs = golden["accepted_per_pos"]
        for i, s in enumerate(short["accepted_per_pos"]):  # padded: a slot left out counts 0
            g = theirs[i] if i < len(theirs) else 0
            top = (slots[i] if i < len(slots) else 0) + extra_drafts
            why = _bound_error(g, s, top, golden.get("drafts"), "drafts")
            if why:
                out["accepted_per_pos"] = f"accepted at position {i}: {why}"
                break
    return out


def _bound_error(golden: int, short: int, most: int, drafted: int | None, what: str) -> str:
    """Why an accepted counter ``golden`` (``short`` above the placed blocks') is not what
    trimming leaves (empty when it is): more than ``drafted``, fewer than placed, or more
    than ``most`` above them."""
    if drafted is not None and golden > drafted:
        return f"the golden counts {golden}, more than its {drafted} {what}"
    if short < 0:
        return (
            f"the golden counts {-short} fewer than the placed blocks show (vLLM counts "
            f"acceptance before trimming the output: never fewer)"
        )
    if short > most:
        return (
            f"the golden counts {short} more than the placed blocks show; the drafts cut at "
            f"the output's end explain at most {most}"
        )
    return ""


#: Counters whose difference means blocks missing from (or added to) the trace: the
#: accepted counters may also differ where a block's bonus falls past max_tokens, within
#: the drafts cut there (:func:`_unexplained`).
BLOCK_COUNTERS = ("drafts", "draft_tokens")


def check_status(check: dict) -> dict:
    """The ``meta["checks"]`` status items of a :func:`counters_check` result, as the vLLM
    capture writes them: ``{"status": "mismatch", "mismatch": [names]}`` when the placed
    blocks' drafts or draft tokens differ from the golden's counters (blocks vLLM counted
    are missing), or its accepted counters differ by more than trimming at the output's end
    explains (``check["unexplained"]``), both ``capture_incomplete``; ``{"status": "ok"}``
    otherwise, ``{}`` without counters."""
    short = check.get("shortfall")
    if not isinstance(short, dict):
        return {}
    bad = [k for k in BLOCK_COUNTERS if short.get(k)] + list(check.get("unexplained") or [])
    return {"status": "mismatch", "mismatch": bad} if bad else {"status": "ok"}


def _minus(a, b):
    if isinstance(a, list):
        n = max(len(a), len(b))
        a, b = a + [0] * (n - len(a)), b + [0] * (n - len(b))
        return [x - y for x, y in zip(a, b)]
    return a - b


def _message(golden: dict, placed: dict, short: dict, past: int, equal: bool) -> str:
    names = [k for k in ("drafts", "draft_tokens", "accepted_tokens") if k in golden]
    both = ", ".join(f"{k.replace('_', ' ')} {golden[k]} vs {placed[k]}" for k in names)
    if "accepted_per_pos" in golden:
        both += f", accepted per position {golden['accepted_per_pos']} vs "
        both += f"{placed['accepted_per_pos']}"
    if equal:
        return f"golden counters equal the placed blocks' ({both})"
    text = f"golden counters vs placed blocks: {both}"
    if short.get("accepted_tokens", 0) > 0 and past:
        text += (
            f"; {past} placed block(s) reach past max_tokens, where the golden's output shows "
            f"only part of what the engine accepted"
        )
    return text
