"""The V2 tap's background joiner thread (``spectrace.hooks.vllm.v2.drainer.Drainer``)."""

from __future__ import annotations

import threading

import pytest

from spectrace.hooks.vllm.v2.drainer import Drainer


def test_runs_after_each_kick_and_polls_while_copies_are_in_flight():
    """One kick: ``drain_ready`` runs until it returns None (pause, pause, None: 3 runs)."""
    answers = [0.0, 0.0001, None]
    done = threading.Event()

    def drain_ready():
        pause = answers.pop(0)
        if pause is None:
            done.set()
        return pause

    d = Drainer(drain_ready, on_error=lambda exc: None)
    assert d.runs == 0  # nothing runs before a kick
    d.kick()
    assert done.wait(5)
    d.stop()
    assert d.runs == 3 and answers == [] and not d.alive and d.busy_ns > 0


def test_an_error_is_handed_over_and_the_thread_stops():
    errors: list = []
    got = threading.Event()

    def on_error(exc):
        errors.append(exc)
        got.set()

    def drain_ready():
        raise ValueError("boom")

    d = Drainer(drain_ready, on_error)
    d.kick()
    assert got.wait(5)
    d._thread.join(5)
    assert [str(e) for e in errors] == ["boom"] and not d.alive and d.runs == 1
    d.stop()  # stopping a finished thread is fine


def test_stop_without_a_kick_runs_nothing():
    calls: list = []
    d = Drainer(lambda: calls.append(1), on_error=lambda exc: None)
    d.stop()
    assert calls == [] and not d.alive


def test_a_second_kick_runs_it_again():
    runs: list = []
    got = threading.Event()

    def drain_ready():
        runs.append(1)
        if len(runs) == 2:
            got.set()

    d = Drainer(drain_ready, on_error=lambda exc: None)
    d.kick()
    deadline = threading.Event()
    while len(runs) < 1 and not deadline.wait(0.001):
        pass
    d.kick()
    assert got.wait(5)
    d.stop()
    assert len(runs) == 2 and d.runs == 2


def test_the_switch_interval_is_lowered_while_joining_and_restored():
    import sys

    seen: list = []
    got = threading.Event()

    def drain_ready():
        seen.append(sys.getswitchinterval())
        got.set()

    before = sys.getswitchinterval()
    d = Drainer(drain_ready, on_error=lambda exc: None)
    d.kick()
    assert got.wait(5)
    d.stop()
    assert seen == [pytest.approx(1e-4)] and sys.getswitchinterval() == before  # 0.1 ms
