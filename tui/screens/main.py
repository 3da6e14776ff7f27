"""The main screen: overview, blocks (requests pane + block view) and charts tabs, and every
navigation action (divergences, findings, positions, search, filter).

The screen owns the navigation state (the pair in view, the filter, the search); the app
owns the model and the background work and tells the screen through messages.
"""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane

from spectrace.tracer.compare import NO_DIVERGENCE
from spectrace.tracer.findings import Finding
from spectrace.tracer.fmt import pct
from spectrace.tracer.tokens import Decoder

from ..fmt import divergence_text, explain
from ..keymap import KEYS, bindings
from ..messages import AnalysisReady, FindingChosen, JumpTo, LoadProgress, ModelStage
from ..model import Analysis, QueryError, Rows, ViewModel, query_ids
from ..widgets.block_view import BlockView
from ..widgets.charts import Charts
from ..widgets.overview import Overview, finding_where, verdict_text
from ..widgets.request_list import RequestList, pair_badges
from ..widgets.text_line import TextLine
from .detail import BlockDetail, detail_renderable
from .dialogs import GotoDialog, SearchDialog
from .help import HelpScreen


class MainScreen(Screen):
    """Tabs and navigation (see the module docstring)."""

    BINDINGS = bindings(KEYS)
    DEFAULT_CSS = """
    MainScreen { layout: vertical; overflow: hidden; }
    MainScreen #title { height: 1; background: $panel; color: $text; padding: 0 1; }
    MainScreen #tabs { height: 1fr; }
    MainScreen ContentSwitcher { height: 1fr; }
    MainScreen TabPane { height: 1fr; }
    MainScreen #blockview { height: 1fr; }
    MainScreen #requests { width: 38; border-right: vkey $panel-lighten-2; }
    MainScreen #requests.hidden { display: none; }
    MainScreen #rows-title { height: 1; background: $panel; padding: 0 1; }
    MainScreen #explain { height: 4; background: $panel; padding: 0 1; color: $text; }
    MainScreen TabPane { padding: 0; }
    """

    def __init__(self, model: ViewModel, start_tab: str = "overview") -> None:
        super().__init__()
        self.model = model
        self.analysis: Analysis | None = None
        self.analysis_error: str | None = None
        self.start_tab = start_tab
        self.pair = -1
        self.filtered = False
        self.search_ids: np.ndarray | None = None
        self.search_text = ""
        self.progress = ""
        self.live = ""
        self._pending: tuple[int, int | None] | None = None

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield TextLine(id="title")
        with TabbedContent(initial=self.start_tab, id="tabs"):
            with TabPane("Overview", id="overview"):
                yield Overview(id="overview-body")
            with TabPane("Blocks", id="blocks"):
                with Horizontal():
                    yield RequestList(id="requests")
                    with Vertical():
                        yield TextLine(id="rows-title")
                        yield BlockView(id="blockview")
                        yield TextLine(id="explain")
            with TabPane("Charts", id="charts"):
                yield Charts(id="charts-body-scroll")
        yield Footer()

    def on_mount(self) -> None:
        self.set_model(self.model)

    @property
    def view(self) -> BlockView:
        """The block view."""
        return self.query_one(BlockView)

    def _title_text(self) -> Text:
        m = self.model
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("spectrace  ", style="bold")
        t.append(f"ours: {m.a.name}", style="cyan")
        if m.b is not None:
            t.append("  vs  ")
            t.append(f"theirs: {m.b.name}", style="magenta")
        if self.live:
            t.append(f"   ● LIVE {self.live}", style="bold green")
        if self.progress:
            t.append(f"   {self.progress}", style="dim")
        return t

    def _refresh_title(self) -> None:
        self.query_one("#title", TextLine).set(self._title_text())

    # -- model updates -------------------------------------------------------------------------

    def set_model(self, model: ViewModel) -> None:
        """Show ``model`` (a new one after a follow-mode reload keeps the place in view)."""
        keep = None
        if self.pair >= 0 and self.view.rows is not None and len(self.view.rows):
            keep = (self.pair, int(self.view.rows.pos[self.view.cursor]))
        self.model = model
        self.view.decoder = self._decoder
        self.query_one(Overview).show_model(model)
        self._verdict()
        self.query_one(Overview).show_analysis(self.analysis, model.paired, self.analysis_error)
        self.view.clear_rows("reading the request tables…")
        self._pending = keep
        self._refresh_title()
        if model.requests_ready:
            self._on_stage("requests")
        if model.index_ready:
            self._on_stage("index")

    def on_load_progress(self, msg: LoadProgress) -> None:
        self.progress = "" if msg.fraction >= 1 else f"{msg.stage} {pct(msg.fraction, 0)}"
        self._refresh_title()
        if self.view.rows is None and msg.fraction < 1:
            self.view.clear_rows(f"{msg.stage}… {pct(msg.fraction, 0)}")

    def on_model_stage(self, msg: ModelStage) -> None:
        if msg.generation == self.model.generation:
            self._on_stage(msg.stage)

    def _on_stage(self, stage: str) -> None:
        rl = self.query_one(RequestList)
        if stage == "requests":
            rl.set_pairs(self.model.pairs, self._badges())
            self.view.clear_rows("indexing blocks…")
        elif stage == "index":
            if not self.model.pairs:
                self.view.clear_rows("this trace has no requests")
                return
            pair, pos = self._pending or (0, None)
            self._pending = None
            self.show_pair(min(pair, len(self.model.pairs) - 1), pos)
        elif stage == "divergence":
            rl.set_badges(self._badges())
            self._verdict()

    def on_analysis_ready(self, msg: AnalysisReady) -> None:
        if msg.generation != self.model.generation:
            return
        self.analysis, self.analysis_error = msg.analysis, msg.error
        self.query_one(Overview).show_analysis(self.analysis, self.model.paired, msg.error)
        self.query_one(RequestList).set_badges(self._badges())
        self._verdict()
        self._update_marks()
        if self.query_one(TabbedContent).active == "charts":
            self._charts()

    # -- derived data --------------------------------------------------------------------------

    @property
    def findings(self) -> list[Finding]:
        """The analysis's findings (empty until it ran)."""
        return list(self.analysis.findings) if self.analysis else []

    def finding_pair(self, f: Finding) -> int | None:
        """The pair a finding points at (by request id, on its side first), or None."""
        if f.request is None or not self.model.requests_ready:
            return None
        key = (self.model.generation, len(self.model.pairs))
        if getattr(self, "_id_key", None) != key:
            self._ids_a = {p.id_a: p.index for p in self.model.pairs if p.id_a}
            self._ids_b = {p.id_b: p.index for p in self.model.pairs if p.id_b}
            self._id_key = key
        ids_a, ids_b = self._ids_a, self._ids_b
        first, second = (ids_b, ids_a) if f.side == "theirs" else (ids_a, ids_b)
        return first.get(str(f.request), second.get(str(f.request)))

    def _badges(self) -> dict[int, dict]:
        return pair_badges(self.model.pairs, self.analysis, self.findings, self.finding_pair)

    def _verdict(self) -> None:
        self.query_one(Overview).show_verdict(
            verdict_text(self.analysis, self.model, self.analysis_error)
        )

    def _update_marks(self) -> None:
        marks = frozenset(
            int(f.position)
            for f in self.findings
            if f.position is not None and self.finding_pair(f) == self.pair
        )
        self.view.set_marks(marks)

    def _charts(self) -> None:
        series = None
        label = ""
        if self.pair >= 0 and self.model.index_ready:
            series = self.model.series(self.pair)
            label = self.model.pairs[self.pair].label
        self.query_one(Charts).show(self.analysis, series, label)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "charts":
            self._charts()
        elif event.pane.id == "blocks":
            self.view.focus()

    # -- showing rows --------------------------------------------------------------------------

    def _rows(self, pair: int) -> Rows:
        return self.model.rows(pair, self.filtered)

    def show_pair(
        self, pair: int, position: int | None = None, base_row: int | None = None
    ) -> None:
        """Show pair ``pair`` with the cursor at ``position`` (or unfiltered ``base_row``)."""
        if not self.model.index_ready:
            self._pending = (pair, position)
            return
        self.pair = pair
        rows = self._rows(pair)
        if base_row is not None:
            row = int(np.searchsorted(rows.base, base_row)) if rows.filtered else base_row
        elif position is not None:
            row = rows.row_of_position(position)
        else:
            row = 0
        row = min(row, max(len(rows) - 1, 0))
        self.view.show_rows(self.model, rows, row)
        self.query_one(RequestList).set_current(pair)
        self._update_marks()
        if self.query_one(TabbedContent).active == "charts":
            self._charts()

    def _rows_title(self, rows: Rows) -> Text:
        p = rows.pair
        t = Text()
        t.append(f"request {p.label}", style="bold")
        if not p.matched and p.matched_by != "single":
            t.append(f" ({p.matched_by})", style="yellow")
        if self.model.paired and p.matched:
            nbad = int(self.model.bad_mask(self.model.rows(p.index)).sum())
            t.append(" · ")
            t.append(f"{nbad} divergent blocks", style="bold red" if nbad else "green")
            div = rows.divergence
            t.append(" · content divergence ")
            t.append(divergence_text(div), style="yellow" if div != NO_DIVERGENCE else "green")
        t.append(f" · {len(rows)} rows · prompt {p.prompt_len} tokens", style="dim")
        if self.filtered:
            t.append(" · filter: divergent only (d)", style="bold yellow")
        return t

    def on_block_view_cursor_moved(self, msg: BlockView.CursorMoved) -> None:
        rows = msg.rows
        if rows is None:
            return
        if getattr(self, "_titled", None) != rows.key:
            self._titled = rows.key
            self.query_one("#rows-title", TextLine).set(self._rows_title(rows))
        exp = self.query_one("#explain", TextLine)
        if not len(rows):
            exp.set(
                Text(
                    "no rows"
                    + (
                        " (no divergent blocks here; d turns the filter off)"
                        if self.filtered
                        else ""
                    ),
                    style="dim",
                )
            )
            return
        win = self.model.window(rows, msg.row)
        i = msg.row - win.start
        pos = int(win.pos[i])
        fs = [
            f
            for f in self.findings
            if f.position == pos and self.finding_pair(f) == rows.pair.index
        ]
        text = explain(
            win,
            i,
            rows.pair,
            self._decoder,
            rows.divergence,
            fs,
            self._next_ids(rows, pos, win.w),
        )
        style = "bold" if win.bad[i] else ""
        exp.set(Text(f"row {msg.row + 1}/{len(rows)} · ", style="dim") + Text(text, style))

    def _next_ids(self, rows: Rows, pos: int, n: int):
        """The output's ids after the anchor at ``pos`` (ours' text), or None."""
        p = rows.pair
        side, req = ("ours", p.req_a) if p.req_a >= 0 else ("theirs", p.req_b)
        ctx = self.model.trace(side).requests
        seq = ctx.full_sequence(req) if 0 <= req < len(ctx) else None
        if seq is None or len(ctx.output_ids[req]) == 0:
            return None
        return seq[pos + 1 : pos + 1 + n]

    def on_block_view_detail_requested(self, msg: BlockView.DetailRequested) -> None:
        rows, row = msg.rows, msg.row
        win = self.model.window(rows, row)
        pos = int(win.pos[row - win.start])
        fs = [
            f
            for f in self.findings
            if f.position == pos and self.finding_pair(f) == rows.pair.index
        ]
        body = detail_renderable(
            self.model,
            rows,
            row,
            self._decoder,
            fs,
            self._next_ids(rows, pos, win.w),
        )
        self.app.push_screen(BlockDetail(body))

    def on_request_list_selected(self, msg: RequestList.Selected) -> None:
        self.show_pair(msg.pair)
        self.view.focus()

    def on_jump_to(self, msg: JumpTo) -> None:
        self._goto_tab("blocks")
        self.show_pair(msg.pair, msg.position)

    def on_finding_chosen(self, msg: FindingChosen) -> None:
        self._jump_finding(self.findings[msg.index])

    def _jump_finding(self, f: Finding) -> None:
        p = self.finding_pair(f)
        if p is None:
            self.notify(f"{f.kind}: {f.message}", title="finding (no single location)")
            return
        if self.filtered:
            self.filtered = False
        self._goto_tab("blocks")
        self.show_pair(p, f.position)
        self.notify(f.message, title=f"{f.severity}: {f.kind} ({finding_where(f)})", timeout=8)

    def _goto_tab(self, tab: str) -> None:
        tabs = self.query_one(TabbedContent)
        if tabs.active != tab:
            tabs.active = tab
        if tab == "blocks":
            self.view.focus()

    # -- actions -------------------------------------------------------------------------------

    def action_tab(self, tab: str) -> None:
        """Switch tab."""
        self._goto_tab(tab)

    def action_help(self) -> None:
        """Show every key."""
        self.app.push_screen(HelpScreen())

    def _base_row(self) -> int:
        rows = self.view.rows
        if rows is None or not len(rows):
            return -1
        return int(rows.base[self.view.cursor])

    def action_divergence(self, direction: int) -> None:
        """Next (1) / previous (-1) divergent block, across requests."""
        if not self._ready() or not self.model.paired:
            self.notify("divergences need two traces", severity="warning")
            return
        an = self.analysis

        def skip(p: int) -> bool:
            return an is not None and p < len(an.per_pair) and an.per_pair[p]["bad"] == 0

        # From another tab, n means "the first divergent block" (as the overview says).
        from_start = self.query_one(TabbedContent).active != "blocks" or self.pair < 0
        start = 0 if from_start else self.pair
        row = -1 if from_start else self._base_row()
        if direction < 0 and row < 0:
            row = 1 << 62
        hit = self.model.next_divergent(start, row, direction > 0, skip=skip)
        if hit is None:
            self.notify(
                "no further divergent block" if direction > 0 else "no earlier divergent block"
            )
            return
        self._goto_tab("blocks")
        self.show_pair(hit[0], base_row=hit[1])

    def action_finding(self, direction: int) -> None:
        """Next (1) / previous (-1) finding in report order: most severe first, so the first
        `f` always shows the finding that names the bug."""
        if self.analysis is None:
            self.notify("the analysis is still running", severity="warning")
            return
        fs = self.findings
        if not fs:
            self.notify("no findings")
            return
        idx = getattr(self, "_finding_idx", -1 if direction > 0 else 0)
        self._finding_idx = (idx + direction) % len(fs)
        self._jump_finding(fs[self._finding_idx])

    def action_content_divergence(self) -> None:
        """Go to the content divergence of the request in view."""
        if self.pair < 0:
            return
        div = self.model.divergence(self.model.pairs[self.pair])
        if div == NO_DIVERGENCE:
            self.notify("the two texts agree on their common length")
            return
        if self.filtered:
            self.filtered = False
        self.show_pair(self.pair, div)
        self.notify(f"content diverges at position {div}; rows from here on are greyed")

    def action_goto(self) -> None:
        """Ask for a position and go there."""
        if not self._ready():
            return

        def done(pos: int | None) -> None:
            if pos is None:
                return
            row, note = self._rows(self.pair).goto(pos)
            if note is not None:
                self.notify(note, severity="warning" if row is None else "information")
            if row is not None:
                self._goto_tab("blocks")
                self.show_pair(self.pair, pos)

        self.app.push_screen(GotoDialog(), done)

    def action_request(self, delta: int) -> None:
        """Next (1) / previous (-1) request."""
        if not self._ready():
            return
        p = max(0, min(self.pair + delta, len(self.model.pairs) - 1))
        self._goto_tab("blocks")
        self.show_pair(p)

    def action_filter(self) -> None:
        """Toggle the divergent-only filter (keeps the place)."""
        if not self._ready():
            return
        if not self.model.paired:
            self.notify("the filter needs two traces", severity="warning")
            return
        base = self._base_row()
        self.filtered = not self.filtered
        self._goto_tab("blocks")
        self.show_pair(self.pair, base_row=max(base, 0))

    def action_toggle_ids(self) -> None:
        """Toggle token ids / decoded text."""
        if self._decoder is None:
            self.notify("no tokenizer (use --tokenizer PATH): showing ids", severity="warning")
            return
        self.view.show_ids = not self.view.show_ids

    def action_toggle_requests(self) -> None:
        """Show or hide the requests pane."""
        self.query_one(RequestList).toggle_class("hidden")

    def action_search(self) -> None:
        """Ask for a token id or text and go to the next row containing it."""
        if not self._ready():
            return

        def done(query: str | None) -> None:
            if query is not None:
                self._run_search(query, None, 1)

        self.app.push_screen(SearchDialog(self.search_text), done)

    def action_search_again(self, direction: int) -> None:
        """Next (1) / previous (-1) row with a search hit."""
        if self.search_ids is None or not self._ready():
            self.notify("search first with /")
            return
        self._run_search(self.search_text, self.search_ids, direction)

    def _run_search(self, query: str, ids: np.ndarray | None, direction: int) -> None:
        """Resolve ``query`` to ids (unless ``ids`` are known: an O(vocab) scan for text)
        and find the next row holding one, in a worker thread; :meth:`_searched` shows it."""
        model, pair, row = self.model, max(self.pair, 0), self._base_row()
        decoder = self._decoder

        def work() -> None:
            try:
                found = query_ids(query, decoder) if ids is None else ids
            except QueryError as exc:
                self.app.call_from_thread(self.notify, str(exc), severity="warning")
                return
            hit = model.search(pair, row, found, forward=direction > 0)
            self.app.call_from_thread(self._searched, model, query, found, hit)

        self.run_worker(work, thread=True, group="search", exclusive=True, name="search")

    def _searched(
        self, model: ViewModel, query: str, ids: np.ndarray, hit: tuple[int, int] | None
    ) -> None:
        if model is not self.model:  # re-opened meanwhile (follow mode): rows moved
            return
        if ids is not self.search_ids:
            self.search_ids, self.search_text = ids, query
            self.view.set_hits(frozenset(int(x) for x in ids[:4096]))
        if hit is None:
            self.notify(f"{self.search_text!r} not found", severity="warning")
            return
        if self.filtered:
            self.filtered = False
        self._goto_tab("blocks")
        self.show_pair(hit[0], base_row=hit[1])

    @property
    def _decoder(self) -> Decoder | None:
        """The app's token decoder (SpectraceApp.decoder; None when ids are shown raw)."""
        return getattr(self.app, "decoder", None)

    def _ready(self) -> bool:
        if not self.model.index_ready:
            self.notify("still indexing the blocks…")
            return False
        return True
