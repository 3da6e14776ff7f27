"""What a search query means: token ids from digits, or every vocabulary id whose decoded
text contains the query (an O(vocab) scan: the viewer runs it in a worker thread)."""

from __future__ import annotations

import numpy as np

from spectrace.tracer.tokens import Decoder


class QueryError(ValueError):
    """A query that matches no token (the message says why, for a notification)."""


def query_ids(query: str, decoder: Decoder | None) -> np.ndarray:
    """Token ids a search query stands for.

    Args:
        query: ``123`` or ``#123`` (one id), else text matched case-insensitively against
            every token's decoded text.
        decoder: the tokenizer, or None (then only ids are searchable).
    Returns:
        int64 [n] ids, n >= 1.
    Raises:
        QueryError: text without a decoder, or no token contains the text.
    """
    q = query.strip()
    if q.lstrip("#").isdigit():
        return np.array([int(q.lstrip("#"))], np.int64)
    if decoder is None:
        raise QueryError("no tokenizer: search by id (digits)")
    needle = query.casefold()
    ids = [t for t in range(decoder.vocab_size) if needle in decoder.token(t).casefold()]
    if not ids:
        raise QueryError(f"no token contains {query!r}")
    return np.array(ids, np.int64)
