"""Step model revision 1 (issue 16, H200 run 4 residuals): CUDA-graph padding rows route as one token, and the
executor's kv_b_proj is priced in BF16; stored profiles keep the revision they were fitted with."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from costmodels.calibration import CalibrationProfile
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.profiled import DENSE, EXPERT, ProfiledStepCost
from costmodels.step import StepCostModel
from costmodels.step_ops import KV_UP
from costmodels.step_profile import FIT_CATEGORIES, STEP_MODEL_REV, StepPoint, StepProfile

SIZES = [1, 2, 4, 8, 16, 24, 32]


def _cost(rev: int, dtype: str = "fp8") -> ProfiledStepCost:
    prof = CalibrationProfile.default(get_hardware("H200"))
    st = StepProfile(model="deepseek-v3", num_layers=5, dtype=dtype, device="cuda", graph_sizes=SIZES, model_rev=rev)
    return ProfiledStepCost(prof, st)


def test_padding_rows_touch_one_tokens_experts():
    new, old = _cost(STEP_MODEL_REV), _cost(0)
    # 9 decodes replay the 16-row graph: the dense GEMMs run 16 rows, the routed experts see 9 tokens plus one
    # (the padding rows are token 0 at position 0, all identical)
    v9 = new._decode_base(9, 0, 16)[0]
    v16 = new._decode_base(16, 0, 16)[0]
    e10 = new.base.nonattn(10.0, 10.0, 9.0, 10.0, 0.0, 0.0, 1.0)[EXPERT]
    assert v9[FIT_CATEGORIES.index("expert_gemm")] == pytest.approx(e10, rel=1e-12)
    assert v9[FIT_CATEGORIES.index("expert_gemm")] < 0.8 * v16[FIT_CATEGORIES.index("expert_gemm")]
    # revision 0 priced the padding as random tokens: experts flat across the bucket
    o9, o16 = old._decode_base(9, 0, 16)[0], old._decode_base(16, 0, 16)[0]
    # the dense GEMMs still run all 16 rows (the logits only the 9 real ones), the K/V projections in BF16
    d = FIT_CATEGORIES.index("dense_gemm")
    assert v9[d] == pytest.approx(o9[d] + new.kv_up_extra(16.0), rel=1e-12) and o9[d] < o16[d]
    assert o9[FIT_CATEGORIES.index("expert_gemm")] == pytest.approx(o16[FIT_CATEGORIES.index("expert_gemm")], rel=1e-12)
    # so the step time rises with the real rows inside a bucket (run 4 measured 6.9 -> 7.8 ms over b = 9..16)
    t = [new.chunked_step_time(np.full(b, 600, np.int64), 0, [], []) for b in range(9, 17)]
    assert all(b > a for a, b in zip(t, t[1:]))
    assert t[-1] - t[0] > 3 * (old.chunked_step_time(np.full(16, 600, np.int64), 0, [], [])
                               - old.chunked_step_time(np.full(9, 600, np.int64), 0, [], []))
    # a full bucket is not padded: both revisions agree up to the BF16 up-projection of the decode rows
    assert v16[FIT_CATEGORIES.index("expert_gemm")] == pytest.approx(o16[FIT_CATEGORIES.index("expert_gemm")], rel=1e-12)
    # multi-step decode prices the padded graph like single steps
    ctx = np.array([300.0] * 11)
    k = new.decode_times(ctx, 3)
    assert np.allclose(k, [new.chunked_step_time((ctx + i).astype(np.int64), 0, [], []) for i in range(3)], rtol=1e-9)


def test_kv_up_projection_is_priced_in_bf16_for_an_fp8_engine():
    new, old, bf = _cost(STEP_MODEL_REV), _cost(0), _cost(STEP_MODEL_REV, "bf16")
    hw, cal = get_hardware("H200"), new.base.cal
    rows = 1024 + 6144   # a 1024-token chunk over 6144 cached tokens up-projects all of them
    args = (np.array([1024]), np.array([6144]), np.array([False]))
    extra = new.category_times(*args)[FIT_CATEGORIES.index("dense_gemm")] - old.category_times(*args)[FIT_CATEGORIES.index("dense_gemm")]
    # on the analytic BF16 ramp, as the committed profiles' fits took it (ProfiledStepCost.kv_bf16: no op tables)
    b16 = StepCostModel(new.model, hw, ParallelLayout(tp=1, weight_dtype="bf16", kv_dtype="bf16"), cal.model_copy(update={"op_tables": None}))
    x = np.array([float(rows)])
    want = float(b16.gemms(KV_UP, x).time.sum() - new.base.gemms(KV_UP, x).time.sum())
    assert want > 0 and extra == pytest.approx(want, rel=1e-9)
    assert new.kv_up_extra(rows) == pytest.approx(want, rel=1e-12)
    # nothing to add where the engine runs BF16 anyway, or for nothing
    assert bf.kv_up_extra(rows) == 0.0 and new.kv_up_extra(0) == 0.0
    # the decode rows' absorbed projections too (memory-bound: the BF16 weight is twice the bytes)
    assert new._decode_base(8, 0)[0][FIT_CATEGORIES.index("dense_gemm")] > old._decode_base(8, 0)[0][FIT_CATEGORIES.index("dense_gemm")]
    assert DENSE != EXPERT


def test_stored_profiles_keep_the_revision_they_were_fitted_with(tmp_path):
    run4 = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "issue16_h200" / "run4_sync96"
    raw = json.loads(next(run4.glob("calibration_*.json")).read_text())
    assert "model_rev" not in raw["step"]
    prof = CalibrationProfile.load(next(run4.glob("calibration_*.json")))
    assert prof.step.model_rev == 0                               # written before revisions: the old model
    # and that is what reproduces the run's own per-step predictions (validate recorded them at the run's commit)
    from sim.timeline_check import unpacked_run
    s = json.loads(next(unpacked_run(run4).glob("samples_reasoning_*.json")).read_text())["low"]
    cost = ProfiledStepCost(prof)
    loop = prof.step.loop
    for i in range(0, 400, 37):
        if s["prefill_chunks"][i] == 0 and s["decodes"][i] == 1:
            ctx = np.array([int(round(s["decode_ctx_mean"][i]))])
            pred = cost.chunked_step_time(ctx, 0, [], []) + float(loop(1, 1))
            assert pred == pytest.approx(s["predicted_s"][i], abs=2e-6)
    p = tmp_path / "p.json"
    prof.save(p)
    assert CalibrationProfile.load(p).step.model_rev == 0          # round trip
    # a new fit is of the current revision, and a profile built in code is too
    assert StepProfile(model="deepseek-v3", num_layers=5).model_rev == STEP_MODEL_REV
    prof1 = prof.model_copy(update={"step": prof.step.model_copy(update={"model_rev": STEP_MODEL_REV})})
    prof1.save(p)
    assert CalibrationProfile.load(p).step.model_rev == STEP_MODEL_REV
    with pytest.raises(ValueError):
        StepProfile(model="deepseek-v3", num_layers=5, model_rev=STEP_MODEL_REV + 1)


def test_residual_script_rebuilds_steps_and_bins_them():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import step_residuals as sr

    s = {"decodes": [3, 0, 2], "decode_ctx_mean": [100.4, 0.0, 50.0], "prefill_tokens": [0, 10, 7], "prefill_chunks": [0, 3, 1],
         "prefill_ctx": [0, 9, 64], "graph_bs": [4, 0, 0], "measured_s": [0.01, 0.03, 0.02], "predicted_s": [0.012, 0.027, None]}
    steps = list(sr.rebuilt_steps(s))
    assert steps[0][0].tolist() == [100, 100, 100] and steps[0][1] == [] and steps[0][2] == []
    assert steps[1][1] == [4, 3, 3] and sum(steps[1][1]) == 10 and steps[1][2] == [3, 3, 3]
    assert steps[2][0].tolist() == [50, 50] and steps[2][1] == [7] and steps[2][2] == [64]
    c = sr.columns({"chat": {"low": s}}, None, None, True, recorded=True)
    assert c["prev"].tolist() == ["first", "graph", "eager"]
    assert np.isnan(c["pred"][2]) and c["pred"][0] == 0.012
    line = sr.row("x", c["measured_s"][:2], c["pred"][:2])
    # bias = mean(+20%, -10%) = +5%, MAPE 15%, p90 of the absolute errors (2 and 3 ms) 2.9 ms
    assert line.split()[-3:] == ["+5.0%", "15.0%", "2.90"]
    assert StepPoint(num_layers=1, decode_ctx=[1], wall_s=1.0).num_tokens == 1


def test_matrix_offline_reads_one_replays_figures(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import matrix_offline as mo

    runs = [{"output_throughput": 100.0}, {"output_throughput": 130.0}]
    rep = {"workload": "agentic", "levels": [{"name": "low", "rate_rps": 1.0, "measured": {"output_throughput": 115.0}, "runs": runs}]}
    (tmp_path / "validation_agentic_x.json").write_text(json.dumps(rep))
    (tmp_path / "validation_chat_x.json").write_text(json.dumps({"workload": "chat", "levels": [
        {"name": "low", "rate_rps": 2.0, "measured": {"output_throughput": 7.0}, "runs": []}]}))
    (tmp_path / "measured_recovered.json").write_text(json.dumps({"reasoning": {"low": {"rate_rps": 3.0, "measured": {"output_throughput": 9.0}}}}))
    assert mo.measured_levels(tmp_path) == {"reasoning": {"low": {"rate_rps": 3.0, "measured": {"output_throughput": 9.0}}}}
    two = mo.measured_levels(tmp_path, 2)
    assert two["agentic"]["low"]["measured"] == {"output_throughput": 130.0} and "chat" not in two   # chat kept no replays
    assert mo.measured_levels(tmp_path, 1)["agentic"]["low"]["measured"] == {"output_throughput": 100.0}
    assert "agentic" not in mo.measured_levels(tmp_path, 3)
