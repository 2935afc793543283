"""A pipelined loop priced launch by launch (costmodels.host.pipeline_step): the rule, the simulator's loop that runs
it, and validate's per-step prediction, which must be the number the simulator charges."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from costmodels.host import pipeline_step, pipelined_walls


def test_a_graph_step_starts_when_launched_an_eager_one_as_issued():
    # in flight until 5; the host starts the next launch at 1 and needs 2: launched at 3, the one in flight read at 5
    assert pipeline_step(5.0, 1.0, 2.0, 4.0, eager=False) == (3.0, 5.0, 9.0)
    assert pipeline_step(5.0, 1.0, 2.0, 4.0, eager=True) == (3.0, 5.0, 9.0)
    # a launch longer than what is left in flight: the read-back waits for it; a graph starts after it, an eager
    # step's kernels ran while it was issued
    assert pipeline_step(2.0, 1.0, 6.0, 4.0, eager=False) == (7.0, 7.0, 11.0)
    assert pipeline_step(2.0, 1.0, 6.0, 4.0, eager=True) == (7.0, 7.0, 7.0)
    assert pipeline_step(2.0, 1.0, 6.0, 9.0, eager=True) == (7.0, 7.0, 11.0)
    # ...but not what its launch issues last (the sampler, after the forward): a step read back with nothing launched
    # behind it still takes that long after its launch
    assert pipeline_step(2.0, 1.0, 6.0, 4.0, eager=True, tail_s=1.5) == (7.0, 7.0, 8.5)
    assert pipeline_step(2.0, 1.0, 6.0, 4.0, eager=False, tail_s=1.5) == (7.0, 7.0, 11.0)
    w = pipelined_walls([3.0, 0.5], [1.0, 4.0], [False, True], [True, False], [0.0, 0.2])
    assert w[1] == pytest.approx(0.2)    # its device work ran during its launch, all but the sampler's
    # nothing in flight: the launch starts the device
    assert pipeline_step(-np.inf, 1.0, 2.0, 4.0, eager=False)[2] == 7.0
    assert pipeline_step(-np.inf, 1.0, 2.0, 4.0, eager=True)[2] == 5.0


def test_like_steps_cost_max_device_host_and_a_prompt_step_moves_its_launch_to_the_step_before():
    w = pipelined_walls([3.0] * 5, [1.0] * 5, [False] * 5, [True, False, False, False, False])
    assert w[0] == pytest.approx(4.0) and np.allclose(w[1:], 3.0)          # cold: launch then device
    w = pipelined_walls([3.0] * 4, [5.0] * 4, [False] * 4, [True, False, False, False])
    assert np.allclose(w[1:3], 5.0) and w[3] == pytest.approx(3.0)         # host-bound; the last waits for no launch
    # decode (3.4 ms device), then a prompt step (16.8 ms device, 8 ms to launch), then decodes: the decode before
    # the prompt step runs until its launch is done, the prompt step's own iteration is short by what ran meanwhile
    d, h = [3.4, 3.4, 16.8, 3.4, 3.4], [1.0, 1.0, 8.0, 1.0, 1.0]
    w = pipelined_walls(d, h, [False, False, True, False, False], [True] + [False] * 4)
    assert w[1] == pytest.approx(8.0) and w[2] == pytest.approx(3.4 + 16.8 - 8.0)
    assert w[3] == pytest.approx(3.4) and w[4] == pytest.approx(3.4)
    # over the run, the per-step rule max(device, host) and this one agree once the prompt step's device work covers
    # its launch; only the split between neighbours moves
    alone = np.maximum(d, h)
    assert w[1:].sum() == pytest.approx(alone[1:].sum())
    # the first step launched cold, and the host launches the one behind it before reading it back; a step with an
    # idle gap after it (the next is cold) waits for no launch
    w = pipelined_walls([3.0, 3.0, 3.0], [1.0, 9.0, 1.0], [False] * 3, [True, False, True])
    assert np.allclose(w, [1.0 + 9.0, 3.0, 1.0 + 3.0])
    assert pipelined_walls([], [], [], []).size == 0


def _profile(after=False):
    from costmodels.calibration import CalibrationProfile
    from costmodels.hardware import get_hardware
    from costmodels.step_profile import HostTerms, LoopTerms, StepProfile

    st = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", graph_sizes=[1, 2, 4, 8, 16],
                     host=HostTerms(fixed_s=4e-3, per_prefill_s=1e-3, graph_fixed_s=0.4e-3,
                                    **({"after_eager_s": 3e-4, "after_eager_decode_s": [4e-4, 2e-4, 1e-4]} if after else {})),
                     loop=LoopTerms(fixed_s=2e-4, per_request_s=1e-5))
    return CalibrationProfile.default(get_hardware("H200")).model_copy(update={"step": st})


class _Recording:
    """A SimBackend factory that records each plan's shape and whether it launched with nothing in flight."""

    def __init__(self):
        from sim.backend import SimBackend

        rec = self.plans = []

        class Rec(SimBackend):
            def execute(self, plan, stop_at=None):
                cold = not self._in_flight
                firsts = [c for c in plan.prefills if c.request.num_computed_tokens == c.request.num_cached_tokens
                          and c.request.num_output_tokens == 0]
                rec.append(SimpleNamespace(decode_ctx=np.array(plan.decode_context_lens), draft_len=plan.draft_len,
                                           prefill=[(c.num_new_tokens, c.context_len) for c in plan.prefills],
                                           admitted=len(firsts), admitted_tokens=sum(c.request.prompt_len for c in firsts),
                                           cold=cold))
                return super().execute(plan, stop_at)
        self.cls = Rec


