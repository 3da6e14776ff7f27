"""Text for people: token cells, row explanations and figures (pure functions, no widgets).

Everything the block view, the detail dialog and the explain line say about a row is built
here from a :class:`~spectrace.tui.model.Window`, so the words are tested once. Figures
and severity styles come from :mod:`spectrace.tracer.fmt` (shared with the text report).
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size

from spectrace.tracer.compare import NO_DIVERGENCE
from spectrace.tracer.tokens import Decoder, show

from .model import S_SHIFT, Pair, Window

#: Shown for an absent id (padding) in cells.
EMPTY = "·"


def fit(text: str, width: int) -> str:
    """``text`` padded or cut (with ``…``) to exactly ``width`` terminal cells."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return set_cell_size(text, width)
    return set_cell_size(text, width - 1) + "…"


def token(decoder: Decoder | None, tid: int, ids: bool) -> str:
    """One token for a cell: its id (``ids`` or no decoder) or its visible decoded text."""
    if tid < 0:
        return EMPTY
    if ids or decoder is None:
        return str(tid)
    return show(decoder.token(int(tid))) or "⟨⟩"


def quoted(decoder: Decoder | None, tid: int) -> str:
    """``'text' (id)`` for sentences, or ``id`` without a decoder."""
    if tid < 0:
        return "none"
    if decoder is None:
        return str(tid)
    return f"'{show(decoder.token(int(tid)))}' ({tid})"


def divergence_text(div: int | None) -> str:
    """``at N`` / ``none`` / ``?`` for a content divergence."""
    if div is None:
        return "?"
    return "none" if div == NO_DIVERGENCE else f"at {div}"


def row_note(win: Window, i: int, paired_view: bool) -> str:
    """The short 'why' column of a row (a few words)."""
    a, b = win.a, win.b
    if not paired_view or b is None:
        if a["k"][i] == 0:
            return ""
        return "unverified" if a["unverified"][i].all() else ""
    if not win.comparable[i]:
        return "past divergence" if win.pos[i] >= win.divergence else "final proposal"
    if not win.paired[i]:
        return "only ours" if a["has"][i] else "only theirs"
    if not win.anchor_eq[i]:
        return "anchor differs"
    if win.bad[i]:
        if a["k"][i] != b["k"][i] and win.first_diff[i] >= min(a["k"][i], b["k"][i]):
            return f"k {a['k'][i]}≠{b['k'][i]}"
        j = int(win.first_diff[i])
        shifted = a["state"][i, j] == S_SHIFT or b["state"][i, j] == S_SHIFT
        return f"≠ slot {j}" + (" (shift)" if shifted else "")
    if a["vdiff"][i].any() or b["vdiff"][i].any():
        return "verified≠proposed"
    return "same"


