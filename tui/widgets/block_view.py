"""The block view: one line per anchor position of one request pair (the Line API).

A :class:`~textual.scroll_view.ScrollView` whose virtual height is the row count plus a
sticky header line. ``render_line`` turns a screen line into a row, asks the view model for
the cached :class:`~spectrace.tui.model.Window` holding it, and returns a cached
:class:`~textual.strip.Strip`. The strip cache key holds everything that changes the pixels
(rows identity, row, ids/text mode, cursor, search hits, finding marks, theme), so the cost
of a page is a handful of dictionary hits. Paging is never animated.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.cache import LRUCache
from textual.events import Click
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from spectrace.tracer.tokens import Decoder

from ..fmt import fit, row_note, token
from ..keymap import VIEW_KEYS, bindings
from ..model import S_DIFF, S_EQUAL, S_NONE, S_PAST, S_SHIFT, S_SOLO, Rows, ViewModel

#: Cells of the columns left of the drafts.
GUTTER, POS_W = 2, 8
NOTE_W = 18


class BlockView(ScrollView, can_focus=True):
    """Rows of one request pair: position, anchor, both sides' drafts slot by slot.

    Slots are coloured by state (equal, different, shifted, past the content divergence,
    unpaired), underlined inside the accepted prefix, dimmed when not verified, and
    preceded by ``*`` where the verified id differs from the proposed one.
    """

    BINDINGS = bindings(VIEW_KEYS)

    COMPONENT_CLASSES = {
        "blockview--header",
        "blockview--cursor",
        "blockview--equal",
        "blockview--different",
        "blockview--shifted",
        "blockview--past",
        "blockview--solo",
        "blockview--accepted",
        "blockview--unverified",
        "blockview--vdiff",
        "blockview--bad",
        "blockview--finding",
        "blockview--rule",
        "blockview--hit",
        "blockview--dim",
    }

    DEFAULT_CSS = """
    BlockView { background: $surface; }
    BlockView > .blockview--header { text-style: bold; color: $text; background: $panel; }
    BlockView > .blockview--cursor { background: $primary-muted; }
    BlockView:focus > .blockview--cursor { background: $accent-muted; }
    BlockView > .blockview--equal { color: $success; }
    BlockView > .blockview--different { color: $error; text-style: bold; }
    BlockView > .blockview--shifted { color: $warning; text-style: bold; }
    BlockView > .blockview--past { color: $text-disabled; }
    BlockView > .blockview--solo { color: $text; }
    BlockView > .blockview--accepted { text-style: underline; }
    BlockView > .blockview--unverified { text-style: dim italic; }
    BlockView > .blockview--vdiff { color: $secondary; text-style: bold; }
    BlockView > .blockview--bad { color: $error; text-style: bold; }
    BlockView > .blockview--finding { color: $warning; text-style: bold; }
    BlockView > .blockview--rule { color: $text-muted; }
    BlockView > .blockview--hit { text-style: reverse; }
    BlockView > .blockview--dim { color: $text-muted; }
    """

    cursor: reactive[int] = reactive(0, always_update=True, init=False)
    """Row under the cursor (index into the current rows)."""
    show_ids: reactive[bool] = reactive(False, init=False)
    """Show token ids instead of decoded text."""

    class CursorMoved(Message):
        """The cursor moved to ``row`` of ``rows`` (also sent when the rows change)."""

        def __init__(self, rows: Rows | None, row: int) -> None:
            super().__init__()
            self.rows = rows
            self.row = row

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, BlockView.CursorMoved)

    class DetailRequested(Message):
        """Enter (or a double click) on ``row`` of ``rows``."""

        def __init__(self, rows: Rows, row: int) -> None:
            super().__init__()
            self.rows = rows
            self.row = row

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.model: ViewModel | None = None
        self.rows: Rows | None = None
        self.decoder: Decoder | None = None
        self.marks: frozenset[int] = frozenset()
        self.hits: frozenset[int] = frozenset()
        self._version = 0  # bumped when marks or hits change (part of the strip key)
        self._cells: dict[tuple, str] = {}
        self.placeholder = "loading…"
        self._strips: LRUCache[tuple, Strip] = LRUCache(2048)
        self._styles: dict[str, Style] = {}
        self._slot_w = 8
        self._width = 80
        self._layout()

    # -- data ----------------------------------------------------------------------------------

    def show_rows(self, model: ViewModel, rows: Rows, row: int = 0) -> None:
        """Display ``rows`` with the cursor on ``row`` (placed about a third down)."""
        self.model, self.rows = model, rows
        self._layout()
        self.virtual_size = Size(self._width, len(rows) + 1)
        self._set_cursor(row, center=True)
        self.refresh()
        self.post_message(self.CursorMoved(rows, self.cursor))

    def clear_rows(self, placeholder: str) -> None:
        """Show no rows, only ``placeholder`` (e.g. while indexing)."""
        self.rows = None
        self.placeholder = placeholder
        self.virtual_size = Size(0, 1)
        self.refresh()

    def set_marks(self, positions: frozenset[int]) -> None:
        """Anchor positions with a finding (marked in the gutter)."""
        if positions != self.marks:
            self.marks = positions
            self._version += 1
            self.refresh()

    def set_hits(self, ids: frozenset[int]) -> None:
        """Token ids to highlight (search)."""
        self.hits = ids
        self._version += 1
        self.refresh()

    def _layout(self) -> None:
        ids = self.show_ids or self.decoder is None
        if ids:
            vocab = getattr(self.decoder, "vocab_size", 0) or 100000
            self._slot_w = max(len(str(vocab - 1)), 3)
        else:
            self._slot_w = 8
        self._anchor_w = max(self._slot_w + 1, 7)
        w = self._kmax()
        self._side_w = w * (self._slot_w + 1)
        paired = self.model is not None and self.model.paired
        width = GUTTER + POS_W + self._anchor_w + 3 + self._side_w
        if paired:
            width += 3 + self._side_w + 3 + 7 + 3 + NOTE_W
        else:
            width += 3 + 5 + 3 + NOTE_W
        self._width = width

    def _kmax(self) -> int:
        if self.model is None or self.rows is None or not len(self.rows):
            return 4
        return max(self.model.window(self.rows, 0).w, 1)

    # -- cursor --------------------------------------------------------------------------------

    @property
    def page_rows(self) -> int:
        """Rows visible at once (the header excluded)."""
        return max(self.scrollable_content_region.height - 1, 1)

    def _set_cursor(self, row: int, center: bool = False) -> None:
        n = len(self.rows) if self.rows is not None else 0
        row = max(0, min(row, n - 1)) if n else 0
        self.cursor = row
        top = int(self.scroll_offset.y)
        page = self.page_rows
        if center:
            self.scroll_to(y=max(row - page // 3, 0), animate=False, immediate=True)
        elif row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + page:
            self.scroll_to(y=row - page + 1, animate=False, immediate=True)

    def watch_cursor(self, old: int, new: int) -> None:
        self.refresh()
        self.post_message(self.CursorMoved(self.rows, new))

    def watch_show_ids(self) -> None:
        self._layout()
        if self.rows is not None:
            self.virtual_size = Size(self._width, len(self.rows) + 1)
        self.refresh()

    def move_to(self, row: int, center: bool = True) -> None:
        """Put the cursor on ``row`` (scrolling without animation)."""
        self._set_cursor(row, center=center)

    def action_cursor(self, delta: int) -> None:
        """Move the cursor by ``delta`` rows."""
        self._set_cursor(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        """Page down (1) or up (-1) without animation."""
        page = self.page_rows
        n = len(self.rows) if self.rows is not None else 0
        top = int(self.scroll_offset.y)
        new_top = max(0, min(top + direction * page, max(n - page, 0)))
        self.scroll_to(y=new_top, animate=False, immediate=True)
        self._set_cursor(self.cursor + direction * page)

    def action_edge(self, direction: int) -> None:
        """First (-1) or last (1) row."""
        n = len(self.rows) if self.rows is not None else 0
        self._set_cursor(0 if direction < 0 else n - 1)

    def action_pan(self, delta: int) -> None:
        """Scroll horizontally by ``delta`` cells."""
        self.scroll_to(x=self.scroll_offset.x + delta, animate=False, immediate=True)

    def action_detail(self) -> None:
        """Ask for the detail dialog of the cursor row."""
        if self.rows is not None and len(self.rows):
            self.post_message(self.DetailRequested(self.rows, self.cursor))

    def on_click(self, event: Click) -> None:
        if self.rows is None or event.y < 1:
            return
        row = int(self.scroll_offset.y) + event.y - 1
        if 0 <= row < len(self.rows):
            self._set_cursor(row)
            if event.chain >= 2:
                self.action_detail()

    # -- rendering -----------------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._strips.clear()

    def on_focus(self) -> None:
        self._styles.clear()  # the cursor colour depends on focus
        self._strips.clear()
        self.refresh()

    def on_blur(self) -> None:
        self.on_focus()

    def _style(self, name: str) -> Style:
        st = self._styles.get(name)
        if st is None:
            st = self.get_component_rich_style(f"blockview--{name}", partial=True)
            self._styles[name] = st
        return st

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        x = int(self.scroll_offset.x)
        base = self._styles.get("__base")
        if base is None:  # computing it walks the DOM: once per style change, not per line
            base = self._styles["__base"] = self.rich_style
        if y == 0:
            return self._header().crop_extend(x, x + width, base)
        if self.rows is None:
            text = self.placeholder if y == 1 else ""
            return Strip([Segment(text, self._style("dim"))]).crop_extend(0, width, base)
        row = int(self.scroll_offset.y) + y - 1
        if row >= len(self.rows):
            return Strip.blank(width, base)
        key = (self.rows.key, row, self.show_ids, row == self.cursor, self._version, self._slot_w)
        strip = self._strips.get(key)
        if strip is None:
            try:
                strip = self._render_row(row)
            except Exception as exc:  # a trace re-opened under us (follow mode): say so
                return Strip(
                    [Segment(f"  (row unavailable: {exc})", self._style("dim"))]
                ).crop_extend(x, x + width, base)
            if row == self.cursor:
                strip = strip.extend_cell_length(max(self._width, width)).apply_style(
                    self._style("cursor")
                )
            self._strips[key] = strip
        return strip.crop_extend(x, x + width, base)

    def _header(self) -> Strip:
        st = self._style("header")
        rule = " │ "
        if self.model is not None and self.model.paired:
            ours = self._side_title("ours", self.model.a)
            theirs = self._side_title("theirs", self.model.b)
            text = (
                " " * GUTTER
                + fit("pos", POS_W)
                + fit("anchor", self._anchor_w)
                + rule
                + fit(ours, self._side_w)
                + rule
                + fit(theirs, self._side_w)
                + rule
                + fit("acc o|t", 7)
                + rule
                + fit("why", NOTE_W)
            )
        else:
            ours = self._side_title("drafts", self.model.a if self.model else None)
            text = (
                " " * GUTTER
                + fit("pos", POS_W)
                + fit("anchor", self._anchor_w)
                + rule
                + fit(ours, self._side_w)
                + rule
                + fit("acc", 5)
                + rule
                + fit("note", NOTE_W)
            )
        text = fit(text, max(self._width, self.size.width))
        return Strip([Segment(text, st)])

    def _side_title(self, label: str, trace) -> str:
        if trace is None:
            return label
        eng = trace.meta.get("engine") or trace.name
        k = trace.meta.get("k")
        return f"{label}: {eng}" + (f"  k={k}" if k else "")

    def _render_row(self, row: int) -> Strip:
        assert self.model is not None and self.rows is not None
        win = self.model.window(self.rows, row)
        i = row - win.start
        st = self._style
        segs: list[Segment] = []
        pos = int(win.pos[i])
        if win.bad[i]:
            segs.append(Segment("● ", st("bad")))
        elif pos in self.marks:
            segs.append(Segment("◆ ", st("finding")))
        else:
            segs.append(Segment("  "))
        past = not win.comparable[i]
        segs.append(Segment(fit(str(pos), POS_W), st("past") if past else st("dim")))
        a, b = win.a, win.b
        anchor = int(a["anchor"][i]) if a["has"][i] else int(b["anchor"][i]) if b else -1
        anchor_st = st("bad") if not win.anchor_eq[i] else Style()
        segs.append(Segment(self._cell(anchor, self._anchor_w), anchor_st))
        rule = Segment(" │ ", st("rule"))
        segs.append(rule)
        segs += self._slots(a, i, win.w)
        if b is not None:
            segs.append(rule)
            segs += self._slots(b, i, win.w)
            segs.append(rule)
            acc = f"{_acc(a, i)}|{_acc(b, i)}"
            segs.append(Segment(fit(acc, 7)))
        else:
            segs.append(rule)
            segs.append(Segment(fit(_acc(a, i), 5)))
        segs.append(rule)
        note = row_note(win, i, b is not None)
        note_st = st("bad") if win.bad[i] else st("dim")
        segs.append(Segment(fit(note, NOTE_W), note_st))
        return Strip(segs)

    def _cell(self, tid: int, width: int) -> str:
        """A token's cell text (cached: the same ids recur on every page)."""
        key = (tid, width, self.show_ids)
        text = self._cells.get(key)
        if text is None:
            if len(self._cells) > 65536:
                self._cells.clear()
            text = self._cells[key] = fit(token(self.decoder, tid, self.show_ids), width)
        return text

    def _slots(self, side: dict, i: int, w: int) -> list[Segment]:
        st = self._style
        out: list[Segment] = []
        names = {
            S_EQUAL: "equal",
            S_DIFF: "different",
            S_SHIFT: "shifted",
            S_PAST: "past",
            S_SOLO: "solo",
        }
        for j in range(w):
            state = int(side["state"][i, j])
            if state == S_NONE or not side["has"][i]:
                out.append(Segment(" " * (self._slot_w + 1)))
                continue
            tid = int(side["proposed"][i, j])
            style = st(names[state])
            if side["acc"][i, j]:
                style += st("accepted")
            if side["unverified"][i, j]:
                style += st("unverified")
            if tid in self.hits:
                style += st("hit")
            mark = Segment("*", st("vdiff")) if side["vdiff"][i, j] else Segment(" ")
            out.append(mark)
            out.append(Segment(self._cell(tid, self._slot_w), style))
        return out


def _acc(side: dict, i: int) -> str:
    if not side["has"][i]:
        return "-"
    acc = int(side["accepted"][i])
    return "?" if acc < 0 else str(acc)
