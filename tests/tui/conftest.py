"""Shared builders of the viewer tests: an independent greedy speculative-decoding simulator,
the standard pair of small traces (:func:`make_pair`), a word-level tokenizer and a loaded
:class:`~spectrace.tui.model.ViewModel`.

The standard pair: ``r0`` (theirs' slot 1 wrong from position 20: divergent blocks), ``r1``
(identical), ``r2`` (theirs' text differs at position 12), ``solo`` (ours only). Test modules
take these through fixtures (``pair``, ``single_trace``, ``sim``, ``load_model``); the follow
test's writer process loads this file by path (:data:`HERE`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from spectrace.tracer.store import TraceWriter, open_trace
from spectrace.tui.model import ViewModel

HERE = Path(__file__).resolve()
K = 3
PROMPT = [1, 2, 3]
OUTPUT = list(range(10, 50))  # 40 output tokens
TRUTH = PROMPT + OUTPUT
R2_OUTPUT = OUTPUT[:9] + [99] + OUTPUT[10:]  # content diverges at position 12


def simulate(writer, req_id, prompt, output, drafter, step0=0):
    """Greedy speculative decoding over a known output (records verified = proposed)."""
    seq = list(prompt) + list(output)
    writer.request(req_id, prompt_ids=prompt, output_ids=output, finish_reason="length")
    pos, step, positions = len(prompt) - 1, step0, []
    while pos + 1 < len(seq):
        drafts = drafter(seq, pos)
        acc = 0
        while acc < len(drafts) and pos + 1 + acc < len(seq) and drafts[acc] == seq[pos + 1 + acc]:
            acc += 1
        writer.add_block(
            req_id,
            step,
            pos,
            seq[pos],
            drafts,
            verified=drafts,
            accepted=acc,
            emitted=seq[pos + 1 : pos + 2 + acc],
            t_ns=step,
        )
        writer.add_phase(step, "draft", 1.5)
        positions.append(pos)
        pos, step = pos + acc + 1, step + 1
    return positions


def oracle(good, wrong=lambda pos, j: 1000 + j, truth=TRUTH):
    """Drafts equal to ``truth`` in the slots ``good(pos)``, ``wrong(pos, j)`` elsewhere."""

    def drafter(seq, pos):
        return [
            truth[pos + 1 + j] if pos + 1 + j < len(truth) and j in good(pos) else wrong(pos, j)
            for j in range(K)
        ]

    return drafter


def good_ours(pos):
    return {0, 1} if pos % 3 else {0}


def good_theirs(pos):
    # From position 20 on, theirs gets slot 1 wrong where ours got it right: a draft bug.
    return {0} if pos >= 20 else good_ours(pos)


def make_tokenizer(path):
    """A word-level tokenizer.json whose token i decodes to ``t<i>`` (ids 0..1199)."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(1200)}, unk_token="t0"))
    tok.save(str(path))
    return path


def make_pair(tmp, *, single=False):
    """Write ``ours.h5`` and ``theirs.h5`` (and ``tokenizer.json``) under ``tmp``; returns
    their paths (theirs None with ``single``). See the module docstring."""
    tokp = make_tokenizer(tmp / "tokenizer.json")
    meta = {
        "k": K,
        "method": "draft_model",
        "engine_version": "1",
        "tokenizer": str(tokp),
        "sampling": {"temperature": 0.0},
    }
    with TraceWriter(tmp / "ours.h5", {**meta, "engine": "ours-engine"}, flush_interval=0) as w:
        simulate(w, "r0", PROMPT, OUTPUT, oracle(good_ours))
        simulate(w, "r1", [4, 5, 6], OUTPUT, oracle(good_ours), step0=100)
        simulate(w, "r2", [7, 8, 9], OUTPUT, oracle(good_ours), step0=200)
        simulate(w, "solo", [9, 9, 9], OUTPUT[:6], oracle(good_ours), step0=300)
    if single:
        return tmp / "ours.h5", None
    with TraceWriter(
        tmp / "theirs.h5",
        {**meta, "engine": "theirs-engine", "engine_version": "2"},
        flush_interval=0,
    ) as w:
        simulate(w, "q0", PROMPT, OUTPUT, oracle(good_theirs))
        simulate(w, "q1", [4, 5, 6], OUTPUT, oracle(good_ours), step0=100)
        simulate(w, "q2", [7, 8, 9], R2_OUTPUT, oracle(good_ours), step0=200)
    return tmp / "ours.h5", tmp / "theirs.h5"


def loaded_model(a, b=None) -> ViewModel:
    """A :class:`ViewModel` of trace paths ``a`` (and ``b``) with every stage loaded."""
    vm = ViewModel(
        open_trace(a, lazy_requests=True), open_trace(b, lazy_requests=True) if b else None
    )
    vm.load_requests()
    vm.load_index()
    vm.load_divergence()
    return vm


@pytest.fixture
def pair(tmp_path):
    """Paths of the standard pair (ours, theirs)."""
    return make_pair(tmp_path)


@pytest.fixture
def single_trace(tmp_path):
    """Path of ours of the standard pair alone."""
    return make_pair(tmp_path, single=True)[0]


@pytest.fixture
def load_model():
    """:func:`loaded_model`, for tests building their own traces."""
    return loaded_model


@pytest.fixture
def sim():
    """The simulator and its constants (K, PROMPT, OUTPUT, TRUTH, simulate, oracle, ...)."""
    return SimpleNamespace(
        K=K,
        PROMPT=PROMPT,
        OUTPUT=OUTPUT,
        TRUTH=TRUTH,
        simulate=simulate,
        oracle=oracle,
        good_ours=good_ours,
        make_pair=make_pair,
        here=HERE,
    )
