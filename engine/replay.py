"""Replay with the bundled reference engine, in process: the ``reference`` runner of
``spectrace replay`` (:func:`spectrace.hooks.replay.run.replay` takes it as ``runner``; the
CLI passes it, since hooks never import the engine).

Per request one target forward over the reference sequence gives the target's token (and
its top-1 minus top-2 logit margin) at every position at once: the model is causal, so the
row before position p sees exactly the prefix ``sequence[:p]``. The ``content`` and
``repetition`` faults apply with the request's real prompt length, as in a natural run. The
drafter then proposes from ``sequence[:p] + [anchor]`` for many sites per call
(``EngineOptions.batch``), recording its per-slot margins.
"""

from __future__ import annotations

from collections.abc import Callable

from spectrace.hooks.replay.options import EngineOptions
from spectrace.hooks.replay.positions import Reference, Site
from spectrace.hooks.replay.write import Draft
from spectrace.tracer.errors import InputError

Progress = Callable[[int, int], None] | None


def engine_meta(opts: EngineOptions, target: str, draft: str | None) -> dict:
    """The /meta items of a reference-engine replay."""
    meta = {
        "engine": "spectrace-reference",
        "method": opts.method,
        "k": opts.k,
        "target_model": target,
        "tokenizer": target,
        "sampling": {"temperature": 0.0},
    }
    if draft is not None:
        meta["draft_model"] = draft
    if opts.faults:
        meta["faults"] = list(opts.faults)
    return meta


def _load(opts: EngineOptions):
    """(target LoadedModel, drafter, draft path or None) for ``opts`` (faults enabled)."""
    from . import faults
    from .drafters import DraftModelDrafter, NgramDrafter
    from .loader import bundled_model_dir, configure_torch

    if opts.method not in ("draft_model", "ngram"):
        raise InputError(f"--engine reference: --method {opts.method} cannot be replayed")
    try:
        faults.enable(opts.faults)
        faults.check(opts.method, None)
    except ValueError as exc:
        raise InputError(f"--fault: {exc}") from None
    configure_torch(1)
    target = _model("--target", opts.target or bundled_model_dir("target"))
    if opts.method == "ngram":
        return target, NgramDrafter(opts.k, max_model_len=target.max_model_len), None
    draft_dir = opts.draft or bundled_model_dir("draft")
    return target, DraftModelDrafter(_model("--draft", draft_dir), opts.k), draft_dir


def _model(option: str, path):
    """:func:`~spectrace.engine.loader.load_model` of a user's folder; a folder transformers
    cannot load as a causal LM (no or a foreign ``config.json``, missing weights) is bad
    input (InputError naming the option and folder), not an engine failure."""
    from .loader import load_model

    try:
        return load_model(path)
    except (OSError, ValueError, KeyError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"{option} {path}: not a model folder transformers can load ({why})"
        ) from None


def _check_vocab(ref: Reference, vocab_size: int) -> None:
    """Raises InputError when a reference id lies outside the target's vocabulary (the
    embedding lookup would fail inside torch)."""
    bad = next((x for x in ref.sequence if not 0 <= x < vocab_size), None)
    if bad is not None:
        raise InputError(
            f"request {ref.req_id}: token id {bad} outside the target's vocabulary "
            f"[0, {vocab_size}) (field=prompt_ids/output_ids)"
        )


def target_choices(model, ref: Reference, positions: list[int]) -> list[tuple[int, float]]:
    """(token, top-1 minus top-2 logit) the target samples at each of ``positions`` given
    the reference prefix before it. One fp32 forward over ``sequence[:max(positions)]``."""
    import torch

    from . import faults

    lo, hi = min(positions), max(positions)
    seq = list(ref.sequence[:hi])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, lo - 1 : hi]
    top = torch.topk(logits, 2, dim=-1).values
    tokens = [int(t) for t in torch.argmax(logits, dim=-1).tolist()]
    if faults.active("content") or faults.active("repetition"):
        tokens = faults.target_tokens(tokens, logits, seq, len(ref.prompt_ids))
    gaps = (top[:, 0] - top[:, 1]).tolist()
    return [(tokens[p - lo], float(gaps[p - lo])) for p in positions]


def replay_reference(
    refs: list[Reference], sites: list[Site], opts: EngineOptions, progress: Progress = None
) -> tuple[list[Draft], dict]:
    """Draft at every site with the reference engine.

    Returns:
        (one :class:`Draft` per site, in site order; the /meta items of the engine).
    Raises:
        InputError: an unsupported method or fault, or a sequence longer than the target's
            positions.
    """
    target, drafter, draft_dir = _load(opts)
    anchors: dict[Site, tuple[int, float]] = {}
    for i, ref in enumerate(refs):
        mine = [s for s in sites if s.request == i]
        if mine:
            if len(ref.sequence) + opts.k > target.max_model_len:
                raise InputError(f"request {ref.req_id}: longer than max_model_len")
            _check_vocab(ref, target.vocab_size)
            got = target_choices(target.model, ref, [s.position for s in mine])
            anchors.update(zip(mine, got))
    drafts: list[Draft] = []
    for lo in range(0, len(sites), max(1, opts.batch)):
        chunk = sites[lo : lo + max(1, opts.batch)]
        seqs = [list(refs[s.request].sequence[: s.position]) + [anchors[s][0]] for s in chunk]
        prop = drafter.propose(seqs)
        for j, s in enumerate(chunk):
            margins = prop.margins[j] if prop.margins is not None else None
            drafts.append(Draft(s, anchors[s][0], prop.drafts[j], margins, anchors[s][1]))
        if progress is not None:
            progress(len(drafts), len(sites))
    meta = engine_meta(opts, str(target.path), None if draft_dir is None else str(draft_dir))
    return drafts, meta
