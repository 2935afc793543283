"""Calibration profiles: step-model fitting, interpolation, the profiled step cost, the committed H200 profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from costmodels.calibration import CalibrationProfile, EffTable
from costmodels.hardware import get_hardware
from costmodels.profiled import ProfiledStepCost, point_categories
from costmodels.step_fit import errors, fit_runner_model, fit_step_profile, loop_scheduler_terms, nnls
from costmodels.step_profile import FIT_CATEGORIES, HostTerms, LoopTerms, StepPoint, StepProfile
from costmodels.step_memo import MemoStepCost

H200_PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json"


def test_nnls_matches_unconstrained_when_positive_and_clips_otherwise():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1.0, (40, 3))
    x_true = np.array([0.5, 2.0, 1.0])
    assert np.allclose(nnls(a, a @ x_true), x_true, atol=1e-9)
    b = a @ np.array([1.0, -3.0, 0.5])
    x = nnls(a, b)
    assert (x >= 0).all()
    # optimality (KKT): the gradient is zero on the free variables and points outward on the clamped ones
    g = a.T @ (a @ x - b)
    assert np.all(np.abs(g[x > 0]) < 1e-8) and np.all(g[x == 0] >= -1e-8)


def test_runner_fit_recovers_a_max_plus_overlap_model():
    rng = np.random.default_rng(1)
    n = 60
    hf = np.stack([np.ones(n), rng.integers(1, 128, n), rng.integers(1, 8192, n), rng.integers(0, 8, n)], 1).astype(float)
    # device terms of the same order as the host's, so that both sides of the max hold points: with every point
    # device-bound, y = D + alpha H fixes only alpha x h (numpy 2.4's draws at the old range 0-0.2 gave no host-bound
    # point, and the fit answered alpha 0.1 with h three times too large, exactly)
    df = rng.uniform(0, 0.02, (n, 4))
    h_true = np.array([0.02, 5e-5, 1e-6, 1e-3])
    k_true = np.array([1.5, 2.0, 0.7, 3.0])
    h, d = hf @ h_true, df @ k_true
    y = np.maximum(h, d) + 0.3 * np.minimum(h, d)
    hh, kk, alpha, sse = fit_runner_model(hf, df, y)
    pred = np.maximum(hf @ hh, df @ kk) + alpha * np.minimum(hf @ hh, df @ kk)
    assert ((hf @ h_true) > (df @ k_true)).sum() >= 5 and ((hf @ h_true) < (df @ k_true)).sum() >= 5
    assert errors(pred, y)["mape"] < 0.01
    assert alpha == pytest.approx(0.3, abs=0.051)


def _tiny_profile() -> CalibrationProfile:
    return CalibrationProfile.default(get_hardware("H200"))


def _synthetic_points(cost: ProfiledStepCost, truth: StepProfile) -> list[StepPoint]:
    pts = []
    for b in (1, 2, 4, 8, 16, 32):
        for c in (16, 64, 200):
            pts.append(StepPoint(num_layers=truth.num_layers, decode_ctx=[c] * b, wall_s=1.0))
    for p in (8, 32, 128, 256):
        pts.append(StepPoint(num_layers=truth.num_layers, prefill=[(p, 0)], wall_s=1.0))
        pts.append(StepPoint(num_layers=truth.num_layers, decode_ctx=[50] * 4, prefill=[(p, 0), (p // 2, 0)], wall_s=1.0))
    out = []
    for p in pts:
        t = float(truth.combine(truth.host(truth.num_layers, p.num_requests, p.num_tokens, len(p.prefill)),
                                point_categories(cost, p) @ truth.scales()))
        out.append(p.model_copy(update={"wall_s": t, "loop_s": 3e-4 + 2e-6 * p.num_requests}))
    return out


def test_fit_step_profile_recovers_synthetic_engine_and_round_trips(tmp_path):
    prof = _tiny_profile()
    truth = StepProfile(model="tiny", num_layers=4, dtype="fp32", device="cpu",
                        category_scale=dict(zip(FIT_CATEGORIES, (3.0, 6.0, 2.0, 4.0, 1.5))),
                        host=HostTerms(fixed_s=2e-3, per_request_s=3e-5, per_prefill_s=2e-4), overlap=0.2)
    cost = ProfiledStepCost(prof, truth)
    pts = _synthetic_points(cost, truth)
    st = fit_step_profile(prof, pts, model="tiny", dtype="fp32", device="cpu")
    assert st.fit.mape < 0.02 and st.fit.points == len(pts)
    assert st.loop.fixed_s == pytest.approx(3e-4, rel=0.05) and st.loop.per_request_s == pytest.approx(2e-6, rel=0.1)
    assert any("folded" in n for n in st.notes)  # one layer count: no per-layer term
    full = prof.model_copy(update={"step": st, "provenance": {"gpu": "cpu", "command": "test"}})
    path = tmp_path / "p.json"
    full.save(path)
    back = CalibrationProfile.load(path)
    assert back.step is not None and back.step.category_scale == st.category_scale
    assert back.provenance["command"] == "test" and len(back.step.points) == len(pts)
    c2 = ProfiledStepCost(back)
    for p in pts[:5]:
        assert c2.point_time(p) == pytest.approx(ProfiledStepCost(full).point_time(p))


def test_fit_separates_cuda_graph_decode_steps_from_eager_steps():
    """Decode-only steps that replay a captured graph pad to its size and add host to device time; the fit
    recovers both host models and predicts a padded batch like the graph it replays."""
    prof = _tiny_profile()
    sizes = [1, 2, 4, 8, 16, 32]
    truth = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda",
                        category_scale=dict(zip(FIT_CATEGORIES, (3.0, 6.0, 2.0, 4.0, 1.5))),
                        host=HostTerms(fixed_s=2e-3, per_prefill_s=2e-4, graph_fixed_s=3e-4,
                                       graph_per_request_s=1e-5),
                        overlap=0.2, graph_sizes=sizes)
    cost = ProfiledStepCost(prof, truth)
    pts = []
    for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48):
        for c in (128, 1024, 4096):
            pts.append(StepPoint(num_layers=4, decode_ctx=[c] * b, wall_s=1.0, graph_bs=truth.graph_bucket(b)))
    for q in (64, 256, 1024, 4096):
        pts.append(StepPoint(num_layers=4, prefill=[(q, 0)], wall_s=1.0))
        pts.append(StepPoint(num_layers=4, decode_ctx=[50] * 4, prefill=[(q, 0), (q // 2, 0)], wall_s=1.0))
    pts = [p.model_copy(update={"wall_s": cost.point_time(p)}) for p in pts]
    assert {p.graph_bs for p in pts} == {0, 1, 2, 4, 8, 16, 32}  # 48 runs eager: above the largest graph
    # (the synthetic truth's scales are beyond a GPU fit's bounds: fit unbounded)
    st = fit_step_profile(prof, pts, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=sizes, scale_bounds=None)
    assert st.graph_sizes == sizes and st.fit.mape < 0.02
    # (the eager host terms hide under device-bound prefills here: only the fit error says they are right)
    assert st.host.graph_fixed_s == pytest.approx(3e-4, rel=0.1) and st.host.graph_per_request_s == pytest.approx(1e-5, rel=0.1)
    fit = ProfiledStepCost(prof, st)
    # a batch of 3 replays the 4-row graph: same GEMM/expert work, host for 3 sequences, attention for 3 rows
    ctx3 = np.array([1024, 1024, 1024])
    t3 = fit.chunked_step_time(ctx3, 0, [], [])
    t4 = fit.chunked_step_time(np.array([1024] * 4), 0, [], [])
    assert t3 < t4 and t3 > 0.97 * t4
    # multi-step decode runs price graph steps exactly like single steps
    ctx = np.array([10.0, 50.0, 300.0])
    k = fit.decode_times(ctx, 4)
    assert np.allclose(k, [fit.chunked_step_time((ctx + i).astype(np.int64), 0, [], []) for i in range(4)], rtol=1e-9)
    # without graphs the same batch is priced as an eager step: max(host, device) + overlap * min on the real rows
    eager = ProfiledStepCost(prof, truth.model_copy(update={"graph_sizes": []}))
    d = float(eager.category_times(np.ones(3, np.int64), ctx3, np.ones(3, bool)) @ truth.scales())
    h = float(truth.host(4, 3, 3, 0))
    assert eager.chunked_step_time(ctx3, 0, [], []) == pytest.approx(max(h, d) + 0.2 * min(h, d), rel=1e-9)


def test_profiled_decode_times_equal_single_steps_and_memo_is_exact():
    prof = _tiny_profile()
    st = StepProfile(model="tiny", num_layers=4, dtype="fp32", category_scale=dict(zip(FIT_CATEGORIES, (2.0, 3.0, 1.0, 1.0, 1.0))),
                     host=HostTerms(fixed_s=1e-4, per_request_s=1e-6), overlap=0.5)
    cost = ProfiledStepCost(prof, st)
    ctx = np.array([10.0, 50.0, 300.0])
    k = cost.decode_times(ctx, 4)
    loop = [cost.chunked_step_time((ctx + i).astype(np.int64), 0, [], []) for i in range(4)]
    assert np.allclose(k, loop, rtol=1e-9)
    memo = MemoStepCost(cost)
    assert np.allclose(memo.decode_times(ctx, 4), k, rtol=1e-5)


def test_loop_terms_become_scheduler_host_overhead():
    st = StepProfile(model="tiny", num_layers=4, loop=LoopTerms(fixed_s=4e-4, per_request_s=5e-6, per_token_s=1e-8))
    t = loop_scheduler_terms(st)
    assert t == {"host_step_s": 4e-4, "host_per_request_s": 5e-6, "host_per_token_s": 1e-8, "host_admit_s": 0.0,
                 "host_admit_per_token_s": 0.0, "host_after_eager_s": 0.0, "host_after_eager_decode_s": [],
                 "host_after_eager_decode_by_tokens": []}
    st.loop = st.loop.model_copy(update={"admit_s": 3e-5, "admit_per_token_s": 5e-8})
    assert loop_scheduler_terms(st)["host_admit_s"] == 3e-5 and loop_scheduler_terms(st)["host_admit_per_token_s"] == 5e-8


def test_admission_is_charged_once_to_a_requests_first_chunk():
    """The simulator charges a measured profile's admission (per request, per prompt token) to the step that runs a
    request's first prompt chunk (its prefix hits before it), not to its later chunks, decodes or a recompute."""
    from scheduler.config import SchedulerConfig
    from scheduler.plan import ScheduledChunk, StepPlan
    from scheduler.request import Request
    from sim.backend import SimBackend, host_coeffs

    cfg = SchedulerConfig(host_step_s=1e-4, host_per_request_s=0.0, host_per_token_s=0.0, host_admit_s=3e-5,
                          host_admit_per_token_s=5e-8)
    b = SimBackend(ProfiledStepCost(_tiny_profile(), StepProfile(model="tiny", num_layers=4, dtype="fp32")),
                   np.random.default_rng(0), host_coeffs=host_coeffs(cfg))
    first = Request("a", 0.0, 1000, 8, num_cached_tokens=256, num_computed_tokens=256)   # admitted with a prefix hit
    later = Request("b", 0.0, 3000, 8, num_cached_tokens=0, num_computed_tokens=2048)
    resumed = Request("c", 0.0, 500, 8, num_preemptions=1)
    # a later chunk a sliding-window replay policy resumes at context 0 (its window replayed): not a first chunk
    replayed = Request("d", 0.0, 2000, 8, num_computed_tokens=512)
    plan = StepPlan(0, prefills=[ScheduledChunk(first, 512, 256, False), ScheduledChunk(later, 512, 2048, False),
                                 ScheduledChunk(resumed, 500, 0, True), ScheduledChunk(replayed, 512, 0, False, replayed=512)],
                    decodes=[], decode_context_lens=np.zeros(0, np.int64))
    assert b.host_time(plan) == pytest.approx(1e-4 + 3e-5 + 5e-8 * 1000)
    off = SchedulerConfig(host_step_s=1e-4, host_per_request_s=0.0, host_per_token_s=0.0)
    assert host_coeffs(cfg)[6] == 0.0 and host_coeffs(cfg.model_copy(update={"host_after_eager_s": 4e-4}))[6] == 4e-4
    b.admit_coeffs = tuple(host_coeffs(off)[4:6])
    assert b.host_time(plan) == pytest.approx(1e-4)            # catalog configs price no admission