def _simulate(cost, cfg, reqs, max_steps=1, debug=False):
    """``reqs`` through one instance of the simulator's loop on ``cost`` (a MemoStepCost) under ``cfg``, recording
    each plan (``_Recording``): (plans, collector, the backend)."""
    import simpy

    from scheduler.metrics import MetricsCollector
    from scheduler.scheduler import Scheduler
    from sim import invariants
    from sim.backend import host_coeffs
    from sim.cluster import Cluster
    from sim.router import RouterConfig, make_router

    rec = _Recording()
    env = simpy.Environment()
    col = (invariants.CheckingCollector if debug else MetricsCollector)(record_steps=True)
    sched = Scheduler(cfg, 4000, 0, name_all_blocks=False)
    backends = []

    def make(i):
        b = rec.cls(cost, np.random.default_rng([1, i]), (), cfg.async_overlap, host_coeffs=host_coeffs(cfg))
        backends.append(b)
        return b
    Cluster(env, [sched], make, make_router(RouterConfig()), col, sorted(reqs, key=lambda r: r.arrival_time), max_steps=max_steps)
    env.run()
    if debug:
        invariants.check_end(col, [sched], len(reqs), env.now)
    return rec.plans, col, backends[0]


def _run(prof, overlap=True, max_steps=1, debug=False, rate=4.0):
    from costmodels.profiled import ProfiledStepCost
    from scheduler.config import SchedulerConfig
    from sim.backend import MemoStepCost, loop_cost
    from sim.workload import generate, preset
    from ui.cmd_validate import sim_config

    cfg = sim_config(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048, async_overlap=overlap), prof)
    reqs = generate(preset("chat", num_requests=40, rate=rate), np.random.default_rng(3), cfg.block_size)
    plans, col, backend = _simulate(MemoStepCost(loop_cost(ProfiledStepCost(prof), overlap)), cfg, reqs, max_steps, debug)
    return plans, col, backend, cfg


def test_the_simulator_charges_each_step_what_validate_predicts_for_it():
    """One number: run single-step plans through the simulator's pipelined loop and predict the same sequence of
    steps with validate's ``predict_steps``: each step's charged wall (its read-back less the previous one) is that
    prediction; the two loops differ (the per-step rule charges the steps around a prompt step otherwise)."""
    from costmodels.profiled import ProfiledStepCost
    from ui.cmd_validate import predict_steps

    for after in (False, True):   # and with the measured cost of following a prompt step, and its decay
        prof = _profile(after)
        plans, col, backend, cfg = _run(prof)
        assert backend.lead
        walls = np.array([r.duration_s for r in col.step_records])
        assert len(walls) == len(plans) > 50 and any(p.prefill for p in plans) and any(p.cold for p in plans[1:])
        starts = np.array([r.start_s for r in col.step_records])
        cold = np.array([p.cold for p in plans])
        # where the engine idled before a cold plan (the power limit's average decays over it): from the read-back
        # before it to its start
        idle = np.where(cold, starts - np.concatenate(([0.0], starts[:-1] + walls[:-1])), 0.0)
        pred = predict_steps(ProfiledStepCost(prof), prof, plans, True, cold, np.maximum(idle, 0.0))
        assert np.allclose(pred, walls, rtol=1e-9, atol=1e-12)
        per_step = predict_steps(ProfiledStepCost(prof), prof, plans, 0.999999)   # not lead: each step alone
        assert not np.allclose(per_step, walls, rtol=1e-3)
        # read-backs follow one another: each plan starts where the one before it was read back, or later (idle)
        starts = np.array([r.start_s for r in col.step_records])
        assert np.all(starts[1:] >= starts[:-1] + walls[:-1] - 1e-12)


