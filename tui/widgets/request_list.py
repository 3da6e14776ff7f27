"""The requests pane: one line per matched request pair, unmatched requests listed apart.

A Line API list (thousands of requests stay cheap). Each line carries badges: content
divergence position, divergent blocks, findings, a degenerate-output mark and both sides'
acceptance. Selecting a line posts :class:`RequestList.Selected`.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.segment import Segment
from rich.style import Style
from textual.events import Click
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from spectrace.tracer.compare import NO_DIVERGENCE
from spectrace.tracer.findings import Finding
from spectrace.tracer.fmt import pct

from ..fmt import fit
from ..keymap import LIST_KEYS, bindings
from ..model import Analysis, Pair


class RequestList(ScrollView, can_focus=True):
    """The request pairs of the view model, with badges (see the module docstring)."""

    BINDINGS = bindings(LIST_KEYS)
    COMPONENT_CLASSES = {
        "requestlist--cursor",
        "requestlist--bad",
        "requestlist--ok",
        "requestlist--dim",
        "requestlist--warn",
        "requestlist--title",
        "requestlist--current",
    }
    DEFAULT_CSS = """
    RequestList { background: $surface; overflow-x: hidden; }
    RequestList > .requestlist--cursor { background: $primary-muted; }
    RequestList:focus > .requestlist--cursor { background: $accent-muted; }
    RequestList > .requestlist--current { text-style: bold; }
    RequestList > .requestlist--bad { color: $error; text-style: bold; }
    RequestList > .requestlist--ok { color: $success; }
    RequestList > .requestlist--warn { color: $warning; }
    RequestList > .requestlist--dim { color: $text-muted; }
    RequestList > .requestlist--title { color: $text-muted; text-style: bold; }
    """

    cursor: reactive[int] = reactive(0, init=False)
    """Line under the cursor."""

    class Selected(Message):
        """The user chose pair ``pair`` (index into the view model's pairs)."""

        def __init__(self, pair: int) -> None:
            super().__init__()
            self.pair = pair

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.pairs: list[Pair] = []
        self.lines: list[int] = []  # pair index per line, -1 for a section title
        self.badges: dict[int, dict] = {}
        self.current = -1

    def set_pairs(self, pairs: list[Pair], badges: dict[int, dict] | None = None) -> None:
        """Show ``pairs`` (matched first, then unmatched under a title line)."""
        self.pairs = pairs
        self.badges = badges or {}
        lines: list[int] = []
        titled = False
        for p in pairs:
            if not p.matched and p.matched_by != "single" and not titled:
                lines.append(-1)
                titled = True
            lines.append(p.index)
        self.lines = lines
        self.virtual_size = Size(0, len(lines))
        self.refresh()

    def set_badges(self, badges: dict[int, dict]) -> None:
        """Per-pair badge data: ``bad``, ``findings``, ``degenerate``, ``acc_a``, ``acc_b``."""
        self.badges = badges
        self.refresh()

    def set_current(self, pair: int) -> None:
        """Mark the pair shown in the block view (and move the cursor to it)."""
        self.current = pair
        if pair in self.lines:
            self._move(self.lines.index(pair))
        self.refresh()

    def _move(self, line: int) -> None:
        line = max(0, min(line, len(self.lines) - 1))
        self.cursor = line
        top, h = int(self.scroll_offset.y), self.scrollable_content_region.height
        if line < top:
            self.scroll_to(y=line, animate=False, immediate=True)
        elif line >= top + h:
            self.scroll_to(y=line - h + 1, animate=False, immediate=True)

    def watch_cursor(self) -> None:
        self.refresh()

    def action_cursor(self, delta: int) -> None:
        """Move the cursor by ``delta`` lines (skipping titles)."""
        line = self.cursor + delta
        if 0 <= line < len(self.lines) and self.lines[line] < 0:
            line += 1 if delta > 0 else -1
        self._move(line)

    def action_page(self, direction: int) -> None:
        """Page down/up."""
        self._move(self.cursor + direction * max(self.scrollable_content_region.height - 1, 1))

    def action_open(self) -> None:
        """Select the pair under the cursor."""
        if 0 <= self.cursor < len(self.lines) and self.lines[self.cursor] >= 0:
            self.post_message(self.Selected(self.lines[self.cursor]))

    def on_click(self, event: Click) -> None:
        line = int(self.scroll_offset.y) + event.y
        if 0 <= line < len(self.lines):
            self._move(line)
            self.action_open()

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        line = int(self.scroll_offset.y) + y
        base = self.rich_style
        if line >= len(self.lines):
            return Strip.blank(width, base)
        st = lambda n: self.get_component_rich_style(f"requestlist--{n}", partial=True)  # noqa
        idx = self.lines[line]
        if idx < 0:
            segs = [Segment(fit("── unmatched requests ──", width), st("title"))]
        else:
            segs = self._line(self.pairs[idx], st, width)
        under = base + st("cursor") if line == self.cursor else base
        return Strip(segs).apply_style(under).crop_extend(0, width, under)

    def _line(self, p: Pair, st, width: int) -> list[Segment]:
        b = self.badges.get(p.index, {})
        segs: list[Segment] = []
        if b.get("bad"):
            segs.append(Segment("● ", st("bad")))
        elif b.get("analysed") and p.matched:
            segs.append(Segment("✓ ", st("ok")))
        else:
            segs.append(Segment("  "))
        label = p.label if p.matched or p.matched_by == "single" else f"{p.label} ({p.matched_by})"
        segs.append(Segment(fit(label, 16), st("current") if p.index == self.current else Style()))
        badges: list[tuple[str, Style]] = []
        if p.divergence is not None and p.divergence != NO_DIVERGENCE:
            badges.append((f" div@{p.divergence}", st("warn")))
        if b.get("bad"):
            badges.append((f" ≠{b['bad']}", st("bad")))
        if b.get("findings"):
            badges.append((f" ◆{b['findings']}", st("warn")))
        if b.get("degenerate"):
            badges.append((" loop", st("bad")))
        acc = _acc_text(b.get("acc_a"), b.get("acc_b"), p)
        if acc:
            badges.append((f" {acc}", st("dim")))
        segs += [Segment(t, s) for t, s in badges]
        return segs


def _acc_text(x, y, p: Pair) -> str:
    def one(v) -> str:
        return pct(v, 0)

    if x is None and y is None:
        return ""
    if p.matched:
        return f"{one(x)}|{one(y)}"
    return one(x if x is not None else y)


def pair_badges(
    pairs: list[Pair],
    an: Analysis | None,
    findings: list[Finding],
    finding_pair: Callable[[Finding], int | None],
) -> dict[int, dict]:
    """The badge data of every pair (see :meth:`RequestList.set_badges`).

    ``bad`` is the analysis's differing blocks of a matched pair (``spectrace diff``'s count,
    which the block view's divergent rows agree with); ``acc_a``/``acc_b`` the request's
    acceptance rate; ``findings`` how many findings point into it (``finding_pair``).
    """
    out: dict[int, dict] = {}
    per_req = an.per_request if an else {}
    for p in pairs:
        b: dict = {}
        if an is not None:
            b["analysed"] = True
            if p.matched and p.index < len(an.per_pair):
                b["bad"] = an.per_pair[p.index]["bad"]
            for key, side, req in (("acc_a", "ours", p.req_a), ("acc_b", "theirs", p.req_b)):
                d = per_req.get(side)
                if d and 0 <= req < len(d["checked"]) and d["checked"][req]:
                    b[key] = d["accepted"][req] / d["checked"][req]
        out[p.index] = b
    for f in findings:
        q = finding_pair(f)
        if q is not None:
            out.setdefault(q, {})
            out[q]["findings"] = out[q].get("findings", 0) + 1
            if f.kind == "degenerate_output":
                out[q]["degenerate"] = True
    return out