def test_eff_table_interpolates_in_log_space_and_clamps():
    t = EffTable(x=[1e6, 1e8], y=[0.1, 0.5])
    assert float(t(1e7)) == pytest.approx(0.3)
    assert float(t(1.0)) == pytest.approx(0.1) and float(t(1e12)) == pytest.approx(0.5)


def test_committed_h200_profile_parses_and_predicts_the_measured_steps():
    prof = CalibrationProfile.load(H200_PROFILE)
    assert prof.measured_on == "H200" and "H200" in prof.provenance["gpu"]
    for key in ("torch", "date", "command", "kernels", "nvidia_smi"):
        assert key in prof.provenance
    st = prof.step
    assert st.model == "deepseek-v3" and st.num_layers == 5 and st.dtype == "fp8"
    assert {"gemm_mem", "gemm_compute"} <= set(prof.tables)
    cost = ProfiledStepCost(prof)
    pts = [p for p in st.points if p.wall_s > 0]
    pred = np.array([cost.point_time(p) for p in pts])
    meas = np.array([p.wall_s for p in pts])
    e = errors(pred, meas)
    assert e["mape"] == pytest.approx(st.fit.mape, rel=1e-6)  # the stored fit statistics are reproducible
    assert e["mape"] < 0.08
    # decode steps replay CUDA graphs (~3.6 ms at one request, ~9.3 ms at 64), padded to the captured sizes; a
    # 64-token prefill runs its GEMMs in the 64-token piecewise graph (~8 ms), four 2048-token chunks run wholly eager
    # beyond the largest bucket (~100 ms; H200 run 21, the engine after the per-step sync fixes)
    assert st.graph_sizes[:4] == [1, 2, 4, 8] and st.graph_sizes[-1] == 128
    assert any(p.graph_bs for p in pts) and any(not p.graph_bs for p in pts)
    one = cost.chunked_step_time(np.array([512]), 0, [], [])
    b64 = cost.chunked_step_time(np.full(64, 1024), 0, [], [])
    b57 = cost.chunked_step_time(np.full(57, 1024), 0, [], [])
    small = cost.chunked_step_time(np.zeros(0, np.int64), 0, [64], [0])
    big = cost.chunked_step_time(np.zeros(0, np.int64), 0, [2048] * 4, [0] * 4)
    assert 0.003 < one < 0.007 and 0.007 < b64 < 0.016 and 0.005 < small < 0.015 and 0.07 < big < 0.15
    assert b57 > 0.97 * b64  # 57 decodes replay the 64-row graph


