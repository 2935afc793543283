"""Hardware and model catalogs: numbers, lookups, HF config import."""

import json

import pytest

from costmodels.catalog import from_hf_config, get_model, list_models
from costmodels.hardware import Hardware, get_hardware, list_hardware
from costmodels.params import active_params, total_params
from twinfer.errors import TwinferError, UnknownNameError


def test_hardware_catalog_has_every_gpu_with_sources():
    names = {h.name for h in list_hardware()}
    assert names == {"GB300", "B300", "GB200", "B200", "H200", "H100", "H800", "MI355X"}
    for h in list_hardware():
        assert h.sources, h.name
        assert h.fp8_tflops == pytest.approx(2 * h.bf16_tflops, rel=0.01)  # dense FP8 is twice dense BF16 on all of them


def test_hardware_lookup_and_dtype_rates():
    h = get_hardware("h200")
    assert h is get_hardware("H200")
    assert h.tflops("bf16") == 989 and h.tflops("fp8") == 1979
    assert h.fp4_tflops is None and h.tflops("fp4") == 1979  # no FP4 tensor cores: FP8 rate
    assert get_hardware("b200").tflops("fp4") == 9000
    assert h.measured.copy_tbps == 4.11 and h.measured.bf16_matmul_tflops == 741 and h.measured.fp8_matmul_tflops == 1310


def test_unknown_hardware_lists_known():
    with pytest.raises(UnknownNameError) as e:
        get_hardware("a100")
    assert "H200" in str(e.value) and "MI355X" in str(e.value)


def test_user_hardware_yaml(tmp_path):
    p = tmp_path / "mygpu.yaml"
    p.write_text("name: X1\nbf16_tflops: 100\nfp8_tflops: 200\nhbm_gb: 10\nhbm_tbps: 1\nscaleup_gbps: 50\nscaleup_domain: 4\nscaleout_gbps: 100\n")
    h = get_hardware(str(p))
    assert isinstance(h, Hardware) and h.name == "X1" and h.scaleup_domain == 4
    p.write_text("name: X1\nbf16_tflops: -1\nfp8_tflops: 200\nhbm_gb: 10\nhbm_tbps: 1\nscaleup_gbps: 50\nscaleup_domain: 4\nscaleout_gbps: 100\n")
    with pytest.raises(TwinferError, match="bf16_tflops"):
        get_hardware(str(p))


def test_model_catalog_names_and_aliases():
    assert set(list_models()) >= {"deepseek-v3", "deepseek-v3.2", "deepseek-v4-flash", "qwen3-235b-a22b", "qwen3-30b-a3b",
                                  "kimi-k2", "glm-4.5", "llama-3.1-8b", "llama-3.1-70b", "tiny"}
    assert get_model("DeepSeek-R1").name == "deepseek-v3"
    with pytest.raises(UnknownNameError, match="deepseek-v3"):
        get_model("gpt-oss")


def test_deepseek_v3_numbers():
    m = get_model("deepseek-v3")
    assert (m.num_layers, m.hidden_size, m.vocab_size, m.num_attention_heads) == (61, 7168, 129280, 128)
    assert (m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_nope_head_dim, m.mla.qk_rope_head_dim, m.mla.v_head_dim) == (1536, 512, 128, 64, 128)
    assert (m.moe.n_routed_experts, m.moe.top_k, m.moe.moe_intermediate_size, m.moe.first_k_dense) == (256, 8, 2048, 3)
    assert m.mtp_layers == 1 and m.sources
    assert total_params(m) == pytest.approx(671e9, rel=0.01)   # V3 report: 671B total
    assert active_params(m) == pytest.approx(37e9, rel=0.03)   # 37B active


def test_other_model_totals():
    assert total_params(get_model("qwen3-235b-a22b")) == pytest.approx(235e9, rel=0.01)
    assert active_params(get_model("qwen3-235b-a22b")) == pytest.approx(22e9, rel=0.03)
    assert total_params(get_model("qwen3-30b-a3b")) == pytest.approx(30.5e9, rel=0.02)
    assert total_params(get_model("kimi-k2")) == pytest.approx(1.03e12, rel=0.02)
    assert total_params(get_model("llama-3.1-8b")) == pytest.approx(8.03e9, rel=0.01)
    assert total_params(get_model("llama-3.1-70b")) == pytest.approx(70.6e9, rel=0.01)
    assert total_params(get_model("deepseek-v4-flash")) == pytest.approx(284e9, rel=0.02)
    assert total_params(get_model("glm-4.5")) == pytest.approx(355e9, rel=0.02)


