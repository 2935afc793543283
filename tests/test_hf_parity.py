"""The executor computes what Hugging Face ``transformers`` computes (issue 22), one model type per test.

Each test builds a tiny HF config with every mechanism of the type switched on, random weights,
``save_pretrained``, loads the folder with the executor's ``--load-format auto`` path, and checks
fp32 logits position by position (one-shot prefill; chunked prefill over scattered pages then
one-token paged decodes) to a max relative error of 1e-4, and 32 greedy tokens of the serving
engine against HF's. The ``gpu`` variant repeats it with the vendor kernels on a CUDA device.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf_parity_helpers import assert_parity, build_hf, check_parity  # noqa: E402

# YaRN as DeepSeek-V3 ships it (factor 40 there; 4 keeps the tiny context meaningful), theta off its default
YARN = {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, max_position_embeddings=512)


def deepseek_v3_config(**kw):
    """MLA with q/kv LoRA, YaRN, sigmoid group-limited routing with bias correction, shared expert, 1 dense layer.

    rms_norm_eps differs from 1e-6 on purpose: the latent norms keep 1e-6 whatever the config says.
    """
    args = dict(TINY, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, moe_intermediate_size=32,
                n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=48,
                qk_rope_head_dim=16, v_head_dim=24, qk_nope_head_dim=32, n_group=4, topk_group=2,
                num_experts_per_tok=3, first_k_dense_replace=1, rms_norm_eps=1e-5, rope_parameters=dict(YARN),
                num_mtp_layers=0)
    args.update(kw)
    return transformers.DeepseekV3Config(**args)


def deepseek_v32_config():
    """V3 plus the DSA indexer in every layer; top-8 of up to 44 keys so the selection matters.

    16 indexer heads: with few heads, exact-zero scores (ReLU) tie and torch.topk breaks ties in no
    stated order, while the executor keeps the lowest position; ties are a measure-zero event here.
    """
    args = dict(deepseek_v3_config().to_dict(), index_topk=8, index_head_dim=32, index_n_heads=16)
    for k in ("model_type", "transformers_version", "architectures", "qk_head_dim", "head_dim"):
        args.pop(k, None)
    return transformers.DeepseekV32Config(**args)


def llama_config():
    """GQA 2:1, llama3 RoPE scaling, q/k/v/o biases."""
    return transformers.LlamaConfig(**TINY, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                    rms_norm_eps=1e-5, attention_bias=True,
                                    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 64})


def qwen3_moe_config():
    """GQA with per-head q/k norms, head_dim != hidden/heads, softmax top-3 of 8 with renormalisation."""
    return transformers.Qwen3MoeConfig(**TINY, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=24, num_experts=8, num_experts_per_tok=3,
                                       norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": 20000.0})


def glm4_moe_config():
    """GLM-4.5: partial rotary (half the head), q/k norms, qkv biases, sigmoid group routing with bias, scaling."""
    return transformers.Glm4MoeConfig(**TINY, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=32, n_routed_experts=8, n_shared_experts=1,
                                      num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1,
                                      routed_scaling_factor=1.8, norm_topk_prob=True, use_qk_norm=True,
                                      attention_bias=True, partial_rotary_factor=0.5, num_mtp_layers=0,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                       "partial_rotary_factor": 0.5})


def deepseek_v3_neox_config():
    """V3 with ``rope_interleave=false``: MLA's rope dims rotated in halves."""
    return deepseek_v3_config(rope_interleave=False)


def qwen3_config():
    """Dense Qwen3: q/k norms, head_dim != hidden/heads, YaRN on GQA (cos/sin scaled by 0.1 ln f + 1)."""
    return transformers.Qwen3Config(**TINY, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                    head_dim=24, rope_parameters={"rope_type": "yarn", "rope_theta": 20000.0,
                                                                  "factor": 4.0, "original_max_position_embeddings": 128})


