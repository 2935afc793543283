"""Executor models on CPU: chunked/paged forward equals one-shot forward; weights load and save."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from costmodels.model_spec import ModelSpec, MoEConfig  # noqa: E402
from executor.forward_batch import SeqInput, build_forward_batch  # noqa: E402
from executor.kv_cache import KVCache  # noqa: E402
from executor.model_config import ExecModelConfig, tiny_spec  # noqa: E402
from executor.weights import build_model, save_hf  # noqa: E402

CPU = torch.device("cpu")


def qwen_moe_spec() -> ModelSpec:
    """A toy Qwen3-MoE: GQA 2:1 with q/k norms, softmax top-2 of 8 experts in every layer."""
    return ModelSpec(name="toy-qwen3-moe", family="qwen3_moe", num_layers=3, hidden_size=128, vocab_size=300,
                     num_attention_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256, attention="gqa",
                     moe=MoEConfig(n_routed_experts=8, top_k=2, moe_intermediate_size=64, first_k_dense=0),
                     max_context=1024)


def full_logits(model, cfg, tokens, dtype):
    pages = -(-len(tokens) // 16)
    kv = KVCache(cfg, pages, 16, CPU, dtype)
    b = build_forward_batch([SeqInput(tokens, 0, list(range(pages)), False)], 16, kv.null_page, CPU)
    return model.compute_logits(model(b, kv))


@pytest.mark.parametrize("spec_fn", [tiny_spec, qwen_moe_spec])
def test_chunked_paged_forward_equals_one_shot(spec_fn):
    cfg = ExecModelConfig.build(spec_fn())
    model = build_model(cfg, CPU, "fp64", "dummy", seed=3, routing_skew=0.5)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, cfg.spec.vocab_size, (90,), generator=g).tolist()
    want = full_logits(model, cfg, toks, torch.float64)
    kv = KVCache(cfg, 12, 16, CPU, torch.float64)
    table = [11, 2, 7, 0, 5, 9]                       # scattered pages
    got = []
    for start, end, dec in ((0, 37, False), (37, 86, False), (86, 88, True), (88, 90, True)):
        # decodes here carry 2 queries each (one token + one draft position), as MTP verification does
        b = build_forward_batch([SeqInput(toks[start:end], start, table, dec)], 16, kv.null_page, CPU)
        got.append(model.compute_logits(model(b, kv)))
    got = torch.cat(got)
    assert float((got - want).abs().max()) < 1e-9


def test_mixed_batch_of_decodes_and_prefills_matches_separate_runs():
    cfg = ExecModelConfig.build(tiny_spec())
    model = build_model(cfg, CPU, "fp64", "dummy", seed=1)
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 512, (70,), generator=g).tolist()
    b = torch.randint(0, 512, (20,), generator=g).tolist()
    kv = KVCache(cfg, 16, 16, CPU, torch.float64)
    ta, tb = [0, 1, 2, 3, 4], [8, 9]
    model(build_forward_batch([SeqInput(a[:69], 0, ta, False)], 16, kv.null_page, CPU), kv)
    mixed = build_forward_batch([SeqInput(a[69:], 69, ta, True), SeqInput(b, 0, tb, False)], 16, kv.null_page, CPU)
    h = model(mixed, kv)
    la, lb = full_logits(model, cfg, a, torch.float64), full_logits(model, cfg, b, torch.float64)
    assert float((model.compute_logits(h[:1]) - la[-1:]).abs().max()) < 1e-9
    assert float((model.compute_logits(h[1:]) - lb).abs().max()) < 1e-9


def test_dummy_weights_are_deterministic_and_skew_biases_routing():
    cfg = ExecModelConfig.build(tiny_spec())
    m1 = build_model(cfg, CPU, "fp32", "dummy", seed=5)
    m2 = build_model(cfg, CPU, "fp32", "dummy", seed=5)
    for (n, p), (_, q) in zip(m1.named_parameters(), m2.named_parameters()):
        assert torch.equal(p, q), n
    skewed = build_model(cfg, CPU, "fp32", "dummy", seed=5, routing_skew=2.0)
    x = torch.randn(512, 256, generator=torch.Generator().manual_seed(0))
    moe_u, moe_s = m1.model.layers[1].mlp, skewed.model.layers[1].mlp
    cu = torch.bincount(moe_u.route(x)[1].flatten(), minlength=16).float()
    cs = torch.bincount(moe_s.route(x)[1].flatten(), minlength=16).float()
    assert cs.max() / cs.mean() > cu.max() / cu.mean()


@pytest.mark.parametrize("spec_fn", [tiny_spec, qwen_moe_spec])
def test_hf_checkpoint_roundtrip(tmp_path, spec_fn):
    cfg = ExecModelConfig.build(spec_fn())
    model = build_model(cfg, CPU, "fp32", "dummy", seed=2)
    save_hf(model, tmp_path)
    names = set()
    from executor import safetensors_io
    for n, _ in safetensors_io.iter_tensors(tmp_path / "model.safetensors"):
        names.add(n)
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in names
    if cfg.spec.mtp_layers:
        assert f"model.layers.{cfg.spec.num_layers}.eh_proj.weight" in names
    cfg2 = ExecModelConfig.build(spec_fn(), tmp_path)
    loaded = build_model(cfg2, CPU, "fp32", "auto")
    for (n, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters()):
        assert torch.equal(p, q), n


def test_fallback_safetensors_io_matches_library(tmp_path, monkeypatch):
    from executor import safetensors_io
    t = {"a": torch.randn(3, 4), "b": torch.arange(6, dtype=torch.int64), "c": torch.randn(2, 2).to(torch.bfloat16),
         "d": torch.randn(4, 4).to(torch.float8_e4m3fn)}
    monkeypatch.setattr(safetensors_io, "has_library", lambda: False)
    safetensors_io.save_file(t, tmp_path / "x.safetensors")
    got = dict(safetensors_io.iter_tensors(tmp_path / "x.safetensors"))
    for k, v in t.items():
        assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k


def test_fp8_model_tracks_bf16_model(tmp_path):
    """Loading a BF16 checkpoint as FP8 (128x128 weight blocks, 1x128 activations): each linear
    stays within FP8 rounding of its BF16 twin; the whole model runs (routing flips amplify
    per-layer differences on random weights, so the end-to-end bound is loose)."""
    cfg = ExecModelConfig.build(tiny_spec())
    ref_model = build_model(cfg, CPU, "fp32", "dummy", seed=4)
    save_hf(ref_model, tmp_path)
    fp8 = build_model(ExecModelConfig.build(tiny_spec(), tmp_path), CPU, "fp8", "auto")
    lin8, lin = fp8.model.layers[0].self_attn.q_a_proj, ref_model.model.layers[0].self_attn.q_a_proj
    assert fp8.model.layers[1].mlp.experts.fp8 and lin8.fp8
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(0))
    y8, y = lin8(x.bfloat16()).float(), lin(x)
    assert float((y8 - y).norm() / y.norm()) < 0.05
    toks = list(range(1, 40))
    want = full_logits(ref_model, cfg, toks, torch.float32)
    got = full_logits(fp8, cfg, toks, torch.bfloat16)
    assert torch.isfinite(got).all() and float((got - want).norm() / want.norm()) < 0.3


@pytest.mark.parametrize("spec_fn", [tiny_spec, qwen_moe_spec])
def test_engine_serves_an_hf_checkpoint_folder(tmp_path, spec_fn):
    """config.json + safetensors -> costmodels.catalog spec -> executor model: same greedy tokens as in memory."""
    from executor.engine import LLMEngine, SamplingParams
    pytest.importorskip("costmodels.catalog")
    cfg = ExecModelConfig.build(spec_fn())
    model = build_model(cfg, CPU, "fp64", "dummy", seed=1)
    save_hf(model, tmp_path)
    e = LLMEngine.from_args(str(tmp_path), load_format="auto", dtype="fp64",
                            scheduler_config={"block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 4})
    assert e.cfg.spec.num_layers == cfg.spec.num_layers and e.cfg.spec.attention == cfg.spec.attention
    prompt = list(range(3, 40))
    out = e.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    want = full_logits(model, cfg, prompt + out[:-1], torch.float64)[len(prompt) - 1:].argmax(-1).tolist()
    assert out == want