def test_measured_prefill_attention_and_expert_tables_drive_the_cost_model():
    from costmodels.catalog import get_model
    from costmodels.layout import ParallelLayout
    from costmodels.step import StepCostModel

    hw = get_hardware("H200")
    base = CalibrationProfile.default(hw)
    slow = base.model_copy(update={"tables": {**base.tables,
                                              "attn_prefill_compute": EffTable(x=[128, 4096], y=[0.01, 0.1]),
                                              "expert_mem": EffTable(x=[1e8, 1e10], y=[0.05, 0.3])}})
    model, lay = get_model("deepseek-v3"), ParallelLayout(tp=8, weight_dtype="fp8")
    a, b = StepCostModel(model, hw, lay, base), StepCostModel(model, hw, lay, slow)
    # a 4096-token prompt: attention at 0.1 of peak instead of 0.586 costs more; short chunks even more per FLOP
    new, ctx, dec = np.array([4096]), np.array([0]), np.array([False])
    assert b.attention(new, ctx, dec, 0, 1.0)[0] > 4 * a.attention(new, ctx, dec, 0, 1.0)[0]
    # routed experts read at 5-30% of HBM bandwidth instead of the GEMM ramp
    tok = np.array([64.0])
    assert b.experts(tok, 1, "e").total()[0] > 2 * a.experts(tok, 1, "e").total()[0]
    # no table: exactly the analytic default
    assert float(base.attn_prefill_compute(512.0)) == base.attn_compute_eff and base.expert_mem(1e9) == base.gemm_mem(1e9)


def test_prefill_token_term_adds_device_time_to_eager_steps_only_and_is_recovered():
    prof = _tiny_profile()
    sizes = [1, 2, 4, 8]
    kw = dict(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", graph_sizes=sizes, overlap=0.0,
              category_scale=dict(zip(FIT_CATEGORIES, (2.0, 3.0, 1.5, 1.0, 1.0))), host=HostTerms(fixed_s=1e-3, graph_fixed_s=2e-4))
    plain, extra = StepProfile(**kw), StepProfile(**kw, prefill_token_s=2e-5)
    a, b = ProfiledStepCost(prof, plain), ProfiledStepCost(prof, extra)
    big = (np.zeros(0, np.int64), 0, [4096], [0])
    assert b.chunked_step_time(*big) == pytest.approx(a.chunked_step_time(*big) + 2e-5 * 4096, rel=1e-9)  # device-bound: adds
    dec = (np.array([512, 512]), 0, [], [])
    assert b.chunked_step_time(*dec) == a.chunked_step_time(*dec)  # graph decode: untouched
    pts = [StepPoint(num_layers=4, decode_ctx=[256] * n, wall_s=1.0, graph_bs=extra.graph_bucket(n)) for n in (1, 2, 3, 4, 6, 8)]
    pts += [StepPoint(num_layers=4, decode_ctx=[256] * d, prefill=[(q, 0)] * c, wall_s=1.0)
            for q in (256, 1024, 2048, 4096) for c in (1, 2) for d in (0, 16)]
    pts = [p.model_copy(update={"wall_s": b.point_time(p)}) for p in pts]
    st = fit_step_profile(prof, pts, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=sizes, try_op_tables=False,
                          scale_bounds=None)
    assert st.fit.mape < 0.02 and st.prefill_token_s == pytest.approx(2e-5, rel=0.25)


def test_gpu_fit_bounds_category_scales_and_says_which_sit_at_a_bound():
    from costmodels.step_fit import GPU_SCALE_BOUNDS

    prof = _tiny_profile()
    sizes = [1, 2, 4, 8]
    kw = dict(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", graph_sizes=sizes, overlap=0.0,
              host=HostTerms(fixed_s=1e-3, graph_fixed_s=2e-4))
    pts = [StepPoint(num_layers=4, decode_ctx=[256] * n, wall_s=1.0, graph_bs=sizes[-1] if n > 4 else (4 if n > 2 else n))
           for n in (1, 2, 3, 4, 6, 8)]
    pts += [StepPoint(num_layers=4, decode_ctx=[256] * d, prefill=[(q, 0)] * c, wall_s=1.0)
            for q in (256, 1024, 2048, 4096) for c in (1, 2) for d in (0, 16)]
    for scales, at_bound in (((1.2, 0.85, 1.15, 1.0, 1.1), False), ((1.2, 6.0, 1.15, 1.0, 1.1), True)):
        truth = StepProfile(**kw, category_scale=dict(zip(FIT_CATEGORIES, scales)))
        cost = ProfiledStepCost(prof, truth)
        pts_t = [p.model_copy(update={"wall_s": cost.point_time(p)}) for p in pts]
        st = fit_step_profile(prof, pts_t, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=sizes, try_op_tables=False)
        lo, hi = GPU_SCALE_BOUNDS
        assert all(lo - 1e-9 <= v <= hi + 1e-9 for v in st.category_scale.values())
        assert any(f"bounded to [{lo:g}, {hi:g}]" in n for n in st.notes)
        if at_bound:   # prefill attention 6x the cost model: held at the upper bound and named
            assert st.category_scale["prefill_attention"] == pytest.approx(hi) and any("prefill_attention" in n for n in st.notes)
        else:
            assert st.fit.mape < 0.02