def test_the_pipelined_loop_keeps_every_invariant_multi_step_plans_included():
    """Debug mode (every request accounted for, tokens conserved, time monotone) over the launch-by-launch loop, with
    multi-step decode plans cut by arrivals; the first tokens and finishes are dated at their plan's read-back."""
    prof = _profile()
    for rate in (4.0, 30.0):
        plans, col, backend, cfg = _run(prof, max_steps=64, debug=True, rate=rate)
        assert backend.lead and any(r.num_steps > 1 for r in col.step_records)
        assert col.summarize(1, None).requests_finished == 40


def test_the_synchronous_loop_and_a_partly_hiding_overlap_keep_the_per_step_rule():
    from costmodels.profiled import ProfiledStepCost
    from sim.backend import MemoStepCost, SimBackend, loop_cost

    prof = _profile()
    sync = SimBackend(MemoStepCost(loop_cost(ProfiledStepCost(prof), False)), np.random.default_rng(0), (), False)
    assert not sync.lead
    plans, col, backend, cfg = _run(prof, overlap=False)
    assert not backend.lead
    # an overlap that hides only part of the host work (vLLM v0's output processor) is no pipelined launch
    part = SimBackend(MemoStepCost(ProfiledStepCost(prof)), np.random.default_rng(0), (), True, host_coeffs=(2e-3, 0, 0, 0.25))
    assert not part.lead


def _run_analytic(host_s, max_steps=1, debug=False):
    """Single- (or multi-) step plans of a small dense model on the analytic cost model through the simulator's
    pipelined loop, with ``host_s`` seconds of loop host work a step (the config's ``host_step_s``)."""
    from costmodels.catalog import get_model
    from costmodels.hardware import get_hardware
    from costmodels.layout import ParallelLayout
    from costmodels.step import StepCostModel
    from scheduler.config import SchedulerConfig
    from sim.backend import MemoStepCost
    from sim.workload import generate, preset

    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048, async_overlap=True, host_step_s=host_s,
                          host_per_request_s=0.0, host_per_token_s=0.0)
    reqs = generate(preset("chat", num_requests=24, rate=0.5), np.random.default_rng(3), cfg.block_size)
    model = StepCostModel(get_model("llama-3.1-8b"), get_hardware("H200"), ParallelLayout())
    plans, col, backend = _simulate(MemoStepCost(model), cfg, reqs, max_steps, debug)
    return plans, col, backend, model


def test_an_analytic_model_runs_the_pipelined_loop_launch_by_launch_too():
    """The analytic models (``simulate``'s and ``plan``'s full-model figures) price serving's pipelined loop with the
    same rule as a measured profile: their device time, the config's host terms as each launch's host work, a step
    launched before the one in flight is read back. Each charged wall is ``pipelined_walls`` over the plans' device
    and host seconds; with host work longer than some steps' device work the walls differ from the per-step max."""
    from costmodels.host import wall_time

    host = 12e-3
    plans, col, backend, model = _run_analytic(host)
    assert backend.lead and not backend._split
    walls = np.array([r.duration_s for r in col.step_records])
    assert len(walls) == len(plans) > 50 and any(p.prefill for p in plans) and any(p.cold for p in plans[1:])
    dev = np.array([model.chunked_step_time(p.decode_ctx, 0, [a for a, _ in p.prefill], [c for _, c in p.prefill])
                    if p.prefill else float(model.decode_times(p.decode_ctx, 1)[0]) for p in plans])
    cold = np.array([p.cold for p in plans])
    want = pipelined_walls(dev, np.full(dev.size, host), np.zeros(dev.size, bool), cold)
    assert np.allclose(walls, want, rtol=1e-9, atol=1e-12)
    per_step = np.array([wall_time(float(d), host, True, bool(c)) for d, c in zip(dev, cold)])
    assert (dev < host).any() and (dev > host).any() and not np.allclose(walls, per_step, rtol=1e-3)
    # multi-step plans cut by arrivals keep every invariant
    plans, col, backend, model = _run_analytic(host, max_steps=32, debug=True)
    assert any(r.num_steps > 1 for r in col.step_records) and col.summarize(1, None).requests_finished == 24


