"""Which implementation runs each op on each device, and why.

Every op has implementations in preference order: vendor libraries (tier 2), Triton
(tier 1), the torch reference (tier 0, always there). Vendor libraries are probed lazily
(imported the first time an op is chosen or ``twinfer kernels`` asks), under their own
package names and bundled inside vLLM (``vllm.third_party.*``) or sgl-kernel, because the
PyPI ``deep-gemm``/``flash-mla``/``deep-ep`` packages are unbuildable stubs (KERNELS.md).

Users override the choice per op with ``TWINFER_KERNEL_<OP>=<name>`` (e.g.
``TWINFER_KERNEL_MLA_DECODE=torch``), ``TWINFER_KERNELS="mla_decode=triton,fp8_gemm=torch"``
or :func:`configure`. An implementation that takes only some calls (say, FlashMLA and page
size 64) declares ``declines``: a check on the call's signature, the op's cheap metadata
listed in :data:`SIGNATURES` (dtypes, shapes, strides, page size). The op facade
(``kernels.ops``) decides once per (op, device, signature) which implementation takes it and
reuses that decision, so a repeated call pays no check and no exception; it records which
one ran. An adapter may still raise :class:`Unsupported` (a vendor failure at run time, a
case its check lacks): the next one runs and that decline is remembered for the signature.
No torch import at module level: the CLI lists kernels without paying for torch until a
probe or a decision needs it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field


class Unsupported(Exception):
    """An implementation declines these arguments (shape, dtype, page size); try the next."""


@dataclass(frozen=True)
class Impl:
    """One implementation of one op."""

    op: str
    name: str                  # torch | sdpa | triton | flashmla | deepgemm | flashinfer | deepep
    tier: int                  # 0 reference, 1 triton, 2 vendor
    devices: tuple[str, ...]   # device types it runs on
    target: str                # "module:function" of the adapter, imported lazily
    library: str = ""          # library key probed before use ("" = none needed)
    min_capability: tuple[int, int] | None = None   # CUDA compute capability needed
    notes: str = ""            # constraints a user should know
    # why it does not take a call of this signature ("" = it takes it), given the op's SIGNATURES tuple unpacked;
    # None = it takes every call (or says so itself by raising Unsupported)
    declines: Callable[..., str] | None = None
    max_major: int | None = None   # newest CUDA major version it runs on (FA3: Hopper, 9); None: any


# --- which calls an implementation takes ------------------------------------------------------------------------
# op -> the call's signature: the cheap metadata (no device sync, no data read) on which its implementations' accept
# checks decide, computed from the op's arguments as kernels.ops passes them. It is the dispatcher's cache key, so it
# must hold everything a ``declines`` check reads, and little more (each distinct value is one decision). Ops not
# listed here key on :func:`generic_signature`. (``t.stride()[-1]``, not ``t.stride(-1)``: 0.1 vs 0.16 us on the CPU.)
SIGNATURES: dict[str, Callable[..., tuple]] = {
    "mla_decode": lambda q, kv_cache, block_table, seq_lens, scale, kv_rank, topk_indices=None, memo=None:
        (q.dtype, q.shape[-1], kv_cache.shape[1], kv_rank, topk_indices is None),
    "attention_prefill": lambda q, k, v, q_positions, scale, key_mask=None, bottom_right=False:
        (q.dtype, k.dtype, v.dtype, q.shape[1], k.shape[1], q.shape[-1], v.shape[-1], 0 < q.shape[0] <= k.shape[0],
         key_mask is None, bottom_right),
    # the last field: a decode-sized call (rows <= NARROW_GEMM_ROWS), where DeepGEMM declines narrow weights
    "fp8_gemm": lambda xq, xs, wq, ws, out_dtype=None: (xq.dtype, wq.dtype, xq.shape[-1], wq.shape[0], out_dtype,
                                                        xq.numel() <= NARROW_GEMM_ROWS * xq.shape[-1]),
    "grouped_gemm": lambda x, w, m_indices: (x.shape[0] % 64 == 0,),
    "moe_experts": lambda x, topk_weights, topk_ids, w13, w2, w13_scale=None, w2_scale=None:
        (x.dtype, x.dim(), topk_ids.shape[0], w13.shape[1], w13.shape[2], w13_scale is not None),
    "quant_fp8_act": lambda x: (x.dtype, x.dim(), x.shape[-1], x.stride()[-1]),
    "rms_norm": lambda x, weight, eps=1e-6: (x.dtype, x.shape[-1], x.stride()[-1]),
    "rope": lambda x, positions, cos_sin, interleaved, rows=None: (x.dtype, x.dim(), x.shape[-1], x.stride()[-1], cos_sin.dtype),
    "silu_mul": lambda gate, up: (gate.dtype, gate.dim(), gate.shape == up.shape, gate.stride()[-1], up.stride()[-1]),
}


def generic_signature(*args, **kwargs) -> tuple:
    """The key of an op without a SIGNATURES entry: each tensor's dtype, shape and strides, each plain value, anything
    else by its type name. Slower than a declared signature, fine where only a raised Unsupported needs a key."""
    import torch

    def meta(a):
        if isinstance(a, torch.Tensor):
            return (a.dtype, tuple(a.shape), a.stride())
        if a is None or isinstance(a, (bool, int, float, str, torch.dtype)):
            return a
        return type(a).__name__
    return tuple(meta(a) for a in args) + tuple((k, meta(v)) for k, v in sorted(kwargs.items()))


def _dtypes(*names: str) -> tuple:
    """torch dtypes by name (torch is imported at the first decision, not with this module)."""
    import torch
    return tuple(getattr(torch, n) for n in names)


_FLOATS = ("bfloat16", "float16", "float32")


def _pow2_16(x: int) -> bool:
    return x >= 16 and x & (x - 1) == 0


# Each check below mirrors its adapter's own (named in the docstring), which stays in the adapter as the backstop.

def _flashmla_declines(dtype, head_dim: int, page: int, kv_rank: int, dense: bool) -> str:
    """kernels.vendor.flashmla_decode."""
    if not dense:
        return "flashmla: the sparse (DSA) kernel needs an FP8 cache layout; dense only here"
    if dtype not in _dtypes("bfloat16") or page != 64 or head_dim != 576 or kv_rank != 512:
        return (f"flashmla: needs bf16, page size 64, head dim 576 (512 latent + 64 rope); got {dtype}, page {page}, "
                f"head dim {head_dim}, latent {kv_rank}")
    return ""


def _triton_mla_declines(dtype, head_dim: int, page: int, kv_rank: int, dense: bool) -> str:
    """kernels.triton_mla_decode.mla_decode."""
    if not dense:
        return "triton mla_decode: dense attention only"
    if not (_pow2_16(kv_rank) and _pow2_16(head_dim - kv_rank)) or dtype not in _dtypes("bfloat16", "float16"):
        return (f"triton mla_decode: bf16/fp16 with power-of-two latent and rope dims >= 16; got {dtype}, "
                f"latent {kv_rank}, rope {head_dim - kv_rank}")
    return ""


# Limits the accept checks read, defined here and imported by the adapters' modules (kernels.prefill_attention
# FLASH_MAX_HEAD_DIM / FLASH_DTYPES, kernels.vendor FUSED_MOE_MIN_TOKENS, with its measurement), which import this one
_FLASH_MAX_HEAD_DIM = 256
_FLASH_DTYPES = ("float16", "bfloat16")
_FUSED_MOE_MIN_TOKENS = 2048


def _flash_available() -> bool:
    """Whether this torch build has the flash SDPA backend."""
    import torch
    fn = getattr(torch.backends.cuda, "is_flash_attention_available", None)
    return bool(fn()) if fn is not None else True


def _flash_kernel_declines(who: str, q_dtype, k_dtype, v_dtype, no_mask: bool, bottom_right: bool) -> str:
    """What every FlashAttention kernel of a prefill chunk needs (the torch flash split and FA3): queries at the
    sequence's end, no key mask, fp16/bf16 throughout. ``who`` names the kernel in the reason."""
    if not bottom_right:
        return "needs queries at the sequence's end (bottom-right causal), decided by the caller"
    if not no_mask:
        return f"{who} takes no explicit mask (key_mask given)"
    if q_dtype not in _dtypes(*_FLASH_DTYPES) or k_dtype != q_dtype or v_dtype != q_dtype:
        return f"{who} runs fp16/bf16, got {q_dtype}"
    return ""


