"""The host/device split of an eager step, and the per-step path's host-to-device copies that must not wait.

On CPU: FA3's cumulative lengths are made once per chunk shape and reused; ``host_to_device`` leaves a tensor where it
is; the sampler reads its knobs on the host; the runner records how long each forward call took to return; the
calibration's one-line summary of the measured split is the arithmetic it states. The GPU side (the spin-kernel
measurement itself) runs in ``twinfer calibrate`` on a device and is archived with each matrix run.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodels.step_profile import StepPoint  # noqa: E402


def test_cu_seqlens_made_once_per_shape():
    from kernels.vendor import cu_seqlens

    a = cu_seqlens(5, 12, torch.device("cpu"))
    assert a.dtype == torch.int32 and a.tolist() == [0, 5, 0, 12]
    assert cu_seqlens(5, 12, torch.device("cpu")) is a          # every layer and later step of this shape share it
    assert cu_seqlens(6, 12, torch.device("cpu")).tolist() == [0, 6, 0, 12]


def test_host_to_device_keeps_a_tensor_already_there():
    from kernels.reference import host_to_device

    t = torch.arange(4)
    assert host_to_device(t, torch.device("cpu")) is t


def test_sampler_with_host_knobs_matches_greedy_and_seeded_draws():
    from kernels.reference import sample

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    temp = torch.tensor([0.0, 0.7, 1.3])
    k, p = torch.tensor([-1, 5, -1]), torch.tensor([1.0, 1.0, 0.9])
    g = [None, torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)]
    out = sample(logits, temp, k, p, g)
    assert out[0] == logits[0].argmax()
    assert logits[1].argsort(descending=True)[:5].tolist().count(int(out[1])) == 1   # within row 1's top-5
    g2 = [None, torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)]
    assert torch.equal(sample(logits, temp, k, p, g2), out)                           # the same seeds, the same tokens


def test_runner_records_forward_host_seconds():
    from executor.calibrate import build_engine
    from executor.synthetic_steps import drop_plan, synthetic_plan

    engine = build_engine("tiny", None, "cpu", "fp32", 8, 128, num_kv_blocks=40)
    plan = synthetic_plan(engine, [20, 30], [(16, 0)], "hd_")
    try:
        engine.runner.execute(plan)
    finally:
        drop_plan(engine, plan)
    rec = engine.runner.step_records[0]
    assert 0 < rec["forward_host_s"] <= rec["wall_s"]


def test_queued_forward_is_absent_off_cuda():
    from executor.calibrate import build_engine, queued_forward

    engine = build_engine("tiny", None, "cpu", "fp32", 8, 128, num_kv_blocks=40)
    assert queued_forward(engine.runner, lambda: None, 0.01) == {}


def test_queued_launch_is_absent_off_cuda():
    from executor.calibrate import build_engine, queued_launch

    engine = build_engine("tiny", None, "cpu", "fp32", 8, 128, num_kv_blocks=40)
    assert queued_launch(engine.runner, None, 0.01) == {}


@pytest.mark.gpu
def test_a_graph_points_held_launch_spans_its_held_forward():
    """On a GPU every CUDA-graph grid point times its whole pipelined launch held (queued_launch_s): it holds the
    replay, so it is at least the held forward; the engine's step count is left as it was."""
    import torch

    from executor.calibrate import build_engine, measure_steps

    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    engine = build_engine("tiny", None, "cuda", "bf16", 8, 256, num_kv_blocks=64)
    if not getattr(engine.runner, "graphs", None):
        pytest.skip("no CUDA graphs captured")
    pts = measure_steps(engine, [([100] * 2, []), ([100] * 4, [])], repeats=2, log=lambda s: None)
    for p in pts:
        assert p.graph_bs > 0 and p.queued_forward_s and p.queued_launch_s
        assert p.queued_launch_s >= p.queued_forward_s
    from executor.calibrate import queued_launch
    from executor.synthetic_steps import synthetic_plan
    plan = synthetic_plan(engine, [100] * 2, [], "held_")
    try:
        engine.runner.execute(plan)
        before = engine.runner.num_steps_run
        assert "queued_launch_s" in queued_launch(engine.runner, plan, 0.01)
        assert engine.runner.num_steps_run == before   # a measurement, not a step the engine ran
    finally:
        for r in plan.decodes:
            engine.runner.remove_request(r.request_id)