CONFIGS = {"deepseek_v3": deepseek_v3_config, "deepseek_v3_neox": deepseek_v3_neox_config, "qwen3": qwen3_config,
           "deepseek_v32": deepseek_v32_config, "llama": llama_config, "qwen3_moe": qwen3_moe_config,
           "glm4_moe": glm4_moe_config}


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_executor_matches_hf(tmp_path, model_type):
    hf = build_hf(CONFIGS[model_type](), seed=1)
    hf.save_pretrained(tmp_path)
    res = check_parity(hf, tmp_path, seed=2)
    assert_parity(res)


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_executor_matches_hf_on_cuda(tmp_path, model_type):
    """The same comparison with the executor on the GPU (the registry's CUDA kernels that take fp32:
    Triton MLA decode and MoE, SDPA prefill), HF on the CPU as the reference."""
    hf = build_hf(CONFIGS[model_type](), seed=1)
    hf.save_pretrained(tmp_path)
    assert_parity(check_parity(hf, tmp_path, seed=2, device="cuda"))


@pytest.mark.gpu
def test_deepseek_v3_vendor_kernels_bf16_track_hf(tmp_path):
    """FlashMLA's shapes (latent 512 + rope 64, 64-token pages, bf16) so the vendor decode kernel serves the
    paged decodes. The reference holds the same bf16-rounded weights in fp32, so what is measured is the
    kernels' bf16 arithmetic: issue 22's bf16 bound (2e-2) per position, with the expert choice pinned (see
    below) so that a near-tie flip, a discrete change no tolerance describes, is not what is measured."""
    from kernels import ops
    from test_hf_parity_helpers import exec_chunked_then_decode, hf_logits, load_executor

    cfg = deepseek_v3_config(hidden_size=512, intermediate_size=512, moe_intermediate_size=128, num_attention_heads=16,
                             num_key_value_heads=16, q_lora_rank=256, kv_lora_rank=512, qk_rope_head_dim=64,
                             qk_nope_head_dim=128, v_head_dim=128)
    hf = build_hf(cfg, seed=1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(p.bfloat16().float())
        # routing pinned: correction biases spaced wider than the sigmoid scores' range (0, 1) make every
        # token pick the same experts, so a bf16 near-tie cannot flip a choice (a flip at one position
        # reaches the later ones through attention: measured on the H200, 2026-12-01, 15% of positions);
        # the routing itself is checked by the fp32 comparisons above
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.arange(b.numel(), dtype=b.dtype) * 2.0)
    hf.save_pretrained(tmp_path)
    ecfg, ex = load_executor(tmp_path, "bf16", torch.device("cuda"))
    toks = torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    ops.reset_used()
    got = exec_chunked_then_decode(ex, ecfg, toks, (70, 150), torch.bfloat16, page=64).float()
    used = ops.reset_used()
    want = hf_logits(hf, toks)
    assert used.get("mla_decode") == "flashmla", used
    per_pos = (got - want).abs().amax(-1) / want.abs().amax(-1)
    assert float(per_pos.max()) <= 2e-2, per_pos.tolist()
    # greedy choice: the same token wherever HF's top two are further apart than the bound allows the
    # logits to move (2 x 2e-2 x max |logit|); a closer pair is a tie at bf16 precision (seen on the H200:
    # 1 of 200 positions flipped, all inside that margin). Random weights give flat logits: 73% of these
    # seeded positions are clear (H200, 2026-12-02), so at least half must be, or the check says nothing
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * 2e-2 * want.abs().amax(-1)
    assert bool((got.argmax(-1) == want.argmax(-1))[clear].all())
    assert float(clear.float().mean()) >= 0.5


def test_deepseek_v4_folder_is_refused_at_load_naming_what_is_missing(tmp_path):
    """The executor has MLA and MoE but not V4's attention: `twinfer run` must say so, not serve a V3-like model."""
    import subprocess
    import sys

    cfg = transformers.DeepseekV4Config(vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
                                        num_attention_heads=4, head_dim=32, q_lora_rank=32, n_routed_experts=8,
                                        num_experts_per_tok=2, o_groups=2, o_lora_rank=32, index_n_heads=4,
                                        index_head_dim=32, index_topk=8, qk_rope_head_dim=16, sliding_window=16)
    cfg.save_pretrained(tmp_path)
    res = subprocess.run([sys.executable, "-m", "ui.cli", "run", "--model", str(tmp_path), "--load-format", "auto",
                          "--device", "cpu"], capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    for part in ("deepseek_v4", "mHC", "compressed", "low-rank output", "sqrtsoftplus"):
        assert part in out, out
    assert "Traceback" not in out
