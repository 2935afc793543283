"""The synchronous engine loop reports each plan's share of the wall clock to its step observer (as the pipelined loop
does): back to back while requests remain, so the ITL and busy time the replay metrics read include the loop's host
work between runner calls, as a client sees them and as the simulator prices a step (runner + loop overhead)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from executor.engine import LLMEngine, SamplingParams  # noqa: E402

SC = {"block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 4, "async_overlap": False}


class TickClock:
    """A perf_counter that advances a fixed tick per read: deterministic durations, no real timing."""

    def __init__(self, tick: float = 1e-3):
        self.t, self.tick = 100.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def run_observed(monkeypatch, between: int = 0):
    """Two requests through ``step`` with a tick clock; ``between`` extra clock reads between steps stand in for
    the caller's work (arrival handling). The observed (start, duration) and the runner's own seconds per plan."""
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, scheduler_config=SC)
    assert not e.async_overlap
    clock = TickClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    e.restart_clock()
    seen = []
    e.step_observer = lambda start, plan, result: seen.append(
        (start, float(result.step_durations.sum()), sum(r["wall_s"] for r in e.runner.step_records)))
    for i in range(2):
        e.add_request(f"r{i}", [3 + i, 5, 7, 11, 13], SamplingParams(max_tokens=4, ignore_eos=True))
    while e.has_unfinished():
        e.step()
        for _ in range(between):
            clock()
    return e, clock, seen


def test_busy_steps_tile_the_wall_clock(monkeypatch):
    _, _, seen = run_observed(monkeypatch, between=3)
    assert len(seen) >= 4
    for (s0, d0, _), (s1, _, _) in zip(seen, seen[1:]):
        assert s1 == pytest.approx(s0 + d0, abs=1e-9)   # no gap: the caller's work between steps is the loop's
    for _, d, runner in seen:
        assert d > runner > 0                            # the runner's timer leaves out scheduling and completion


def test_caller_work_between_steps_counts_in_the_next_step(monkeypatch):
    _, _, quiet = run_observed(monkeypatch, between=0)
    _, _, busy = run_observed(monkeypatch, between=5)
    assert len(quiet) == len(busy)
    assert busy[0][1] == pytest.approx(quiet[0][1])     # the first plan starts when step() is called
    for (_, dq, _), (_, db, _) in zip(quiet[1:], busy[1:]):
        assert db == pytest.approx(dq + 5e-3)            # five ticks of the caller's work each


def test_a_step_after_idle_starts_at_the_call(monkeypatch):
    e, clock, seen = run_observed(monkeypatch)
    assert not e.has_unfinished()
    e.step()   # idle: nothing runs, nothing observed
    for _ in range(50):
        clock()  # a long idle gap
    e.add_request("late", [9, 8, 7], SamplingParams(max_tokens=2, ignore_eos=True))
    n = len(seen)
    e.step()
    start, dur, runner = seen[n]
    assert dur < runner + 50e-3                          # the idle gap is not the step's
    assert start + dur == pytest.approx(e.now(), abs=5e-3)


def test_replay_steps_carry_runner_and_device_seconds(monkeypatch):
    from executor.replay import replay
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, scheduler_config=SC)
    monkeypatch.setattr(time, "perf_counter", TickClock())
    res = replay(e, [(0.0, f"r{i}", [3 + i, 5, 7, 11], 3) for i in range(2)])
    assert len(res.steps) >= 3
    for a, b in zip(res.steps, res.steps[1:]):
        assert b.start_s > a.start_s
    for s in res.steps:
        assert 0 < s.runner_s < s.iter_s
        assert s.device_s != s.device_s   # NaN: no CUDA events on the CPU


@pytest.mark.parametrize("async_overlap", [True, False])
def test_a_replays_inter_token_gaps_sum_to_each_requests_decode_time(async_overlap, monkeypatch):
    """The pipelined loop launches a plan before the one ahead of it is read back; the replay's metrics put a plan's
    tokens at its start plus its share of the wall clock, and took the start as the launch: the first gap of a request
    whose prompt completed in the plan ahead came out negative (`twinfer run -n 1 --max-output-len 6` on the CPU: ITL
    mean 3.4 ms against TPOT 5.0 ms). Each request's gaps sum to its E2E less its TTFT, on either loop. On a tick
    clock: the real one read a token's time and the E2E's end milliseconds apart on a loaded CI machine (0.7% off)."""
    from executor.replay import replay

    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp32", seed=0,
                            scheduler_config={**SC, "max_num_batched_tokens": 128, "async_overlap": async_overlap})
    assert e.async_overlap == async_overlap
    monkeypatch.setattr(time, "perf_counter", TickClock())
    items = [(0.0, "a", list(range(5, 60)), 6), (0.0, "b", list(range(7, 90)), 9), (0.0, "c", list(range(3, 40)), 4)]
    m = replay(e, items).metrics
    assert m.requests_finished == 3 and m.itl_s.count == 5 + 8 + 3
    decode_time = 3 * (m.e2e_s.mean - m.ttft_s.mean)
    assert decode_time > 0 and m.itl_s.mean * m.itl_s.count == pytest.approx(decode_time, rel=1e-9)