def _pt(host, dev, fwd):
    return StepPoint(num_layers=2, prefill=[(64, 0)], wall_s=fwd * 1.2, forward_s=fwd, queued_host_s=host, queued_forward_s=dev)


def test_queued_split_line_states_its_arithmetic():
    from executor.calibrate import queued_split_text

    pts = [_pt(0.004, 0.006, 0.0066), _pt(0.008, 0.005, 0.008), _pt(0.003, 0.010, 0.011),
           StepPoint(num_layers=2, decode_ctx=[5], wall_s=0.002, graph_bs=1)]   # a graph step: not measured apart
    line = queued_split_text(pts)
    ratio = np.array([0.0066 / 0.006, 0.008 / 0.008, 0.011 / 0.010])
    assert "1 of 3 host-bound" in line
    assert f"median {np.median(ratio):.3f}" in line
    assert queued_split_text(pts[3:]) == ""


def _planted():
    from costmodels.calibration import CalibrationProfile, sample_table
    from costmodels.hardware import get_hardware
    from costmodels.profiled import ProfiledStepCost, point_sample_s
    from costmodels.step_profile import FIT_CATEGORIES, HostTerms, StepProfile

    smp = [{"op": "sample", "batch": b, "vocab": 129280, "time_s": 2.5e-4 + 4e-6 * b, "backend": "torch", "with_logits": True}
           for b in (1, 32, 128)]
    prof = CalibrationProfile.default(get_hardware("H200")).model_copy(update={"tables": {"sample": sample_table(smp)}})
    # a slow host: every eager step is host-bound in its forward, so wall times alone cannot tell the fixed issue
    # from the decode group's (each step either holds decodes or not, and one prefill chunk)
    truth = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", use_op_tables=True, op_tables=["sample"],
                        graph_sizes=[1, 2, 4, 8, 16], category_scale=dict(zip(FIT_CATEGORIES, (1.15, 1.0, 1.15, 1.15, 1.15))),
                        host=HostTerms(fixed_s=9e-3, per_prefill_s=2e-3, decode_group_s=3e-3, graph_fixed_s=3e-4,
                                       graph_per_request_s=5e-6, serial_s=6e-4), overlap=0.0, layer_early=0.25)
    cost = ProfiledStepCost(prof, truth)
    pts = []
    for q in (16, 32, 64, 128):
        for d in (0, 3, 12):
            k = 1 + (q == 64)     # two chunks in some steps: the per-chunk issue told apart from the fixed one
            p = StepPoint(num_layers=4, decode_ctx=[500] * d, prefill=[(q, 0)] * k, wall_s=1.0)
            wall = cost.point_time(p)
            new, ctx, dec = (np.array([1] * d + [q] * k), np.array([500] * d + [0] * k), np.array([True] * d + [False] * k))
            h = cost.host_time(new.size, int(new.sum()), k)
            dv = float(cost.category_times(new, ctx, dec) @ cost.k) + truth.prefill_token_s * q * k
            pts.append(p.model_copy(update={"wall_s": wall, "forward_s": wall - 6e-4 - point_sample_s(cost, p),
                                            "queued_host_s": h, "queued_forward_s": dv}))
    pts += [StepPoint(num_layers=4, decode_ctx=[c] * b, prefill=[], wall_s=1.0, graph_bs=g)
            for b, g in ((1, 1), (2, 2), (3, 4), (7, 8), (12, 16)) for c in (300, 4000)]
    pts = [p if not p.graph_bs else p.model_copy(update={"wall_s": cost.point_time(p)}) for p in pts]
    return prof.model_copy(update={"op_points": []}), pts


