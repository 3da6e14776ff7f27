"""The viewer's model, UI-independent (no textual, no rich): request pairs, rows and windows
built on the comparison kernel, lazy side reads, search queries and the whole-trace analysis
(in a thread or a child process). The screens render what it computes; tests drive it
directly.
"""

from .rows import (
    ROW_FIELDS,
    S_DIFF,
    S_EQUAL,
    S_NONE,
    S_PAST,
    S_SHIFT,
    S_SOLO,
    STATE_NAMES,
    Pair,
    Rows,
    Window,
    compute_window,
)
from .search import QueryError, query_ids
from .sides import LRU, SideIndex, gather
from .view_model import BLOCK_FIELDS, WINDOW, ViewModel
from .worker import SUBPROCESS_BLOCKS, Analysis, analyse, analyse_in_child

__all__ = [
    "BLOCK_FIELDS",
    "LRU",
    "ROW_FIELDS",
    "S_DIFF",
    "S_EQUAL",
    "S_NONE",
    "S_PAST",
    "S_SHIFT",
    "S_SOLO",
    "STATE_NAMES",
    "SUBPROCESS_BLOCKS",
    "WINDOW",
    "Analysis",
    "Pair",
    "QueryError",
    "Rows",
    "SideIndex",
    "ViewModel",
    "Window",
    "analyse",
    "analyse_in_child",
    "compute_window",
    "gather",
    "query_ids",
]
