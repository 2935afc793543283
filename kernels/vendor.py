"""Tier 2: adapters from our op contracts to vendor kernels (FlashMLA, DeepGEMM, FlashAttention-3), imported lazily.

Each adapter checks what the library accepts and raises ``Unsupported`` otherwise (the
registry then runs the next tier). A library call that fails at run time (a JIT without a
compiler, an ABI mismatch) is also turned into ``Unsupported`` and remembered in
``failures`` so the op stops trying it; ``kernels.ops`` records what ran instead.
Usage per KERNELS.md: FlashMLA q ``[B,s_q,H,576]``, cache ``[pages,64,1,576]``, ``dv=512``;
DeepGEMM on Hopper with FP32 scales and ``disable_ue8m0_cast=True``.
"""

from __future__ import annotations

import functools

import torch

from kernels import jit_cache
from kernels.reference import host_to_device
from kernels.registry import (_FUSED_MOE_MIN_TOKENS, SIGNATURES, Unsupported, _deepgemm_moe_declines, _fa3_prefill_declines,
                              library_module)

failures: dict[str, str] = {}


def _guard(name: str):
    if name in failures:
        raise Unsupported(f"{name} failed earlier: {failures[name]}")


def _flashmla_api():
    mod = library_module("flashmla")
    if not hasattr(mod, "flash_mla_with_kvcache"):  # the package root re-exports the interface
        mod = getattr(mod, "flash_mla_interface", mod)
    return mod.get_mla_metadata, mod.flash_mla_with_kvcache


def flashmla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                    scale: float, kv_rank: int, topk_indices: torch.Tensor | None = None,
                    memo: dict | None = None) -> torch.Tensor:
    """``reference.mla_decode_paged`` through FlashMLA's dense decode (bf16, page 64, 512+64).

    FlashMLA splits the batch's KV over the SMs by a scheduling metadata computed from the KV lengths (the current
    interface fills it at the first call that gets an empty one; the older one computes it in ``get_mla_metadata``,
    a kernel of its own). Every layer of a step has the same lengths and shapes, so with ``memo`` (the forward's
    scratch, ``ForwardBatch.memo``) it is made once per step and reused, as FlashMLA's interface allows ("reuse the
    same sched_meta ... when the tensor shapes and the values of cache_seqlens ... remain the same") and vLLM's
    backend does: one metadata per step instead of one per layer. Keyed on the very ``seq_lens`` tensor."""
    _guard("flashmla")
    if topk_indices is not None:
        raise Unsupported("flashmla: the sparse (DSA) kernel needs an FP8 cache layout; dense only here")
    b, s_q, h, d = q.shape
    if q.dtype != torch.bfloat16 or kv_cache.shape[1] != 64 or d != 576 or kv_rank != 512 or not q.is_cuda:
        raise Unsupported("flashmla: needs bf16 on CUDA, page size 64, head dim 576 (512 latent + 64 rope)")
    get_meta, fwd = _flashmla_api()
    lens = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.to(torch.int32)
    key = ("flashmla", b, s_q, h)
    kept = memo.get(key) if memo is not None else None
    try:
        if kept is not None and kept[0] is seq_lens:
            meta, splits = kept[1], kept[2]
        else:
            meta, splits = get_meta(lens, s_q * h, 1)   # old API uses the args; the new one ignores them
            if memo is not None:
                memo[key] = (seq_lens, meta, splits)
        out, _ = fwd(q if q.is_contiguous() else q.contiguous(), kv_cache.unsqueeze(2),
                     block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32), lens, 512,
                     meta, splits, softmax_scale=scale, causal=True)
    except Exception as e:  # noqa: BLE001 - a vendor failure must not take the engine down
        failures["flashmla"] = f"{type(e).__name__}: {e}"[:300]
        raise Unsupported(failures["flashmla"]) from e
    return out


@functools.lru_cache(maxsize=16)
def _is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


@functools.cache
def _fa3_varlen():
    """FA3's varlen entry point, resolved once (every prefill chunk of every layer calls it): the sm90 extension
    (registers torch.ops._vllm_fa3_C), then its Python interface."""
    library_module("fa3")
    import importlib
    return importlib.import_module("vllm.vllm_flash_attn.flash_attn_interface").flash_attn_varlen_func


@functools.lru_cache(maxsize=4096)
def _cu_seqlens(n: int, s: int, device: torch.device, stream: int) -> torch.Tensor:
    # through pinned memory (host_to_device): a copy from pageable memory makes the host wait for every kernel queued
    # on the stream (CUDA's API sync behaviour), which in a piecewise forward is the layer's graph piece before the call
    return host_to_device(torch.tensor([0, n, 0, s], dtype=torch.int32), device)