def test_fast_path_agrees_with_op_by_op_under_a_prefill_attention_table():
    from costmodels.catalog import get_model
    from costmodels.layout import ParallelLayout
    from costmodels.step import StepCostModel

    hw = get_hardware("H200")
    base = CalibrationProfile.default(hw)
    cal = base.model_copy(update={"tables": {**base.tables, "attn_prefill_compute": EffTable(x=[128, 4096], y=[0.02, 0.2])}})
    cm = StepCostModel(get_model("deepseek-v3"), hw, ParallelLayout(tp=8, weight_dtype="fp8"), cal)
    new, ctx, dec = np.array([1, 1, 1, 700, 64]), np.array([900, 2000, 40, 0, 512]), np.array([True, True, True, False, False])
    ref = cm._mixed_step_time_reference(new, ctx, dec)
    assert cm.mixed_step_time(new, ctx, dec) == pytest.approx(ref, rel=1e-9)
    assert cm.chunked_step_time(np.array([900, 2000, 40]), 0, [700, 64], [0, 512]) == pytest.approx(ref, rel=1e-9)
    assert ref > StepCostModel(get_model("deepseek-v3"), hw, ParallelLayout(tp=8, weight_dtype="fp8"), base).mixed_step_time(new, ctx, dec)


def test_measured_alltoall_fraction_prices_only_all_to_all():
    """The EP benchmark's fitted all-to-all bandwidth (alltoall_eff) moves all-to-all and EP dispatch times and
    leaves all-reduce alone; the committed 2xH200 NCCL profiles reproduce their own measured large messages."""
    import json
    from costmodels.batch import BatchShape
    from costmodels.comm import allreduce_time, alltoall_time
    from costmodels.layout import ParallelLayout
    from costmodels.catalog import get_model
    from costmodels.step import StepCostModel
    hw = get_hardware("H200")
    base = CalibrationProfile.default(hw)
    slow = base.model_copy(update={"alltoall_eff": base.comm_eff / 2})
    assert base.a2a_eff == base.comm_eff and slow.a2a_eff == base.comm_eff / 2
    b = 64e6
    lat = base.alltoall_latency_s
    assert alltoall_time(b, 8, hw, slow) - lat == pytest.approx(2 * (alltoall_time(b, 8, hw, base) - lat))
    assert allreduce_time(b, 8, hw, slow) == allreduce_time(b, 8, hw, base)
    spec = get_model("deepseek-v3")
    lay = ParallelLayout(dp=8, ep=8)
    batch = BatchShape.prefill(8, 2048)
    op = lambda cal: next(o.time_s for o in StepCostModel(spec, hw, lay, cal).step(batch).ops if o.name.startswith("ep_dispatch"))  # noqa: E731
    assert op(slow) > 1.5 * op(base)
    root = Path(__file__).resolve().parents[1] / "profiles" / "h200"
    for name in ("ep_profile_tiny_bf16_x2", "ep_profile_dsv3-4layers_fp8_x2"):
        cal = CalibrationProfile.load(root / f"{name}.json")
        assert cal.comm_eff == 0.8 and 0.3 < cal.a2a_eff < 1.0
        assert cal.provenance["ep_bench"]["gpus"] == 2 and cal.provenance["ep_bench"]["driver"]
        rep = json.loads((root / f"{name}.report.json").read_text())
        big = [r for r in rep["a2a"] if r["bytes_out"] >= 16e6]
        for r in big:   # the fit is within 15% of its own large-message points
            assert alltoall_time(r["bytes_out"], r["ep"], hw, cal) == pytest.approx(r["time_s"], rel=0.15)


def test_dense_gemms_priced_from_the_library_the_engine_ran():
    """A calibration that ran Triton FP8 GEMMs names it (op_table_libs) and its dense GEMMs take the Triton rows of the
    op tables (slower at decode rows than DeepGEMM's, the default); the step's notes say which library priced them."""
    from costmodels.catalog import get_model
    from costmodels.layout import ParallelLayout
    from costmodels.step import StepCostModel

    hw = get_hardware("H200")
    base = CalibrationProfile.default(hw)
    tri = base.model_copy(update={"op_table_libs": {"fp8_gemm": "triton"}})
    assert base.gemm_libs() == ("deepgemm", "triton") and tri.gemm_libs() == ("triton", "deepgemm")
    lay = ParallelLayout(tp=1, weight_dtype="fp8")
    a, b = (StepCostModel(get_model("deepseek-v3"), hw, lay, c) for c in (base, tri))
    ctx = np.full(8, 1000.0)
    assert float(b.decode_times(ctx, 1)[0]) > 1.05 * float(a.decode_times(ctx, 1)[0])   # 61 layers: experts dominate
    assert "deepgemm" in a.gemm_table_note() and "triton" in b.gemm_table_note()
    with pytest.raises(ValueError, match="op_table_libs"):
        CalibrationProfile.model_validate({**base.model_dump(), "op_table_libs": {"fp8_gemm": "cublas"}})


def _graph_setup():
    """A tiny profile, its graph sizes, a step model at scale 1, its cost and graph decode points (1-8 rows, two
    contexts each, unmeasured): what the graph-forward fit tests plant their forwards on."""
    prof = _tiny_profile()
    sizes = [1, 2, 4, 8]
    kw = dict(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", graph_sizes=sizes, overlap=0.0,
              host=HostTerms(fixed_s=1e-3, graph_fixed_s=2e-4))
    truth = StepProfile(**kw, category_scale=dict(zip(FIT_CATEGORIES, (1.0,) * len(FIT_CATEGORIES))))
    graph = [StepPoint(num_layers=4, decode_ctx=[256 + 64 * j] * n, wall_s=1.0, graph_bs=min(s for s in sizes if s >= n))
             for n in (1, 2, 3, 4, 6, 8) for j in range(2)]
    return prof, sizes, truth, ProfiledStepCost(prof, truth), graph