def test_measured_issue_fixes_the_eager_host_terms():
    from costmodels.step_fit import fit_issue_host, fit_step_profile, host_features

    prof, pts = _planted()
    hf, names = host_features(pts, False)
    got = {names[j]: v for j, v in fit_issue_host(pts, hf, names).items()}
    assert got == pytest.approx({"fixed_s": 9e-3, "per_prefill_s": 2e-3, "decode_group_s": 3e-3}, rel=1e-6, abs=1e-9)
    st = fit_step_profile(prof, pts, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=[1, 2, 4, 8, 16])
    assert (st.host.fixed_s, st.host.per_prefill_s, st.host.decode_group_s) == pytest.approx((9e-3, 2e-3, 3e-3), rel=1e-6)
    assert any("eager host terms measured" in n for n in st.notes)
    assert any("measured device work (spin-held)" in n for n in st.notes)
    assert st.fit.mape < 0.01


def test_an_issue_that_waited_for_the_device_is_left_out():
    from costmodels.step_fit import fit_issue_host, host_features

    _, pts = _planted()
    # a forward that syncs inside: under the spin its call returns after the spin, longer than the whole unheld step
    bad = [p.model_copy(update={"queued_host_s": p.wall_s * 1.3}) if not p.graph_bs and i % 4 == 1 else p
           for i, p in enumerate(pts)]
    hf, names = host_features(bad, False)
    got = {names[j]: v for j, v in fit_issue_host(bad, hf, names).items()}
    assert got == pytest.approx({"fixed_s": 9e-3, "per_prefill_s": 2e-3, "decode_group_s": 3e-3}, rel=1e-6, abs=1e-9)
    few = [p.model_copy(update={"queued_host_s": None}) if not p.graph_bs else p for p in pts]
    assert fit_issue_host(few, *host_features(few, False)) == {}


def test_replay_records_where_the_loop_time_went():
    from executor.calibrate import build_engine
    from executor.replay import replay

    engine = build_engine("tiny", None, "cpu", "fp32", 8, 128, num_kv_blocks=40)
    items = [(0.0, f"r{i}", list(range(1, 20 + i)), 3) for i in range(3)]
    res = replay(engine, items)
    first = res.steps[0]
    assert first.admitted == 3 and first.admitted_tokens == 19 + 20 + 21 and first.admit_s > 0
    assert all(s.schedule_s >= 0 and s.complete_s >= 0 for s in res.steps)
    # the loop's parts lie inside the iteration, beside the runner
    assert all(s.admit_s + s.schedule_s + s.complete_s + s.runner_s <= s.iter_s * 1.001 + 1e-6 for s in res.steps)
    assert sum(s.admitted for s in res.steps) == 3


def test_eager_device_terms_and_overlap_come_from_the_measured_split():
    from costmodels.profiled import ProfiledStepCost, point_categories
    from costmodels.host import layered_forward
    from costmodels.step_fit import fit_eager_device, fit_eager_overlap, fit_layer_flow, fit_step_profile
    from costmodels.step_profile import FIT_CATEGORIES

    from costmodels.step_profile import StepProfile

    prof, pts = _planted()
    raw = ProfiledStepCost(prof, StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda",
                                             use_op_tables=True, op_tables=["sample"]))
    ja = FIT_CATEGORIES.index("prefill_attention")
    out, alt = [], []
    for p in pts:
        if p.graph_bs:
            out.append(p)
            continue
        c = point_categories(raw, p)
        dev = (np.delete(c, ja).sum() * 0.95 + c[ja] + 2e-6 * sum(a for a, _ in p.prefill) + (8e-4 if p.decode_ctx else 0.0))
        rows = float(p.num_tokens)
        fwd = layered_forward(p.queued_host_s, dev * raw.layer_fractions(rows, c), 0.3) + 0.08 * min(p.queued_host_s, dev)
        ovl = max(p.queued_host_s, dev) + 0.2 * min(p.queued_host_s, dev)
        out.append(p.model_copy(update={"queued_forward_s": dev, "forward_s": fwd}))
        alt.append(p.model_copy(update={"queued_forward_s": dev, "forward_s": ovl}))
    cats = np.array([point_categories(raw, p) for p in out])
    eag = fit_eager_device(out, cats, (0.8, 1.25), pin_prefill_attention=False)
    assert eag["n"] == 12 and eag["mape"] < 1e-6
    assert (eag["eager_scale"], eag["prefill_token_s"], eag["eager_decode_group_s"], eag["prefill_attention"]) == pytest.approx(
        (0.95, 2e-6, 8e-4, 1.0), rel=1e-4)
    assert fit_eager_overlap(alt) == pytest.approx(0.2)          # the whole-forward rule, where a forward follows it
    fr = {i: raw.layer_fractions(float(p.num_tokens), cats[i]) for i, p in enumerate(out) if not p.graph_bs}
    assert fit_layer_flow(out, fr) == pytest.approx((0.3, 0.08))
    st = fit_step_profile(prof, out, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=[1, 2, 4, 8, 16])
    assert st.eager_scale == pytest.approx(0.95, rel=1e-4) and (st.layer_early, st.overlap) == pytest.approx((0.3, 0.08))
    assert st.eager_decode_group_s == pytest.approx(8e-4, rel=1e-4)
    # the graph steps keep the graph forwards' scale; the eager ones are priced by the measured terms
    pc = ProfiledStepCost(prof, st)
    p = next(q for q in out if not q.graph_bs and q.decode_ctx)
    new = np.array([1] * len(p.decode_ctx) + [a for a, _ in p.prefill])
    ctx = np.array(list(p.decode_ctx) + [c for _, c in p.prefill])
    dec = np.array([True] * len(p.decode_ctx) + [False] * len(p.prefill))
    assert pc.eager_device(new, ctx, dec) == pytest.approx(p.queued_forward_s, rel=1e-3)
    assert not any(x.eager_scale for x in [StepProfile(model="m", num_layers=1)])   # older profiles: None, as before


