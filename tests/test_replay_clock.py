"""An offline replay counts arrival times from its own start: the engine's build and JIT warm-up before it are not
queueing (a `twinfer run` after a 45 s DeepGEMM warm-up reported 151.6 output tok/s for a 6.7 s run)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from executor.engine import LLMEngine, SamplingParams  # noqa: E402
from executor.replay import replay  # noqa: E402

SC = {"block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 4}


def test_warm_up_time_before_a_replay_is_not_counted():
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, scheduler_config=SC)
    time.sleep(0.6)   # stands in for a long JIT warm-up after the engine was built
    items = [(0.0, f"r{i}", [3 + i, 5, 7, 11], 3) for i in range(2)]
    t = time.perf_counter()
    res = replay(e, items)
    wall = time.perf_counter() - t
    m = res.metrics
    assert m.requests_finished == 2
    assert m.duration_s <= wall + 1e-6
    assert m.ttft_s.p99 <= wall   # not the 0.6 s before the replay


def test_the_clock_restarts_only_on_an_idle_engine():
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, scheduler_config=SC)
    e.add_request("busy", [1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="in flight"):
        e.restart_clock()
