"""JIT warm-up at engine start: run every FP8 GEMM and MoE shape the model has once, with progress.

DeepGEMM compiles per kernel configuration (N, K and a tile chosen from M) and Triton per
specialisation; doing that inside the first timed step (or inside CUDA-graph capture) makes the
first requests slow and the twin's calibration wrong. :func:`jit_plan` lists the shapes from the
model's modules (duck-typed: FP8 linears carry ``weight_scale_inv``, MoE experts ``w13_scale_inv``),
:func:`jit_warmup` runs each through the same ``kernels.ops`` facade serving uses (so the
implementation the registry chose is what compiles), printing one line per shape with its time.
Compiled DeepGEMM kernels persist in ``kernels.jit_cache``'s folder, so a second start is quick.
When DeepGEMM serves the dense FP8 GEMMs, :func:`precompile` first compiles those shapes in parallel
worker processes (``kernels.jit_pool``; nvcc takes ~3.5 s a shape) unless an earlier start already did
(a marker in the cache folder); if NVRTC was asked for and fails there, DeepGEMM is switched to nvcc
before this process compiles anything, and the pool runs again.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from kernels import ops


@dataclass(frozen=True)
class WarmItem:
    """One call to make: op, shape, and the module whose weights it uses."""

    op: str                 # fp8_gemm | moe_experts
    m: int                  # tokens
    n: int
    k: int
    groups: int = 0         # experts (moe_experts)
    module: object = None

    def label(self) -> str:
        if self.op == "moe_experts":
            return f"moe_experts E={self.groups} T={self.m} 2I={self.n} D={self.k}"
        return f"fp8_gemm M={self.m} N={self.n} K={self.k}"


def token_counts(decode_sizes, max_batched_tokens: int, step_buckets=()) -> tuple[int, ...]:
    """Token counts to compile for: every decode graph size, then prefill sizes 128, 256, .. up to the step budget,
    and ``step_buckets``: the token buckets piecewise CUDA graphs capture (their capture runs each once; a bucket the
    warm-up missed compiled there, one at a time: H200 run 16, 137 s of capture with DeepGEMM's dense GEMMs).

    DeepGEMM picks its tile configuration from M, so prefill steps of a size never seen JIT a new kernel
    mid-run (seen on the H200: ``twinfer run`` right after a decode-only warm-up stalled in prefill
    compiles). Powers of two cover the M ranges its heuristic switches on; any gap still compiles once
    and then sits in the on-disk cache."""
    pre, m = [], 128
    while m < max_batched_tokens:
        pre.append(m)
        m *= 2
    return tuple(sorted(set(decode_sizes) | set(pre) | {max_batched_tokens} | {int(b) for b in step_buckets}))


EAGER_ROW_STEP = 64   # DeepGEMM's smallest BLOCK_M: its tile choice sees M only through ceil(M / BLOCK_M)


def eager_gemm_rows(max_batched_tokens: int, step_buckets=(), step: int = EAGER_ROW_STEP) -> tuple[int, ...]:
    """Dense-GEMM row counts a step can run at outside every captured size: the multiples of ``step`` above the
    largest piecewise bucket (without buckets, every prefill or mixed step runs eagerly: from ``step`` on) up to the
    step budget.

    Those steps run at their exact row count, and DeepGEMM JIT-compiles the tile configuration its heuristic picks for
    that M the first time it sees one (H200 run 19: a 5719-token step, past the 4096-token bucket, took 3438 ms once on
    the DeepGEMM engine). The heuristic sees M only through the tile counts ceil(M / BLOCK_M), BLOCK_M a multiple of
    64, so every M shares its configuration with the next multiple of 64: warming those covers every row count (a gap
    would still compile once, then sit in the on-disk cache)."""
    top = max([int(b) for b in step_buckets] or [0])
    first = (top // step + 1) * step
    return tuple(range(first, int(max_batched_tokens) + 1, step))


def jit_plan(model: torch.nn.Module, token_counts: tuple[int, ...], gemm_counts: tuple[int, ...] = ()) -> list[WarmItem]:
    """Distinct (op, shape) calls of ``model``'s FP8 GEMMs and MoE layers at each token count; the dense GEMMs also at
    ``gemm_counts`` (``eager_gemm_rows``)."""
    gemm_m = tuple(sorted(set(token_counts) | set(gemm_counts)))
    seen, items = set(), []
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if isinstance(w, torch.Tensor) and w.dtype == torch.float8_e4m3fn and hasattr(mod, "weight_scale_inv"):
            key = ("fp8_gemm", w.shape[0], w.shape[1])
            if key not in seen:
                seen.add(key)
                items += [WarmItem("fp8_gemm", m, w.shape[0], w.shape[1], module=mod) for m in gemm_m]
        w13 = getattr(mod, "w13", None)
        if isinstance(w13, torch.Tensor) and w13.dtype == torch.float8_e4m3fn and hasattr(mod, "w13_scale_inv"):
            key = ("moe_experts",) + tuple(w13.shape)
            if key not in seen:
                seen.add(key)
                e, two_i, d = w13.shape
                items += [WarmItem("moe_experts", m, two_i, d, groups=e, module=mod) for m in token_counts]
    return items


def _run(item: WarmItem, device: torch.device, gen: torch.Generator, top_k: int) -> str:
    """Make the call once; returns the implementation that ran."""
    mod = item.module
    x = torch.randn(item.m, item.k, device=device, generator=gen, dtype=torch.bfloat16)
    if item.op == "fp8_gemm":
        xq, xs = ops.quant_fp8_act(x)   # the activation quantisation serving runs (a Triton kernel on CUDA) compiles too
        ops.fp8_gemm(xq, xs, mod.weight, mod.weight_scale_inv, torch.bfloat16)
    else:
        k = min(top_k, item.groups)
        ids = torch.rand(item.m, item.groups, device=device, generator=gen).topk(k, dim=-1).indices
        wts = torch.full((item.m, k), 1.0 / k, device=device)
        ops.moe_experts(x, wts, ids, mod.w13, mod.w2, mod.w13_scale_inv, mod.w2_scale_inv)
    return ops.used.get(item.op, "?")


def jit_warmup(model: torch.nn.Module, device: torch.device, token_counts: tuple[int, ...], top_k: int = 8,
               log: Callable[[str], None] | None = None, gemm_counts: tuple[int, ...] = ()) -> list[dict]:
    """Compile every planned shape now (CUDA only); one progress line each. Rows: label, impl, seconds.
    ``gemm_counts``: more row counts for the dense FP8 GEMMs only (``eager_gemm_rows``)."""
    if torch.device(device).type != "cuda":
        return []
    from kernels.jit_cache import jit_cache_dir
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    items = jit_plan(model, tuple(sorted(set(token_counts))), tuple(gemm_counts))
    cache, src = jit_cache_dir()
    log(f"kernel JIT warm-up: {len(items)} shapes (DeepGEMM cache {cache}, {src})")
    t_all = time.perf_counter()
    pre = precompile(items, torch.device(device), log)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for i, item in enumerate(items, 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            impl = _run(item, device, gen, top_k)
        torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        rows.append({"shape": item.label(), "impl": impl, "seconds": round(dt, 3)})
        log(f"  [{i}/{len(items)}] {item.label()} -> {impl} ({dt:.2f} s)")
    if pre and all(r["impl"] == "deepgemm" for r in rows if r["shape"] in pre["labels"]):
        _mark_done(pre["marker"])
    log(f"kernel JIT warm-up done in {time.perf_counter() - t_all:.1f} s")
    return rows


def deepgemm_items(items: list[WarmItem], device: torch.device) -> list[WarmItem]:
    """The planned dense FP8 GEMMs DeepGEMM will run: it is the registry's first choice for fp8_gemm, and takes the
    item's call (``registry`` declines narrow weights at decode rows)."""
    from kernels import registry
    if not any(i.op == "fp8_gemm" for i in items):
        return []
    ch = ops.choice("fp8_gemm", device)
    if not ch.candidates or ch.candidates[0].name != "deepgemm":
        return []
    fp8 = torch.float8_e4m3fn
    # the item's call signature as ``_run`` makes it (registry.SIGNATURES), decided as ``kernels.ops.call`` decides it
    return [i for i in items if i.op == "fp8_gemm"
            and ch.decide((fp8, fp8, i.k, i.n, torch.bfloat16, i.m <= registry.NARROW_GEMM_ROWS))[0] == 0]


def precompile(items: list[WarmItem], device: torch.device, log: Callable[[str], None]) -> dict | None:
    """Compile DeepGEMM's shapes in a process pool before the in-process pass; None when there is nothing to do.

    Skipped when an earlier start compiled the same shapes with the same compiler (marker file in the
    JIT cache), or with fewer than two workers. Returns the marker path and the labels it covers; the
    caller writes the marker once its own pass ran every one of them on DeepGEMM."""
    from kernels import jit_cache, jit_pool
    from twinfer.errors import TwinferError
    todo = deepgemm_items(items, device)
    if not todo:
        return None
    marker = _marker_path(todo)
    info = {"marker": marker, "labels": {i.label() for i in todo}}
    try:
        workers = jit_pool.worker_count(len(todo))
    except ValueError as e:
        raise TwinferError(str(e)) from None
    if marker.exists():
        log(f"  DeepGEMM: {len(todo)} GEMM shapes compiled by an earlier start ({jit_cache.state['note']}): loading from the cache")
        return info
    tasks = [(i.m, i.n, i.k) for i in todo]
    free = _free_bytes(device) if workers >= 2 else None
    if free is not None:
        fit = jit_pool.memory_workers(tasks, workers, free)
        if fit < workers:
            log(f"  DeepGEMM: {fit} of {workers} worker processes fit in {free / 2**30:.1f} GiB free "
                f"({jit_pool.WORKER_CONTEXT_BYTES / 2**30:.1f} GiB context + the largest GEMM's operands each)")
            workers = fit
    if workers < 2:
        return info
    for attempt in range(2):
        log(f"  DeepGEMM: compiling {len(tasks)} GEMM shapes in {workers} worker processes ({jit_cache.state['note']})")
        t0 = time.perf_counter()
        try:
            res = jit_pool.compile_parallel(tasks, workers, device.index or 0, log)
        except Exception as e:  # noqa: BLE001 - the pool only saves time: the in-process pass still compiles
            log(f"  DeepGEMM pool failed ({type(e).__name__}: {e}); compiling in this process")
            break
        bad = [r for r in res if not r["ok"]]
        log(f"  DeepGEMM pool: {len(res) - len(bad)}/{len(res)} compiled in {time.perf_counter() - t0:.1f} s")
        failed = [r for r in bad if not r["error"].startswith(("not run", "worker died"))]   # compiles, not workers
        if not failed or attempt or jit_cache.state["compiler"] != "nvrtc":
            break
        if not jit_cache.fall_back_to_nvcc(failed[0]["error"]):
            break
        log(f"  NVRTC failed on {len(failed)} shapes ({failed[0]['error'][:160]}): switching DeepGEMM to nvcc")
        info["marker"] = _marker_path(todo)
    return info


def _free_bytes(device: torch.device) -> int | None:
    """Free device memory in bytes now, None where it cannot be read (no CUDA)."""
    try:
        return int(torch.cuda.mem_get_info(device)[0])
    except (RuntimeError, AssertionError, ValueError):
        return None


def _marker_path(todo: list[WarmItem]) -> Path:
    """A file in DeepGEMM's cache named by what was compiled: shapes, compiler, toolkit, GPU, library path."""
    from kernels import jit_cache, registry
    cache, _ = jit_cache.jit_cache_dir()
    key = json.dumps({"shapes": sorted((i.m, i.n, i.k) for i in todo), "compiler": jit_cache.state["compiler"],
                      "cuda_home": jit_cache.state["cuda_home"], "shim": jit_cache.state["shim"],
                      "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "",
                      "lib": registry.probe_library("deepgemm")[1]}, sort_keys=True)
    return cache / "twinfer_warm" / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".done")


def _mark_done(marker: Path) -> None:
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    except OSError:   # read-only cache: the next start runs the pool again
        pass