def test_decay_profile_is_a_bounded_decay():
    from executor.calibrate import decay_profile

    assert decay_profile([3e-4, 2e-4, 2.5e-4, -1e-5, 1e-4], 2.5e-4, True) == [2.5e-4, 2e-4, 2e-4, 0.0, 0.0]
    assert decay_profile([3e-4, 2e-4], 2.5e-4, False) == [0.0, 0.0]        # one probe alone: nothing priced
    assert decay_profile([0.07, 0.12], -0.01, True) == [0.0, 0.0]           # a busy CPU's noise


def test_layered_forward_by_hand():
    from costmodels.host import layered_forward

    # device-bound layers: one layer's issue, then the device back to back
    assert layered_forward(1.0, [2.0, 2.0], 0.0) == pytest.approx(0.5 + 4.0)
    # host-bound first layers the later device work cannot give back: issue 3 over 3 layers, device 0.2, 0.2, 3
    assert layered_forward(3.0, [0.2, 0.2, 3.0], 0.0) == pytest.approx(3.0 + 3.0)   # max(H, D) would say 3.4
    # a share of each layer's device work starting with its issue
    assert layered_forward(3.0, [0.2, 0.2, 3.0], 0.5) == pytest.approx(2.1 + 1.5 + 1.5)   # layer 3 starts at 2.1
    assert layered_forward(0.0, [1.0, 2.0], 0.3) == pytest.approx(3.0)
    assert layered_forward(2.0, [], 0.3) == 2.0


def test_layer_fractions_put_the_experts_in_the_moe_layers():
    from costmodels.calibration import CalibrationProfile
    from costmodels.hardware import get_hardware
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_profile import FIT_CATEGORIES, StepProfile

    prof = CalibrationProfile.default(get_hardware("H200"))
    cost = ProfiledStepCost(prof, StepProfile(model="deepseek-v3", num_layers=5, dtype="fp8", device="cuda"))
    assert cost._dense == [True, True, True, False, False]          # DeepSeek-V3: the first three layers dense
    new, ctx, dec = np.array([1, 1, 128]), np.array([500, 500, 0]), np.array([True, True, False])
    cats = cost.category_times(new, ctx, dec)
    fr = cost.layer_fractions(130.0, cats)
    assert fr.sum() == pytest.approx(1.0) and fr[0] == fr[1] == fr[2] and fr[3] == fr[4] and fr[3] > 3 * fr[0]
    more = cats.copy()
    more[FIT_CATEGORIES.index("expert_gemm")] *= 2                  # more expert work: more in the MoE layers
    assert cost.layer_fractions(130.0, more)[3] > fr[3]


