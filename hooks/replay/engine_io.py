"""What the external engines (``vllm``, ``cmd``) exchange with a replay: the prefixes JSONL
they read and the trace of one-token requests they leave, read back into :class:`Draft` s."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from spectrace.tracer.errors import SpectraceError
from spectrace.tracer.store import Trace

from .positions import Reference, Site
from .write import Draft


class EngineFailed(SpectraceError):
    """The replayed engine failed (a non-zero exit status, or stopped by ``--timeout``):
    no trace verdict can be given, and the input was not at fault, so the CLI exits 3
    (:attr:`ExitCode.FAILURE`) with one line, never 1 (a divergence) or 2 (bad input)."""


def _sampled(t: Trace, r: int | None) -> int | None:
    """The token request row ``r`` of ``t`` emitted first (its target's sample at the
    site), or None when the request or its output is unknown."""
    if r is None:
        return None
    out = t.requests.output_ids[r]
    return int(out[0]) if len(out) else None


def write_prefixes(path: str | os.PathLike, refs: list[Reference], sites: list[Site]) -> Path:
    """One ``{"id": site.ident, "prompt_ids": sequence[:position]}`` line per site."""
    path = Path(path)
    with open(path, "w", encoding="utf-8") as f:
        for s in sites:
            ids = list(refs[s.request].sequence[: s.position])
            f.write(json.dumps({"id": s.ident, "prompt_ids": ids}) + "\n")
    return path


def drafts_of(
    t: Trace, refs: list[Reference], sites: list[Site], by: str, always_drafts: bool = True
) -> list[Draft]:
    """The first block of each site's request in the engine's trace ``t``.

    Args:
        by: how requests of ``t`` name their site: ``prompt`` (by prompt ids; vLLM) or
            ``id`` (the request id is the site's ident; the ``cmd`` contract).
        always_drafts: the drafter proposes at every step (a model). False for n-gram,
            which rightly proposes nothing where the prefix holds no match: a site whose
            request emitted its token without a block is then an empty proposal.
    Raises:
        EngineFailed: a site without a block at its position (the engine did not draft
            there: dropped work, never bad input), or whose block's anchor is unknown (no
            requests record holds the request: its result is lost, not another sample),
            naming the first and how many.
    """
    req, pos, k = t.blocks.request, t.blocks.position, t.blocks.k
    first: dict[int, int] = {}
    for row in np.argsort(t.blocks.step, kind="stable"):
        first.setdefault(int(req[row]), int(row))
    index = _site_index(t, refs, sites, by)
    margins = t.blocks.draft_margin
    out: list[Draft] = []
    missing: list[Site] = []
    unknown: list[Site] = []
    if by == "id":
        _answers_what_was_asked(t, refs, sites, index)
    for s in sites:
        r = index.get(s.ident)
        row = first.get(r) if r is not None else None
        if row is None or int(pos[row]) != s.position:
            sampled = _sampled(t, r) if not always_drafts and row is None else None
            if sampled is None:
                missing.append(s)
            else:  # no match, no proposal: what the reference replay records too
                out.append(Draft(s, sampled, []))
            continue
        if int(t.blocks.anchor[row]) < 0:
            unknown.append(s)
            continue
        n = int(k[row])
        dm = [float(x) for x in margins[row, :n]]
        out.append(
            Draft(
                s,
                int(t.blocks.anchor[row]),
                [int(x) for x in t.blocks.proposed[row, :n]],
                None if all(math.isnan(x) for x in dm) else dm,
                float(t.blocks.target_margin[row]),
            )
        )
    if missing:
        s = missing[0]
        raise EngineFailed(
            f"engine left no block at {len(missing)} of {len(sites)} replayed positions "
            f"(first: request {refs[s.request].req_id} position {s.position}, site {s.ident}): "
            f"its drafts there are missing"
        )
    if unknown:
        s = unknown[0]
        raise EngineFailed(
            f"engine left no anchor at {len(unknown)} of {len(sites)} replayed positions "
            f"(first: request {refs[s.request].req_id} position {s.position}, site {s.ident}: "
            f"no requests record holds it): its results there are missing"
        )
    return out


def _answers_what_was_asked(
    t: Trace, refs: list[Reference], sites: list[Site], index: dict[str, int]
) -> None:
    """Raises EngineFailed when the ``cmd`` engine drafted for a request it was not given,
    or its requests record holds another prompt than the prefix it was given."""
    rq, asked = t.requests, {s.ident for s in sites}
    drafted = {str(rq.req_id[int(r)]) for r in np.unique(t.blocks.request)}
    extra = sorted(drafted - asked)
    if extra:
        raise EngineFailed(
            f"engine drafted for {len(extra)} request(s) it was not given (first: id "
            f"{extra[0]}): its trace is not this replay's"
        )
    for s in sites:
        r = index.get(s.ident)
        got = rq.prompt_ids[r] if r is not None else ()
        if len(got) and not np.array_equal(got, refs[s.request].sequence[: s.position]):
            sizes = f" ({len(got)} tokens, not {s.position})" if len(got) != s.position else ""
            raise EngineFailed(
                f"engine's requests record for site {s.ident} (request "
                f"{refs[s.request].req_id} position {s.position}) holds another prompt than "
                f"the prefix it was given{sizes}"
            )


def _site_index(t: Trace, refs: list[Reference], sites: list[Site], by: str) -> dict[str, int]:
    """site ident -> request row of ``t``."""
    rq = t.requests
    if by == "id":
        return {str(rq.req_id[i]): i for i in range(len(rq))}
    rows: dict[tuple[int, ...], list[int]] = {}
    for i in range(len(rq)):
        rows.setdefault(tuple(int(x) for x in rq.prompt_ids[i]), []).append(i)
    out = {}
    for s in sites:
        cands = rows.get(refs[s.request].sequence[: s.position])
        if cands:
            out[s.ident] = cands.pop(0)
    return out


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """The engine's stdout (its completions) goes to stderr: stdout carries data only."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
