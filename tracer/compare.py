"""The comparison kernel: the one definition of how two engines' draft blocks compare.

``spectrace diff``, the detectors, the TUI's rows and the pytest assertions all call these
functions, so a block that differs in one place differs in all of them.

Terms (per paired block, ours = ``a``, theirs = ``b``):

* **slot equality**: slot j is equal when both proposals reach slot j (``j < min(ka, kb)``)
  and hold the same id;
* **exact match**: same k and every slot equal;
* **anchor equality**: the anchors are equal, or either is unknown (-1);
* **divergent block**: not an exact match, or the anchors differ;
* **shift by s**: ``ours[j] == theirs[j + s]`` with both slots present (s < 0 mirrors it);
* **first differing slot**: the first j < max(ka, kb) that is not equal, -1 when none;
* **common prefix**: the number of leading equal slots;
* **final position**: when both outputs are known, the shorter full sequence's last token
  (``common_len - 1``), if it lies before the first position where the two full sequences
  differ: a block anchored there is a request's final proposal (drafted after its last
  token, never verified) on the side whose sequence ends there, and, where the other
  sequence goes on (one output a prefix of the other), an ordinary block on the other side,
  drafted from the same context (prompt + output up to and including that token);
* **comparable**: a block lies on matched content: its anchor position is before the first
  position where the two full sequences (prompt + output) differ and, when both outputs are
  known, before the final position, or at the final position when both sides have a block
  there (same request pair, same position; :mod:`spectrace.tracer.align` pairs them). A
  final proposal only one side drafted (an engine may or may not draft after the last
  token: vLLM does, our reference engine does not) compares with nothing.

:func:`compare_blocks` compares rows already paired; :func:`compare_paired` gathers an
alignment's paired rows and compares them in chunks on threads, with the per-slot counts
(:class:`SlotCounts`) of the same pass.

Matrices are ``[n, w]`` with w the wider proposal width; proposals are padded with -1 (see
:func:`spectrace.tracer.schema.pad_to`). Boolean matrices are returned in Fortran order so
that per-slot passes (``eq[:, j]``) read contiguous memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .parallel import chunks, each_chunk
from .schema import pad_to

#: Divergence position meaning "the sequences agree on their common length".
NO_DIVERGENCE = np.iinfo(np.int64).max

#: Final position meaning "none" (:func:`final_position`): no block is anchored there.
NO_FINAL = np.iinfo(np.int64).min

#: The slot shifts tested per slot (ours[j] == theirs[j + s]): the diff's shift agreement
#: and the TUI's "shifted" cells. The layout-shift detector scans wider shifts itself.
SHIFTS = (1, -1)


def first_difference(x: np.ndarray, y: np.ndarray) -> int:
    """First index where int arrays ``x`` and ``y`` differ within their common length.

    Args:
        x, y: int arrays [n] / [m] (token ids).
    Returns:
        The index, or :data:`NO_DIVERGENCE` when one is a prefix of the other.
    """
    n = min(len(x), len(y))
    diff = np.flatnonzero(x[:n] != y[:n])
    return int(diff[0]) if len(diff) else NO_DIVERGENCE


def comparable_limit(
    divergence: np.ndarray, common_len: np.ndarray, content_known: np.ndarray
) -> np.ndarray:
    """Per request pair, the first anchor position that is no longer comparable.

    Args:
        divergence: int64 [m] content divergence position (or :data:`NO_DIVERGENCE`).
        common_len: int64 [m] length of the shorter full sequence (tokens).
        content_known: bool [m] both sides know their output ids.
    Returns:
        int64 [m]: a block at anchor position p of pair i is comparable if ``p < limit[i]``;
        past it, only a block at the final position (:func:`final_position`) that both
        sides drafted is.
    """
    return np.where(content_known, np.minimum(divergence, common_len - 1), divergence)


def final_position(
    divergence: np.ndarray, common_len: np.ndarray, content_known: np.ndarray
) -> np.ndarray:
    """Per request pair, the final position (module docstring): int64 [m], ``common_len -
    1`` where both outputs are known and the sequences agree up to and including that token,
    else :data:`NO_FINAL` (no block position). Arguments as :func:`comparable_limit`'s."""
    last = common_len - 1
    return np.where(content_known & (last < divergence) & (last >= 0), last, NO_FINAL)


