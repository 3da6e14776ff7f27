"""The spectrace viewer app and its factory :func:`make_app` (shared by the CLI and tests).

The app opens the traces (lazily: only /meta is read up front, so the first paint is
immediate), owns the :class:`~spectrace.tui.model.ViewModel`, and runs the
background work in thread workers: the model's loading stages and the whole-trace analysis
(in a thread for small traces, in a child process for big ones so its peak memory stays
out of the viewer). With ``follow`` it polls the files and re-opens them when they grow,
keeping the place in view. Bad input met while viewing (a damaged chunk, a request index
past its table) ends the app with that error, one line, not a traceback
(:attr:`SpectraceApp.failure`, raised again by the CLI after the app exited).
"""

from __future__ import annotations

import gc
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from textual.app import App
from textual.worker import WorkerFailed, get_current_worker

from spectrace.tracer.errors import InputError, SpectraceError
from spectrace.tracer.store import Trace, TraceWarning, final_path, open_trace
from spectrace.tracer.tokens import Decoder, decoder_for

from .commands import SpectraceCommands
from .messages import AnalysisReady, LoadProgress, ModelStage
from .model import SUBPROCESS_BLOCKS, Analysis, ViewModel, analyse, analyse_in_child
from .screens.main import MainScreen

Spec = str | os.PathLike | Sequence[str | os.PathLike]


def _specs(spec: Spec) -> list[str]:
    return [str(spec)] if isinstance(spec, (str, os.PathLike)) else [str(s) for s in spec]