def explain(
    win: Window,
    i: int,
    pair: Pair,
    decoder: Decoder | None,
    divergence: int,
    findings: list | None = None,
    next_ids=None,
) -> str:
    """One or two sentences saying what row ``i`` of ``win`` shows and why it matters.

    ``next_ids`` (optional): the ids the output actually has after the anchor, to say which
    side's differing draft was right.
    """
    pos = int(win.pos[i])
    a, b = win.a, win.b
    parts: list[str] = []
    anchor = a["anchor"][i] if a["has"][i] else (b["anchor"][i] if b is not None else -1)
    head = f"Position {pos}, anchor {quoted(decoder, int(anchor))}."

    def drafts(side: dict) -> str:
        return _drafts_text(side, i)

    if b is None:
        parts.append(f"{head} Proposed {drafts(a)}.")
        if a["unverified"][i].all() and a["k"][i]:
            parts.append("The target did not verify these drafts.")
    elif not win.comparable[i] and pos >= divergence:
        parts.append(
            f"{head} Past the content divergence at {divergence}: the two engines' "
            f"texts differ from there on, so their drafts are not comparable."
        )
    elif not win.comparable[i]:
        parts.append(
            f"{head} The request's final proposal: drafted after the last common "
            f"token, never verified, with no block of the other side drafted from the same "
            f"known context (none at this position, or past the output's end), so it "
            f"compares with nothing."
        )
    elif not win.paired[i] and not pair.matched:
        who, other = ("ours", "theirs") if a["has"][i] else ("theirs", "ours")
        side = a if a["has"][i] else b
        parts.append(
            f"{head} Only {who} drafted from here ({drafts(side)}): no request of {other} "
            f"matches this one, so there is nothing to compare."
        )
    elif not win.paired[i]:
        who, other = ("ours", "theirs") if a["has"][i] else ("theirs", "ours")
        side = a if a["has"][i] else b
        parts.append(
            f"{head} Only {who} drafted from here ({drafts(side)}): {other} "
            f"accepted a different number of drafts earlier and skipped this "
            f"position, so there is nothing to compare."
        )
    elif not win.anchor_eq[i]:
        parts.append(
            f"{head} ANCHORS DIFFER: ours {quoted(decoder, int(a['anchor'][i]))}, "
            f"theirs {quoted(decoder, int(b['anchor'][i]))} at the same position "
            f"on identical content: a position or anchor bookkeeping bug."
        )
    elif win.bad[i]:
        parts += _differing_drafts(win, i, head, decoder, next_ids)
        parts.append(f"Ours: {drafts(a)}; theirs: {drafts(b)}.")
    else:
        parts.append(
            f"{head} Both engines proposed the same {int(a['k'][i])} drafts. "
            f"Ours: {drafts(a)}; theirs: {drafts(b)}."
        )
    parts += _verified_differs(win, i)
    for f in findings or []:
        parts.append(f"Finding ({f.kind}): {f.message}")
    return " ".join(parts)


def _drafts_text(side: dict, i: int) -> str:
    """``k drafts, n accepted`` of row ``i`` of one side (``?`` when never verified)."""
    acc = int(side["accepted"][i])
    return f"{int(side['k'][i])} drafts, {'?' if acc < 0 else acc} accepted"


def _differing_drafts(
    win: Window, i: int, head: str, decoder: Decoder | None, next_ids
) -> list[str]:
    """The sentences for a divergent row ``i`` whose anchors agree: where the drafts differ,
    which side the text agrees with (``next_ids``), and any one-slot shifts."""
    a, b = win.a, win.b
    assert b is not None  # a divergent row is a paired row
    j = int(win.first_diff[i])
    ka, kb = int(a["k"][i]), int(b["k"][i])
    if j >= min(ka, kb):
        return [f"{head} Ours proposed {ka} drafts, theirs {kb}; the common {min(ka, kb)} agree."]
    ours, theirs = int(a["proposed"][i, j]), int(b["proposed"][i, j])
    parts = [
        f"{head} DRAFTS DIFFER from slot {j}: ours {quoted(decoder, ours)}, "
        f"theirs {quoted(decoder, theirs)}."
    ]
    if next_ids is not None and j < len(next_ids):
        truth = int(next_ids[j])
        right = [n for n, x in (("ours", ours), ("theirs", theirs)) if x == truth]
        said = (
            f"{right[0]} drafted it"
            if len(right) == 1
            else ("neither drafted it" if not right else "both drafted it")
        )
        parts.append(f"The text continues with {quoted(decoder, truth)}: {said}.")
    sh = [jj for jj in range(min(ka, kb)) if a["state"][i, jj] == S_SHIFT]
    if sh:
        parts.append(
            f"Slot(s) {', '.join(map(str, sh))} match the other side one "
            f"slot off: a shift (layout or anchor offset)."
        )
    return parts


def _verified_differs(win: Window, i: int) -> list[str]:
    """Per side of row ``i``: the slots whose verified id differs from the proposed one."""
    out = []
    for name, sd in (("ours", win.a), ("theirs", win.b)):
        if sd is None or not sd["has"][i]:
            continue
        vd = [int(j) for j in range(sd["vdiff"].shape[1]) if sd["vdiff"][i, j]]
        if vd:
            out.append(
                f"{name.capitalize()} verified ids differ from the proposed ones at "
                f"slot(s) {', '.join(map(str, vd))}."
            )
    return out