def test_the_samplers_host_issue_comes_from_the_measured_phase():
    """``fit_sample_issue``: the sampler's host issue, affine in sampled rows, from the calibration points' measured
    'sample' host phase; too few points, no term. A pipelined launch then pays it on the host (``sample_split``),
    where before it paid the sampler's eager seconds less its device work."""
    from costmodels.calibration import SampleTable
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import fit_sample_issue
    from costmodels.step_profile import StepPoint

    pts = [StepPoint(num_layers=4, decode_ctx=[100] * b, wall_s=0.01, graph_bs=b,
                     host_phases={"inputs": 1e-4, "sample": 6e-4 + 8e-6 * b, "readback": 1e-5, "post": 1e-4})
           for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    got = fit_sample_issue(pts)
    assert got["sample_issue_s"] == pytest.approx(6e-4, rel=1e-6) and got["sample_issue_per_row_s"] == pytest.approx(8e-6, rel=1e-6)
    assert fit_sample_issue(pts[:7]) == {}
    assert fit_sample_issue([p.model_copy(update={"host_phases": None}) for p in pts]) == {}

    prof = _profile()
    smp = SampleTable(batch=[1, 64], seconds=[7e-4, 1.2e-3], device_seconds=[6.5e-4, 1.1e-3], vocab=129280, includes_logits=True)
    st = prof.step.model_copy(update={"op_tables": ["sample"]})
    prof = prof.model_copy(update={"step": st, "tables": {**prof.tables, "sample": smp}})
    pc = ProfiledStepCost(prof, st)
    d, h = pc.sample_split(16)
    assert h == pytest.approx(7e-4 + 15 * (5e-4 / 63) - d)          # eager seconds less device work
    st2 = st.model_copy(update={"host": st.host.model_copy(update=got)})
    pc2 = ProfiledStepCost(prof.model_copy(update={"step": st2}), st2)
    d2, h2 = pc2.sample_split(16)
    assert d2 == pytest.approx(d) and h2 == pytest.approx(6e-4 + 16 * 8e-6)
    assert pc2.pipelined().pipelined_parts([1] * 16, [100] * 16, [True] * 16)[1] > pc.pipelined().pipelined_parts([1] * 16, [100] * 16, [True] * 16)[1]


@pytest.mark.parametrize("draft,blocks,kind,instances", [(1, 4000, "chat", 1), (0, 60, "chat", 1), (1, 80, "agentic", 2)])
def test_the_pipelined_loop_keeps_its_invariants_with_drafts_preemption_and_several_instances(draft, blocks, kind, instances):
    """The launch-by-launch loop in debug mode with MTP drafts drawn per step, with a KV cache small enough to
    preempt (and drop what can never fit), and behind a router over several instances: every invariant holds."""
    import simpy

    from costmodels.profiled import ProfiledStepCost
    from scheduler.config import SchedulerConfig
    from scheduler.scheduler import Scheduler
    from sim import invariants
    from sim.backend import MemoStepCost, SimBackend, host_coeffs, loop_cost
    from sim.cluster import Cluster
    from sim.router import RouterConfig, make_router
    from sim.workload import generate, preset
    from ui.cmd_validate import sim_config

    prof = _profile(True)
    cfg = sim_config(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048, draft_len=draft), prof)
    reqs = generate(preset(kind, num_requests=40, rate=25.0), np.random.default_rng(5), cfg.block_size)
    cost = MemoStepCost(loop_cost(ProfiledStepCost(prof), True))
    env = simpy.Environment()
    col = invariants.CheckingCollector(record_steps=False)
    scheds = [Scheduler(cfg, blocks, i, name_all_blocks=False) for i in range(instances)]
    made = []

    def make(i):
        made.append(SimBackend(cost, np.random.default_rng([1, i]), cfg.effective_acceptance_rates(), True,
                               host_coeffs=host_coeffs(cfg)))
        return made[-1]
    Cluster(env, scheds, make, make_router(RouterConfig()), col, sorted(reqs, key=lambda r: r.arrival_time), max_steps=64)
    env.run()
    invariants.check_end(col, scheds, len(reqs), env.now)
    assert all(b.lead for b in made)
    assert col.n_finished + col.n_dropped == 40 and col.n_finished > 0


