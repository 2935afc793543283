"""Weight offload to host memory with layer-ahead prefetch: the memory it frees and the step time it costs."""

import numpy as np
import pytest

from costmodels.batch import BatchShape
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import memory_fit
from costmodels.offload import Prefetch, host_bytes_per_gpu, offloaded_bytes_per_layer, prefetch_for
from costmodels.step import StepCostModel
from twinfer.config import validate
from twinfer.errors import TwinferError
from ui.cmd_cost import CostConfig, run_cost

V3 = get_model("deepseek-v3")
# DeepSeek-V3 routed experts of one MoE layer: 256 experts x 3 x 7168 x 2048 params in FP8 (1 byte + an fp32
# scale per 128 x 128 block)
FP8 = 1 + 4 / (128 * 128)
V3_ROUTED_LAYER = 256 * 3 * 7168 * 2048 * FP8
V3_SHARED_LAYER = 3 * 7168 * 2048 * FP8  # one shared expert of the same width
V3_MOE_LAYERS = 61 - 3


def test_offloaded_bytes_per_layer_by_hand():
    tp8 = ParallelLayout(tp=8, weight_dtype="fp8", offload_fraction=0.5)
    assert offloaded_bytes_per_layer(V3, tp8) == pytest.approx(0.5 * V3_ROUTED_LAYER / 8)  # experts split 8 ways
    moe = ParallelLayout(tp=8, weight_dtype="fp8", offload_fraction=0.5, offload_scope="moe")
    assert offloaded_bytes_per_layer(V3, moe) == pytest.approx(0.5 * (V3_ROUTED_LAYER + V3_SHARED_LAYER) / 8)
    assert offloaded_bytes_per_layer(V3, ParallelLayout(tp=8, weight_dtype="fp8")) == 0.0
    assert offloaded_bytes_per_layer(get_model("llama-3.1-8b"), ParallelLayout(tp=1, offload_fraction=0.5)) == 0.0


def test_memory_fit_moves_the_offloaded_share_to_host_and_adds_a_double_buffer():
    hw = get_hardware("h200")
    base = memory_fit(V3, hw, ParallelLayout(tp=4, weight_dtype="fp8"))
    off = memory_fit(V3, hw, ParallelLayout(tp=4, weight_dtype="fp8", offload_fraction=0.6))
    per_layer = 0.6 * V3_ROUTED_LAYER / 4
    assert off.weight_breakdown["routed_experts"] == pytest.approx(0.4 * base.weight_breakdown["routed_experts"])
    assert off.weight_breakdown["offload_buffer"] == pytest.approx(2 * per_layer)
    assert base.weight_bytes - off.weight_bytes == pytest.approx(V3_MOE_LAYERS * per_layer - 2 * per_layer)
    assert "offload_buffer" not in base.weight_breakdown
    # DeepSeek-V3 FP8 on 4 x H200 does not fit with every expert in HBM; with 60% of them in host memory it does
    assert not base.fits and off.fits and off.host_fits
    assert host_bytes_per_gpu(V3, off_layout := ParallelLayout(tp=4, weight_dtype="fp8", offload_fraction=0.6)) == \
        pytest.approx(V3_MOE_LAYERS * per_layer)
    small_host = hw.model_copy(update={"host_mem_gb": 10.0})
    assert not memory_fit(V3, small_host, off_layout).host_fits


def test_prefetch_step_arithmetic():
    p = Prefetch(bytes_per_layer=2e9, offloaded_layers=8, layers=10, link_bytes_per_s=1e12)  # 2 ms a layer
    # 10 ms step: 1 ms a layer, each of 8 offloaded layers stalls 1 ms, plus the first layer's 2 ms exposure
    assert p.transfer_s == pytest.approx(2e-3)
    assert p.step_time(10e-3) == pytest.approx(10e-3 + 8 * 1e-3 + 2e-3)
    # 40 ms step: 4 ms a layer hides the transfer; only the first layer's fetch shows
    assert p.step_time(40e-3) == pytest.approx(42e-3)
    assert p.step_time(np.array([10e-3, 40e-3])) == pytest.approx([20e-3, 42e-3])
    assert p.exposed(40e-3) == pytest.approx(2e-3)


@pytest.mark.parametrize("batch", [
    BatchShape.from_lists([1] * 64, [4096] * 64, [True] * 64),
    BatchShape.from_lists([16384], [0], [False]),
    BatchShape.from_lists([1] * 8 + [2048], [1024] * 8 + [0], [True] * 8 + [False]),
])
def test_step_time_with_offload_is_the_prefetch_of_the_in_hbm_step(batch):
    hw = get_hardware("gb300")
    lay = dict(tp=4, weight_dtype="fp8")
    base = StepCostModel(V3, hw, ParallelLayout(**lay))
    off = StepCostModel(V3, hw, ParallelLayout(**lay, offload_fraction=0.5))
    p = off.prefetch
    assert p.link_bytes_per_s == pytest.approx(225e9 * off.cal.comm_eff)  # GB300's NVLink-C2C host link, derated
    t0 = base.step_time(batch)
    want = t0 + p.offloaded_layers * max(0.0, p.transfer_s - t0 / V3.num_layers) + p.transfer_s
    assert off.step_time(batch) == pytest.approx(want)
    sc = off.step(batch)
    assert sc.time_s == pytest.approx(want) and sc.time_s == pytest.approx(sum(sc.breakdown.values()))
    assert any(o.name.startswith("weight_prefetch") for o in sc.ops)


def test_decode_times_apply_the_prefetch_to_each_step():
    hw = get_hardware("gb300")
    off = StepCostModel(V3, hw, ParallelLayout(tp=4, weight_dtype="fp8", offload_fraction=0.25))
    ctx = np.full(32, 2048)
    many = off.decode_times(ctx, 3)
    one = [off.step_time(BatchShape.from_lists([1] * 32, (ctx + k).tolist(), [True] * 32)) for k in range(3)]
    assert many == pytest.approx(one)


def test_prefill_hides_more_of_the_transfer_than_decode():
    """Per token, a big prefill pays little for offload (compute covers the fetch); a decode step pays it whole."""
    hw = get_hardware("gb300")
    lay = dict(tp=4, weight_dtype="fp8")
    base, off = (StepCostModel(V3, hw, ParallelLayout(**lay, offload_fraction=f)) for f in (0.0, 0.1))
    dec, pre = BatchShape.from_lists([1] * 64, [4096] * 64, [True] * 64), BatchShape.from_lists([32768], [0], [False])
    slow = {n: off.step_time(b) / base.step_time(b) for n, b in (("decode", dec), ("prefill", pre))}
    assert slow["prefill"] < slow["decode"]


def test_offload_through_cost_and_its_errors():
    res = run_cost(CostConfig(hardware="h200", tp=4, dtype="fp8", offload_fraction=0.6, batch=["prefill:1x8192"]))
    assert res["fits"] and res["offload"]["offloaded_layers"] == V3_MOE_LAYERS
    assert res["offload"]["bytes_per_layer"] == pytest.approx(0.6 * V3_ROUTED_LAYER / 4)
    assert res["layout"]["offload_fraction"] == 0.6
    with pytest.raises(TwinferError, match="offload_fraction"):
        validate(ParallelLayout, {"offload_fraction": -0.1})
    with pytest.raises(TwinferError, match="offload_scope"):
        validate(ParallelLayout, {"offload_fraction": 0.1, "offload_scope": "attention"})
    assert prefetch_for(V3, 64e9, 0.8, ParallelLayout(tp=8)) is None