def test_v32_and_v4_structure():
    v32 = get_model("deepseek-v3.2")
    assert (v32.indexer.n_heads, v32.indexer.head_dim, v32.indexer.topk) == (64, 128, 2048)
    v4 = get_model("deepseek-v4-flash")
    kinds = v4.kinds()
    assert kinds[:2] == ["sliding", "sliding"] and kinds.count("csa") == 21 and kinds.count("hca") == 20
    assert v4.compress_ratio == {"csa": 4, "hca": 128} and v4.default_kv_dtype == "fp4"
    assert v4.checkpoint_expert_dtype == "fp4" and v4.assumptions


def test_tiny_exact():
    t = get_model("tiny")
    assert (t.num_layers, t.hidden_size, t.vocab_size, t.num_attention_heads, t.num_kv_heads, t.head_dim, t.intermediate_size) == (4, 256, 512, 4, 1, 48, 512)
    assert (t.mla.q_lora_rank, t.mla.kv_lora_rank, t.mla.qk_nope_head_dim, t.mla.qk_rope_head_dim, t.mla.v_head_dim) == (128, 64, 32, 16, 32)
    assert (t.indexer.n_heads, t.indexer.head_dim, t.indexer.topk) == (4, 32, 64)
    assert (t.moe.n_routed_experts, t.moe.n_shared_experts, t.moe.top_k, t.moe.moe_intermediate_size, t.moe.first_k_dense, t.moe.n_group, t.moe.topk_group, t.moe.scoring) == (16, 1, 4, 128, 1, 4, 2, "sigmoid")
    assert (t.mtp_layers, t.max_context, t.rope_theta, t.rms_norm_eps, t.family) == (1, 4096, 10000, 1e-6, "tiny")


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v3.2", "deepseek-v4-flash", "qwen3-235b-a22b", "kimi-k2", "glm-4.5", "llama-3.1-8b"])
def test_hf_config_round_trip(tmp_path, name):
    from costmodels.catalog import _entries
    cfg = _entries()[name]["hf_config"]
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    imported = get_model(str(d))
    ref = get_model(name)
    skip = {"name", "sources", "assumptions"}
    assert imported.model_dump(exclude=skip) == ref.model_dump(exclude=skip)
    assert get_model(str(d / "config.json")).model_dump(exclude=skip) == ref.model_dump(exclude=skip)


def test_hf_config_missing_key_is_named():
    with pytest.raises(TwinferError, match="lacks required key"):
        from_hf_config({"model_type": "deepseek_v3", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2, "vocab_size": 10}, "x")
    with pytest.raises(TwinferError, match="unsupported config.json"):
        from_hf_config({"model_type": "bert"}, "x")


def test_modelspec_yaml(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text(get_model("tiny").model_dump_json())
    assert get_model(str(p)).hidden_size == 256


def test_blackwell_ultra_sizes_the_hbm_cuda_sees_not_the_advertised():
    """B300 and GB300 advertise 288 GB; CUDA sees about 279 GiB on a GB300 and 270 on a B300 (the catalog's source). The
    memory fit took 288 as GiB: DeepSeek-V3 TP8 on a GB300 held a KV pool 8.7 GiB too large (2.70 M tokens, 2.58 M
    now). A GPU without a visible figure keeps its advertised one."""
    from costmodels.catalog import get_model
    from costmodels.hardware import get_hardware
    from costmodels.layout import ParallelLayout
    from costmodels.memory import memory_fit

    for name, seen in (("GB300", 279), ("B300", 270)):
        hw = get_hardware(name)
        assert hw.hbm_gb == 288 and hw.hbm_bytes == seen * 2**30
    assert get_hardware("H200").hbm_bytes == 141 * 2**30
    fit = memory_fit(get_model("deepseek-v3"), get_hardware("GB300"), ParallelLayout(tp=8, weight_dtype="fp8"))
    assert 2.5e6 < fit.max_kv_tokens < 2.65e6
