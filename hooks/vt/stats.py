"""What a ``VT_SPEC_TRACE`` parse found: counts and the first offending lines of each kind
(stored as ``meta["import"]``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: How many offending line numbers each statistic keeps.
MAX_EXAMPLES = 20


@dataclass
class ImportStats:
    """What a parse found: counts, and the first offending line numbers of each kind.

    Attributes:
        source: the log's name (file name or ``<stdin>``), used in messages.
        lines: lines fed; ``trace_lines`` of them were trace lines.
        blocks: blocks written; ``requests``: distinct request ids among them.
        steps: engine steps delimited; ``k_max``: the largest k seen (drafts per block).
        chain_gaps: blocks whose ``pos`` is past the previous block's ``pos + ns``: the
            request decoded tokens in steps without drafts, which print no line.
        malformed: trace lines skipped because their fields are unreadable.
        edited: trace lines used although they differ from the engine's exact format.
        violations: broken invariants by kind (chain break, acc != ns-1, ...).
        examples: kind -> list of ``[line, message]`` (at most MAX_EXAMPLES each).
        families: line count per tag; ``probes``: scheduler/engine-core details.
        joins: propose-join outcome counts (exact, hint, truncated, partial, unjoined, ...).
        proposed_source: blocks whose ``proposed`` came from a ``[spec-propose]`` line
            (``propose_line``) or copies ``verified`` (``verified``).
        anchors: anchor source counts (chain, requests, unknown, patched later).
        phases: phase rows written.
        requests_check: how the requests file matches the log (:func:`check_requests`),
            None without a requests file.
    """

    source: str = "?"
    lines: int = 0
    trace_lines: int = 0
    blocks: int = 0
    requests: int = 0
    steps: int = 0
    k_max: int = 0
    #: The largest ``lookahead`` of ``[spec-install]`` lines: the draft slots the engine
    #: reserves per request (k, or k + 1 where the drafter counts the anchor), drafts or not.
    lookahead_max: int = 0
    chain_gaps: int = 0
    malformed: int = 0
    edited: int = 0
    violations: Counter = field(default_factory=Counter)
    examples: dict[str, list] = field(default_factory=dict)
    families: Counter = field(default_factory=Counter)
    probes: Counter = field(default_factory=Counter)
    joins: Counter = field(default_factory=Counter)
    proposed_source: Counter = field(default_factory=Counter)
    anchors: Counter = field(default_factory=Counter)
    phases: int = 0
    trace_level: int | None = None
    requests_check: dict | None = None

    def note(self, kind: str, lineno: int, msg: str) -> None:
        """Keep ``[lineno, msg]`` as an example of ``kind`` (the first MAX_EXAMPLES only)."""
        ex = self.examples.setdefault(kind, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append([lineno, msg])

    def summary(self, verb: str = "imported") -> str:
        """One line for people, e.g. ``imported 412 blocks of 4 requests from LOG (k=4, …)``."""
        parts = [f"k={self.k_max}", f"{self.steps} steps", f"{self.malformed} malformed lines"]
        if self.edited:
            parts.append(f"{self.edited} edited lines")
        nviol = sum(self.violations.values())
        if nviol:
            kinds = ", ".join(f"{n} {k}" for k, n in self.violations.most_common())
            first = self._first_line()
            parts.append(f"{nviol} invariant violations ({kinds}; first at line {first})")
        if self.chain_gaps:
            parts.append(f"{self.chain_gaps} chain gaps")
        if self.anchors.get("unknown"):
            parts.append(f"{self.anchors['unknown']} anchors unknown")
        if self.families.get("spec-propose"):
            # A never-installed proposal is written from its propose line but joins nothing
            # (once placed: without a known position it is not written at all).
            held = self.joins.get("not_installed", 0)
            placed = held - self.joins.get("not_installed, position unknown", 0)
            joined = self.proposed_source.get("propose_line", 0) - placed
            parts.append(f"{joined} proposals joined, {self.joins.get('unjoined', 0)} unjoined")
            if held:
                parts.append(f"{held} never installed ({placed} kept as unverified blocks)")
            if self.joins.get("proposed != verified"):
                parts.append(f"{self.joins['proposed != verified']} proposed != verified")
        if self.phases:
            parts.append(f"{self.phases} phase timings")
        return (
            f"{verb} {_plural(self.blocks, 'block')} of {_plural(self.requests, 'request')} "
            f"from {self.source} ({', '.join(parts)})"
        )

    def requests_warning(self) -> str | None:
        """One line on a requests file that does not match the log, or None."""
        c = self.requests_check
        return c["message"] if c and c.get("message") else None

    def no_blocks_warning(self) -> str | None:
        """One line when the parse wrote no block, or None."""
        if self.blocks:
            return None
        return (
            f"{self.source}: no [SPECTRACE] verify lines, so the trace has no blocks "
            f"(was VT_SPEC_TRACE set, and does this command run our engine with drafts?)"
        )

    def _first_line(self) -> int:
        lines = [ex[0][0] for k, ex in self.examples.items() if k in self.violations and ex]
        return min(lines, default=0)

    def probe(self, key: str, values: dict) -> None:
        """Count one runner probe line (``post_step``, ``install``, ``update_*``) with its
        parsed ``values``; an install line's ``lookahead`` raises :attr:`lookahead_max`."""
        self.probes[key] += 1
        if key == "install":
            self.lookahead_max = max(self.lookahead_max, int(values.get("lookahead", 0)))

    def to_meta(self) -> dict:
        """The statistics as a JSON-ready dict (stored as ``meta["import"]``)."""
        return {
            "source": self.source,
            "lines": self.lines,
            "trace_lines": self.trace_lines,
            "blocks": self.blocks,
            "requests": self.requests,
            "steps": self.steps,
            "k_max": self.k_max,
            "lookahead_max": self.lookahead_max,
            "chain_gaps": self.chain_gaps,
            "malformed": self.malformed,
            "edited": self.edited,
            "violations": dict(self.violations),
            "examples": self.examples,
            "families": dict(self.families),
            "probes": dict(self.probes),
            "joins": dict(self.joins),
            "proposed_source": dict(self.proposed_source),
            "anchors": dict(self.anchors),
            "phases": self.phases,
            **({"requests_check": self.requests_check} if self.requests_check else {}),
        }

    def meta_items(self, configured: int | None, levels_seen: set[int], meta: dict) -> dict:
        """The /meta items an import writes: ``import`` (these statistics), ``k`` (when the
        meta has none: the widest block seen, else the install lines' lookahead) and
        ``trace_level`` (configured, else the
        highest level evidenced by the lines; a lower bound). Sets :attr:`trace_level`."""
        seen = max(levels_seen) if levels_seen else (0 if self.trace_lines else None)
        self.trace_level = configured if configured is not None else seen
        imp = self.to_meta()
        imp["trace_level_source"] = (
            "configured" if configured is not None else "inferred (lower bound)"
        )
        # k: the widest block; without blocks (drafts never installed), the engine's
        # lookahead (its draft slots; not k itself where the drafter counts the anchor in
        # them, as DFlash's block does: lookahead 4, 3 drafts).
        items = {"import": imp, "k": meta.get("k") or self.k_max or self.lookahead_max}
        if meta.get("trace_level") is None and self.trace_level is not None:
            items["trace_level"] = self.trace_level
        return items


