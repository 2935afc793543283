"""Which implementation runs each op on each device, and why.

Every op has implementations in preference order: vendor libraries (tier 2), Triton
(tier 1), the torch reference (tier 0, always there). Vendor libraries are probed lazily
(imported the first time an op is chosen or ``twinfer kernels`` asks), under their own
package names and bundled inside vLLM (``vllm.third_party.*``) or sgl-kernel, because the
PyPI ``deep-gemm``/``flash-mla``/``deep-ep`` packages are unbuildable stubs (KERNELS.md).

Users override the choice per op with ``TWINFER_KERNEL_<OP>=<name>`` (e.g.
``TWINFER_KERNEL_MLA_DECODE=torch``), ``TWINFER_KERNELS="mla_decode=triton,fp8_gemm=torch"``
or :func:`configure`. An implementation that cannot handle a call's arguments (say, a
page size FlashMLA does not take) raises :class:`Unsupported` and the next one runs; the
op facade (``kernels.ops``) records which one did. No torch import at module level: the
CLI lists kernels without paying for torch until a probe needs it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
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


# library key -> import paths tried in order (own package, then bundled copies)
LIBRARIES: dict[str, tuple[str, ...]] = {
    "triton": ("triton",),
    "flashmla": ("flash_mla", "vllm.third_party.flashmla.flash_mla_interface", "sgl_kernel.flash_mla"),
    "deepgemm": ("deep_gemm", "vllm.third_party.deep_gemm", "sgl_kernel.deep_gemm"),
    "flashinfer": ("flashinfer",),
    "deepep": ("deep_ep", "sgl_kernel.deep_ep"),
}

_R = "kernels.reference"
_V = "kernels.vendor"
IMPLS: dict[str, list[Impl]] = {
    "mla_decode": [
        Impl("mla_decode", "flashmla", 2, ("cuda",), f"{_V}:flashmla_decode", "flashmla", (9, 0), "bf16, page 64, head dims 512+64"),
        Impl("mla_decode", "triton", 1, ("cuda",), "kernels.triton_mla_decode:mla_decode", "triton", (8, 0), "split-K flash-decoding"),
        Impl("mla_decode", "torch_batched", 0, ("cpu", "cuda"), "kernels.torch_fast:mla_decode_batched",
             notes="one gather + batched matmuls; dense or DSA top-k"),
        Impl("mla_decode", "torch", 0, ("cpu", "cuda"), f"{_R}:mla_decode_paged", notes="gathers pages, loops over sequences"),
    ],
    "attention_prefill": [
        # MLA prefill chunks (queries at the sequence's end, no key mask, said by the caller: bottom_right=True) run as
        # two flash calls merged by log-sum-exp (kernels/prefill_attention.py): no per-shape plan as cuDNN, ~2.8x the
        # memory-efficient kernel (H200, benchmarks/gpu/issue16_h200/run5_summarize_646970b/log.txt); the rest declines
        Impl("attention_prefill", "flash", 0, ("cuda",), "kernels.prefill_attention:attention_prefill_flash", min_capability=(8, 0),
             notes="torch flash, causal self part + cached part merged by LSE; bottom-right causal, no key mask, fp16/bf16"),
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
        Impl("fp8_gemm", "deepgemm", 2, ("cuda",), f"{_V}:deepgemm_fp8_gemm", "deepgemm", (9, 0), "1x128 act / 128x128 weight scales; JIT 3-8 s per shape"),
        Impl("fp8_gemm", "triton", 1, ("cuda",), "kernels.triton_fp8_gemm:fp8_gemm", "triton", (8, 9)),
        Impl("fp8_gemm", "torch", 0, ("cpu", "cuda"), f"{_R}:fp8_gemm_blockscaled", notes="dequantise then matmul"),
    ],
    "grouped_gemm": [
        Impl("grouped_gemm", "triton", 1, ("cuda",), "kernels.triton_grouped_gemm:grouped_gemm", "triton", (8, 0), "rows sorted by expert, blocks of 64"),
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
             "smaller ones (decode goes to Triton too) run on Triton unless forced; FP8 weights only"),
        Impl("moe_experts", "triton", 1, ("cuda",), "kernels.triton_grouped_gemm:moe_experts", "triton", (8, 0),
             "align + two grouped GEMMs; serves batches under 1024 tokens and every batch without DeepGEMM"),
        Impl("moe_experts", "torch", 0, ("cpu", "cuda"), f"{_R}:moe_experts", notes="loop over experts"),
    ],
    # row-wise ops fused into one launch each: eager steps pay ~10 us of host per torch op (issue 18); one call to
    # these Triton kernels costs 50-64 us of host on the H200 (benchmarks/gpu/issue18_h200/eager_8df7bd1)
    "quant_fp8_act": [
        Impl("quant_fp8_act", "triton", 1, ("cuda",), "kernels.triton_rowwise:quant_fp8_act", "triton", (8, 9),
             "1x128 FP8 activation groups in one launch; the scale as ATen computes it on CUDA (see triton_rowwise)"),
        Impl("quant_fp8_act", "torch", 0, ("cpu", "cuda"), f"{_R}:quant_fp8_act", notes="9 torch ops"),
    ],
    "rms_norm": [
        Impl("rms_norm", "triton", 1, ("cuda",), "kernels.triton_rowwise:rms_norm", "triton", (8, 0), "one launch per call"),
        Impl("rms_norm", "torch", 0, ("cpu", "cuda"), f"{_R}:rms_norm", notes="9 torch ops"),
    ],
    "rope": [
        Impl("rope", "triton", 1, ("cuda",), "kernels.triton_rowwise:rope", "triton", (8, 0), "x [T, heads, d]: one launch"),
        Impl("rope", "torch", 0, ("cpu", "cuda"), f"{_R}:rope", notes="~12 torch ops"),
    ],
    "silu_mul": [
        Impl("silu_mul", "triton", 1, ("cuda",), "kernels.triton_rowwise:silu_mul", "triton", (8, 0), "one launch"),
        Impl("silu_mul", "torch", 0, ("cpu", "cuda"), f"{_R}:silu_mul", notes="5 torch ops"),
    ],
    "sampling": [
        Impl("sampling", "torch", 0, ("cpu", "cuda"), f"{_R}:sample", notes="FlashInfer sampling JITs ~270 s: not worth it here"),
    ],
    "all_to_all": [
        Impl("all_to_all", "deepep", 2, ("cuda",), f"{_V}:deepep_unavailable", "deepep", (9, 0), "not on PyPI for torch 2.11"),
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
    if impl.library:
        ok, _, why = probe_library(impl.library)
        if not ok:
            return False, why
        return True, why
    return True, "built in"


@dataclass
class Choice:
    """Implementations to try for one op on one device, best first, with the reason."""

    op: str
    device: str
    candidates: list[Impl] = field(default_factory=list)
    why: str = ""


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
