"""Real checkpoint formats (issue 22): DeepSeek FP8 block-quantised safetensors, sharded safetensors with
an index, and the tokenizer + chat template saved beside the weights, each checked against transformers."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file, save_file  # noqa: E402
from test_hf_parity import YARN, deepseek_v3_config  # noqa: E402
from test_hf_parity_helpers import (  # noqa: E402
    RTOL, assert_parity, build_hf, check_parity, exec_prefill, hf_logits, load_executor, rel_err,
)

from twinfer.errors import TwinferError  # noqa: E402

BLOCK = 128   # DeepSeek-V3 FP8 recipe: 128x128 weight blocks (config.json quantization_config.weight_block_size)
# DeepSeek's FP8 checkpoints keep these in BF16: embeddings, head, norms, router, and kv_b_proj is dequantised anyway
NOT_QUANTISED = ("embed_tokens", "lm_head", "norm", "mlp.gate.", "kv_b_proj")


def quantise_block_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's layout, written independently of the executor: e4m3 weight, fp32 ``weight_scale_inv [ceil(N/128), ceil(K/128)]``."""
    n, k = w.shape
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.zeros(nb * BLOCK, kb * BLOCK)
    padded[:n, :k] = w
    blocks = padded.view(nb, BLOCK, kb, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0        # 448: largest finite e4m3 value
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(nb * BLOCK, kb * BLOCK)[:n, :k]
    return q.contiguous(), scale


def dequantise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    return q.float() * scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    """(reference HF model holding the dequantised weights, FP8 checkpoint folder, its tensors)."""
    cfg = deepseek_v3_config(hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
                             n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2, kv_lora_rank=128,
                             q_lora_rank=128, v_head_dim=32, rope_parameters=dict(YARN))
    hf = build_hf(cfg, seed=3)
    folder = tmp_path_factory.mktemp("fp8")
    hf.save_pretrained(folder)
    tensors, reference = {}, {}
    for name, t in load_file(folder / "model.safetensors").items():
        if t.dim() == 2 and name.endswith(".weight") and not any(s in name for s in NOT_QUANTISED):
            q, s = quantise_block_fp8(t.float())
            tensors[name], tensors[name[: -len("weight")] + "weight_scale_inv"] = q, s
            reference[name] = dequantise(q, s)
        else:
            tensors[name] = reference[name] = t
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [BLOCK, BLOCK]}
    (folder / "config.json").write_text(json.dumps(config))
    _load_reference(hf, reference)
    return hf, folder, tensors


def _load_reference(hf, reference: dict) -> None:
    """Copy checkpoint-named tensors into the HF model (its experts are stacked: gate_up_proj / down_proj)."""
    params = {**dict(hf.named_parameters()), **dict(hf.named_buffers())}
    with torch.no_grad():
        for name, t in reference.items():
            if ".mlp.experts." not in name:
                params[name].copy_(t)
                continue
            prefix, e, proj = name.rsplit(".", 3)[0], int(name.split(".")[-3]), name.split(".")[-2]
            inter = params[f"{prefix}.down_proj"].shape[-1]
            if proj == "down_proj":
                params[f"{prefix}.down_proj"][e].copy_(t)
            else:
                rows = slice(0, inter) if proj == "gate_proj" else slice(inter, 2 * inter)
                params[f"{prefix}.gate_up_proj"][e, rows].copy_(t)


def test_fp8_block_checkpoint_loads_dequantised_and_matches_reference(fp8_checkpoint):
    hf, folder, _ = fp8_checkpoint
    res = check_parity(hf, folder, seed=4)
    assert_parity(res)


def test_fp8_block_checkpoint_runs_fp8_with_its_own_scales(fp8_checkpoint):
    """``--dtype fp8`` keeps the checkpoint's e4m3 bytes and scales (no re-quantisation), experts included."""
    hf, folder, tensors = fp8_checkpoint
    cfg, ex = load_executor(folder, "fp8")
    lin = ex.model.layers[0].self_attn.q_a_proj
    name = "model.layers.0.self_attn.q_a_proj.weight"
    assert lin.fp8 and torch.equal(lin.weight.view(torch.uint8), tensors[name].view(torch.uint8))
    assert torch.equal(lin.weight_scale_inv, tensors[name + "_scale_inv"])
    experts = ex.model.layers[1].mlp.experts
    up = tensors["model.layers.1.mlp.experts.2.up_proj.weight"]
    assert experts.fp8 and torch.equal(experts.w13[2, BLOCK:].view(torch.uint8), up.view(torch.uint8))
    assert torch.equal(experts.w13_scale_inv[2, 1:], tensors["model.layers.1.mlp.experts.2.up_proj.weight_scale_inv"])
    toks = list(range(3, 43))
    got = exec_prefill(ex, cfg, toks, torch.bfloat16)
    want = hf_logits(hf, toks)
    # FP8 activations (1x128 groups) and BF16 on top of the FP8 weights: same top token at most positions
    assert torch.isfinite(got).all()
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.8


def test_sharded_checkpoint_with_index(tmp_path):
    hf = build_hf(deepseek_v3_config(), seed=5)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3
    (tmp_path / "stale-extra.safetensors").write_bytes(b"not read: the index names the shards")
    cfg, ex = load_executor(tmp_path)
    toks = list(range(7, 47))
    assert rel_err(exec_prefill(ex, cfg, toks), hf_logits(hf, toks)) <= RTOL
    (tmp_path / shards[1]).unlink()
    with pytest.raises(TwinferError, match=shards[1]):
        load_executor(tmp_path)


def test_tokenizer_and_chat_template_from_the_folder(tmp_path):
    """The server's tokenizer reads tokenizer.json + chat_template.jinja (transformers 5 saves the template there)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from executor.serve.tokenizer import load_tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 10, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    template = ("{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                         chat_template=template).save_pretrained(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = load_tokenizer(str(tmp_path), vocab_size=300)
    msgs = [{"role": "user", "content": "the fox"}, {"role": "assistant", "content": "lazy dog"},
            {"role": "user", "content": "quick?"}]
    want = ref.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    assert ours.encode_chat(msgs) == want
    assert ours.encode("the quick brown fox") == ref("the quick brown fox").input_ids
    assert ours.decode(want) == ref.decode(want, skip_special_tokens=True)
    assert ours.eos_token_id == ref.eos_token_id
