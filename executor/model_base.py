"""What both model families share: embedding, decoder stack, final norm, LM head, RoPE table."""

from __future__ import annotations

import torch
from torch import nn

from executor.forward_batch import ForwardBatch
from executor.kv_cache import KVCache
from executor.layers import Linear, RMSNorm, rope_cache
from executor.model_config import ExecModelConfig


class Backbone(nn.Module):
    """HF's ``model.*`` submodule: ``embed_tokens``, ``layers``, ``norm``."""

    def __init__(self, vocab: int, hidden: int, eps: float, layers: list[nn.Module]):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps)


class CausalLM(nn.Module):
    """Base of the executor's models: ``forward(batch, kv) -> final hidden``, ``compute_logits``.

    ``num_mtp`` is 0 unless the family drafts with MTP layers (``mtp_forward``).
    """

    num_mtp = 0

    def __init__(self, cfg: ExecModelConfig, layers: list[nn.Module], rope_dim: int):
        super().__init__()
        s = cfg.spec
        self.cfg, self.rope_dim = cfg, rope_dim
        self.model = Backbone(s.vocab_size, s.hidden_size, s.rms_norm_eps, layers)
        self.lm_head = None if s.tie_word_embeddings else Linear(s.hidden_size, s.vocab_size)
        self.cos_sin: torch.Tensor | None = None

    def attention_modules(self) -> list[nn.Module]:
        return [layer.self_attn for layer in self.model.layers]

    def setup_rope(self, max_pos: int) -> None:
        """Build the RoPE table on the model's device and hand it to every attention module."""
        w = self.model.embed_tokens.weight
        self.cos_sin = rope_cache(self.rope_dim, max_pos, self.cfg.rope, w.device,
                                  torch.float64 if w.dtype == torch.float64 else torch.float32)
        for attn in self.attention_modules():
            attn.cos_sin = self.cos_sin

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Final-normed hidden states ``[T, hidden]`` of every token in the batch."""
        # values shared by this forward's layers are computed afresh each forward: a CUDA graph capture must record
        # them (a warm-up run's tensors would be replayed stale, and freed under the graph)
        batch.memo.clear()
        x = self.model.embed_tokens(batch.input_ids)
        for layer in self.model.layers:
            x = layer(x, batch, kv)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits (float32) of normed hidden states."""
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        out = nn.functional.linear(hidden, w)
        return out if out.dtype == torch.float64 else out.float()
