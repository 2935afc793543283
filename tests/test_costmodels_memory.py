"""Memory fit: KV bytes, weight bytes, refusal with numbers."""

import pytest

from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import check_fit, kv_bytes_per_token, kv_bytes_per_token_layer, memory_fit
from twinfer.errors import DoesNotFitError


def test_deepseek_v3_kv_bytes():
    m = get_model("deepseek-v3")
    assert kv_bytes_per_token_layer(m, "bf16") == (512 + 64) * 2 == 1152
    assert kv_bytes_per_token(m, "bf16") == 61 * 1152 == 70_272
    # FlashMLA FP8 layout: 512 fp8 + 4 fp32 scales + 64 bf16 rope = 656 B
    assert kv_bytes_per_token_layer(m, "fp8") == 656


def test_gqa_kv_bytes_and_tp_sharding():
    m = get_model("llama-3.1-70b")  # 80 layers, 8 kv heads x 128
    assert kv_bytes_per_token(m, "bf16") == 80 * 2 * 8 * 128 * 2
    h = get_hardware("h200")
    f2 = memory_fit(m, h, ParallelLayout(tp=2))
    f8 = memory_fit(m, h, ParallelLayout(tp=8))
    assert f2.kv_bytes_per_token == kv_bytes_per_token(m) / 2
    assert f8.kv_bytes_per_token == kv_bytes_per_token(m) / 8
    # tp beyond the kv heads replicates them
    q = get_model("qwen3-235b-a22b")  # 4 kv heads
    assert memory_fit(q, h, ParallelLayout(tp=8, weight_dtype="fp8")).kv_bytes_per_token == kv_bytes_per_token(q) / 4


def test_mla_latent_replicated_over_tp_and_dp_multiplies_capacity():
    m = get_model("deepseek-v3")
    h = get_hardware("h200")
    tp8 = memory_fit(m, h, ParallelLayout(tp=8, weight_dtype="fp8"))
    assert tp8.kv_bytes_per_token == pytest.approx(70_272 + 1152)  # + the MTP layer's cache, not divided by tp
    dp8 = memory_fit(m, h, ParallelLayout(dp=8, ep=8, weight_dtype="fp8"))
    assert dp8.max_kv_tokens == 8 * dp8.max_kv_tokens_per_dp_rank


def test_qwen3_235b_fp8_weight_bytes():
    m = get_model("qwen3-235b-a22b")
    f = memory_fit(m, get_hardware("b300"), ParallelLayout(tp=1, weight_dtype="fp8"))
    # ~235e9 parameters at ~1 byte + block scales, embeddings/head (1.2e9 params) kept in BF16
    assert 235e9 < f.weight_bytes < 238e9
    f4 = memory_fit(m, get_hardware("b300"), ParallelLayout(tp=1, weight_dtype="fp8", expert_dtype="fp4"))
    assert f4.weight_bytes < 0.6 * f.weight_bytes


def test_expert_sharding_and_eplb():
    m = get_model("deepseek-v3")
    h = get_hardware("h200")
    base = memory_fit(m, h, ParallelLayout(dp=8, ep=8, weight_dtype="fp8"))
    red = memory_fit(m, h, ParallelLayout(dp=8, ep=8, weight_dtype="fp8", eplb_redundant_experts=32))
    per_expert_layer = 3 * 7168 * 2048 * (1 + 4 / 16384)
    assert red.weight_breakdown["routed_experts"] - base.weight_breakdown["routed_experts"] == pytest.approx(4 * 58 * per_expert_layer)


def test_v3_bf16_on_8xh100_refused_with_numbers():
    m = get_model("deepseek-v3")
    with pytest.raises(DoesNotFitError) as e:
        check_fit(m, get_hardware("h100"), ParallelLayout(tp=8, weight_dtype="bf16"))
    msg = str(e.value)
    assert "does not fit" in msg and "GiB weights" in msg and "short by" in msg and "of 80.0 GiB)" in msg  # the H100 in the catalog's unit
    fit = memory_fit(m, get_hardware("h100"), ParallelLayout(tp=8, weight_dtype="bf16"))
    assert not fit.fits and fit.weight_bytes > 160e9