def test_device_scale_comes_from_the_graph_forwards_when_they_were_timed():
    """Graph points that recorded their forward (CUDA events, no host work) set one device scale: here the forwards
    are 1.1x the graph's own op times (no logits GEMM or sampling, which follow the replay) while the eager steps'
    walls are 1.5x (host-bound launches); the fit keeps 1.1 for every category the graphs exercise and puts the rest
    in the host terms, with the scale bounds or without. Without forwards, nothing is pinned."""
    from costmodels.step_fit import forward_scales

    prof, sizes, truth, cost, graph = _graph_setup()
    fwd_cats = {id(p): cost.graph_categories(np.asarray(p.decode_ctx), p.graph_bs, logits=False) for p in graph}
    graph = [p.model_copy(update={"wall_s": cost.point_time(p) + 1e-3, "forward_s": 1.1 * float(fwd_cats[id(p)].sum())})
             for p in graph]
    eager = [StepPoint(num_layers=4, decode_ctx=[256] * d, prefill=[(q, 0)], wall_s=1.0) for q in (256, 1024, 4096) for d in (0, 16)]
    eager = [p.model_copy(update={"wall_s": 1.5 * cost.point_time(p)}) for p in eager]
    st = fit_step_profile(prof, graph + eager, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=sizes, try_op_tables=False)
    for c in ("attention", "dense_gemm", "expert_gemm", "other"):
        assert st.category_scale[c] == pytest.approx(1.1, rel=1e-3)
    assert any("CUDA-graph decode forwards" in n and "median 1.100" in n for n in st.notes)
    free = fit_step_profile(prof, graph + eager, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=sizes,
                            try_op_tables=False, scale_bounds=None)
    assert free.category_scale["dense_gemm"] == pytest.approx(1.1, rel=1e-3)
    cats = np.array([cost.graph_categories(np.asarray(p.decode_ctx), p.graph_bs, logits=False) for p in graph])
    assert forward_scales([p.model_copy(update={"forward_s": None}) for p in graph], cats, (0.8, 1.25)) == {}
    assert all(v == pytest.approx(1.1) for v in forward_scales(graph, cats, (0.8, 1.25)).values())


def test_a_graph_replays_fixed_device_cost_is_fitted_with_the_scale_from_held_forwards():
    """Forwards timed with the GPU held (device work alone) that run 1.05x their op times plus 0.1 ms a replay: the fit
    recovers both, prices the replay in every graph step, and says so; the same forwards timed only on an idle GPU (the
    launch wait in them) fit the scale alone; the replay term stays within a tenth of the smallest held forward."""
    from costmodels.step_fit import forward_fit

    prof, sizes, truth, cost, graph = _graph_setup()
    cats = np.array([cost.graph_categories(np.asarray(p.decode_ctx), p.graph_bs, logits=False) for p in graph])
    fwd = 1.05 * cats.sum(1) + 1e-4
    held = [p.model_copy(update={"forward_s": f + 1.2e-4, "queued_forward_s": f}) for p, f in zip(graph, fwd)]
    scales, replay = forward_fit(held, cats, (0.8, 1.25))
    assert replay == pytest.approx(1e-4, rel=1e-6) and all(v == pytest.approx(1.05, rel=1e-6) for v in scales.values())
    idle = [p.model_copy(update={"forward_s": f + 1.2e-4}) for p, f in zip(graph, fwd)]
    assert forward_fit(idle, cats, (0.8, 1.25))[1] == 0.0
    assert forward_fit(held, cats, (0.8, 1.25), replay_cap=1e-3)[1] == pytest.approx(1e-3 * fwd.min())
    # the whole-step fit keeps them, and the step model prices the replay in a graph step's device work
    held = [p.model_copy(update={"wall_s": float(truth.host.graph(len(p.decode_ctx), float(np.sum(p.decode_ctx)))) + f
                                 + cost.sample_s(len(p.decode_ctx))}) for p, f in zip(held, fwd)]
    eager = [StepPoint(num_layers=4, decode_ctx=[256] * d, prefill=[(q, 0)], wall_s=1.0) for q in (256, 1024, 4096) for d in (0, 16)]
    eager = [p.model_copy(update={"wall_s": 1.5 * cost.point_time(p)}) for p in eager]
    st = fit_step_profile(prof, held + eager, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=sizes, try_op_tables=False)
    assert st.graph_replay_s == pytest.approx(1e-4, rel=1e-6) and any("decode-graph replay: 0.100 ms" in n for n in st.notes)
    fitted = ProfiledStepCost(prof, st)
    dev = fitted.pipelined().pipelined_parts(np.ones(3, np.int64), np.full(3, 300), np.ones(3, bool))[0]
    zero = ProfiledStepCost(prof, st.model_copy(update={"graph_replay_s": 0.0}))
    assert dev - zero.pipelined().pipelined_parts(np.ones(3, np.int64), np.full(3, 300), np.ones(3, bool))[0] == pytest.approx(1e-4)


def test_a_pipelined_launchs_device_work_beyond_forward_and_sampler():
    """Held launch spans that run 40 us + 0.5 us a row beyond their held forward and the sampler's device work: the fit
    recovers both terms; a negative per-row slope falls back to the constant alone; without enough such points or
    without the sampler's device table, None. The pipelined step model adds it to a graph step's device work; the
    synchronous one (whose wall fit holds it) does not."""
    from costmodels.step_fit import fit_launch_device, launch_device_table

    smp = lambda r: 1e-4 + 2e-6 * r  # noqa: E731
    pts = [StepPoint(num_layers=4, decode_ctx=[500] * n, wall_s=1e-2, graph_bs=n, queued_forward_s=3e-3 + 1e-5 * n,
                     queued_launch_s=3e-3 + 1e-5 * n + smp(n) + 4e-5 + 5e-7 * n) for n in (1, 2, 4, 8, 16, 32, 64, 128)]
    c0, c1 = fit_launch_device(pts, smp)
    assert c0 == pytest.approx(4e-5, rel=1e-6) and c1 == pytest.approx(5e-7, rel=1e-6)
    falling = [p.model_copy(update={"queued_launch_s": p.queued_launch_s - 1e-6 * len(p.decode_ctx)}) for p in pts]
    c0, c1 = fit_launch_device(falling, smp)
    assert c1 == 0.0 and c0 > 0
    assert fit_launch_device(pts[:5], smp) is None and fit_launch_device(pts, lambda r: None) is None
    assert fit_launch_device([p.model_copy(update={"queued_launch_s": None}) for p in pts], smp) is None
    # the same residuals at each row count as measured (median over a count's points), which the line cannot follow
    # where the sampler table misses one count: 0.1 ms more at 2 rows only
    bump = [p.model_copy(update={"queued_launch_s": p.queued_launch_s + (1e-4 if len(p.decode_ctx) == 2 else 0.0)}) for p in pts]
    tab = launch_device_table(bump, smp)
    assert [r for r, _ in tab] == [1, 2, 4, 8, 16, 32, 64, 128]
    for r, v in tab:
        assert v == pytest.approx(4e-5 + 5e-7 * r + (1e-4 if r == 2 else 0.0), rel=1e-9)
    assert launch_device_table(bump, lambda r: None) == []
    three = bump + [bump[1].model_copy(update={"queued_launch_s": bump[1].queued_launch_s + 1.0})]
    assert dict(launch_device_table(three, smp))[2] == pytest.approx(tab[1][1] + 0.5)   # the median of the two at 2 rows

    prof = _tiny_profile()
    st = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", graph_sizes=[1, 2, 4, 8],
                     host=HostTerms(fixed_s=1e-3, graph_fixed_s=2e-4))
    with_launch = st.model_copy(update={"launch_device_s": 4e-5, "launch_device_per_row_s": 5e-7})
    a, b = ProfiledStepCost(prof, st), ProfiledStepCost(prof, with_launch)
    args = (np.ones(3, np.int64), np.full(3, 300), np.ones(3, bool))
    assert b.pipelined().pipelined_parts(*args)[0] - a.pipelined().pipelined_parts(*args)[0] == pytest.approx(4e-5 + 3 * 5e-7)
    assert b.pipelined().decode_parts(np.full(3, 300.0))[0] - a.pipelined().decode_parts(np.full(3, 300.0))[0] == pytest.approx(4e-5 + 3 * 5e-7)
    assert b.decode_times(np.full(3, 300.0), 1)[0] == a.decode_times(np.full(3, 300.0), 1)[0]
    # measured per row count, the table prices the launch in place of the line, linear between counts
    rows = with_launch.model_copy(update={"launch_device_rows": [(1, 1e-5), (2, 1.2e-4), (4, 2e-5)]})
    c = ProfiledStepCost(prof, rows)
    assert [c.launch_device(n) for n in (1, 2, 3, 4)] == pytest.approx([1e-5, 1.2e-4, 7e-5, 2e-5])
    assert c.pipelined().pipelined_parts(*args)[0] - a.pipelined().pipelined_parts(*args)[0] == pytest.approx(7e-5)


