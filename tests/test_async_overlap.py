"""Async overlap in the executor (issue 23): the pipelined loop gives the synchronous loop's tokens, and its
structure is the one costmodels/host.py prices.

Greedy tokens on the tiny model in float64 are exact, so the pipelined loop (schedule and launch plan N+1 before
reading plan N back, placeholders for N's tokens) must reproduce the synchronous loop token for token through
finishes at different lengths, stop tokens read back late, preemption under a tiny KV budget and aborts, and
never hand out a token past a stop. The structure test counts no time: it records the order of the calls, and a
virtual clock (host cost per scheduled plan, device time per launched plan) must add up to ``wall_time``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodels.host import wall_time  # noqa: E402
from executor.engine import LLMEngine, SamplingParams  # noqa: E402
from executor.replay import replay  # noqa: E402

SC = {"block_size": 16, "max_num_batched_tokens": 48, "max_num_seqs": 6}


def engine(overlap: bool, **kw) -> LLMEngine:
    sc = {**SC, **kw.pop("sc", {}), "async_overlap": overlap}
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, scheduler_config=sc, **kw)
    assert e.async_overlap is overlap, e.overlap_off_reason
    return e


def prompts(seed: int, lens) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in lens]


def run_all(e: LLMEngine, ps, params, abort_after: dict[int, int] | None = None):
    """Drive ``step`` to the end; per prompt the tokens and the finish reason. ``abort_after``: prompt index ->
    abort it once it has that many tokens."""
    ids = [f"r{i}" for i in range(len(ps))]
    for rid, p, sp in zip(ids, ps, params):
        e.add_request(rid, p, sp)
    got = {rid: [] for rid in ids}
    reason = {}
    while e.has_unfinished():
        for o in e.step():
            assert o.request_id not in reason, f"{o.request_id}: output after it finished"
            got[o.request_id] += o.new_token_ids
            if o.finished:
                reason[o.request_id] = o.finish_reason
        for i, n in (abort_after or {}).items():
            if ids[i] not in reason and len(got[ids[i]]) >= n:
                e.abort(ids[i])
    return [got[r] for r in ids], [reason[r] for r in ids]


def check_scheduler_clean(e: LLMEngine) -> None:
    s = e.scheduler.stats()
    assert s.num_running == s.num_waiting == 0 and s.kv_held_blocks == 0
    assert e.scheduler.outstanding_tokens == 0


def test_identical_tokens_with_finishes_at_different_lengths():
    ps = prompts(0, (5, 70, 100, 17, 33))
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (1, 9, 3, 14, 6)]
    runs = {ov: run_all(engine(ov), ps, params) for ov in (False, True)}
    assert runs[True] == runs[False]
    assert [len(t) for t in runs[True][0]] == [1, 9, 3, 14, 6]
    assert runs[True][1] == ["length"] * 5


def test_stop_tokens_read_back_late_finish_without_extra_tokens():
    """A stop token is known only when its step is read back, after the next step was launched with the
    request in it: that one speculative step is dropped, never a token past the stop."""
    ps = prompts(6, (8, 40, 21))
    free = engine(False).generate(ps, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    stops = [free[0][3], free[1][6], free[2][0]]   # a stop in the middle, and one on the first token
    params = [SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[s], ignore_eos=True) for s in stops]
    runs = {}
    for ov in (False, True):
        e = engine(ov)
        runs[ov] = run_all(e, ps, params)
        check_scheduler_clean(e)
        assert e.scheduler.num_finished == 3 and e.stats().generation_tokens_total == sum(map(len, runs[ov][0]))
    assert runs[True] == runs[False]
    for toks, f, s, why in zip(runs[True][0], free, stops, runs[True][1]):
        assert toks == f[: f.index(s) + 1] and why == "stop"


def test_preemption_under_a_tiny_kv_budget_gives_the_same_tokens():
    ps = prompts(3, (40, 35, 50, 20))
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (24, 30, 10, 28)]
    runs, preempted = {}, {}
    for ov in (False, True):
        e = engine(ov, num_kv_blocks=12)
        runs[ov] = run_all(e, ps, params)
        preempted[ov] = e.scheduler.num_preemptions
        check_scheduler_clean(e)
    assert preempted[False] > 0 and preempted[True] > 0
    assert runs[True] == runs[False]


def test_aborts_end_streams_and_leave_the_rest_untouched():
    ps = prompts(4, (12, 30, 9))
    params = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)] * 3
    full = run_all(engine(False), ps, params)[0]
    for ov in (False, True):
        e = engine(ov)
        toks, why = run_all(e, ps, params, abort_after={1: 3})
        check_scheduler_clean(e)
        assert why == ["length", "abort", "length"]
        assert toks[0] == full[0] and toks[2] == full[2]
        assert 3 <= len(toks[1]) < 10 and toks[1] == full[1][: len(toks[1])]


def test_sampled_requests_match_and_replay_runs_pipelined():
    """Seeded sampling draws the same tokens (one draw per request per step in both loops), and the offline
    replay loop (run / validate / tune --measure) finishes every request with its full output."""
    ps = prompts(7, (9, 30, 16))
    sp = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=7, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    assert run_all(engine(True), ps, sp) == run_all(engine(False), ps, sp)
    items = [(0.0, f"q{i}", p, 5 + i) for i, p in enumerate(ps)]
    for ov in (False, True):
        e = engine(ov)
        res = replay(e, items)
        assert len(res.steps) > 0 and all(s.num_steps == 1 for s in res.steps)
        # both loops time the scheduling and completion around each step (the pipelined one: of what the call launched)
        assert all(s.schedule_s >= 0 and s.complete_s >= 0 for s in res.steps), ov
        assert sum(s.schedule_s for s in res.steps) > 0
        m = res.metrics
        assert m.requests_finished == 3 and m.output_tokens == 5 + 6 + 7 and not e.has_unfinished()
        assert e.stats().generation_tokens_total == 5 + 6 + 7


def test_step_observers_see_each_finish_once_and_token_times_in_order():
    """The server's metrics read finish and first-token times off the plans the observer is shown (serve/prom.py):
    the pipelined loop sets them when the tokens are read back, so every finished request shows up finished in
    exactly one observed plan, and its first token never comes after its finish or before its plan started."""
    ps = prompts(2, (9, 40, 17, 5))
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (1, 7, 4, 12)]
    for ov in (False, True):
        e = engine(ov)
        seen: dict[str, int] = {}

        def observe(start_s, plan, result):
            for r in list(plan.decodes) + [c.request for c in plan.prefills]:
                if r.finish_time is not None and r.first_token_time is not None:
                    seen[r.request_id] = seen.get(r.request_id, 0) + 1
                    assert r.first_scheduled_time <= r.first_token_time <= r.finish_time

        e.step_observer = observe
        run_all(e, ps, params)
        assert seen == {f"r{i}": 1 for i in range(4)}, (ov, seen)


def test_off_switch_and_configurations_that_stay_synchronous():
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", scheduler_config={**SC, "async_overlap": True}, decode_steps=4)
    assert not e.async_overlap and "multi-step" in e.overlap_off_reason
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", scheduler_config={**SC, "async_overlap": True},
                            async_overlap=False)
    assert not e.async_overlap and e.step.__name__ == "step_sync"
    e = engine(True)
    assert e.step.__name__ == "step_overlapped"


# ----------------------------------------------------------------------------- structure, no time measured

class Recorder:
    """Wraps the engine's pipeline and scheduler: logs schedule / launch / collect in call order, and runs a
    virtual clock: ``host_s`` per non-empty plan scheduled, ``device_s`` per plan on a device that starts a plan
    when the host launched it and the previous one ended; a read-back waits for its plan's end."""

    def __init__(self, e: LLMEngine, host_s: float, device_s: float):
        self.log: list[tuple[str, int]] = []
        self.host_s, self.device_s = host_s, device_s
        self.clock = 0.0
        self.dev_free = 0.0
        self.n_sched = 0
        self.ends: dict[int, float] = {}
        sched_fn = e.scheduler.schedule

        def schedule(now, max_steps=1):
            plan = sched_fn(now, max_steps)
            if not plan.is_empty:
                self.log.append(("schedule", self.n_sched))
                self.n_sched += 1
                self.clock += host_s
            return plan

        e.scheduler.schedule = schedule
        if e.pipeline is not None:
            self.inner = e.pipeline
            e.pipeline = self
        else:
            run = e.backend.execute

            def execute(plan, stop_at=None):
                self.log.append(("execute", self.n_sched - 1))
                self.clock += device_s
                return run(plan, stop_at)

            e.backend = type("B", (), {"execute": staticmethod(execute)})()

    def launch(self, plan, prev):
        n = self.n_sched - 1
        self.log.append(("launch", n))
        f = self.inner.launch(plan, prev)
        start = max(self.clock, self.dev_free)
        self.dev_free = self.ends[id(f)] = start + self.device_s
        f.record["n"] = n
        return f

    def collect(self, f):
        self.log.append(("collect", f.record["n"]))
        self.clock = max(self.clock, self.ends[id(f)])
        return self.inner.collect(f)