def _flash_prefill_declines(q_dtype, k_dtype, v_dtype, q_heads: int, kv_heads: int, dqk: int, dv: int, lengths_ok: bool,
                            no_mask: bool, bottom_right: bool) -> str:
    """kernels.prefill_attention.flash_decline, on a signature (its device check is the choice's: flash is listed for
    CUDA only)."""
    why = _flash_kernel_declines("flash", q_dtype, k_dtype, v_dtype, no_mask, bottom_right)
    if why:
        return why
    if kv_heads != q_heads:
        return "GQA (fewer KV heads) stays on SDPA"
    if dqk > _FLASH_MAX_HEAD_DIM or dqk % 8 or dv > dqk:
        return f"head dims q/k {dqk}, v {dv}: flash needs <= {_FLASH_MAX_HEAD_DIM}, a multiple of 8, v <= q/k"
    if not lengths_ok:
        return "no queries, or more queries than keys"
    if not _flash_available():
        return "this torch build has no flash attention"
    return ""


# FlashAttention-3 (Hopper) head dims: equal q/k and v head dims up to 256, or DeepSeek MLA's 192 / 128 (its
# ``hdimdiff`` build, the one vLLM's MLA prefill uses on sm90 without padding v)
_FA3_MAX_HEAD_DIM = 256
_FA3_DIFF_HEAD_DIMS = ((192, 128),)