def check_requests(source: str, log: str, reached: dict[str, int], lengths: dict[str, int]) -> dict:
    """Compare a requests file with the log it belongs to.

    Args:
        source: the requests file's name; ``log`` the log's (for the message).
        reached: log request id -> the last block's ``pos`` (its anchor is token
            ``pos - 1``), in the order the log first names them.
        lengths: requests-file id -> ``len(prompt_ids + output_ids)``, in file order.
    Returns:
        ``{"log_requests", "file_requests", "missing", "unmatched", "short"}`` counts (log
        requests absent from the file, file requests absent from the log, file requests that
        end before the log's last anchor), ``first_missing`` / ``first_unmatched`` /
        ``first_short`` examples when nonzero, and ``message`` (one line, "" when all match).
    """
    missing = [r for r in reached if r not in lengths]
    unmatched = [r for r in lengths if r not in reached]
    short = [r for r, pos in reached.items() if r in lengths and lengths[r] < pos]
    out: dict = {
        "log_requests": len(reached),
        "file_requests": len(lengths),
        "missing": len(missing),
        "unmatched": len(unmatched),
        "short": len(short),
    }
    parts = []
    if missing:
        out["first_missing"] = missing[0]
        parts.append(
            f"{len(missing)} of {len(reached)} log requests are not in it (first: req={missing[0]})"
        )
    if unmatched:
        out["first_unmatched"] = unmatched[0]
        parts.append(
            f"{len(unmatched)} of its {len(lengths)} requests are not in the log "
            f"(first: req={unmatched[0]})"
        )
    if short:
        r = short[0]
        out["first_short"] = f"req={r} has {lengths[r]} ids, the log reached position {reached[r]}"
        parts.append(
            f"{len(short)} of {len(reached)} log requests end before the log's last anchor "
            f"(first: {out['first_short']})"
        )
    out["message"] = f"{source}: does not match {log}: {'; '.join(parts)}" if parts else ""
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