def test_an_unbucketed_step_has_its_own_issue_term():
    from costmodels.step_fit import host_features

    pts = [StepPoint(num_layers=2, prefill=[(n, 0)], wall_s=0.01) for n in (100, 4000, 5000)]
    hf, names = host_features(pts, False, piecewise_sizes=[64, 4096])
    assert names[-1] == "unbucketed_s" and hf[:, -1].tolist() == [0.0, 0.0, 1.0]
    assert "unbucketed_s" not in host_features(pts, False)[1]


def test_a_pipelined_loop_prices_each_step_as_max_of_device_and_host():
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_profile import LoopTerms
    from sim.backend import loop_cost

    from costmodels.step_fit import fit_step_profile

    prof, pts = _planted()
    st = fit_step_profile(prof, pts, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=[1, 2, 4, 8, 16])
    st = st.model_copy(update={"loop": LoopTerms(fixed_s=3e-4, per_request_s=1e-5)})
    sync = ProfiledStepCost(prof, st)
    pipe = loop_cost(sync, True)
    assert loop_cost(sync, False) is sync and pipe.pipelined_loop and not sync.pipelined_loop
    # an eager step: the device (forward and sampler) against the host (serial, issue and the loop's terms)
    new, ctx, dec = np.array([1, 1, 64]), np.array([500, 500, 0]), np.array([True, True, False])
    d = pipe.eager_device(new, ctx, dec) + pipe.sample_s(pipe.sampled_rows(new, dec))
    h = float(st.host.serial(3, 1, 64)) + pipe.host_time(3, 66, 1) + float(st.loop(3, 66))
    assert pipe.mixed_step_time(new, ctx, dec) == pytest.approx(max(d, h))
    assert sync.mixed_step_time(new, ctx, dec) > pipe.mixed_step_time(new, ctx, dec)
    # a decode graph step: its device against its input build and launch plus the loop
    ctx4 = np.array([300, 400, 500, 600])
    g = float(sync.graph_categories(ctx4, 4) @ sync.k) + sync.sample_s(4)
    gh = float(st.host.graph(4, float(ctx4.sum())))
    assert pipe.mixed_step_time(np.ones(4, np.int64), ctx4, np.ones(4, bool)) == pytest.approx(max(g, gh + float(st.loop(4, 4))))
    assert sync.mixed_step_time(np.ones(4, np.int64), ctx4, np.ones(4, bool)) == pytest.approx(g + gh)
    assert float(pipe.decode_times(ctx4, 1)[0]) == pytest.approx(max(g, gh + float(st.loop(4, 4))), rel=1e-6)


def test_moe_block_rule_switches_where_the_h200_measured_it():
    pytest.importorskip("triton")
    from kernels.triton_grouped_gemm import default_block_m

    assert [default_block_m(t, 8, 256) for t in (64, 128, 129, 384, 385, 512, 2048)] == [16, 16, 16, 16, 64, 64, 64]


def test_eager_issue_drift_compares_serving_issue_with_the_measured_terms():
    from types import SimpleNamespace

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import fit_step_profile
    from ui.cmd_validate import eager_issue_drift

    prof, pts = _planted()
    st = fit_step_profile(prof, pts, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=[1, 2, 4, 8, 16])
    cost = ProfiledStepCost(prof, st)
    model = cost.host_time(3, 66, 1)          # two decodes beside one 64-token chunk
    steps = [SimpleNamespace(prefill=[(64, 0)], decode_ctx=[500, 500], forward_host_s=model * 1.2, num_steps=1)] * 5
    steps += [SimpleNamespace(prefill=[], decode_ctx=[500], forward_host_s=1e-3, num_steps=1)] * 5   # decodes: not counted
    assert eager_issue_drift(steps, cost, SimpleNamespace(step=st)) == pytest.approx(0.2)
    assert eager_issue_drift(steps[:4], cost, SimpleNamespace(step=st)) is None                        # too few
    assert eager_issue_drift(steps, cost, SimpleNamespace(step=st.model_copy(update={"eager_scale": None}))) is None