def cu_seqlens(n: int, s: int, device: torch.device) -> torch.Tensor:
    """``[0, n, 0, s]`` (int32) on ``device``: FA3's cumulative query and key lengths of one chunk of ``n`` queries
    over ``s`` keys. Made once per ``(n, s)`` and stream, read only afterwards (every layer of a forward, and later
    steps with the same chunk shape, share it): the copy is stream-ordered before its first use, and the per-layer
    call costs a dictionary lookup. The copy it replaced came from pageable memory, one host sync per chunk per
    layer."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    return _cu_seqlens(int(n), int(s), device, stream)


def fa3_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor, scale: float,
                key_mask: torch.Tensor | None = None, bottom_right: bool = False) -> torch.Tensor:
    """Registry adapter (op ``attention_prefill``): one FlashAttention-3 varlen call over a prefill chunk whose
    ``n = len(q)`` queries are the last ``n`` of ``len(k)`` keys (``bottom_right``, said by the caller; FA's causal
    mask is aligned bottom-right, so ``q_positions`` is not read). v keeps its own head dim (MLA: 192 / 128).
    ``cu_seqlens`` come from :func:`cu_seqlens` (made once per chunk shape, never a host sync). Declines as
    ``registry._fa3_prefill_declines`` says, and off sm90."""
    _guard("fa3")
    why = _fa3_prefill_declines(*SIGNATURES["attention_prefill"](q, k, v, q_positions, scale, key_mask, bottom_right))
    if why:
        raise Unsupported(why)
    if not q.is_cuda or not _is_sm90(q.device.index if q.device.index is not None else torch.cuda.current_device()):
        raise Unsupported("fa3: Hopper (sm90) only")
    fn = _fa3_varlen()
    n, s = q.shape[0], k.shape[0]
    cu = cu_seqlens(n, s, q.device)
    try:
        return fn(q, k, v, max_seqlen_q=n, cu_seqlens_q=cu[:2], max_seqlen_k=s, cu_seqlens_k=cu[2:],
                  softmax_scale=scale, causal=True, fa_version=3)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a vendor failure must not take the engine down
        failures["fa3"] = f"{type(e).__name__}: {e}"[:300]
        raise Unsupported(failures["fa3"]) from e


def _dg():
    mod = library_module("deepgemm")
    jit_cache.state["used"] = True   # DeepGEMM picks its compiler at this process's first call: fixed from now on
    return mod


def deepgemm_fp8_gemm(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
                      out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``reference.fp8_gemm_blockscaled`` through DeepGEMM ``fp8_gemm_nt`` (bf16 out)."""
    _guard("deepgemm")
    m, k = xq.shape
    n = wq.shape[0]
    if not xq.is_cuda or out_dtype != torch.bfloat16 or k % 128 or n % 64:
        raise Unsupported("deepgemm fp8_gemm: CUDA, bf16 output, K % 128 == 0, N % 64 == 0")
    dg = _dg()
    out = torch.empty(m, n, dtype=torch.bfloat16, device=xq.device)
    try:
        try:
            dg.fp8_gemm_nt((xq, xs.float()), (wq, ws.float()), out, disable_ue8m0_cast=True)
        except TypeError:  # older releases have no ue8m0 switch (and no ue8m0 path on Hopper)
            dg.fp8_gemm_nt((xq, xs.float()), (wq, ws.float()), out)
    except Exception as e:  # noqa: BLE001
        failures["deepgemm"] = f"{type(e).__name__}: {e}"[:300]
        raise Unsupported(failures["deepgemm"]) from e
    return out


def deepgemm_grouped_fp8_contiguous(aq: torch.Tensor, as_: torch.Tensor, bq: torch.Tensor, bs: torch.Tensor,
                                    m_indices: torch.Tensor) -> torch.Tensor:
    """DeepGEMM ``m_grouped_fp8_gemm_nt_contiguous``: rows sorted by expert, runs padded to 128, padding -1."""
    _guard("deepgemm")
    dg = _dg()
    out = torch.empty(aq.shape[0], bq.shape[1], dtype=torch.bfloat16, device=aq.device)
    try:
        try:
            dg.m_grouped_fp8_gemm_nt_contiguous((aq, as_.float()), (bq, bs.float()), out, m_indices.to(torch.int32),
                                                disable_ue8m0_cast=True)
        except TypeError:
            dg.m_grouped_fp8_gemm_nt_contiguous((aq, as_.float()), (bq, bs.float()), out, m_indices.to(torch.int32))
    except Exception as e:  # noqa: BLE001
        failures["deepgemm"] = f"{type(e).__name__}: {e}"[:300]
        raise Unsupported(failures["deepgemm"]) from e
    return out


