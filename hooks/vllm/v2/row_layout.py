"""The staged row's columns and the in-graph descriptor's fields: one definition that the
Triton kernels (:mod:`.stage_triton`), the host writers (:mod:`.stage`, :mod:`.graph_stage`) and
the join read. A leaf module (no imports), so the kernel module can take it too."""

#: Columns before the drafts in a staged row: num_sampled, num_rejected, anchor, anchor position.
META_COLS = 4

#: The in-graph descriptor (:mod:`.graph_stage`): int64 fields, in order. ``wide`` has bit i
#: set when input i (ns, nr, idx, qsl, positions, last, nxt: :func:`.stage.input_ptrs`'s
#: order, which the seven pointers keep) is int64 (else int32).
DESC_FIELDS = (
    "seq",
    "n",
    "out",
    "out_stride",
    "row0",
    "ns",
    "nr",
    "idx",
    "qsl",
    "positions",
    "last",
    "nxt",
    "last_stride",
    "nxt_stride",
    "wide",
    "spare",
)
