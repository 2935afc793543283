"""Building blocks shared by the model families: linear (BF16 or block-scaled FP8), norms, RoPE, MLP."""

from __future__ import annotations

import math

import torch
from torch import nn

from executor.model_config import RopeConfig
from kernels import ops
from kernels import reference as ref


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with W in the model dtype, or FP8 with 128x128 block scales.

    FP8 follows DeepSeek-V3's recipe (weights 128x128 blocks, activations quantised per token
    per 128 columns at run time); ``weight_scale_inv`` is the multiplier back to real
    values, named as in DeepSeek's FP8 checkpoints so they load unchanged.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, fp8: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.fp8 = fp8 and in_features % ref.FP8_BLOCK == 0
        if self.fp8:
            self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn), requires_grad=False)
            nb_out = (out_features + ref.FP8_BLOCK - 1) // ref.FP8_BLOCK
            self.weight_scale_inv = nn.Parameter(torch.ones(nb_out, in_features // ref.FP8_BLOCK), requires_grad=False)
        else:
            self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The FP8 activation groups of ``x`` this layer would compute (None for a BF16 layer): linears that read the
        same input (q_a/kv_a, gate/up) quantise it once and pass it to :meth:`forward`."""
        return ops.quant_fp8_act(x.reshape(-1, self.in_features)) if self.fp8 else None

    def forward(self, x: torch.Tensor, quant: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if not self.fp8:
            return nn.functional.linear(x, self.weight, self.bias)
        shape = x.shape
        xq, xs = quant if quant is not None else self.quantize(x)
        y = ops.fp8_gemm(xq, xs, self.weight, self.weight_scale_inv, x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)

    def dense_weight(self) -> torch.Tensor:
        """The weight as a float tensor in the activation dtype (dequantised if FP8)."""
        if self.fp8:
            return ref.dequant_fp8_weight(self.weight, self.weight_scale_inv)
        return self.weight


def shared_quant(x: torch.Tensor, *linears: Linear) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``x`` quantised once for several FP8 linears that all read it (None unless all are FP8 of one width)."""
    if all(lin.fp8 and lin.in_features == linears[0].in_features for lin in linears):
        return linears[0].quantize(x)
    return None


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm with weight and bias (the DSA indexer's key norm)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ref.layer_norm(x, self.weight, self.bias, self.eps)


def _yarn_inv_freq(dim: int, cfg: RopeConfig) -> torch.Tensor:
    """YaRN-interpolated inverse frequencies (DeepSeek-V3 modeling code, yarn_find_correction_range)."""
    base = cfg.theta
    freq_extra = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freq_inter = freq_extra / cfg.factor

    def corr_dim(rot: float) -> float:
        return (dim * math.log(cfg.original_max_position / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(cfg.beta_fast), corr_dim(cfg.beta_slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    mask = 1.0 - ramp
    return freq_inter * (1 - mask) + freq_extra * mask


def _llama3_inv_freq(dim: int, cfg: RopeConfig) -> torch.Tensor:
    """Llama-3.1 frequency scaling (HF _compute_llama3_parameters)."""
    inv = 1.0 / (cfg.theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    low_wl = cfg.original_max_position / cfg.low_freq_factor
    high_wl = cfg.original_max_position / cfg.high_freq_factor
    wl = 2 * math.pi / inv
    smooth = (cfg.original_max_position / wl - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
    scaled = torch.where(wl > low_wl, inv / cfg.factor, inv)
    mid = (wl <= low_wl) & (wl >= high_wl)
    return torch.where(mid, (1 - smooth) * inv / cfg.factor + smooth * inv, scaled)


def rope_cache(dim: int, max_pos: int, cfg: RopeConfig, device=None, dtype=torch.float32) -> torch.Tensor:
    """``[max_pos, dim]`` (float32; float64 for fp64 models): cos in the first half, sin in the second."""
    if cfg.kind == "yarn":
        inv = _yarn_inv_freq(dim, cfg)
    elif cfg.kind == "llama3":
        inv = _llama3_inv_freq(dim, cfg)
    else:
        inv = 1.0 / (cfg.theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    scale = cfg.cos_sin_scale()   # YaRN's attention factor on cos/sin
    return torch.cat((freqs.cos() * scale, freqs.sin() * scale), dim=-1).to(dtype).to(device)


class MLP(nn.Module):
    """SwiGLU feed-forward (dense layers and shared experts), HF parameter names."""

    def __init__(self, hidden: int, inter: int, fp8: bool = False):
        super().__init__()
        self.gate_proj = Linear(hidden, inter, fp8=fp8)
        self.up_proj = Linear(hidden, inter, fp8=fp8)
        self.down_proj = Linear(inter, hidden, fp8=fp8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quant = shared_quant(x, self.gate_proj, self.up_proj)
        g = self.gate_proj(x, quant)
        u = self.up_proj(x, quant)
        return self.down_proj(ops.silu_mul(g, u))


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, hidden: int, eps: float, self_attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, batch, kv) -> torch.Tensor:
        return self.after_attention(x, self.self_attn(self.input_layernorm(x), batch, kv))

    def after_attention(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """The block's tail once attention produced ``attn_out``: residual, norm, MLP/MoE, residual (the middle of a
        piecewise CUDA graph piece, executor/piecewise_graphs.py)."""
        x = x + attn_out
        return x + self.mlp(self.post_attention_layernorm(x))
