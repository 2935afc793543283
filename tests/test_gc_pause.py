"""planner.gc_pause: the collector is off inside a simulation, back on (and the run's cycles collected) after it."""

from __future__ import annotations

import gc
import weakref

import pytest

from planner.gc_pause import gc_paused


class _Cycle:
    def __init__(self):
        self.me = self


def test_collector_is_off_inside_and_back_on_after_with_the_cycles_freed():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        obj = _Cycle()
        ref = weakref.ref(obj)
        del obj
        assert ref() is not None   # a reference cycle: only the collector frees it
    assert gc.isenabled() and ref() is None


def test_collector_stays_off_after_if_it_was_off_and_errors_pass_through():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ValueError):
        with gc_paused():
            raise ValueError("boom")
    assert gc.isenabled()