def _steps(*specs):
    """Measured-sample-like steps: (decode contexts, prefill chunks, admitted, admitted tokens) each."""
    return [SimpleNamespace(decode_ctx=np.array(d, np.int64), prefill=list(p), draft_len=0, admitted=a, admitted_tokens=t)
            for d, p, a, t in specs]


def test_the_cost_of_following_a_prompt_step_is_launch_work_the_pipelined_loop_hides():
    """A profile's after-prompt terms (measured in the runner's input build and sampler, not its forward:
    ``executor.calibrate.measure_after_eager``) are host work of the launch: a synchronous loop adds them, a pipelined
    one hides them under device work as it hides the rest of the launch. Charged on the device side they made the
    decode steps behind a prompt step end late and the prompt step's own iteration short (H200 runs 35-40: the pair's
    sum right, the split 1-2 ms off)."""
    from costmodels.profiled import ProfiledStepCost
    from ui.cmd_validate import predict_steps

    ctx = [8192] * 16   # device-bound decode graph steps: their launch is a fraction of their device work
    seq = _steps((ctx, [], 0, 0), (ctx, [], 0, 0), (ctx, [(512, 0)], 0, 0), *[(ctx, [], 0, 0)] * 5)
    plain, after = _profile(False), _profile(True)
    cold = np.zeros(len(seq), bool)
    cold[0] = True
    piped = [predict_steps(ProfiledStepCost(p), p, seq, True, cold) for p in (plain, after)]
    assert np.allclose(piped[0], piped[1], rtol=0, atol=1e-12)
    d, h, _, _ = ProfiledStepCost(plain).pipelined().step_parts(np.array(ctx), 0, [], [])
    assert d > h + 4e-4                                # hidden: the launch plus the extra is still shorter
    sync = [predict_steps(ProfiledStepCost(p), p, seq, False) for p in (plain, after)]
    assert sync[1] - sync[0] == pytest.approx([0, 0, 0, 4e-4, 2e-4, 1e-4, 0, 0], abs=1e-12)


def test_admissions_delay_the_launch_after_the_call_that_made_them():
    """A measured step's admissions are the arrivals of the engine call that read it back, which admits them before
    it launches the next step (executor.replay): their host seconds lengthen that launch, so the iteration that waits
    for it (this step's) grows by them and the next one (whose device work started no later) shrinks by them. A step
    launched cold was admitted for before its own launch, outside any measured iteration: nothing moves."""
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_profile import LoopTerms
    from ui.cmd_validate import predict_steps

    base = _profile(False)
    prof = base.model_copy(update={"step": base.step.model_copy(update={"loop": LoopTerms(
        fixed_s=2e-4, per_request_s=1e-5, admit_s=3e-4, admit_per_token_s=1e-7)})})
    cost = ProfiledStepCost(prof)
    ctx = [1024] * 4
    quiet = _steps((ctx, [], 0, 0), (ctx, [], 0, 0), (ctx, [(2048, 0)], 0, 0), (ctx, [], 0, 0), (ctx, [], 0, 0))
    busy = _steps((ctx, [], 0, 0), (ctx, [], 1, 2048), (ctx, [(2048, 0)], 0, 0), (ctx, [], 0, 0), (ctx, [], 0, 0))
    cold = np.array([True, False, False, False, False])
    a, b = (predict_steps(cost, prof, s, True, cold) for s in (quiet, busy))
    dt = 3e-4 + 2048e-7
    assert b - a == pytest.approx([0, dt, -dt, 0, 0], abs=1e-12)
    cold[1] = True
    a, b = (predict_steps(cost, prof, s, True, cold) for s in (quiet, busy))
    assert np.allclose(a, b, rtol=0, atol=1e-12)