def at_final(position: np.ndarray, pair: np.ndarray, final: np.ndarray) -> np.ndarray:
    """bool [n]: which blocks (int [n] anchor ``position``, int64 [n] ``pair``, -1 for an
    unmatched request: False) are anchored at their pair's ``final`` position (int64 [m],
    :func:`final_position`): comparable only where the other side has a block there too."""
    fin = np.append(final, NO_FINAL)  # index -1: the unmatched "pair"
    return position == fin[pair]


def comparable(position: np.ndarray, pair: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """Which blocks lie on matched content.

    Args:
        position: int [n] anchor positions (tokens from the start of the prompt).
        pair: int64 [n] request-pair index per block, -1 for an unmatched request.
        limit: int64 [m] from :func:`comparable_limit`.
    Returns:
        bool [n]; False for every block of an unmatched request.
    """
    lim = np.append(limit, np.iinfo(np.int64).min)  # index -1: the unmatched "pair"
    return position < lim[pair]


def anchors_known(anchor_a: np.ndarray, anchor_b: np.ndarray) -> np.ndarray:
    """Both anchors known (not -1): bool [n] from int [n] anchor ids."""
    return (anchor_a >= 0) & (anchor_b >= 0)


def count_anchors_known(
    anchor_a: np.ndarray, anchor_b: np.ndarray, ia: np.ndarray, ib: np.ndarray
) -> int:
    """How many paired blocks have both anchors known (:func:`anchors_known` of rows ``ia``
    of ``anchor_a`` and ``ib`` of ``anchor_b``, int [P] each), counted in chunks."""
    return sum(
        int(np.count_nonzero(anchors_known(anchor_a[ia[c]], anchor_b[ib[c]])))
        for c in chunks(len(ia))
    )


def anchors_equal(anchor_a: np.ndarray, anchor_b: np.ndarray) -> np.ndarray:
    """Anchor equality of paired blocks: equal ids, or unknown (-1) on either side.

    Args:
        anchor_a, anchor_b: int [n] anchor token ids, -1 unknown.
    Returns:
        bool [n].
    """
    return ~anchors_known(anchor_a, anchor_b) | (anchor_a == anchor_b)


def _width(pa: np.ndarray, pb: np.ndarray) -> int:
    return max(pa.shape[1], pb.shape[1], 1)


def slots_present(ka: np.ndarray, kb: np.ndarray, w: int) -> np.ndarray:
    """Slot j present on both sides: ``j < min(ka, kb)``.

    Args:
        ka, kb: int [n] proposal lengths (tokens); w: slots.
    Returns:
        bool [n, w] (Fortran order).
    """
    kmin = np.minimum(ka, kb)
    out = np.empty((len(kmin), w), bool, order="F")
    for j in range(w):
        np.greater(kmin, j, out=out[:, j])
    return out


def present_counts(ka: np.ndarray, kb: np.ndarray, w: int) -> np.ndarray:
    """Per slot, the blocks whose slot j is present on both sides (column sums of
    :func:`slots_present`, by one bincount).

    Args:
        ka, kb: int [n] proposal lengths (tokens); w: slots.
    Returns:
        int64 [w].
    """
    by_kmin = np.zeros(w + 1, np.int64)
    for c in chunks(len(ka)):  # in chunks: no whole-column temporaries
        kmin = np.maximum(np.minimum(ka[c], kb[c]), 0)
        by_kmin += np.bincount(kmin, minlength=w + 1)[: w + 1]
    return len(ka) - np.cumsum(by_kmin)[:w]


def slot_equal(
    pa: np.ndarray, pb: np.ndarray, ka: np.ndarray, kb: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """Per-slot equality of paired proposals.

    Args:
        pa, pb: int32 [n, wa] / [n, wb] proposed ids (-1 padded), row i of each paired.
        ka, kb: int [n] proposal lengths (tokens).
        out: bool [n, w] to fill (e.g. a row slice of a Fortran-order matrix), or None.
    Returns:
        bool [n, w] (Fortran order unless ``out`` is given), w = max(wa, wb): slot j equal
        and present on both.
    """
    w = _width(pa, pb)
    pa, pb = pad_to(pa, w), pad_to(pb, w)
    kmin = np.minimum(ka, kb)
    eq = np.empty((len(kmin), w), bool, order="F") if out is None else out
    tmp = np.empty(len(kmin), bool)
    for j in range(w):  # slot-major: 1-D passes, where reductions over w columns crawl
        np.equal(pa[:, j], pb[:, j], out=eq[:, j])
        eq[:, j] &= np.greater(kmin, j, out=tmp)
    return eq


def common_prefix(eq: np.ndarray) -> np.ndarray:
    """Common-prefix length per block: leading equal slots.

    Args:
        eq: bool [n, w] from :func:`slot_equal`.
    Returns:
        int16 [n] (tokens).
    """
    alive = np.ones(eq.shape[0], bool)
    prefix = np.zeros(eq.shape[0], np.int16)
    for j in range(eq.shape[1]):
        alive &= eq[:, j]
        prefix += alive
    return prefix


def exact_match(prefix: np.ndarray, ka: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """Exact match: same k and every slot equal.

    Args:
        prefix: int [n] from :func:`common_prefix`; ka, kb: int [n] proposal lengths.
    Returns:
        bool [n].
    """
    return (ka == kb) & (prefix == ka)


def first_differing_slot(eq: np.ndarray, ka: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """The first slot j < max(ka, kb) that is not equal.

    Args:
        eq: bool [n, w] from :func:`slot_equal`; ka, kb: int [n] proposal lengths.
    Returns:
        int64 [n]; -1 where every slot up to the longer proposal is equal.
    """
    return first_slot_from_prefix(common_prefix(eq), ka, kb)


def first_slot_from_prefix(prefix: np.ndarray, ka: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """:func:`first_differing_slot` from the common prefix: slot ``prefix`` is the first
    that is not equal (slots before it are), so it is the first differing slot when it lies
    below the longer proposal (equal slots are present on both, so prefix <= min(ka, kb)).

    Args:
        prefix: int [n] from :func:`common_prefix`; ka, kb: int [n] proposal lengths.
    Returns:
        int64 [n]; -1 where every slot up to the longer proposal is equal.
    """
    prefix = prefix.astype(np.int64)
    return np.where(prefix < np.maximum(ka, kb), prefix, -1)


def shift_equal(
    pa: np.ndarray, pb: np.ndarray, ka: np.ndarray, kb: np.ndarray, s: int
) -> np.ndarray:
    """Shifted slot equality: ``ours[j] == theirs[j + s]`` with both slots present.

    Args:
        pa, pb: int32 [n, wa] / [n, wb] proposed ids (-1 padded); ka, kb: int [n] lengths.
        s: the shift, nonzero; for s < 0 the test is ``ours[j - s] == theirs[j]``.
    Returns:
        bool [n, w - |s|] (Fortran order); column j is ours' slot j (s > 0) or theirs'
        slot j (s < 0). Empty columns when |s| >= w.
    """
    w = _width(pa, pb)
    pa, pb = pad_to(pa, w), pad_to(pb, w)
    d = abs(s)
    x, y = (pa, pb) if s > 0 else (pb, pa)
    out = shift_present(ka, kb, w, s)
    tmp = np.empty(len(ka), bool)
    for j in range(w - d):
        out[:, j] &= np.equal(x[:, j], y[:, j + d], out=tmp)
    return out


def shift_present(ka: np.ndarray, kb: np.ndarray, w: int, s: int) -> np.ndarray:
    """Both slots of the shift-s test present: ours' slot j and theirs' slot j + s (s > 0),
    or theirs' slot j and ours' slot j - s (s < 0).

    Args:
        ka, kb: int [n] proposal lengths (tokens); w: slots; s: the shift, nonzero.
    Returns:
        bool [n, w - |s|] (Fortran order), columns as :func:`shift_equal`'s.
    """
    d = abs(s)
    kx, ky = (ka, kb) if s > 0 else (kb, ka)
    out = np.empty((len(ka), max(w - d, 0)), bool, order="F")
    tmp = np.empty(len(ka), bool)
    for j in range(w - d):
        np.greater(kx, j, out=out[:, j])
        out[:, j] &= np.greater(ky, j + d, out=tmp)
    return out


@dataclass
class BlockComparison:
    """Paired blocks compared (see the module docstring for each term).

    Attributes:
        eq: bool [n, w] slot equality (Fortran order).
        prefix: int16 [n] common-prefix length (tokens).
        exact: bool [n] exact match.
        anchor_eq: bool [n] anchor equality.
        divergent: bool [n] not exact, or the anchors differ.
        first_slot: int [n] first differing slot, -1 none (int16 from
            :func:`compare_paired`).
    """

    eq: np.ndarray
    prefix: np.ndarray
    exact: np.ndarray
    anchor_eq: np.ndarray
    divergent: np.ndarray
    first_slot: np.ndarray


def compare_blocks(
    pa: np.ndarray,
    pb: np.ndarray,
    ka: np.ndarray,
    kb: np.ndarray,
    anchor_a: np.ndarray,
    anchor_b: np.ndarray,
) -> BlockComparison:
    """Compare n paired blocks (row i of ours with row i of theirs).

    Args:
        pa, pb: int32 [n, wa] / [n, wb] proposed ids (-1 padded).
        ka, kb: int [n] proposal lengths (tokens).
        anchor_a, anchor_b: int [n] anchor ids, -1 unknown.
    Returns:
        A :class:`BlockComparison`. For an alignment's paired rows of two proposal
        matrices, :func:`compare_paired` gathers and compares in chunks on threads.
    """
    eq = slot_equal(pa, pb, ka, kb)
    prefix = common_prefix(eq)
    exact = exact_match(prefix, ka, kb)
    anchor_eq = anchors_equal(anchor_a, anchor_b)
    return BlockComparison(
        eq=eq,
        prefix=prefix,
        exact=exact,
        anchor_eq=anchor_eq,
        divergent=~exact | ~anchor_eq,
        first_slot=first_slot_from_prefix(prefix, ka, kb),
    )


@dataclass
class SlotCounts:
    """Per-slot counts over paired blocks (the diff's per-position and shift agreement).

    Attributes:
        equal: int64 [w] blocks whose slot j is equal (:func:`slot_equal`).
        present: int64 [w] blocks whose slot j is present on both sides.
        shift_plus, shift_minus: int64 [w - 1] blocks with ``ours[j] == theirs[j + 1]`` /
            ``ours[j + 1] == theirs[j]`` (:func:`shift_equal`, s = +1 / -1) among the
            ``present[j + 1]`` blocks whose slots j and j + 1 are both on both sides.
    """

    equal: np.ndarray
    present: np.ndarray
    shift_plus: np.ndarray
    shift_minus: np.ndarray


@dataclass
class PairedComparison:
    """The kernel's view of an alignment's paired blocks.

    Attributes:
        ka, kb: int16 [P] proposal lengths of the paired blocks (tokens).
        blocks: the per-block comparison (:class:`BlockComparison`).
        counts: the per-slot counts (:class:`SlotCounts`).
    """

    ka: np.ndarray
    kb: np.ndarray
    blocks: BlockComparison
    counts: SlotCounts


def compare_paired(
    prop_a: np.ndarray,
    prop_b: np.ndarray,
    ia: np.ndarray | None,
    ib: np.ndarray | None,
    k_a: np.ndarray,
    k_b: np.ndarray,
    anchor_a: np.ndarray,
    anchor_b: np.ndarray,
) -> PairedComparison:
    """:func:`compare_blocks` of rows ``ia`` of ours with rows ``ib`` of theirs, gathered and
    compared in chunks on worker threads, with the per-slot counts of the same pass.

    Args:
        prop_a, prop_b: int32 [blocks_a, wa] / [blocks_b, wb] proposal matrices (-1 padded).
        ia, ib: int [P] paired block indices into them, or None: the rows (and ``k_a``...
            ``anchor_b``) are the paired blocks already, in pair order.
        k_a, k_b: int [blocks_a] / [blocks_b] proposal lengths; anchor_a, anchor_b: int
            [blocks_a] / [blocks_b] anchor ids (-1 unknown).
    Returns:
        A :class:`PairedComparison` (its ``eq`` is [P, w] in Fortran order, w = max(wa, wb)).
        For both matrices streamed rather than held, see
        :class:`~spectrace.tracer.compare_stream.PairedStreams`.
    """
    w = max(prop_a.shape[1], prop_b.shape[1])  # 0 only for two empty traces (P = 0)
    n = len(k_a) if ia is None else len(ia)
    every = slice(None)
    acc = Accumulator(n, w, lengths(k_a[_rows(ia, every)]), lengths(k_b[_rows(ib, every)]))

    def part(cs: list[slice]) -> np.ndarray:
        """Fill rows ``cs``; returns int64 [3, w] counts (equal, shift +1, shift -1)."""
        counts = np.zeros((3, w), np.int64)
        for c in cs:
            counts += acc.fill(c, prop_a[_rows(ia, c)], prop_b[_rows(ib, c)])
        return counts

    acc.counts = sum(each_chunk(n, part), acc.counts)
    return acc.result(anchor_a, anchor_b, ia, ib)


def lengths(k: np.ndarray) -> np.ndarray:
    """int16 [n] proposal lengths (the store's dtype of ``k``)."""
    return np.asarray(k).astype(np.int16, copy=False)


class Accumulator:
    """The per-block outputs and per-slot counts of :func:`compare_paired`, filled row set
    by row set (in any order) by :meth:`fill`, finished by :meth:`result` (also the
    streamed comparisons', :mod:`spectrace.tracer.compare_stream`)."""

    def __init__(self, n: int, w: int, ka: np.ndarray, kb: np.ndarray) -> None:
        self.w, self.ka, self.kb = w, ka, kb
        self.eq = np.empty((n, w), bool, order="F")
        self.prefix = np.empty(n, np.int16)
        self.counts = np.zeros((3, w), np.int64)

    def fill(self, rows, pa: np.ndarray, pb: np.ndarray) -> np.ndarray:
        """Compare paired blocks ``rows`` (a slice or int indices) holding proposals ``pa``
        and ``pb``; returns their int64 [3, w] counts (equal, shift +1, shift -1)."""
        w, counts = self.w, np.zeros((3, self.w), np.int64)
        kac, kbc = self.ka[rows], self.kb[rows]
        e = slot_equal(pa, pb, kac, kbc, out=self.eq[rows] if isinstance(rows, slice) else None)
        if not isinstance(rows, slice):
            self.eq[rows] = e
        self.prefix[rows] = common_prefix(e)
        for j in range(w):  # 1-D counts: fast where axis reductions crawl
            counts[0, j] += np.count_nonzero(e[:, j])
        both = slots_present(kac, kbc, w)
        for row, s in ((1, 1), (2, -1)):
            se = shift_equal(pa, pb, kac, kbc, s)
            for j in range(w - 1):
                se[:, j] &= both[:, j + 1]
                counts[row, j] += np.count_nonzero(se[:, j])
        return counts

    def result(self, anchor_a, anchor_b, ia, ib) -> PairedComparison:
        """The :class:`PairedComparison` of the filled rows; anchors as
        :func:`compare_paired` takes them (rows ``ia`` / ``ib`` of each, or None)."""
        ka, kb, prefix, w, n = self.ka, self.kb, self.prefix, self.w, len(self.ka)
        exact = exact_match(prefix, ka, kb)
        first = np.empty(n, np.int16)
        anchor_eq = np.empty(n, bool)
        for c in chunks(n):  # in chunks: the temporaries stay small
            first[c] = first_slot_from_prefix(prefix[c], ka[c], kb[c])
            anchor_eq[c] = anchors_equal(anchor_a[_rows(ia, c)], anchor_b[_rows(ib, c)])
        blocks = BlockComparison(
            eq=self.eq,
            prefix=prefix,
            exact=exact,
            anchor_eq=anchor_eq,
            divergent=~exact | ~anchor_eq,
            first_slot=first,
        )
        counts = SlotCounts(
            equal=self.counts[0],
            present=present_counts(ka, kb, w),
            shift_plus=self.counts[1, :-1],
            shift_minus=self.counts[2, :-1],
        )
        return PairedComparison(ka=ka, kb=kb, blocks=blocks, counts=counts)


def _rows(idx: np.ndarray | None, c: slice):
    """Rows ``c`` of the paired blocks as indices into a column (``idx[c]``; ``c`` itself
    when the column is in pair order already)."""
    return c if idx is None else idx[c]