def _fa3_prefill_declines(q_dtype, k_dtype, v_dtype, q_heads: int, kv_heads: int, dqk: int, dv: int, lengths_ok: bool,
                          no_mask: bool, bottom_right: bool) -> str:
    """kernels.vendor.fa3_prefill (CUDA: the choice's device; sm_9x: the choice's ``max_major``, and the adapter's)."""
    why = _flash_kernel_declines("fa3", q_dtype, k_dtype, v_dtype, no_mask, bottom_right)
    if why:
        return why
    if kv_heads < 1 or q_heads % kv_heads:
        return f"query heads {q_heads} must be a multiple of KV heads {kv_heads}"
    if dqk > _FA3_MAX_HEAD_DIM or dqk % 8 or (dv != dqk and (dqk, dv) not in _FA3_DIFF_HEAD_DIMS):
        return (f"head dims q/k {dqk}, v {dv}: fa3 needs equal dims <= {_FA3_MAX_HEAD_DIM} (multiple of 8) or "
                f"q/k, v in {list(_FA3_DIFF_HEAD_DIMS)}")
    if not lengths_ok:
        return "no queries, or more queries than keys"
    return ""


# DeepGEMM's dense GEMM does not split K: at <= 64 rows it runs one CTA per BLOCK_N columns, so a weight of N <= 1024
# columns occupies at most 16 of the H200's 132 SMs, where the Triton kernel splits K over them (its tuned table,
# kernels/configs). H200, benchmarks/gpu/issue18_h200/engine_ops_e83595f: 64 x 576 x 7168 (the KV down-projection)
# DeepGEMM 15.8 us, Triton 12.2 us; at 128 rows, and at 64 rows with N >= 1536, DeepGEMM was the faster one (within
# 4% where Triton led in the re-check, benchmarks/gpu/issue16_h200/ctx_mix_d995ef1: 576 columns 18.6 vs 17.7 us).
NARROW_GEMM_ROWS = 64
NARROW_GEMM_N = 1024


def _deepgemm_gemm_declines(x_dtype, w_dtype, k: int, n: int, out_dtype, decode_rows: bool = False) -> str:
    """kernels.vendor.deepgemm_fp8_gemm (CUDA: the choice's device)."""
    if out_dtype not in (None,) + _dtypes("bfloat16") or k % 128 or n % 64:
        return f"deepgemm fp8_gemm: bf16 output, K % 128 == 0, N % 64 == 0; got {out_dtype}, K {k}, N {n}"
    if decode_rows and n <= NARROW_GEMM_N and probe_library("triton")[0] and override_for("fp8_gemm") != "deepgemm":
        return (f"deepgemm fp8_gemm: N {n} <= {NARROW_GEMM_N} at <= {NARROW_GEMM_ROWS} rows fills few SMs without split-K; "
                "the Triton kernel splits K (force fp8_gemm=deepgemm to use it)")
    return ""