class SpectraceApp(App[None]):
    """The viewer (see the module docstring). Build it with :func:`make_app`."""

    TITLE = "spectrace"
    COMMANDS = App.COMMANDS | {SpectraceCommands}
    CSS = "Screen { background: $surface; }"

    def __init__(
        self,
        ours: Spec,
        theirs: Spec | None = None,
        *,
        decoder: Decoder | None = None,
        follow: bool = False,
        follow_interval: float = 1.0,
        analysis: str = "auto",
        start_tab: str = "overview",
    ) -> None:
        super().__init__()
        self.spec_a = _specs(ours)
        self.spec_b = _specs(theirs) if theirs is not None else None
        self.decoder = decoder
        self.follow = follow
        self.follow_interval = follow_interval
        self.analysis_mode = analysis
        self.start_tab = start_tab
        self.generation = 0
        self.model = self._open()
        self._stamp = self._file_stamp()
        self._analysing = False
        self._stale = False
        self.reloads = 0
        #: Follow mode: why reloads or loads failed (after the reader's own retries).
        self.follow_errors: list[str] = []
        self.first_paint: float | None = None
        #: The spectrace error (bad input) that ended the app, if one did.
        self.failure: SpectraceError | None = None

    # -- opening -------------------------------------------------------------------------------

    def _open(self) -> ViewModel:
        # A .partial trace warns on every open (follow mode re-opens it each time it grows):
        # the overview shows its status instead of a warning line over the screen.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            # The request-index scan waits for the load worker's read of the column (the
            # same check, the same error): the first paint does not wait for both columns.
            kw = {"lazy_requests": True, "scan_requests": False}
            a = open_trace(self.spec_a, **kw)
            b = open_trace(self.spec_b, **kw) if self.spec_b else None
        return ViewModel(a, b, generation=self.generation)

    def _paths(self) -> list[Path]:
        m = self.model
        out = list(m.a.paths) + (list(m.b.paths) if m.b is not None else [])
        return out

    def _file_stamp(self) -> tuple:
        stamp = []
        for p in self._paths():
            q = p if p.exists() else final_path(p)
            try:
                st = q.stat()
                stamp.append((str(q), st.st_size, st.st_mtime_ns))
            except OSError:
                stamp.append((str(q), -1, -1))
        return tuple(stamp)

    # -- lifecycle -----------------------------------------------------------------------------

    def _handle_exception(self, error: Exception) -> None:
        """Textual's handler of an exception no handler or worker caught: a spectrace error
        (bad input: a damaged chunk, a bad index) ends the app quietly, kept in
        :attr:`failure` for the CLI to report as it reports every spectrace error (bad
        input: exit 2); any other is Textual's traceback (a bug)."""
        err = error.error if isinstance(error, WorkerFailed) else error
        if self.failure is not None:  # the app is ending: later errors are its consequence
            return None
        if not isinstance(err, SpectraceError):
            return super()._handle_exception(error)
        self.failure = err
        self.exit(return_code=2 if isinstance(err, InputError) else 3)
        return None

    def on_mount(self) -> None:
        self.main = MainScreen(self.model, self.start_tab)
        self.push_screen(self.main)
        self.call_after_refresh(self._painted)
        # Loading starts after the first paint: its reads hold the GIL (h5py), which the
        # paint would otherwise wait for.
        self.call_after_refresh(lambda: self._start(self.model))
        if self.follow:
            self.main.live = self._live_badge(self.model)
            self.set_interval(self.follow_interval, self._poll)

    def _painted(self) -> None:
        if self.first_paint is None:
            self.first_paint = time.perf_counter()

    def _start(self, model: ViewModel) -> None:
        # The analysis starts once the block index is read, so the two do not compete for
        # the CPU before the block view has its first rows.
        self.run_worker(
            lambda: self._load(model), thread=True, group="load", exclusive=True, name="load"
        )

    def _load(self, model: ViewModel) -> None:
        try:
            self._load_stages(model)
        except Exception as exc:
            if not self.follow:
                raise
            if model.generation != self.generation:
                return  # a newer reload closed this model's files under it: nothing lost
            # A read that still failed after the reader's retries (store.live): the next
            # poll opens the files again.
            self._stale = True
            self.follow_errors.append(f"loading failed: {type(exc).__name__}: {exc}")
            self.log.warning(f"follow: {self.follow_errors[-1]}")

    def _load_stages(self, model: ViewModel) -> None:
        worker = get_current_worker()
        main = self.main
        gen = model.generation
        model.load_requests()
        main.post_message(ModelStage("requests", gen))
        ok = model.load_index(
            lambda: worker.is_cancelled,
            lambda x: main.post_message(LoadProgress("indexing blocks", x)),
        )
        if not ok:
            return
        main.post_message(LoadProgress("indexing blocks", 1.0))
        main.post_message(ModelStage("index", gen))
        self.call_from_thread(self._start_analysis_again)
        if model.load_divergence(lambda: worker.is_cancelled):
            main.post_message(ModelStage("divergence", gen))
        # The request tables are many long-lived objects: keep the cyclic GC from walking
        # them again and again (its full passes were the worst page-down pauses).
        gc.freeze()

    def _analyse(self, model: ViewModel) -> None:
        an, err = None, None
        try:
            blocks = len(model.a.blocks) + (len(model.b.blocks) if model.b is not None else 0)
            child = self.analysis_mode == "process" or (
                self.analysis_mode == "auto" and blocks > SUBPROCESS_BLOCKS
            )
            if child:
                tok = str(self.decoder.path) if self.decoder is not None else None
                an = analyse_in_child(
                    [str(p) for p in model.a.paths],
                    [str(p) for p in model.b.paths] if model.b else None,
                    tok,
                )
            else:
                an = analyse(model.a, model.b, self.decoder)
        except Exception as exc:  # shown in the overview; the block view keeps working
            err = f"analysis failed: {type(exc).__name__}: {exc}"
        self.call_from_thread(self._analysed, model, an, err)

    def _analysed(self, model: ViewModel, an: Analysis | None, err: str | None) -> None:
        self._analysing = False
        if model.generation != self.generation:
            self._start_analysis_again()
            return
        self.analysis = an
        self.main.post_message(AnalysisReady(an, err, model.generation))

    def _start_analysis_again(self) -> None:
        """Run the analysis of the current model (unless one is running: its end re-checks)."""
        if not self._analysing and self.analysis_mode != "off":
            self._analysing = True
            model = self.model
            self.run_worker(
                lambda: self._analyse(model), thread=True, group="analysis", name="analysis"
            )

    # -- follow --------------------------------------------------------------------------------

    @staticmethod
    def _live_badge(model: ViewModel) -> str:
        """The LIVE badge's text, or "" once every file is complete (the writer closed it)."""
        traces = [t for t in (model.a, model.b) if t is not None]
        if all(t.status == "complete" for t in traces):
            return ""
        blocks = sum(len(t.blocks) for t in traces)
        return f"{blocks:,} blocks, updated {time.strftime('%H:%M:%S')}"

    def _poll(self) -> None:
        stamp = self._file_stamp()
        if stamp == self._stamp and not self._stale:
            return
        # HDF5 shares one open file between handles of a process, with its metadata cache:
        # the old handles must be closed before a re-open can see what the writer added.
        old = self.model
        for t in (old.a, old.b):
            if t is not None:
                t.close()
        self._stale = True
        try:
            self.generation += 1
            model = self._open()
        except Exception as exc:  # caught mid-write: try again on the next tick
            self.generation -= 1
            self.follow_errors.append(f"reopen failed: {type(exc).__name__}: {exc}")
            self.log.warning(f"follow: {self.follow_errors[-1]}")
            return
        self._stale = False
        self._stamp = stamp
        self.model = model
        self.reloads += 1
        self.main.live = self._live_badge(model)
        self.main.set_model(model)
        self._start(model)


def make_app(
    ours: Spec,
    theirs: Spec | None = None,
    *,
    tokenizer: str | Path | None = None,
    follow: bool = False,
    follow_interval: float = 1.0,
    analysis: str = "auto",
    start_tab: str = "overview",
) -> SpectraceApp:
    """Build the viewer for one trace (``theirs`` None) or a pair.

    Args:
        ours, theirs: trace specs (a file, a glob, or a list of them; ``NAME.h5`` may still
            be ``NAME.h5.partial``).
        tokenizer: ``tokenizer.json`` or a directory holding one (default: from the traces'
            metadata; ids are shown when none is found).
        follow: re-open the files when they change (a trace still being written).
        follow_interval: seconds between polls.
        analysis: ``auto`` (thread, or a child process above ``SUBPROCESS_BLOCKS``),
            ``thread``, ``process`` or ``off``.
        start_tab: ``overview``, ``blocks`` or ``charts``.
    Raises:
        InputError: a missing or foreign trace file, or an unusable tokenizer.
    """
    probe: list[Trace] = []
    app = SpectraceApp(
        ours,
        theirs,
        follow=follow,
        follow_interval=follow_interval,
        analysis=analysis,
        start_tab=start_tab,
    )
    probe.append(app.model.a)
    if app.model.b is not None:
        probe.append(app.model.b)
    app.decoder = decoder_for(tokenizer, *(t.meta for t in probe))
    return app