def test_the_engines_gemm_library_is_kept_and_named():
    """A profile that names its engine's GEMM library (op_table_libs) keeps it when the step fit prices without the
    profile's own efficiency tables, and `simulate/tune --calibration` name the library in the profile's source line."""
    import json
    from costmodels.calibration_source import profile_for

    base = CalibrationProfile.default(get_hardware("H200"))
    prof = _tiny_profile().model_copy(update={"op_table_libs": {"fp8_gemm": "triton"}, "op_tables": "H200"})
    st = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", use_op_tables=False)
    assert "triton" in ProfiledStepCost(prof, st).base.gemm_table_note()
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cal.json"
        path.write_text(json.dumps(base.model_copy(update={"op_table_libs": {"fp8_gemm": "triton"}}).model_dump(mode="json")))
        cal = profile_for(get_hardware("H200"), path)
    assert "triton rows" in cal.notes[0]


def _transition_plans():
    """A decode plan of one request and a mixed plan of it beside a 64-token prompt's chunk (fresh requests)."""
    from scheduler.plan import ScheduledChunk, StepPlan
    from scheduler.request import Request

    d = Request("d", 0.0, 32, 64)
    p = Request("p", 0.0, 64, 4)
    dec = StepPlan(0, prefills=[], decodes=[d], decode_context_lens=np.array([32], np.int64))
    mix = StepPlan(0, prefills=[ScheduledChunk(p, 64, 0, True)], decodes=[d], decode_context_lens=np.array([33], np.int64))
    return dec, mix


def test_a_step_after_a_prefill_bearing_step_pays_the_measured_transition():
    """A measured profile's after_eager_s reaches the simulator through loop_scheduler_terms and is charged to the first
    step after a prefill-bearing plan only: a decode after decodes, or the first plan, pays nothing."""
    from scheduler.config import SchedulerConfig
    from sim.backend import SimBackend, host_coeffs

    st = StepProfile(model="tiny", num_layers=4, dtype="fp32", host=HostTerms(after_eager_s=4e-4))
    cfg = SchedulerConfig(host_step_s=0.0, host_per_request_s=0.0, host_per_token_s=0.0, async_overlap=False,
                          **{k: v for k, v in loop_scheduler_terms(st).items() if k.startswith("host_after")})
    assert cfg.host_after_eager_s == 4e-4
    cost = ProfiledStepCost(_tiny_profile(), StepProfile(model="tiny", num_layers=4, dtype="fp32"))

    with_, without = (SimBackend(cost, np.random.default_rng(0), async_overlap=False, host_coeffs=host_coeffs(c))
                      for c in (cfg, cfg.model_copy(update={"host_after_eager_s": 0.0})))
    got = []
    for b in (with_, without):
        dec, mix = _transition_plans()
        got.append([float(b.execute(p).step_durations[0]) for p in (dec, dec, mix, dec, mix, mix)])
    diff = np.array(got[0]) - np.array(got[1])
    assert diff == pytest.approx([0, 0, 0, 4e-4, 0, 4e-4], abs=1e-12)
    # a multi-step decode plan cut at an arrival: every end moves later by the transition, and the cut with them: the
    # first step ending at or after stop_at is the last one run (cut on the unshifted ends, a third step would run)
    dec, mix = _transition_plans()
    with_.execute(mix)
    dec.num_steps = 6
    two = float(without.step_times(dec)[:2].sum())                # (each step's context one longer)
    stop = two + 2e-4                                            # between the 2nd unshifted end and the 2nd shifted one
    res = with_.execute(dec, stop_at=stop)
    ends = np.asarray(with_.ends)
    assert res.num_steps == 2 and ends[-1] == pytest.approx(two + 4e-4) and ends[-1] >= stop > ends[0]