def _triton_gemm_declines(x_dtype, w_dtype, k: int, n: int, out_dtype, decode_rows: bool = False) -> str:
    """kernels.triton_fp8_gemm.fp8_gemm."""
    e4m3 = _dtypes("float8_e4m3fn")
    if k % 128 or x_dtype not in e4m3 or w_dtype not in e4m3:
        return f"triton fp8_gemm: needs e4m3 operands and K % 128 == 0; got {x_dtype} x {w_dtype}, K {k}"
    return ""


def _triton_grouped_declines(rows_ok: bool) -> str:
    """kernels.triton_grouped_gemm.grouped_gemm."""
    return "" if rows_ok else "triton grouped_gemm: rows must be a multiple of 64 (DeepGEMM pads runs to 128)"


def _deepgemm_moe_declines(dtype, dim: int, tokens: int, two_i: int, d: int, fp8: bool) -> str:
    """Also kernels.vendor.deepgemm_moe_experts' own check: decode-sized batches go to Triton unless
    moe_experts=deepgemm is forced or Triton is absent (both fixed for a choice: an override change clears choices)."""
    if tokens < _FUSED_MOE_MIN_TOKENS and override_for("moe_experts") != "deepgemm" and probe_library("triton")[0]:
        return (f"deepgemm moe_experts: {tokens} tokens < {_FUSED_MOE_MIN_TOKENS}: the Triton MoE is faster at decode "
                "(force moe_experts=deepgemm to use the masked layout)")
    if not fp8 or dim != 2:
        return "deepgemm moe_experts: block-scaled FP8 expert weights and 2-D activations only"
    if d % 128 or (two_i // 2) % 128:
        return f"deepgemm moe_experts: hidden and expert dims must be multiples of 128; got {d}, {two_i // 2}"
    return ""


def _triton_moe_declines(dtype, dim: int, tokens: int, two_i: int, d: int, fp8: bool) -> str:
    """kernels.triton_grouped_gemm.moe_experts."""
    if dtype not in _dtypes(*_FLOATS) or dim != 2:
        return f"triton moe_experts: 2-D bf16/fp16/fp32 activations only; got {dim}-D {dtype}"
    if fp8 and (d % 128 or (two_i // 2) % 128):
        return f"triton moe_experts fp8: hidden and expert dims must be multiples of 128; got {d}, {two_i // 2}"
    return ""


def _triton_quant_declines(dtype, dim: int, k: int, last_stride: int) -> str:
    """kernels.triton_rowwise.quant_fp8_act."""
    if dim != 2 or k % 128 or last_stride != 1 or dtype not in _dtypes(*_FLOATS):
        return f"triton quant_fp8_act: 2-D bf16/fp16/fp32 rows with unit column stride, K % 128 == 0; got {dim}-D {dtype}, K {k}"
    return ""


def _triton_rms_declines(dtype, d: int, last_stride: int) -> str:
    """kernels.triton_rowwise.rms_norm."""
    if dtype not in _dtypes(*_FLOATS) or last_stride != 1 or d > 16384:
        return f"triton rms_norm: bf16/fp16/fp32, unit last stride, last dim <= 16384; got {dtype}, dim {d}"
    return ""


def _triton_rope_declines(dtype, dim: int, d: int, last_stride: int, table_dtype) -> str:
    """kernels.triton_rowwise.rope."""
    half = d // 2
    if dim != 3 or last_stride != 1 or d % 2 or half < 1 or half & (half - 1) or table_dtype not in _dtypes("float32") \
            or dtype not in _dtypes(*_FLOATS):
        return f"triton rope: x [T, heads, d] bf16/fp16/fp32 with d/2 a power of two, fp32 cos/sin table; got {dim}-D {dtype}, d {d}"
    return ""


def _triton_silu_declines(dtype, dim: int, same_shape: bool, gate_stride: int, up_stride: int) -> str:
    """kernels.triton_rowwise.silu_mul."""
    if dim != 2 or not same_shape or gate_stride != 1 or up_stride != 1 or dtype not in _dtypes(*_FLOATS):
        return "triton silu_mul: 2-D bf16/fp16/fp32 gate and up of one shape, unit column stride"
    return ""


# library key -> import paths tried in order (own package, then bundled copies)
LIBRARIES: dict[str, tuple[str, ...]] = {
    "triton": ("triton",),
    "flashmla": ("flash_mla", "vllm.third_party.flashmla.flash_mla_interface", "sgl_kernel.flash_mla"),
    "deepgemm": ("deep_gemm", "vllm.third_party.deep_gemm", "sgl_kernel.deep_gemm"),
    "flashinfer": ("flashinfer",),
    # FlashAttention-3 as vLLM bundles it (vllm/vllm_flash_attn: its interface and the sm90 extension, probed by
    # importing the extension itself, so a build whose .so does not load is "not importable")
    "fa3": ("vllm.vllm_flash_attn._vllm_fa3_C",),
    "deepep": ("deep_ep", "sgl_kernel.deep_ep"),
}

_R = "kernels.reference"
_V = "kernels.vendor"
IMPLS: dict[str, list[Impl]] = {
    "mla_decode": [
        Impl("mla_decode", "flashmla", 2, ("cuda",), f"{_V}:flashmla_decode", "flashmla", (9, 0), "bf16, page 64, head dims 512+64",
             _flashmla_declines),
        Impl("mla_decode", "triton", 1, ("cuda",), "kernels.triton_mla_decode:mla_decode", "triton", (8, 0), "split-K flash-decoding",
             _triton_mla_declines),
        Impl("mla_decode", "torch_batched", 0, ("cpu", "cuda"), "kernels.torch_fast:mla_decode_batched",
             notes="one gather + batched matmuls; dense or DSA top-k"),
        Impl("mla_decode", "torch", 0, ("cpu", "cuda"), f"{_R}:mla_decode_paged", notes="gathers pages, loops over sequences"),
    ],
    "attention_prefill": [
        # FlashAttention-3 on Hopper: one varlen call, bottom-right causal, v at its own head dim (no split, no merge,
        # no padding); the flash split below serves where it is absent (not importable, not sm90)
        Impl("attention_prefill", "fa3", 2, ("cuda",), f"{_V}:fa3_prefill", "fa3", (9, 0),
             "FlashAttention-3 varlen (vLLM's build), sm90 only; bottom-right causal, no key mask, fp16/bf16",
             _fa3_prefill_declines, max_major=9),
        # MLA prefill chunks (queries at the sequence's end, no key mask, said by the caller: bottom_right=True) run as
        # two flash calls merged by log-sum-exp (kernels/prefill_attention.py): no per-shape plan as cuDNN, ~2.8x the
        # memory-efficient kernel (H200, benchmarks/gpu/issue16_h200/run5_summarize_646970b/log.txt.gz); the rest declines
        Impl("attention_prefill", "flash", 0, ("cuda",), "kernels.prefill_attention:attention_prefill_flash", min_capability=(8, 0),
             notes="torch flash, causal self part + cached part merged by LSE; bottom-right causal, no key mask, fp16/bf16",
             declines=_flash_prefill_declines),
        Impl("attention_prefill", "sdpa", 0, ("cuda",), "kernels.torch_fast:attention_sdpa", notes="torch SDPA with an explicit causal-offset mask"),
        Impl("attention_prefill", "torch", 0, ("cpu", "cuda"), "kernels.prefill_attention:attention_reference", notes="reference.attention"),
    ],
    "gqa_decode": [
        Impl("gqa_decode", "torch", 0, ("cpu", "cuda"), f"{_R}:paged_attention_decode"),
    ],
    "indexer_topk": [
        Impl("indexer_topk", "torch", 0, ("cpu", "cuda"), f"{_R}:topk_indices", notes="torch.topk; FlashInfer top_k is faster but JITs ~270 s"),
    ],
    "fp8_gemm": [
        Impl("fp8_gemm", "deepgemm", 2, ("cuda",), f"{_V}:deepgemm_fp8_gemm", "deepgemm", (9, 0), "1x128 act / 128x128 weight scales; JIT 3-8 s per shape",
             _deepgemm_gemm_declines),
        Impl("fp8_gemm", "triton", 1, ("cuda",), "kernels.triton_fp8_gemm:fp8_gemm", "triton", (8, 9), declines=_triton_gemm_declines),
        Impl("fp8_gemm", "torch", 0, ("cpu", "cuda"), f"{_R}:fp8_gemm_blockscaled", notes="dequantise then matmul"),
    ],
    "grouped_gemm": [
        Impl("grouped_gemm", "triton", 1, ("cuda",), "kernels.triton_grouped_gemm:grouped_gemm", "triton", (8, 0), "rows sorted by expert, blocks of 64",
             _triton_grouped_declines),
        Impl("grouped_gemm", "torch", 0, ("cpu", "cuda"), f"{_R}:grouped_gemm"),
    ],
    "moe_experts": [
        # The fused DeepGEMM path serves batches of 1024 tokens and more (vendor.FUSED_MOE_MIN_TOKENS): with its layout
        # work as Triton launches (kernels.triton_moe_layout) it took 5.50 ms at 4096 tokens, its two grouped GEMMs alone
        # 5.60, the Triton MoE 7.17; at 512 tokens the Triton MoE was faster, 3.29 vs 3.86 ms (H200,
        # benchmarks/gpu/issue18_h200/moe_layout_63a44f9). Smaller batches are declined by the adapter and run on Triton.
        Impl("moe_experts", "deepgemm", 2, ("cuda",), f"{_V}:deepgemm_moe_experts", "deepgemm", (9, 0),
             "fused: permute+quantise, FP8 grouped GEMMs (contiguous layout), SiLU+requantise, combine (Triton launches); "
             "batches of >= 1024 tokens only (4096 tokens: 5.50 ms vs Triton 7.17; 512: 3.86 vs 3.29 on the H200), "
             "smaller ones (decode goes to Triton too) run on Triton unless forced; FP8 weights only", _deepgemm_moe_declines),
        Impl("moe_experts", "triton", 1, ("cuda",), "kernels.triton_grouped_gemm:moe_experts", "triton", (8, 0),
             "align + two grouped GEMMs; serves batches under 1024 tokens and every batch without DeepGEMM", _triton_moe_declines),
        Impl("moe_experts", "torch", 0, ("cpu", "cuda"), f"{_R}:moe_experts", notes="loop over experts"),
    ],
    # row-wise ops fused into one launch each: eager steps pay ~10 us of host per torch op (issue 18); one call to
    # these Triton kernels costs 50-64 us of host on the H200 (benchmarks/gpu/issue18_h200/eager_8df7bd1)
    "quant_fp8_act": [
        Impl("quant_fp8_act", "triton", 1, ("cuda",), "kernels.triton_rowwise:quant_fp8_act", "triton", (8, 9),
             "1x128 FP8 activation groups in one launch; the scale as ATen computes it on CUDA (see triton_rowwise)",
             _triton_quant_declines),
        Impl("quant_fp8_act", "torch", 0, ("cpu", "cuda"), f"{_R}:quant_fp8_act", notes="9 torch ops"),
    ],
    "rms_norm": [
        Impl("rms_norm", "triton", 1, ("cuda",), "kernels.triton_rowwise:rms_norm", "triton", (8, 0), "one launch per call", _triton_rms_declines),
        Impl("rms_norm", "torch", 0, ("cpu", "cuda"), f"{_R}:rms_norm", notes="9 torch ops"),
    ],
    "rope": [
        Impl("rope", "triton", 1, ("cuda",), "kernels.triton_rowwise:rope", "triton", (8, 0), "x [T, heads, d]: one launch", _triton_rope_declines),
        Impl("rope", "torch", 0, ("cpu", "cuda"), f"{_R}:rope", notes="~12 torch ops"),
    ],
    "silu_mul": [
        Impl("silu_mul", "triton", 1, ("cuda",), "kernels.triton_rowwise:silu_mul", "triton", (8, 0), "one launch", _triton_silu_declines),
        Impl("silu_mul", "torch", 0, ("cpu", "cuda"), f"{_R}:silu_mul", notes="5 torch ops"),
    ],
    "sampling": [
        Impl("sampling", "torch", 0, ("cpu", "cuda"), f"{_R}:sample", notes="FlashInfer sampling JITs ~270 s: not worth it here"),
    ],
    "all_to_all": [
        Impl("all_to_all", "deepep", 2, ("cuda",), f"{_V}:deepep_unavailable", "deepep", (9, 0), "not on PyPI for torch 2.11",
             lambda *sig: "deepep: expert-parallel all-to-all is not wired in this build"),
        Impl("all_to_all", "torch", 0, ("cpu", "cuda"), "torch.distributed:all_to_all_single", notes="NCCL on GPU, gloo on CPU"),
    ],
}

# Vendor libraries worth listing even where no op routes to them yet.
EXTRA_PROBES = {"mla_decode": ["flashinfer"], "fp8_gemm": ["flashinfer"], "indexer_topk": ["flashinfer"], "sampling": ["flashinfer"]}

_overrides: dict[str, str] = {}
_probe_cache: dict[str, tuple[bool, str, str]] = {}
_fn_cache: dict[str, object] = {}


def configure(overrides: dict[str, str] | None) -> None:
    """Set per-op implementation overrides (config file or CLI); env vars still win."""
    _overrides.clear()
    for op, name in (overrides or {}).items():
        _check_override(op, name)
        _overrides[op] = name


def _check_override(op: str, name: str) -> None:
    from twinfer.errors import TwinferError
    if op not in IMPLS:
        raise TwinferError(f"kernel override: unknown op {op!r}; ops: {', '.join(sorted(IMPLS))}")
    names = [i.name for i in IMPLS[op]]
    if name not in names:
        raise TwinferError(f"kernel override {op}={name!r}: known implementations: {', '.join(names)}")


def override_for(op: str) -> str | None:
    """The user's forced implementation name for ``op``, if any."""
    env = os.environ.get(f"TWINFER_KERNEL_{op.upper()}")
    if env:
        _check_override(op, env)
        return env
    spec = os.environ.get("TWINFER_KERNELS", "")
    for part in filter(None, (p.strip() for p in spec.split(","))):
        k, _, v = part.partition("=")
        if k.strip() == op:
            _check_override(op, v.strip())
            return v.strip()
    return _overrides.get(op)


def probe_library(key: str) -> tuple[bool, str, str]:
    """(found, import path or '', reason). Imports the library: call only when needed."""
    if key in _probe_cache:
        return _probe_cache[key]
    errors = []
    with _import_env(key):
        for path in LIBRARIES[key]:
            try:
                importlib.import_module(path)
                _probe_cache[key] = (True, path, f"imported {path}")
                return _probe_cache[key]
            except Exception as e:  # ImportError, or a broken extension raising OSError/RuntimeError
                errors.append(f"{path}: {type(e).__name__}")
    _probe_cache[key] = (False, "", "not importable (" + "; ".join(errors) + ")")
    return _probe_cache[key]


def _import_env(key: str):
    """DeepGEMM reads its JIT cache dir, compiler and CUDA home from the environment at import: set them first."""
    if key == "deepgemm":
        from kernels.jit_cache import deepgemm_import_env
        return deepgemm_import_env()
    return contextlib.nullcontext()


def library_note(key: str) -> str:
    """What a found library runs with, for the reason text (DeepGEMM: its JIT compiler and cache)."""
    if key == "deepgemm" and _probe_cache.get(key, (False,))[0]:
        from kernels.jit_cache import describe
        return describe()
    return ""


def library_module(key: str):
    """The imported module of a library found by :func:`probe_library`."""
    ok, path, why = probe_library(key)
    if not ok:
        raise Unsupported(f"{key}: {why}")
    return importlib.import_module(path)


def device_capability(device: str) -> tuple[int, int] | None:
    """CUDA compute capability of the current device, None for CPU or without CUDA."""
    if device != "cuda":
        return None
    import torch
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability())


def usable(impl: Impl, device: str) -> tuple[bool, str]:
    """Can ``impl`` run on ``device`` here? With the reason either way."""
    if device not in impl.devices:
        return False, f"runs on {'/'.join(impl.devices)} only"
    if device == "cuda":
        cap = device_capability(device)
        if cap is None:
            return False, "no CUDA device"
        if impl.min_capability and cap < impl.min_capability:
            return False, f"needs sm_{impl.min_capability[0]}{impl.min_capability[1]}+, device is sm_{cap[0]}{cap[1]}"
        if impl.max_major is not None and cap[0] > impl.max_major:
            return False, f"runs on sm_{impl.max_major}x only, device is sm_{cap[0]}{cap[1]}"
    if impl.library:
        ok, _, why = probe_library(impl.library)
        if not ok:
            return False, why
        return True, why
    return True, "built in"


# distinct signatures remembered per choice; past it the decisions start over (a bound, not a tuning knob)
MAX_SIGNATURES = 4096


@dataclass
class Choice:
    """Implementations to try for one op on one device, best first, with the reason; and, filled in by the
    dispatcher, which candidate takes each call signature seen."""

    op: str
    device: str
    candidates: list[Impl] = field(default_factory=list)
    why: str = ""
    # signature -> index into candidates of the one that takes it (kernels.ops.call fills it in)
    decided: dict[tuple, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    # decisions depend on the signature: a candidate before the last has a check, or one raised Unsupported
    keyed: bool = field(default=False, init=False, repr=False, compare=False)
    signature: Callable[..., tuple] = field(default=generic_signature, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.keyed = any(c.declines is not None for c in self.candidates[:-1])
        self.signature = SIGNATURES.get(self.op, generic_signature)

    def decide(self, sig: tuple, start: int = 0) -> tuple[int, list[str]]:
        """The first candidate from ``start`` whose check takes ``sig`` (-1: none), and why the ones before it
        declined; remembered for ``sig``."""
        declined = []
        for i in range(start, len(self.candidates)):
            impl = self.candidates[i]
            why = impl.declines(*sig) if impl.declines is not None else ""
            if not why:
                break
            declined.append(f"{impl.name}: {why}")
        else:
            return -1, declined
        if len(self.decided) >= MAX_SIGNATURES:
            self.decided.clear()
        self.decided[sig] = i
        return i, declined


def choose(op: str, device: str) -> Choice:
    """Usable implementations of ``op`` on ``device`` in preference order (an override goes alone, then the reference)."""
    forced = override_for(op)
    impls = IMPLS[op]
    if forced:
        impl = next(i for i in impls if i.name == forced)
        ok, why = usable(impl, device)
        ref = [i for i in impls if i.tier == 0 and device in i.devices and i is not impl]
        if ok:
            return Choice(op, device, [impl] + ref, f"forced by override ({why})")
        return Choice(op, device, ref, f"override {forced!r} unusable: {why}; using the reference")
    cands, skipped = [], []
    for impl in impls:
        ok, why = usable(impl, device)
        if ok:
            cands.append(impl)
        else:
            skipped.append(f"{impl.name}: {why}")
    return Choice(op, device, cands, choice_reason(cands, skipped, len(impls)))


def choice_reason(cands: list[Impl], skipped: list[str], total: int) -> str:
    """Why the first candidate runs: its tier and what made it usable, and what was passed over."""
    if not cands:
        return "nothing usable" + (f" (skipped {'; '.join(skipped)})" if skipped else "")
    best = cands[0]
    tier = {2: "vendor library, preferred", 1: "Triton, the portable fallback", 0: "torch reference"}[best.tier]
    why = f"{best.name}: {tier}"
    if best.library:
        note = library_note(best.library)
        why += f" ({probe_library(best.library)[2]}{'; ' + note if note else ''})"
    above = [c.name for c in cands[1:] if c.tier > best.tier]
    if above:   # a vendor library is usable but ranked below on measurement: say why
        why += f"; ranked above {', '.join(above)}: {best.notes}"
    if skipped:
        why += f"; skipped {'; '.join(skipped)}"
    return why + f"; {len(cands)} of {total} usable"


def load(impl: Impl):
    """The callable behind ``impl`` (imported on first use)."""
    fn = _fn_cache.get(impl.target)
    if fn is None:
        mod, _, name = impl.target.partition(":")
        fn = getattr(importlib.import_module(mod), name)
        _fn_cache[impl.target] = fn
    return fn


def describe(device: str) -> list[dict]:
    """One row per (op, implementation): found?, chosen?, why. For ``twinfer kernels``."""
    rows = []
    for op, impls in IMPLS.items():
        choice = choose(op, device)
        chosen = choice.candidates[0].name if choice.candidates else None
        for impl in impls:
            ok, why = usable(impl, device)
            found = probe_library(impl.library)[0] if impl.library else True
            rows.append({"op": op, "impl": impl.name, "tier": impl.tier, "found": found, "usable": ok,
                         "chosen": impl.name == chosen, "why": why if impl.name != chosen else choice.why,
                         "notes": impl.notes})
        for lib in EXTRA_PROBES.get(op, []):
            if any(i.library == lib for i in impls):
                continue
            ok, _, why = probe_library(lib)
            rows.append({"op": op, "impl": lib, "tier": 2, "found": ok, "usable": False, "chosen": False,
                         "why": ("found, not wired for this op: " + why) if ok else why, "notes": "probe only"})
    return rows
