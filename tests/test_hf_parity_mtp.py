"""DeepSeek-V3's MTP layer against transformers' ``MtpModel`` (issue 22): draft logits and speculative greedy decoding."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file, save_file  # noqa: E402
from test_hf_parity import deepseek_v3_config  # noqa: E402
from test_hf_parity_helpers import (  # noqa: E402
    CPU, GREEDY_STEPS, PAGE, RTOL, build_hf, engine_greedy, hf_greedy, load_executor, randomize, rel_err,
)

from executor.forward_batch import SeqInput, build_forward_batch  # noqa: E402
from executor.kv_cache import KVCache  # noqa: E402


def mtp_checkpoint_tensors(mtp, num_layers: int) -> dict:
    """HF ``MtpModel`` layer 0 in DeepSeek's checkpoint layout: ``model.layers.{num_layers}.*``, per-expert
    tensors, ``shared_head.norm`` for HF's post_norm, plus the repeated embedding and head DeepSeek ships."""
    out = {}
    tensors = {**dict(mtp.named_parameters()), **dict(mtp.named_buffers())}
    L = f"model.layers.{num_layers}."
    for name, t in tensors.items():
        if not name.startswith("layers.0."):
            continue
        rest = name[len("layers.0."):]
        if rest == "post_norm.weight":
            out[L + "shared_head.norm.weight"] = t
        elif rest.startswith("mtp_block.mlp.experts.gate_up_proj"):
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[L + f"mlp.experts.{e}.gate_proj.weight"] = t[e, :inter]
                out[L + f"mlp.experts.{e}.up_proj.weight"] = t[e, inter:]
        elif rest.startswith("mtp_block.mlp.experts.down_proj"):
            for e in range(t.shape[0]):
                out[L + f"mlp.experts.{e}.down_proj.weight"] = t[e]
        elif rest.startswith("mtp_block."):
            out[L + rest[len("mtp_block."):]] = t
        elif rest.startswith("rotary"):
            continue
        else:
            out[L + rest] = t
    out[L + "embed_tokens.weight"] = mtp.embed_tokens.weight      # DeepSeek's checkpoints repeat these per MTP layer
    out[L + "shared_head.head.weight"] = mtp.shared_head.weight
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


@pytest.fixture(scope="module")
def mtp_folder(tmp_path_factory):
    from transformers.modeling_layers import MtpModel

    cfg = deepseek_v3_config(num_mtp_layers=1)
    hf = build_hf(cfg, seed=1)
    mtp = MtpModel(hf, 1).eval()
    randomize(mtp, 7, skip=("embed_tokens", "shared_head"))   # those two are the main model's
    folder = tmp_path_factory.mktemp("mtp")
    hf.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    tensors.update(mtp_checkpoint_tensors(mtp, cfg.num_hidden_layers))
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return hf, mtp, folder


@torch.no_grad()
def test_mtp_draft_logits_match_hf(mtp_folder):
    """MTP at position i sees the main model's final (normed) hidden h_i and token i+1; chunked, paged KV."""
    hf, mtp, folder = mtp_folder
    cfg, ex = load_executor(folder)
    assert ex.num_mtp == 1
    toks = torch.randint(0, 256, (41,), generator=torch.Generator().manual_seed(0)).tolist()
    n = len(toks) - 1
    h = hf.model(torch.tensor([toks[:n]])).last_hidden_state
    emb = hf.model.embed_tokens(torch.tensor([toks[1:]]))
    pos = torch.arange(1, n + 1)[None]
    causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
    hm = mtp.layers[0](emb, h, position_embeddings=hf.model.rotary_emb(emb, pos), attention_mask=causal,
                       position_ids=pos, cache=None)
    want = mtp._project_to_logits(hm)[0]
    kv = KVCache(cfg, 9, PAGE, CPU, torch.float32)
    table, got = [8, 5, 2], []
    for a, b in ((0, 17), (17, n)):
        batch = build_forward_batch([SeqInput(toks[a:b], a, table, False)], PAGE, kv.null_page, CPU)
        hidden = ex(batch, kv)
        mtp_batch = dataclasses.replace(batch, input_ids=torch.tensor(toks[a + 1:b + 1]))
        got.append(ex.mtp_logits(0, ex.mtp_forward(0, mtp_batch, hidden, kv)))
    assert rel_err(torch.cat(got), want) <= RTOL


def test_speculative_greedy_with_mtp_drafts_equals_hf_greedy(mtp_folder):
    hf, _, folder = mtp_folder
    prompt = list(range(20, 32))
    assert engine_greedy(folder, prompt, GREEDY_STEPS, draft_len=2) == hf_greedy(hf, prompt, GREEDY_STEPS)