def test_decode_steps_after_a_prefill_bearing_step_pay_the_measured_decay():
    """A profile's after_eager_decode_s: the j-th decode step after a prefill-bearing plan pays its j-th entry (a
    multi-step decode plan step by step, its ends shifted and cut on the shifted ends; an arrival cut gives back the
    steps that did not run), a mixed step after one pays after_eager_s, and the default scenario's dump is unchanged."""
    from scheduler.config import SchedulerConfig
    from sim.backend import SimBackend, host_coeffs
    from ui.cmd_validate import predict_step, steps_since_prefill

    decay = [6e-4, 3e-4, 1e-4]
    st = StepProfile(model="tiny", num_layers=4, dtype="fp32", host=HostTerms(after_eager_s=4e-4, after_eager_decode_s=decay))
    terms = loop_scheduler_terms(st)
    assert terms["host_after_eager_decode_s"] == decay
    cfg = SchedulerConfig(host_step_s=0.0, host_per_request_s=0.0, host_per_token_s=0.0, async_overlap=False,
                          **{k: v for k, v in terms.items() if k.startswith("host_after")})
    assert "host_after_eager_decode_s" not in SchedulerConfig().model_dump()     # digests of old scenarios unchanged
    cost = ProfiledStepCost(_tiny_profile(), StepProfile(model="tiny", num_layers=4, dtype="fp32"))

    with_, without = (SimBackend(cost, np.random.default_rng(0), async_overlap=False, host_coeffs=host_coeffs(c))
                      for c in (cfg, cfg.model_copy(update={"host_after_eager_decode_s": [], "host_after_eager_s": 0.0})))
    got = []
    for b in (with_, without):
        dec, mix = _transition_plans()
        got.append([float(b.execute(p).step_durations[0]) for p in (dec, mix, dec, dec, dec, dec, mix, mix, dec)])
    diff = np.array(got[0]) - np.array(got[1])
    assert diff == pytest.approx([0, 0, 6e-4, 3e-4, 1e-4, 0, 0, 4e-4, 6e-4], abs=1e-12)
    # one decode plan of 5 steps right after a mixed one: its first three steps pay the decay, its ends move with it
    dec, mix = _transition_plans()
    with_.execute(mix)
    without.execute(mix)
    dec.num_steps = 5
    step = float(without.step_times(dec)[0])
    res = with_.execute(dec)
    assert res.step_durations == pytest.approx([step + 6e-4, step + 3e-4, step + 1e-4, step, step], rel=1e-5)
    assert np.asarray(with_.ends)[-1] - np.asarray(with_.ends)[0] == pytest.approx(4 * step + 4e-4, rel=1e-5)
    # cut by an arrival between the 2nd step's unshifted and shifted end: two steps run, and the decay goes on after
    dec, mix = _transition_plans()
    with_.execute(mix)
    dec.num_steps = 6
    stop = with_.clock() + 2 * step + 7e-4
    res = with_.execute(dec, stop_at=stop)
    assert res.num_steps == 2 and res.step_durations == pytest.approx([step + 6e-4, step + 3e-4])
    dec2, _ = _transition_plans()
    assert float(with_.execute(dec2).step_durations[0]) == pytest.approx(step + 1e-4)
    # the per-step prediction validate records charges the same
    class S:
        def __init__(self, pf):
            self.prefill = pf
    assert steps_since_prefill([S([]), S([(64, 0)]), S([]), S([]), S([(8, 0)]), S([])]) == [0, 0, 1, 2, 0, 1]
    prof = type("P", (), {"step": st})()
    base = predict_step(cost, prof, [32], [])
    assert predict_step(cost, prof, [32], [], since_eager=2) == pytest.approx(base + 3e-4)
    assert predict_step(cost, prof, [32], [], since_eager=4) == pytest.approx(base)
    assert predict_step(cost, prof, [33], [(64, 0)], after_eager=True) == pytest.approx(predict_step(cost, prof, [33], [(64, 0)]) + 4e-4)


def test_the_decay_after_a_prompt_step_priced_by_its_size():
    """Measured behind prompt chunks of several sizes (host.after_eager_decode_by_tokens), the decay a decode step pays
    is the one the last prompt-bearing step's own tokens owe: linear between the measured sizes, the nearest outside
    them (costmodels.host.decay_after), in the simulator and in validate's per-step prediction alike; the default
    scenario's dump is unchanged."""
    from costmodels.host import decay_after
    from scheduler.config import SchedulerConfig
    from scheduler.plan import ScheduledChunk, StepPlan
    from scheduler.request import Request
    from sim.backend import SimBackend, host_coeffs
    from ui.cmd_validate import last_prefill_tokens, predict_step

    by = [(512, [1e-4, 0.0]), (1024, [2e-4, 1e-4]), (4096, [6e-4, 2e-4, 1e-4])]
    assert decay_after(by, 256) == pytest.approx([1e-4, 0.0, 0.0])
    assert decay_after(by, 2560) == pytest.approx([4e-4, 1.5e-4, 0.5e-4])
    assert decay_after(by, 9000) == pytest.approx([6e-4, 2e-4, 1e-4])
    assert decay_after([], 100).size == 0
    st = StepProfile(model="tiny", num_layers=4, dtype="fp32",
                     host=HostTerms(after_eager_decode_s=[2e-4, 1e-4], after_eager_decode_by_tokens=by))
    terms = loop_scheduler_terms(st)
    cfg = SchedulerConfig(host_step_s=0.0, host_per_request_s=0.0, host_per_token_s=0.0, async_overlap=False,
                          **{k: v for k, v in terms.items() if k.startswith("host_after")})
    assert cfg.host_after_eager_decode_by_tokens == [(512, [1e-4, 0.0]), (1024, [2e-4, 1e-4]), (4096, [6e-4, 2e-4, 1e-4])]
    assert "host_after_eager_decode_by_tokens" not in SchedulerConfig().model_dump()
    with pytest.raises(ValueError, match="host_after_eager_decode_by_tokens"):
        SchedulerConfig(host_after_eager_decode_by_tokens=[(0, [1e-4])])
    cost = ProfiledStepCost(_tiny_profile(), StepProfile(model="tiny", num_layers=4, dtype="fp32"))
    with_, without = (SimBackend(cost, np.random.default_rng(0), async_overlap=False, host_coeffs=host_coeffs(c))
                      for c in (cfg, cfg.model_copy(update={"host_after_eager_decode_by_tokens": [], "host_after_eager_decode_s": []})))
    d = Request("d", 0.0, 32, 64)
    dec = StepPlan(0, prefills=[], decodes=[d], decode_context_lens=np.array([32], np.int64))

    def mixed(tokens):
        p = Request(f"p{tokens}", 0.0, tokens, 4)
        return StepPlan(0, prefills=[ScheduledChunk(p, tokens, 0, True)], decodes=[d], decode_context_lens=np.array([33], np.int64))
    got = []
    for b in (with_, without):
        got.append([float(b.execute(p).step_durations[0]) for p in (mixed(256), dec, dec, mixed(2560), dec, dec, dec, dec)])
    diff = np.array(got[0]) - np.array(got[1])
    assert diff == pytest.approx([0, 1e-4, 0, 0, 4e-4, 1.5e-4, 0.5e-4, 0], abs=1e-12)

    class S:
        def __init__(self, pf):
            self.prefill = pf
    assert last_prefill_tokens([S([]), S([(300, 0), (200, 9)]), S([]), S([(64, 0)]), S([])]) == [0, 0, 500, 500, 64]
    prof = type("P", (), {"step": st})()
    base = predict_step(cost, prof, [32], [])
    assert predict_step(cost, prof, [32], [], since_eager=1, eager_tokens=2560) == pytest.approx(base + 4e-4)
    assert predict_step(cost, prof, [32], [], since_eager=2, eager_tokens=300) == pytest.approx(base)