def decode_run(overlap: bool, host_s: float, device_s: float) -> Recorder:
    """Four requests of the same prompt length and output: one prefill plan, then identical decode plans."""
    e = engine(overlap, sc={"max_num_batched_tokens": 64})
    rec = Recorder(e, host_s, device_s)
    for i, p in enumerate(prompts(9, (10, 10, 10, 10))):
        e.add_request(f"d{i}", p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    while e.has_unfinished():
        e.step()
    return rec


def test_schedule_of_the_next_plan_comes_before_reading_back_the_one_in_flight():
    rec = decode_run(True, 1.0, 1.0)
    pos = {ev: i for i, ev in enumerate(rec.log)}
    n = rec.n_sched
    assert n == 8   # the prompts' plan, then seven decode plans
    for k in range(n):
        assert pos[("schedule", k)] < pos[("launch", k)] < pos[("collect", k)]
        if k + 1 < n:   # plan k+1 is scheduled and launched while plan k is still on the device
            assert pos[("launch", k + 1)] < pos[("collect", k)]
        if k + 2 < n:   # one plan of lookahead, not two
            assert pos[("collect", k)] < pos[("schedule", k + 2)]


@pytest.mark.parametrize("host_s,device_s", [(1.0, 3.0), (3.0, 1.0), (2.0, 2.0)])
def test_pipelined_loop_takes_the_time_costmodels_host_prices(host_s, device_s):
    """The virtual clock of the executor's loop equals the simulator's rule (``wall_time``): with overlap
    each step costs max(device, host) after a cold first step; without, device + host."""
    for overlap in (True, False):
        rec = decode_run(overlap, host_s, device_s)
        k = rec.n_sched
        predicted = float(np.sum(wall_time(np.full(k, device_s), host_s, overlap, cold_start=True)))
        assert rec.clock == pytest.approx(predicted), (overlap, rec.log)


def test_gpu_benchmark_smoke_mode_runs_on_cpu(tmp_path):
    """benchmarks/gpu/async_overlap.py --cpu --tiny: the H200 benchmark's whole path (three loads, overlap off and
    on, predicted gain by the host rule) on the tiny model; every replay finishes every request."""
    import json

    from benchmarks.gpu import async_overlap as bench

    doc = bench.main(["--cpu", "--tiny", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "async_overlap.json").read_text())
    assert [lv["level"] for lv in saved["levels"]] == ["low", "knee", "past saturation"] == [lv["level"] for lv in doc["levels"]]
    for lv in saved["levels"]:
        for mode in ("off", "on"):
            assert lv[mode]["requests_finished"] == saved["requests"] and lv[mode]["steps"] > 0
        p = lv["predicted_host_rule"]
        assert np.isfinite(p["step_gain"]) and p["busy_on_s"] <= p["busy_off_s"]


def test_gpu_benchmark_calibrates_in_its_own_process(tmp_path):
    """--calibrate: the engine is calibrated before the bench replays anything (grid points only), the profile is
    written beside the results, and every level carries the simulator's prediction on it."""
    import json

    from benchmarks.gpu import async_overlap as bench
    from costmodels.calibration import CalibrationProfile

    doc = bench.main(["--cpu", "--tiny", "--calibrate", "--out", str(tmp_path)])
    prof = CalibrationProfile.load(tmp_path / "calibration.json")
    assert prof.step is not None and prof.step.model == "tiny" and "--calibrate" in prof.provenance["command"]
    for lv in doc["levels"]:
        p = lv["predicted_calibrated"]
        assert p["off"] > 0 and p["on"] > 0 and p["tok_s_gain"] == pytest.approx(p["on"] / p["off"] - 1.0)
    assert json.loads((tmp_path / "async_overlap.json").read_text())["levels"][0]["predicted_calibrated"]["off"] > 0


def test_gpu_benchmark_rounds_alternate_and_give_an_interval(tmp_path):
    """--rounds 3: each level replays off and on three times, the order alternating; the gain is the median of the
    rounds' on / off, with its spread and a bootstrap interval that holds it."""
    from benchmarks.gpu import async_overlap as bench

    doc = bench.main(["--cpu", "--tiny", "--rounds", "3", "--out", str(tmp_path)])
    for lv in doc["levels"]:
        m = lv["measured"]
        assert m["rounds"] == 3 and len(m["round_gains"]) == len(m["tok_s_off"]) == len(m["tok_s_on"]) == 3
        want = [on / off - 1.0 for off, on in zip(m["tok_s_off"], m["tok_s_on"])]
        assert m["round_gains"] == pytest.approx(want) and m["tok_s_gain"] == pytest.approx(float(np.median(want)))
        assert m["min"] <= m["ci95"][0] <= m["tok_s_gain"] <= m["ci95"][1] <= m["max"]
