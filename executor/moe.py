"""Mixture-of-experts FFN: router, routed experts (stacked for grouped kernels), shared experts.

Routed expert weights are stacked ``w13 [E, 2I, D]`` (gate rows, then up rows) and
``w2 [E, D, I]`` so one grouped-GEMM call serves all experts; the loader fills them from
HF's per-expert tensors. ``router_bias`` is the executor's own knob (zero for real
weights): dummy weights route near-uniformly, so a Zipf-like bias reproduces the skewed
expert load seen in production (``--routing-skew``).
"""

from __future__ import annotations

import torch
from torch import nn

from costmodels.model_spec import MoEConfig
from executor.layers import MLP
from kernels import ops
from kernels import reference as ref

# set while CUDA graphs are captured (executor.cuda_graphs): the torch reference MoE (unique/nonzero
# per expert, data-dependent shapes) is swapped for the dense masked variant below
GRAPH_SAFE = False


def expert_counts(ids: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Tokens per expert without a host sync (``torch.bincount`` on CUDA reads the max back): graph-safe."""
    flat = ids.reshape(-1)
    return torch.zeros(n_experts, dtype=torch.int64, device=ids.device).scatter_add_(0, flat.long(), torch.ones_like(flat, dtype=torch.int64))


def moe_experts_dense(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                      w2: torch.Tensor) -> torch.Tensor:
    """Static-shape MoE: every token through every expert, combined with a dense ``[T, E]`` weight mask.

    The function of ``reference.moe_experts`` (exact in BF16/FP32; FP8 weights are dequantised and
    activations not re-quantised) and graph-capturable; costs all experts'
    FLOPs, so it is only the fallback when no grouped kernel serves the device.
    """
    t, e = x.shape[0], w13.shape[0]
    inter = w13.shape[1] // 2
    mask = torch.zeros(t, e, dtype=torch.float32, device=x.device).scatter_add_(1, topk_ids.long(), topk_weights.float())
    xf = ref._up(x)
    y = torch.zeros(t, x.shape[1], dtype=xf.dtype, device=x.device)
    for i in range(e):
        h = xf @ w13[i].to(xf.dtype).t()
        a = nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y += (a @ w2[i].to(xf.dtype).t()) * mask[:, i:i + 1].to(xf.dtype)
    return y.to(x.dtype)


class Router(nn.Module):
    """HF names: ``gate.weight`` and (sigmoid routing) ``gate.e_score_correction_bias``."""

    def __init__(self, n_experts: int, hidden: int, with_bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, hidden), requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(n_experts), requires_grad=False) if with_bias else None


class Experts(nn.Module):
    """Stacked routed-expert weights, BF16 or FP8 with 128x128 block scales."""

    def __init__(self, n: int, hidden: int, inter: int, fp8: bool):
        super().__init__()
        self.fp8 = fp8 and hidden % ref.FP8_BLOCK == 0 and inter % ref.FP8_BLOCK == 0
        dt = torch.float8_e4m3fn if self.fp8 else torch.float32
        self.w13 = nn.Parameter(torch.empty(n, 2 * inter, hidden, dtype=dt), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(n, hidden, inter, dtype=dt), requires_grad=False)
        if self.fp8:
            b = ref.FP8_BLOCK
            self.w13_scale_inv = nn.Parameter(torch.ones(n, 2 * inter // b, hidden // b), requires_grad=False)
            self.w2_scale_inv = nn.Parameter(torch.ones(n, hidden // b, inter // b), requires_grad=False)

    def dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Weights in float (dequantised when FP8) for the reference path."""
        if not self.fp8:
            return self.w13, self.w2
        b = ref.FP8_BLOCK
        def dq(w, s):
            return (w.float().view(w.shape[0], s.shape[1], b, s.shape[2], b) * s[:, :, None, :, None]).view(w.shape)
        return dq(self.w13, self.w13_scale_inv), dq(self.w2, self.w2_scale_inv)


class MoE(nn.Module):
    """Router + routed experts + optional shared experts (DeepSeek-V3, Qwen3-MoE)."""

    def __init__(self, m: MoEConfig, hidden: int, routed_scaling_factor: float, norm_topk_prob: bool, fp8: bool = False):
        super().__init__()
        self.cfg, self.scaling, self.norm_topk_prob = m, routed_scaling_factor, norm_topk_prob
        self.gate = Router(m.n_routed_experts, hidden, with_bias=m.scoring == "sigmoid")
        self.experts = Experts(m.n_routed_experts, hidden, m.moe_intermediate_size, fp8)
        shared = getattr(m, "shared_intermediate_size", None) or m.moe_intermediate_size * m.n_shared_experts
        self.shared_experts = MLP(hidden, shared, fp8) if m.n_shared_experts else None
        self.register_buffer("router_bias", torch.zeros(m.n_routed_experts), persistent=False)
        self.last_ids: torch.Tensor | None = None   # expert ids of the last forward (load stats, counted on demand)

    @property
    def expert_counts(self) -> torch.Tensor | None:
        """Tokens per expert in the last forward (counted when asked, not on every step's layer loop)."""
        return None if self.last_ids is None else expert_counts(self.last_ids, self.cfg.n_routed_experts)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T,k] float32, expert ids [T,k])."""
        xf = ref._up(x)   # once: each call is a cast of the whole [T, hidden] batch
        logits = nn.functional.linear(xf, self.gate.weight.to(xf.dtype)) + self.router_bias
        m = self.cfg
        if m.scoring == "sigmoid":
            return ref.route_sigmoid_grouped(logits, self.gate.e_score_correction_bias, m.top_k, m.n_group,
                                             m.topk_group, self.scaling, self.norm_topk_prob)
        w, ids = ref.route_softmax_topk(logits, m.top_k, self.norm_topk_prob)
        return w * self.scaling, ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, ids = self.route(x)
        self.last_ids = ids
        if GRAPH_SAFE and ops.choice("moe_experts", x.device).candidates[0].name == "torch":
            y = moe_experts_dense(x, w, ids, *self.experts.dense())
        elif self.experts.fp8:
            y = ops.moe_experts(x, w, ids, self.experts.w13, self.experts.w2,
                                self.experts.w13_scale_inv, self.experts.w2_scale_inv)
        else:
            y = ops.moe_experts(x, w, ids, self.experts.w13, self.experts.w2)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y