def test_validate_step_prediction_prices_the_iterations_admissions():
    """Validate's per-step prediction charges the requests the measured iteration admitted at the profile's admission
    price, as the simulator's loop charges a request's first prompt chunk (sim.backend.SimBackend.host_time), within
    the bounds the scheduler config takes them (loop_scheduler_terms); without admissions nothing changes. The
    samples keep how many were admitted beside their tokens."""
    from scheduler.config import SchedulerConfig
    from scheduler.plan import ScheduledChunk, StepPlan
    from scheduler.request import Request
    from sim.backend import SimBackend, host_coeffs
    from sim.validate import StepSample, compact_samples
    from ui.cmd_validate import predict_step

    st = StepProfile(model="tiny", num_layers=4, dtype="fp32",
                     loop=LoopTerms(fixed_s=2e-4, admit_s=1.5e-5, admit_per_token_s=6e-8))
    prof = type("P", (), {"step": st})()
    cost = ProfiledStepCost(_tiny_profile(), StepProfile(model="tiny", num_layers=4, dtype="fp32"))
    base = predict_step(cost, prof, [32], [(512, 0)])
    assert predict_step(cost, prof, [32], [(512, 0)], admitted=0, admitted_tokens=0) == base
    assert predict_step(cost, prof, [32], [(512, 0)], admitted=2, admitted_tokens=3000) == pytest.approx(
        base + 2 * 1.5e-5 + 3000 * 6e-8)
    # the simulator charges the same for a plan that runs one request's first chunk (synchronous loop, no other host)
    terms = loop_scheduler_terms(st)
    cfg = SchedulerConfig(host_step_s=0.0, host_per_request_s=0.0, host_per_token_s=0.0, async_overlap=False,
                          host_admit_s=terms["host_admit_s"], host_admit_per_token_s=terms["host_admit_per_token_s"])
    d = Request("d", 0.0, 32, 64)
    p = Request("p", 0.0, 512, 4)
    plan = StepPlan(0, prefills=[ScheduledChunk(p, 512, 0, True)], decodes=[d], decode_context_lens=np.array([32], np.int64))
    sim_admit = SimBackend(cost, np.random.default_rng(0), async_overlap=False, host_coeffs=host_coeffs(cfg)).host_time(plan)
    assert sim_admit == pytest.approx(predict_step(cost, prof, [32], [(512, 0)], admitted=1, admitted_tokens=512) - base)
    cols = compact_samples([StepSample(decode_ctx=[32], prefill=[(512, 0)], measured_s=0.01, admitted=1, admitted_tokens=512)])
    assert cols["admitted"] == [1] and cols["admitted_tokens"] == [512]


def test_step_fit_solutions_stay_inside_their_bounds(monkeypatch):
    """The solvers can answer a hair outside their bounds by rounding (bvls: a prefill token term of -3.6e-21 s on a
    CPU calibration, which StepProfile rejects); the fit's solve clips them back onto the bounds."""
    import scipy.optimize

    from costmodels import step_fit

    a, y = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([1.0, 1.0])
    graph, hb = np.array([True, True]), np.array([False, False])

    class R:
        x = np.array([-3.6e-21, 2.0])
    monkeypatch.setattr(scipy.optimize, "lsq_linear", lambda *args, **kw: R())
    x = step_fit._solve(a[:, :1], a[:, 1:], y, hb, 0.0, graph, bounds=(np.array([0.0, 0.5]), np.array([1.0, 1.5])))
    assert x.tolist() == [0.0, 1.5]
    monkeypatch.setattr(step_fit, "nnls", lambda a, b, iters=200: np.array([-1e-22, 0.5]))
    assert step_fit._solve(a[:, :1], a[:, 1:], y, hb, 0.0, graph).min() == 0.0


def test_sparse_table_points_set_aside_the_denser_sampler_and_moe_counts():
    """``sparse_table_points``: the sampler batches and MoE token counts outside the earlier grid go, everything else
    stays (what ``matrix_offline --sparse-tables`` compares the denser tables against on one run)."""
    from costmodels.step_fit import SPARSE_MOE_TOKENS, SPARSE_SAMPLE_ROWS, sparse_table_points

    pts = ([{"op": "sample", "batch": b} for b in (1, 2, 3, 4, 8, 16, 128)]
           + [{"op": "moe_experts", "tokens": t} for t in (1, 2, 8, 17, 64, 8192)]
           + [{"op": "linear", "m": 3}, {"op": "gemm", "m": 24}])
    kept = sparse_table_points(pts)
    assert [p["batch"] for p in kept if p["op"] == "sample"] == [1, 4, 16, 128]
    assert [p["tokens"] for p in kept if p["op"] == "moe_experts"] == [1, 8, 64, 8192]
    assert {"op": "linear", "m": 3} in kept and {"op": "gemm", "m": 24} in kept
    assert 4 in SPARSE_SAMPLE_ROWS and 64 in SPARSE_MOE_TOKENS


def test_a_calibration_on_a_host_whose_speed_moved_says_so():
    """``host_speed_note``: the calibration's host probes (the same host work at its start, after the grid, at its end)
    more than 25% apart give a warning naming them; H100 runs 47-52's probes as recorded: quiet on 47, 49, 50 (0.6-5%),
    moving on 48, 51, 52, whose serving steps before a prompt-bearing step ran 7-18% off the model (1.5-4% elsewhere)."""
    from costmodels.calibration import host_speed_note

    runs = {47: (134.65, 141.24, 134.55), 48: (286.36, 147.62, 230.77), 49: (137.54, 138.39, 137.50),
            50: (136.19, 136.19, 138.54), 51: (357.37, 146.37, 485.97), 52: (150.62, 271.24, 286.15)}
    for run, us in runs.items():
        note = host_speed_note(dict(zip(("start", "after_grid", "end"), (v * 1e-6 for v in us))))
        assert (note is not None) == (run in (48, 51, 52)), run
    note = host_speed_note({"start": 357.37e-6, "after_grid": 146.37e-6, "end": 485.97e-6})
    assert "start 357 us, after_grid 146 us, end 486 us (232% apart, > 25%)" in note and "calibrate again" in note
    assert host_speed_note({"start": 1e-4}) is None and host_speed_note({"start": 1e-4, "end": None}) is None
    assert host_speed_note({"start": 1e-4, "end": 1.3e-4}, limit=0.35) is None