def test_v3_fp8_fits_8xh200():
    fit = check_fit(get_model("deepseek-v3"), get_hardware("h200"), ParallelLayout(tp=8, weight_dtype="fp8"))
    assert 80e9 < fit.weight_bytes < 95e9 and fit.max_kv_tokens > 100_000
    assert fit.max_requests(4096) == fit.kv_pool_bytes // (fit.kv_bytes_per_token * 4096)


def test_pipeline_halves_weights():
    m = get_model("deepseek-v3")
    h = get_hardware("h200")
    one = memory_fit(m, h, ParallelLayout(tp=8, weight_dtype="fp8"))
    two = memory_fit(m, h, ParallelLayout(tp=8, pp=2, weight_dtype="fp8"))
    assert two.weight_bytes < 0.6 * one.weight_bytes


def test_v4_sliding_and_compressed_kv():
    m = get_model("deepseek-v4-flash")
    f = memory_fit(m, get_hardware("b200"), ParallelLayout(tp=1, weight_dtype="fp8", expert_dtype="fp4", kv_dtype="fp4"))
    assert f.kv_fixed_bytes_per_request > 0           # sliding windows cost per request, not per token
    assert f.kv_bytes_per_token < kv_bytes_per_token(get_model("deepseek-v3"), "fp4") / 5


# ---- one definition of the token budget: the instance's limits, each GPU reserving its DP rank's share


def test_workspace_is_sized_per_attention_dp_rank():
    """A DEP32 instance's scheduler budget (548,864 tokens = 32 ranks x 17,152) reserves one rank's share
    per GPU: the same fit as one rank's budget on its own, and ~30x the KV of reserving the whole budget."""
    from costmodels.memory import per_rank_share, workspace_bytes

    m, h = get_model("deepseek-v3"), get_hardware("gb300")
    lay = ParallelLayout(dp=32, ep=32, weight_dtype="fp8", kv_dtype="fp8")
    inst = memory_fit(m, h, lay, max_batched_tokens=548_864, max_running_requests=8192)
    rank = memory_fit(m, h, lay, max_batched_tokens=17_152, max_running_requests=256, sched_ranks=1)
    assert per_rank_share(548_864, 32) == 17_152 and per_rank_share(10, 4) == 3
    assert inst.workspace_bytes == rank.workspace_bytes == workspace_bytes(m, lay, 17_152, 256)
    assert inst.max_kv_tokens_per_dp_rank == rank.max_kv_tokens_per_dp_rank
    whole = inst.usable_bytes - inst.weight_bytes - workspace_bytes(m, lay, 548_864, 8192)
    assert whole <= 0 or inst.kv_pool_bytes / whole > 20  # the old per-GPU reservation of the whole budget


def test_slice_of_ranks_has_the_full_instances_kv_per_rank():
    """A simulated slice (scheduler over dp / mirror ranks) sees the same KV per rank as the full instance."""
    m, h = get_model("deepseek-v3"), get_hardware("gb300")
    lay = ParallelLayout(dp=32, ep=32, weight_dtype="fp8", kv_dtype="fp8")
    full = memory_fit(m, h, lay, max_batched_tokens=32 * 5000, max_running_requests=32 * 64)
    part = memory_fit(m, h, lay, max_batched_tokens=2 * 5000, max_running_requests=2 * 64, sched_ranks=2)
    assert part.max_kv_tokens_per_dp_rank == full.max_kv_tokens_per_dp_rank
    # the fit's KV at other limits is the fit recomputed at those limits
    other = memory_fit(m, h, lay, max_batched_tokens=32 * 9000, max_running_requests=32 * 128)
    assert full.kv_tokens_per_dp_rank_at(m, lay, 32 * 9000, 32 * 128) == other.max_kv_tokens_per_dp_rank


def test_dp1_fit_unchanged_by_the_rank_rule():
    m, h = get_model("deepseek-v3"), get_hardware("h200")
    lay = ParallelLayout(tp=8, weight_dtype="fp8")
    a = memory_fit(m, h, lay, max_batched_tokens=8192, max_running_requests=256)
    b = memory_fit(m, h, lay, max_batched_tokens=8192, max_running_requests=256, sched_ranks=1)
    assert a.workspace_bytes == b.workspace_bytes
