"""Paged KV cache on the device; page ``i`` is the scheduler's block ``i``.

MLA models store one latent per token per layer, ``[pages, page_size, kv_lora + rope]``
(FlashMLA's layout; FlashInfer reads the ``[..., :kv_lora]`` / ``[..., kv_lora:]`` views),
plus the DSA indexer's keys ``[pages, page_size, index_head_dim]`` when configured. GQA
models store K and V ``[pages, page_size, kv_heads, head_dim]``. One extra page at the end
(the null page) absorbs writes for positions without a block and pads block tables.
The MTP layers have their own KV, indexed by the same block table.
"""

from __future__ import annotations

import torch

from executor.model_config import ExecModelConfig


class KVCache:
    """All layers' paged KV, one tensor per kind with the layer as the leading dim."""

    def __init__(self, cfg: ExecModelConfig, num_blocks: int, page_size: int, device: torch.device, dtype: torch.dtype):
        self.num_blocks, self.page_size, self.device, self.dtype = num_blocks, page_size, device, dtype
        self.null_page = num_blocks
        s, layers, pages = cfg.spec, cfg.num_cache_layers, num_blocks + 1
        self.latent = self.index_k = self.k = self.v = None
        if cfg.is_deepseek:
            self.latent = torch.zeros(layers, pages, page_size, s.mla.kv_lora_rank + s.mla.qk_rope_head_dim, dtype=dtype, device=device)
            if s.indexer is not None:
                self.index_k = torch.zeros(layers, pages, page_size, s.indexer.head_dim, dtype=dtype, device=device)
        else:
            self.k = torch.zeros(layers, pages, page_size, s.num_kv_heads, s.head_dim, dtype=dtype, device=device)
            self.v = torch.zeros_like(self.k)

    @staticmethod
    def bytes_per_block(cfg: ExecModelConfig, page_size: int, dtype: torch.dtype) -> int:
        """Device bytes one block (page) costs across all layers."""
        s, el = cfg.spec, torch.tensor([], dtype=dtype).element_size()
        if cfg.is_deepseek:
            per_tok = s.mla.kv_lora_rank + s.mla.qk_rope_head_dim + (s.indexer.head_dim if s.indexer else 0)
        else:
            per_tok = 2 * s.num_kv_heads * s.head_dim
        return per_tok * el * page_size * cfg.num_cache_layers

    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.latent, self.index_k, self.k, self.v) if t is not None)