def deepgemm_grouped_fp8_masked(aq: torch.Tensor, as_: torch.Tensor, bq: torch.Tensor, bs: torch.Tensor,
                                masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
    """DeepGEMM ``m_grouped_fp8_gemm_nt_masked``: ``[E, max_m, K]`` rows, ``masked_m[e]`` valid per expert."""
    _guard("deepgemm")
    dg = _dg()
    out = torch.empty(aq.shape[0], aq.shape[1], bq.shape[1], dtype=torch.bfloat16, device=aq.device)
    try:
        try:
            dg.m_grouped_fp8_gemm_nt_masked((aq, as_.float()), (bq, bs.float()), out, masked_m, expected_m,
                                            disable_ue8m0_cast=True)
        except TypeError:
            dg.m_grouped_fp8_gemm_nt_masked((aq, as_.float()), (bq, bs.float()), out, masked_m, expected_m)
    except Exception as e:  # noqa: BLE001
        failures["deepgemm"] = f"{type(e).__name__}: {e}"[:300]
        raise Unsupported(failures["deepgemm"]) from e
    return out


# Below 2k tokens the Triton MoE is faster on the H200, so the registry entry declines those batches (Triton runs next)
# unless the user forces ``moe_experts=deepgemm``. Measured in one process, CUDA-graph device ms, Triton (its block
# rule) vs this path (benchmarks/gpu/issue16_h200/run24_calibration_moe_b66d980/moe_block_m.json): 256 tokens 2.88 vs
# 3.68, 512 3.21 vs 3.85, 1024 3.50 vs 4.11, 1536 3.98 vs 4.41, 2048 4.51 vs 4.52 (a tie), 3072 6.21 vs 5.02, 4096
# 7.13 vs 5.54, 8192 13.10 vs 8.13. The switch was 1024 (log-linear between 512 and 4096 of an earlier bench,
# moe_layout_63a44f9), where the Triton path is 15% faster.
FUSED_MOE_MIN_TOKENS = _FUSED_MOE_MIN_TOKENS   # defined with the registry's accept check, which reads it


def _contiguous_alignment(dg) -> int:
    """Rows each expert's run is padded to: what DeepGEMM's contiguous kernel is set to (128 on Hopper by default;
    ``set_mk_alignment_for_contiguous_layout`` changes it, and with it the kernel's BLOCK_M on SM90)."""
    get = getattr(dg, "get_mk_alignment_for_contiguous_layout", None)
    return int(get()) if get is not None else 128


def _glue():
    """The Triton layout kernels when Triton is importable, else the torch ops."""
    from kernels import fused_moe
    from kernels.registry import probe_library
    return fused_moe.triton_glue() if probe_library("triton")[0] else fused_moe.TORCH_GLUE


def deepgemm_fused_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                       w2: torch.Tensor, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                       glue=None) -> torch.Tensor:
    """``reference.moe_experts`` through the fused path of ``kernels.fused_moe`` on DeepGEMM's grouped GEMMs, any batch
    (masked layout up to 128 tokens, contiguous above); ``glue``: the layout kernels (default: Triton when importable)."""
    from kernels import fused_moe
    _guard("deepgemm")
    if w13_scale is None or not x.is_cuda or x.dim() != 2:
        raise Unsupported("deepgemm moe_experts: block-scaled FP8 expert weights on CUDA only")
    e, two_i, d = w13.shape
    if d % 128 or (two_i // 2) % 128:
        raise Unsupported("deepgemm moe_experts: hidden and expert dims must be multiples of 128")
    dg = _dg()   # raises Unsupported when the library is absent
    return fused_moe.moe_experts(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale,
                                 deepgemm_grouped_fp8_masked, deepgemm_grouped_fp8_contiguous,
                                 glue if glue is not None else _glue(), _contiguous_alignment(dg))


def deepgemm_moe_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                         w2: torch.Tensor, w13_scale: torch.Tensor | None = None,
                         w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The registry's ``moe_experts=deepgemm``: the fused path for prefill-sized batches; decode batches are declined
    (the Triton MoE measured faster there, see ``FUSED_MOE_MIN_TOKENS``) unless the user forced this implementation
    or Triton is absent (the next candidate would be the torch reference)."""
    why = _deepgemm_moe_declines(*SIGNATURES["moe_experts"](x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale))
    if why:   # the registry's accept check, here as the backstop for a direct call
        raise Unsupported(why)
    return deepgemm_fused_moe(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale)


def deepep_unavailable(*args, **kwargs):
    """DeepEP is probed and listed only: single-GPU runs need no all-to-all."""
    raise Unsupported("deepep: expert-parallel all-to-all is not wired in this build")
