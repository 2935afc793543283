"""Hardware generations reach the step time: Blackwell Ultra's doubled SFU exponential rate bounds
attention where the softmax exponentials outlast the tensor-core math, FP4 tensor rates bound FP4
expert GEMMs where they are compute-bound, and the fast path agrees with the op-by-op evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.batch import BatchShape
from costmodels.calibration import CalibrationProfile
from costmodels.catalog import get_model
from costmodels.hardware import Hardware, get_hardware, list_hardware
from costmodels.layout import ParallelLayout
from costmodels.step import StepCostModel


def _small_heads(head_dim: int):
    """llama-3.1-8b with another head dim: 2 x (head_dim + head_dim) FLOP a score against one exponential."""
    return get_model("llama-3.1-8b").model_copy(update={"head_dim": head_dim})


def _attention_op(cm: StepCostModel, batch: BatchShape):
    return next(o for o in cm.step(batch).ops if o.category == "attention")


def test_every_catalog_gpu_names_its_exponential_rate_and_blackwell_ultra_doubles_blackwell():
    for hw in list_hardware():
        assert hw.exp_rate is not None and hw.exp_rate > 0, hw.name
    gb200, gb300, b200, b300 = (get_hardware(n) for n in ("GB200", "GB300", "B200", "B300"))
    assert gb300.exp_rate / gb200.exp_rate == pytest.approx(2.0, rel=0.01)
    assert b300.exp_rate / b200.exp_rate == pytest.approx(2.0, rel=0.01)
    # same tensor-core peak, so the FP4 dense rate is the other GB300 difference the step time sees
    assert gb300.bf16_tflops == gb200.bf16_tflops and gb300.fp4_tflops / gb200.fp4_tflops == pytest.approx(1.5)
    # Hopper and Blackwell both run 16 exp2/clock/SM: ~250 and ~512 BF16 FLOP per exponential
    assert get_hardware("H200").bf16_tflops * 1e12 / get_hardware("H200").exp_rate == pytest.approx(254, rel=0.01)
    assert gb200.bf16_tflops * 1e12 / gb200.exp_rate == pytest.approx(512, rel=0.01)


def _formula(hw):
    """The default calibration without op tables: attention on the formula (no measured kernel to move)."""
    return CalibrationProfile.default(hw).model_copy(update={"op_tables": None})


def test_gb300_prefill_attention_is_faster_than_gb200_by_the_exp_rate_ratio_when_exp_bound():
    spec = _small_heads(32)   # 128 FLOP a score: below peak / exp rate on both GPUs
    lay = ParallelLayout(tp=8, weight_dtype="bf16")
    batch = BatchShape.prefill(4, 8192)
    ops = {}
    for name in ("GB200", "GB300"):
        hw = get_hardware(name)
        cm = StepCostModel(spec, hw, lay, _formula(hw))
        assert any("exponential-bound" in n for n in cm.notes), cm.notes
        ops[name] = (cm, _attention_op(cm, batch))
    (c2, a2), (c3, a3) = ops["GB200"], ops["GB300"]
    assert a2.flops == a3.flops
    lo = c2._lo * a2.count
    ratio = (a2.time_s - lo) / (a3.time_s - lo)
    assert ratio == pytest.approx(get_hardware("GB300").exp_rate / get_hardware("GB200").exp_rate, rel=1e-9)
    # the exponential time is the number of scores times heads over the rate, at the attention efficiency
    scores = a2.flops / (2.0 * (32 + 32))
    assert (a2.time_s - lo) == pytest.approx(scores / (get_hardware("GB200").exp_rate * c2.cal.attn_compute()), rel=1e-9)


def test_measured_gqa_chunks_move_to_blackwell_by_its_exponential_rate():
    """The measured FlashAttention-3 prefill chunks (an H100 table) moved to GB200 and GB300: their math ceiling
    there is the exponential rate where that is lower (128 FLOP a score), so the GB300 runs a compute-bound prefill
    about the exponential-rate ratio faster (the time over the roofline scales with it too), and a GB200 without
    the rate in its catalog entry runs it at the tensor peak."""
    spec, lay, batch = _small_heads(32), ParallelLayout(tp=8, weight_dtype="bf16"), BatchShape.prefill(4, 8192)
    cms = {n: StepCostModel(spec, get_hardware(n), lay, CalibrationProfile.default(get_hardware(n))) for n in ("GB200", "GB300")}
    if cms["GB200"].gqa_chunks is None:
        pytest.skip("no GQA prefill table")
    t2, t3 = (_attention_op(cms[n], batch).time_s for n in ("GB200", "GB300"))
    # the chunks' composition moves by the rate; the call's walk bound (gqa_chain_floor: the fourth prompt's longest
    # tile after the three ahead of it) holds the kernel's least time, which does not, and binds on the GB300 at this
    # head dim (+7%)
    chunks = {n: cms[n].gqa_chunks_seconds(cms[n].att_groups[0][0], [8192] * 4, [0] * 4, 1.0) for n in cms}
    ratio = get_hardware("GB300").exp_rate / get_hardware("GB200").exp_rate
    assert chunks["GB200"] / chunks["GB300"] == pytest.approx(ratio, rel=0.05)
    assert t2 / t3 == pytest.approx(ratio, rel=0.08)
    assert t3 >= chunks["GB300"] * cms["GB300"].model.num_layers * 0.999
    gb200 = get_hardware("GB200")
    no_exp = Hardware(**{**gb200.model_dump(), "sfu_exp_tera_per_s": None})
    assert _attention_op(StepCostModel(spec, no_exp, lay, CalibrationProfile.default(gb200)), batch).time_s < t2 / 1.5


def test_removing_the_exponential_rate_removes_the_bound_and_mla_is_not_exp_bound():
    gb200 = get_hardware("GB200")
    no_exp = Hardware(**{**gb200.model_dump(), "sfu_exp_tera_per_s": None})
    spec, lay, batch = _small_heads(32), ParallelLayout(tp=8, weight_dtype="bf16"), BatchShape.prefill(2, 4096)
    with_bound = _attention_op(StepCostModel(spec, gb200, lay, _formula(gb200)), batch).time_s
    without = _attention_op(StepCostModel(spec, no_exp, lay, _formula(gb200)), batch).time_s
    assert with_bound > 1.5 * without
    # DeepSeek's MLA prefill (2 x (192 + 128) = 640 FLOP a score) and absorbed decode (2 x 1088) sit above 512
    dsv3, lay3 = get_model("deepseek-v3"), ParallelLayout(tp=8, weight_dtype="fp8")
    for b in (BatchShape.prefill(2, 4096), BatchShape.decode(64, 4096)):
        t = [_attention_op(StepCostModel(dsv3, hw, lay3, CalibrationProfile.default(hw)), b).time_s for hw in (gb200, no_exp)]
        assert t[0] == t[1]


def test_fp4_decode_step_differs_by_the_fp4_rate_where_expert_gemms_are_compute_bound():
    spec = get_model("deepseek-v3")
    lay = ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8", expert_dtype="fp4")
    # 8,192 decodes per rank, ~2,000 tokens per local expert: compute-bound FP4 grouped GEMMs on both GPUs (at
    # 256 decodes per rank they are memory-bound and GB300 equals GB200; at 512, ~125 tokens per expert, FP4 math at
    # its own 0.374 of the peak starts to bind on the GB200)
    batch = BatchShape.decode(65536, 1024)
    ex, steps = {}, {}
    for name in ("GB200", "GB300"):
        hw = get_hardware(name)
        cost = StepCostModel(spec, hw, lay, CalibrationProfile.default(hw)).step(batch)
        ex[name] = next(o for o in cost.ops if o.category == "expert_gemm")
        steps[name] = cost.time_s
    lo = 2 * StepCostModel(spec, get_hardware("GB200"), lay, CalibrationProfile.default(get_hardware("GB200")))._lo * ex["GB200"].count
    ratio = (ex["GB200"].time_s - lo) / (ex["GB300"].time_s - lo)
    assert ratio == pytest.approx(get_hardware("GB300").fp4_tflops / get_hardware("GB200").fp4_tflops, rel=1e-9)
    assert steps["GB300"] < steps["GB200"]
    small = [StepCostModel(spec, get_hardware(n), lay, CalibrationProfile.default(get_hardware(n))).step_time(BatchShape.decode(2048, 1024))
             for n in ("GB200", "GB300")]
    assert small[0] == small[1]
    # the same layout in FP8 experts: same FP8 rate on both, same expert time
    lay8 = ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8")
    t8 = [next(o for o in StepCostModel(spec, get_hardware(n), lay8, CalibrationProfile.default(get_hardware(n))).step(batch).ops
               if o.category == "expert_gemm").time_s for n in ("GB200", "GB300")]
    assert t8[0] == t8[1]


@pytest.mark.parametrize("hw_name", ["GB200", "H200"])
def test_fast_path_agrees_with_op_by_op_when_attention_is_exp_bound(hw_name):
    hw = get_hardware(hw_name)
    cm = StepCostModel(_small_heads(32), hw, ParallelLayout(tp=8, weight_dtype="bf16"), CalibrationProfile.default(hw))
    assert cm.att_math_peak(32, 32) < cm.att_peak   # exponential-bound on both generations at head dim 32
    new, ctx, dec = np.array([1, 1, 1, 3000, 640]), np.array([900, 20000, 40, 0, 5120]), np.array([True, True, True, False, False])
    ref = cm._mixed_step_time_reference(new, ctx, dec)
    assert cm.mixed_step_time(new, ctx, dec) == pytest.approx(ref, rel=1e-9)
    assert cm.chunked_step_time(np.array([900, 20000, 40]), 0, [3000, 640], [0, 5120]) == pytest.approx(ref, rel=1e-9)
    # consecutive decode steps (attention_decode_steps) against one step_time each
    dctx = np.array([900, 20000, 40, 7000])
    many = cm.decode_times(dctx, 3)
    one = [cm.mixed_step_time(np.ones(4, int), dctx + k, np.ones(4, bool)) for k in range(3)]
    assert many == pytest.approx(one, rel=1e-9)
