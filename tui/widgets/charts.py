"""The charts tab, drawn with block characters: per-slot acceptance and agreement for both
engines, and acceptance along the sequence (all requests, and the request in view), which
shows where acceptance collapses (e.g. a degenerate loop, or a drafter that lost its state).
"""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from spectrace.tracer.fmt import pct

from ..model import Analysis

BARS = " ▏▎▍▌▋▊▉█"
COLUMNS = " ▁▂▃▄▅▆▇█"
SIDE_STYLE = {"ours": "cyan", "theirs": "magenta"}


def hbar(x: float | None, width: int) -> str:
    """A horizontal bar of ``x`` (0..1) in ``width`` cells (eighths resolution)."""
    if x is None:
        return " " * width
    eighths = int(round(max(0.0, min(1.0, x)) * width * 8))
    full, part = divmod(eighths, 8)
    s = "█" * full + (BARS[part] if part else "")
    return s.ljust(width)


def columns(values: list[float | None], height: int) -> list[str]:
    """A column chart of ``values`` (0..1, None = no data) as ``height`` lines, top first."""
    lines = []
    for level in range(height - 1, -1, -1):
        row = []
        for v in values:
            if v is None:
                row.append(" " if level else "·")
                continue
            e = int(round(max(0.0, min(1.0, v)) * height * 8)) - level * 8
            row.append(COLUMNS[max(0, min(8, e))])
        lines.append("".join(row))
    return lines


def resample(
    values: list[float | None], weights: list[int] | None, width: int
) -> list[float | None]:
    """Shrink ``values`` to at most ``width`` columns (weighted means of neighbours)."""
    n = len(values)
    if n <= width:
        return list(values)
    v = np.array([np.nan if x is None else x for x in values], float)
    w = np.ones(n) if weights is None else np.asarray(weights, float)
    edges = np.linspace(0, n, width + 1).astype(int)
    out: list[float | None] = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        vv, ww = v[lo:hi], w[lo:hi]
        ok = ~np.isnan(vv) & (ww > 0)
        out.append(float((vv[ok] * ww[ok]).sum() / ww[ok].sum()) if ok.any() else None)
    return out


def slot_chart(title: str, series: dict[str, list], width: int = 40) -> Text:
    """Per-slot bars, one line per side and slot."""
    t = Text(title + "\n", style="bold")
    slots = max((len(v) for v in series.values()), default=0)
    if not slots:
        t.append("  no data\n", style="dim")
    for j in range(slots):
        for side, vals in series.items():
            x = vals[j] if j < len(vals) else None
            t.append(f"  slot {j} {side:<7}", style="dim")
            t.append(hbar(x, width), style=SIDE_STYLE.get(side, ""))
            t.append(f" {pct(x)}\n")
    return t


def sequence_chart(
    title: str,
    series: dict[str, list],
    width: int,
    height: int = 5,
    unit: str = "",
    marker: int | None = None,
) -> Text:
    """Acceptance along the sequence: one column chart per side, with an axis caption."""
    t = Text(title + "\n", style="bold")
    for side, vals in series.items():
        t.append(f"  {side}\n", style=SIDE_STYLE.get(side, ""))
        if not vals:
            t.append("    no data\n", style="dim")
            continue
        for line in columns(vals, height):
            t.append("  │", style="dim")
            t.append(line, style=SIDE_STYLE.get(side, ""))
            t.append("\n")
        axis = "  └" + "─" * len(vals)
        t.append(axis + "\n", style="dim")
        if marker is not None and 0 <= marker < len(vals):
            t.append("   " + " " * marker + "▲ content diverges here\n", style="yellow")
    if unit:
        t.append(f"  {unit}\n", style="dim")
    return t


class Charts(VerticalScroll):
    """The charts tab (see the module docstring)."""

    DEFAULT_CSS = """
    Charts { padding: 0 1; }
    """

    def compose(self):
        yield Static("analysing…", id="charts-body")

    def show(self, an: Analysis | None, series: dict | None, pair_label: str = "") -> None:
        """Redraw from the analysis and the series of the request in view."""
        width = max(20, min(self.size.width - 8 if self.size.width else 100, 120))
        parts = []
        if an is None:
            self.query_one("#charts-body", Static).update(Text("analysing…", style="dim"))
            return
        if an.diff is not None:
            acc = an.diff.acceptance
            parts.append(
                slot_chart(
                    "Acceptance per slot (matched content, recorded: share of blocks with "
                    "accepted > slot)",
                    {
                        s: e.matched_content.recorded.per_position
                        for s, e in (("ours", acc.ours), ("theirs", acc.theirs))
                    },
                )
            )
            parts.append(
                slot_chart(
                    "Agreement per slot (paired blocks: ours[slot] == theirs[slot])",
                    {"both": an.diff.agreement.per_position},
                )
            )
        elif an.summary is not None:
            parts.append(
                slot_chart(
                    "Acceptance per slot (recorded)",
                    {"ours": an.summary["recorded"]["per_position"]},
                )
            )
        along = {side: resample(d["rate"], d["blocks"], width) for side, d in an.along.items()}
        if along:
            w0 = next(iter(an.along.values()))["width"]
            n = max(len(d["rate"]) for d in an.along.values())
            per = w0 * max(1, -(-n // width))
            parts.append(
                sequence_chart(
                    "Acceptance rate along the sequence, all requests (by anchor position)",
                    along,
                    width,
                    unit=f"one column ≈ {per} positions; height = accepted / verified drafts",
                )
            )
        if series:
            sv = {}
            for side in ("ours", "theirs"):
                d = series.get(side)
                if d is None:
                    continue
                pos, acc, chk = d["position"], d["accepted"], d["checked"]
                rate = [float(a / c) if c > 0 and a >= 0 else None for a, c in zip(acc, chk)]
                sv[side] = (pos, rate)
            if sv:
                top = max((int(p.max()) for p, _ in sv.values() if len(p)), default=0) + 1
                cols = min(width, top) or 1
                scale = top / cols
                data, marker = {}, None
                for side, (pos, rate) in sv.items():
                    buckets: list[list[float]] = [[] for _ in range(cols)]
                    for p, r in zip(pos.tolist(), rate):
                        if r is not None:
                            buckets[min(int(p / scale), cols - 1)].append(r)
                    data[side] = [float(np.mean(b)) if b else None for b in buckets]
                div = series.get("divergence")
                if div is not None and div < top:
                    marker = int(div / scale)
                parts.append(
                    sequence_chart(
                        f"Acceptance along the sequence of request {pair_label}",
                        data,
                        width,
                        unit=f"one column ≈ {scale:.1f} positions; blank: no block drafted there",
                        marker=marker,
                    )
                )
        self.query_one("#charts-body", Static).update(Group(*parts))
