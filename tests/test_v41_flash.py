"""DeepSeek-V4.1-Flash in the catalog and the knobs it needs: CSA2 cross-layer KV reuse (kv_share_source),
per-component KV dtypes, NVFP4 blocks, the CED prefill/decode split, index-source layers, Engram placement."""

import numpy as np
import pytest

from costmodels.catalog import from_hf_config, get_model, list_models
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import kv_bytes_per_token, kv_rates, memory_fit
from costmodels.model_spec import ModelSpec
from costmodels.params import active_params, fp4_bytes, total_params
from costmodels.step import StepCostModel
from twinfer.config import validate
from twinfer.errors import TwinferError

V41 = "deepseek-v4.1-flash"


def _v41():
    return get_model(V41)


# ---------------------------------------------------------------------------------------------- KV bytes
def test_kv_bytes_per_token_matches_the_hand_calculation():
    m = _v41()
    # main KV row, NVFP4 packed (RoPE tail too): 512 dims x 0.5 B + 512/16 E4M3 scales x 1 B
    main = 512 * 0.5 + (512 // 16) * 1          # = 288
    # indexer key, MXFP4: 128 dims x 0.5 B + 128/32 UE8M0 scales x 1 B
    index_key = 128 * 0.5 + (128 // 32) * 1     # = 68
    # stored entries per token: KV sources 2, 8, 14 compress 2:1, source 20 keeps every token (ratio 1);
    # the other 34 compressed layers read those caches (CSA2), layers 0-1 are sliding-window only
    entries = 3 * (1 / 2) + 1 * (1 / 1)         # = 2.5
    assert main == 288 and index_key == 68 and entries == 2.5
    assert kv_bytes_per_token(m, "fp4") == pytest.approx(entries * (main + index_key)) == pytest.approx(890.0)
    # FP8 latent + FP4 indexer (per-component dtypes): 448 FP8 + 4 fp32 scales per 128 + 64 RoPE dims BF16
    fp8_main = 448 * 1 + 4 * 4 + 64 * 2         # = 592
    assert kv_bytes_per_token(m, "fp8") == pytest.approx(entries * (fp8_main + index_key)) == pytest.approx(1650.0)
    # every layer (sources and readers) keeps its own 128-token window: a fixed cost per request
    assert kv_rates(m, "fp4")[1] == pytest.approx(40 * 128 * main)


def test_every_other_catalog_model_keeps_its_kv_bytes_and_parameter_count():
    # values of the code before kv_share_source / per-component KV dtypes / V4.1 existed
    before = {
        "deepseek-v3": (70272.0, 40016.0, 24400.0, 671.026404352e9),
        "deepseek-v3.2": (78324.0, 48068.0, 32452.0, 671.8779136e9),
        # + the mHC mixing weights (2 x (24 x 4 x 4096 + 27) a layer, norms one stream wide: 43 x 761,910), counted
        # since mHC is priced as its kernels
        "deepseek-v4-flash": (6229.0, 3893.5, 2671.6875, 284.297955136e9 + 43 * 761910),
        "glm-4.5": (376832.0, 188416.0, 100096.0, 352.79647232e9),
        "kimi-k2": (70272.0, 40016.0, 24400.0, 1026.408209408e9),
        "llama-3.1-70b": (327680.0, 163840.0, 87040.0, 70.553706496e9),
        "llama-3.1-8b": (131072.0, 65536.0, 34816.0, 8.030261248e9),
        "qwen3-235b-a22b": (192512.0, 96256.0, 51136.0, 235.093610496e9),
        "qwen3-30b-a3b": (98304.0, 49152.0, 26112.0, 30.532110336e9),
        "tiny": (784.0, 544.0, 408.0, 0.006294528e9),
    }
    assert set(list_models()) == set(before) | {V41}
    for name, (bf16, fp8, fp4, params) in before.items():
        m = get_model(name)
        assert (kv_bytes_per_token(m, "bf16"), kv_bytes_per_token(m, "fp8"), kv_bytes_per_token(m, "fp4")) == (bf16, fp8, fp4), name
        assert total_params(m) == pytest.approx(params, rel=1e-12), name
        assert active_params(m, "prefill") == active_params(m), name  # no CED split: one active count


# ---------------------------------------------------------------------------------------------- params
def test_backbone_and_the_ced_split_of_active_parameters():
    m = _v41()
    assert total_params(m) == pytest.approx(552e9, rel=0.01)
    decode, prefill = active_params(m), active_params(m, "prefill")
    assert decode == pytest.approx(16e9, rel=0.05)
    assert prefill == pytest.approx(8e9, rel=0.05)
    # the prefill count drops the decoder layers (20-39: at least their 6 active experts and shared expert each) and the LM head
    assert decode - prefill > 20 * 7 * 3 * 5120 * 2304 + 5120 * 129280
    assert active_params(m.model_copy(update={"ced_encoder_layers": None}), "prefill") == decode
    # one routed expert: 3 x 5120 x 2304 weights in MXFP4 = 18.8 MB (colibri: "15,360 experts of 18.8 MB")
    assert 3 * 5120 * 2304 * fp4_bytes("mxfp4") / 1e6 == pytest.approx(18.8, abs=0.01)


def test_nvfp4_block_overhead_is_explicit():
    assert fp4_bytes("mxfp4") == 0.5 + 1 / 32      # 4.25 bits per value
    assert fp4_bytes("nvfp4") == 0.5 + 1 / 16 == 4.5 / 8
    m = _v41()
    lay = ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8", expert_dtype="fp4", kv_dtype="fp4")
    gb = get_hardware("gb300")
    mx = memory_fit(m, gb, lay).weight_breakdown["routed_experts"]
    nv = memory_fit(m.model_copy(update={"fp4_weight_format": "nvfp4"}), gb, lay).weight_breakdown["routed_experts"]
    assert nv / mx == pytest.approx(fp4_bytes("nvfp4") / fp4_bytes("mxfp4"))
    # the step reads the experts in that format too
    dec = (np.full(64, 1), np.full(64, 4096), np.ones(64, bool))
    t_mx = StepCostModel(m, gb, lay).mixed_step_time(*dec)
    t_nv = StepCostModel(m.model_copy(update={"fp4_weight_format": "nvfp4"}), gb, lay).mixed_step_time(*dec)
    assert t_nv > t_mx


# ---------------------------------------------------------------------------------------------- CSA2 map
def _spec(**update) -> dict:
    d = get_model("deepseek-v4-flash").model_dump()
    d.update(update)
    return d


def test_kv_share_source_between_non_adjacent_layers_counts_each_cache_once():
    v4 = get_model("deepseek-v4-flash")
    kinds = v4.kinds()
    # every csa layer after the first reads the cache of the csa layer two below it (csa/hca alternate: not adjacent)
    src = [None] * v4.num_layers
    first_csa = kinds.index("csa")
    for i, k in enumerate(kinds):
        if k == "csa" and i != first_csa:
            src[i] = first_csa if i - 2 < first_csa else (i - 2 if src[i - 2] is None else src[i - 2])
    shared = validate(ModelSpec, _spec(kv_share_source=src))
    n_csa = kinds.count("csa")
    csa_entry = kv_rates(v4, "fp4", [first_csa])[0]
    assert kv_bytes_per_token(shared, "fp4") == pytest.approx(kv_bytes_per_token(v4, "fp4") - (n_csa - 1) * csa_entry)
    # readers keep their own sliding window
    assert kv_rates(shared, "fp4")[1] == kv_rates(v4, "fp4")[1]


@pytest.mark.parametrize("src_of, message", [
    (lambda n: [None] * (n - 1), "kv_share_source has 42 entries, num_layers is 43"),
    (lambda n: [None, None, 4] + [None] * (n - 3), "kv_share_source[2] = 4: a layer can only read the cache of an earlier layer"),
    (lambda n: [None, None, None, 2] + [None] * (n - 4), "kv_share_source[3] = 2: layer 3 is hca but layer 2's cache is csa"),
    (lambda n: [None, 0] + [None] * (n - 2), "kv_share_source[1] = 0: sliding-window layers keep their own window"),
    (lambda n: [None, None, None, None, 2, None, 4] + [None] * (n - 7), "kv_share_source[6] = 4: layer 4 itself reads layer 2's cache"),
])
def test_kv_share_source_errors_name_the_field(src_of, message):
    with pytest.raises(TwinferError) as err:
        validate(ModelSpec, _spec(kv_share_source=src_of(43)), "my-model.yaml")
    assert message in str(err.value)
    assert "my-model.yaml" in str(err.value)


def test_kv_share_source_and_group_are_exclusive():
    with pytest.raises(TwinferError, match="kv_share_source and kv_share_group"):
        validate(ModelSpec, _spec(kv_share_source=[None] * 43, kv_share_group=2))


def test_ced_and_index_source_fields_are_checked():
    with pytest.raises(TwinferError, match="ced_encoder_layers=43 must be below num_layers=43"):
        validate(ModelSpec, _spec(ced_encoder_layers=43))
    with pytest.raises(TwinferError, match="index_source_layers: layer 50 is outside 0..42"):
        validate(ModelSpec, _spec(index_source_layers=[2, 50]))


def test_a_v41_config_json_is_read_and_checked():
    from costmodels.catalog import _entries

    cfg = dict(_entries()[V41]["hf_config"])
    m = from_hf_config(cfg, "v41")
    assert m.family == "deepseek_v41" and m.kv_share_source == _v41().kv_share_source
    assert m.kv_share_source[21] == 20 and m.kv_share_source[19] == 14 and m.stores_kv(8)
    bad = {**cfg, "kv_source_layer_ids": [3, 8, 14, 20]}  # layer 2 (ratio 2) then has no source at or below it
    with pytest.raises(TwinferError, match="layer 2 .compress ratio 2. has no kv_source_layer_ids entry"):
        from_hf_config(bad, "v41")
    with pytest.raises(TwinferError, match="compress_ratios values \\[4\\] not supported for deepseek_v41"):
        from_hf_config({**cfg, "compress_ratios": [4] * 40}, "v41")


# ---------------------------------------------------------------------------------------------- step costs
LAY = dict(tp=1, dp=8, ep=8, weight_dtype="fp8", expert_dtype="fp4", kv_dtype="fp4")


def _cm(model, **lay):
    return StepCostModel(model, get_hardware("gb300"), ParallelLayout(**{**LAY, **lay}))


def test_ced_prefill_runs_the_decoder_layers_over_the_chunk_tails_only():
    m = _v41()
    no_ced = m.model_copy(update={"ced_encoder_layers": None})
    ced, full = _cm(m), _cm(no_ced)
    pre = (np.array([8192] * 8), np.zeros(8, np.int64), np.zeros(8, bool))
    t_ced, t_full = ced.mixed_step_time(*pre), full.mixed_step_time(*pre)
    # the decoder half runs 128 of 8192 tokens: the prefill step costs a bit over half
    assert 0.45 < t_ced / t_full < 0.7
    assert t_ced == pytest.approx(ced._mixed_step_time_reference(*pre), rel=1e-9)
    ops = {o.name for o in ced.step(__import__("costmodels.batch", fromlist=["BatchShape"]).BatchShape(*pre)).ops}
    assert any(n.startswith("decoder_routed_experts") for n in ops)
    # decode runs every layer over every token: CED changes nothing there
    dec = (np.full(32, 1), np.full(32, 131072), np.ones(32, bool))
    assert ced.mixed_step_time(*dec) == pytest.approx(full.mixed_step_time(*dec), rel=1e-9)
    # a mixed step: fast path == op-by-op reference
    mixed = (np.array([1] * 16 + [3000, 100]), np.array([50000] * 16 + [0, 9000]), np.array([True] * 16 + [False, False]))
    assert ced.mixed_step_time(*mixed) == pytest.approx(ced._mixed_step_time_reference(*mixed), rel=1e-9)


def test_only_index_source_layers_pay_the_indexer_scoring():
    m = _v41()
    every = m.model_copy(update={"index_source_layers": None})
    dec = (np.full(64, 1), np.full(64, 131072), np.ones(64, bool))
    from costmodels.batch import BatchShape

    idx_src = _cm(m).step(BatchShape(*dec)).breakdown["indexer"]
    idx_all = _cm(every).step(BatchShape(*dec)).breakdown["indexer"]
    assert idx_src < idx_all
    assert _cm(m).mixed_step_time(*dec) == pytest.approx(_cm(m)._mixed_step_time_reference(*dec), rel=1e-9)


# ---------------------------------------------------------------------------------------------- Engram
def test_engram_tables_and_their_placements():
    from costmodels.effective import TABLE_64K_BW_FACTOR, EffectiveStepCost, fit_with_policies

    m = _v41()
    assert m.host_table_bytes == pytest.approx(2 * 384006168 * 264)      # 203 GB
    assert m.host_table_bytes_per_token == 48 * 264                       # 12.4 KiB
    gb, lay = get_hardware("gb300"), ParallelLayout(**LAY)
    host, peer, local = (fit_with_policies(m, gb, lay, table_placement=p) for p in ("host", "hbm", "local"))
    assert host.kv_pool_bytes - peer.kv_pool_bytes == pytest.approx(m.host_table_bytes / 8)
    assert host.kv_pool_bytes - local.kv_pool_bytes == pytest.approx(m.host_table_bytes)
    dec = (np.full(256, 1), np.full(256, 8192), np.ones(256, bool))

    def t(**kw):
        return EffectiveStepCost(m, gb, lay, table_prefetch=False, dp_balance=False, **kw).mixed_step_time(*dec)

    base = StepCostModel(m, gb, lay).mixed_step_time(*dec)
    t2m, t64k, tlocal = t(table_page="2M"), t(table_page="64K"), t(table_placement="local")
    assert base < tlocal < t2m < t64k
    # 64 KB pages: the same bytes at TABLE_64K_BW_FACTOR of the host bandwidth (the fixed latency cancels)
    bw = gb.host_bw * StepCostModel(m, gb, lay).cal.comm_eff
    rank_bytes = 256 / 8 * m.host_table_bytes_per_token
    assert t64k - t2m == pytest.approx(rank_bytes / (bw * TABLE_64K_BW_FACTOR) - rank_bytes / bw, rel=1e-6)
