"""The viewer's whole-trace analysis, in a thread for small traces or in a child process for
big ones (``python -m spectrace.tui.model.worker SPEC``) so its peak memory never lands in
the viewer.

The analysis is ``spectrace diff``'s own (:func:`~spectrace.tracer.align.align` and
:func:`~spectrace.tracer.diff.diff_traces`), or for one trace ``spectrace info``'s summary
and ``spectrace check``'s findings, plus the figures of :mod:`spectrace.tracer.analysis`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from spectrace.tracer.align import align
from spectrace.tracer.analysis import acceptance_along, differing_per_pair, per_request_acceptance
from spectrace.tracer.diff import diff_traces
from spectrace.tracer.diff_result import DiffResult
from spectrace.tracer.findings import Finding, check_trace
from spectrace.tracer.findings.summary import explained_summary
from spectrace.tracer.pages import prefer_small_pages
from spectrace.tracer.store import Trace, open_trace
from spectrace.tracer.tokens import Decoder, decoder_for

#: Blocks above which the viewer runs :func:`analyse` in a child process by default.
SUBPROCESS_BLOCKS = 200_000


@dataclass
class Analysis:
    """The whole-trace results the viewer shows beside the rows.

    Attributes:
        diff: the typed diff of a pair (``spectrace diff``'s result; its ``bad`` column is
            None after a trip through the child process), None for one trace.
        summary: the ``explained_summary`` of one trace (``spectrace info``'s dict), None for a
            pair.
        findings: typed findings (most severe first): the diff's, or ``check_trace``'s.
        per_pair: per matched pair (order of ``match_requests``), from
            :func:`~spectrace.tracer.analysis.differing_per_pair`: ``bad`` blocks,
            ``first_bad`` position or None, ``paired`` blocks.
        per_request: ``{"ours": {"blocks", "accepted", "checked"} lists per request row,
            "theirs": ...}``.
        along: per side ``{"width", "rate", "blocks"}``: acceptance by anchor-position
            bucket (where it collapses).
        seconds: wall time of the analysis.
    """

    diff: DiffResult | None = None
    summary: dict | None = None
    findings: list[Finding] = field(default_factory=list)
    per_pair: list[dict] = field(default_factory=list)
    per_request: dict = field(default_factory=dict)
    along: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict:
        """JSON form (what the child process prints); a pair's findings travel once, in
        the diff document."""
        return {
            "diff": self.diff.to_json() if self.diff is not None else None,
            "summary": self.summary,
            "findings": [] if self.diff is not None else [f.to_json() for f in self.findings],
            "per_pair": self.per_pair,
            "per_request": self.per_request,
            "along": self.along,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, d: dict) -> Analysis:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError, TypeError: as :meth:`DiffResult.from_json` for a malformed diff.
        """
        diff = DiffResult.from_json(d["diff"]) if d["diff"] is not None else None
        findings = (
            list(diff.findings)
            if diff is not None
            else [Finding.from_json(f) for f in d["findings"]]
        )
        return cls(
            diff=diff,
            summary=d["summary"],
            findings=findings,
            per_pair=d["per_pair"],
            per_request=d["per_request"],
            along=d["along"],
            seconds=d.get("seconds", 0.0),
        )


def analyse(
    a: Trace,
    b: Trace | None = None,
    decoder: Decoder | None = None,
    phase: Callable[[str], object] = lambda name: None,
) -> Analysis:
    """Run the whole-trace analysis: the diff and its findings (or, for one trace,
    ``explained_summary`` and ``check_trace``), per-pair divergence counts, per-request
    acceptance and acceptance along the sequence.

    The diff's memory grows with the traces; the figures of :mod:`spectrace.tracer.analysis`
    are streamed (a few MB) and run after it, once the alignment is dropped.
    ``phase(name)`` is called as each step starts (``align``, ``diff``, ``per pair``,
    ``acceptance``; ``summary``, ``findings``, ``acceptance`` for one trace): for progress
    or per-step memory figures.
    """
    t0 = time.perf_counter()
    if b is None:
        phase("summary")
        summary = explained_summary(a)  # rates with impossible values left out, explained
        phase("findings")
        findings = check_trace(a, decoder)
        phase("acceptance")
        return Analysis(
            summary=summary,
            findings=findings,
            per_request={"ours": per_request_acceptance(a)},
            along={"ours": acceptance_along(a)},
            seconds=time.perf_counter() - t0,
        )
    phase("align")
    al = align(a, b)
    phase("diff")
    res = diff_traces(al, decoder=decoder)
    assert res.bad is not None  # diff_traces always sets it
    phase("per pair")
    per_pair = differing_per_pair(al, res.bad)
    del al  # the paired-block arrays: not needed past here
    phase("acceptance")
    return Analysis(
        diff=res,
        findings=list(res.findings),
        per_pair=per_pair,
        per_request={"ours": per_request_acceptance(a), "theirs": per_request_acceptance(b)},
        along={"ours": acceptance_along(a), "theirs": acceptance_along(b)},
        seconds=time.perf_counter() - t0,
    )


def analyse_in_child(
    paths_a: Sequence[str], paths_b: Sequence[str] | None, tokenizer: str | None = None
) -> Analysis:
    """Run :func:`analyse` in a child Python process (its peak memory stays there).

    Raises:
        RuntimeError: the child failed (its last stderr line is in the message).
    """
    arg = json.dumps(
        {"a": list(paths_a), "b": list(paths_b) if paths_b else None, "tokenizer": tokenizer}
    )
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = subprocess.run(
        [sys.executable, "-m", "spectrace.tui.model.worker", arg],
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"analysis failed: {tail}")
    return Analysis.from_json(json.loads(r.stdout))


def child_main(arg: str, phase: Callable[[str], object] = lambda name: None, out=None) -> None:
    """The child process's work: open the traces named by ``arg`` (the JSON spec of
    :func:`analyse_in_child`), run :func:`analyse` and write its JSON to ``out`` (stdout).
    ``phase`` as :func:`analyse`'s, plus ``open`` and ``json`` (the benchmark's per-step
    memory figures)."""
    spec = json.loads(arg)
    phase("open")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = open_trace(spec["a"])
        b = open_trace(spec["b"]) if spec["b"] else None
    try:
        dec = decoder_for(spec.get("tokenizer"), a.meta, *(b.meta,) if b else ())
    except Exception:  # a bad tokenizer only costs the decoded examples
        dec = None
    an = analyse(a, b, dec, phase)
    phase("json")
    json.dump(an.to_json(), out or sys.stdout)


if __name__ == "__main__":
    prefer_small_pages()
    child_main(sys.argv[1])
