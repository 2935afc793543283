"""Measure this executor on the current device: op micro-benchmarks, a grid of step shapes, the engine loop.

``calibrate(...)`` builds the engine (``LLMEngine.from_args``, any ``--num-layers``), then

1. **ops**: the executor's own ``Linear`` (BF16 or block-scaled FP8, whatever kernel the
   registry picks) over a grid of row counts; turned into the profile's ``gemm_mem`` (over
   bytes moved) and ``gemm_compute`` (over rows) efficiency tables against the hardware
   catalog's ceilings;
2. **steps**: synthetic plans run straight on the ``ModelRunner`` (decode batches over batch
   size x context length, prefill chunks over length and cached context, mixed steps), each
   once to warm up (JIT) and then ``repeats`` times, median wall time (host + device, what a
   step really costs this engine);
3. **loop**: a few closed batches replayed through the real engine loop (``replay``), which
   measures the loop's own time around each runner step (schedule, complete, bookkeeping);

in the order ``measure_grid`` gives (decode-only shapes on a cool GPU, the loop, the eager step warm-up of
``executor.synthetic_steps``, settle, the eager shapes; every point logs the GPU's SM clock and temperature), with
every request sampling at ``executor.synthetic_steps.MEASURE_TEMPERATURE`` as validation's replays do, and fits the step model (``costmodels.step_fit.fit_step_profile``). The result is a
``CalibrationProfile`` with provenance (GPU, driver, torch, kernel backends, date, command).

The offline replay loop it drives (``executor/replay.py``) is the one ``twinfer run``, ``twinfer validate``
and ``twinfer tune`` use.
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
import subprocess
import time

import numpy as np
import torch

from costmodels.calibration import (CalibrationProfile, EffTable, MoELayerTable, PrefillChunkTable, eff_table, host_speed_note,
                                    kv_expand_table, linear_tables, moe_layer_table, prefill_chunk_table, sample_table)
from costmodels.hardware import get_hardware
from costmodels.step_fit import fit_step_profile, nnls_abs
from costmodels.step_profile import HostTerms, LoopTerms, StepPoint, clip_terms
from executor.engine import LLMEngine, SamplingParams
from executor.host_probe import host_probe
from executor.replay import fresh_engine, replay
from executor.synthetic_steps import MEASURE_TEMPERATURE, drop_plan, fresh_chunk_step, probe_new_shape, synthetic_plan, warm_steps
from kernels import ops, vendor
from kernels.measured import spill_copies
from scheduler.config import SchedulerConfig, token_budget_for
from twinfer.config import validate


# ----------------------------------------------------------------------------- provenance
def device_provenance(device: str) -> dict:
    """GPU name, driver, torch/triton versions, host CPU."""
    info = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
            "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, capability=list(torch.cuda.get_device_capability()))
        try:
            info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"],
                                                capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as e:  # noqa: BLE001
            info["nvidia_smi"] = f"unavailable: {e}"
        try:
            import triton
            info["triton"] = triton.__version__
        except Exception:  # noqa: BLE001
            pass
    else:
        info["gpu"] = "cpu"
    return info


def hardware_name(device: str) -> str:
    """Hardware catalog entry for the device (the GPU's own when the catalog has it, else H200 as a basis)."""
    if device == "cuda":
        name = torch.cuda.get_device_name(0).upper()
        for cand in ("H200", "H100", "H800", "B200", "B300", "GB200", "GB300", "MI355X"):
            if cand in name:
                try:
                    get_hardware(cand)
                    return cand
                except Exception:  # noqa: BLE001
                    break
    return "H200"


# ----------------------------------------------------------------------------- timing
class _Clock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def gpu_state(device: torch.device) -> dict:
    """The GPU's SM clock (MHz) and temperature (C) now, from NVML; {} where unreadable (CPU, no NVML bindings).
    GPU Boost lowers the clock as the chip warms, so a grid measured hot runs slower than serving measured cool."""
    out: dict = {}
    if device.type != "cuda":
        return out
    for key, fn in (("sm_clock_mhz", torch.cuda.clock_rate), ("gpu_temp_c", torch.cuda.temperature)):
        try:
            out[key] = float(fn(device))
        except Exception:  # noqa: BLE001 - a diagnostic: no NVML, no reading
            pass
    return out


def _state_text(st: dict) -> str:
    return (f" @ {st['sm_clock_mhz']:.0f} MHz" if "sm_clock_mhz" in st else "") + (f" {st['gpu_temp_c']:.0f} C" if "gpu_temp_c" in st else "")


def _median_time(fn, clock: _Clock, repeats: int, warmup: int = 1) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    clock.sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        clock.sync()
        ts.append(time.perf_counter() - t0)
    med = statistics.median(ts)
    return med, (max(ts) - min(ts)) / med if med > 0 else 0.0


def _graph_device_time(fn, device: torch.device, replays: int = 10, batches: int = 3) -> float | None:
    """Seconds of ``fn``'s device work alone: captured once in a CUDA graph (after two runs on a side stream, for JIT
    and autotuning outside the capture), then ``replays`` back-to-back replays between two CUDA events, median of
    ``batches``. None off CUDA or when ``fn`` cannot be captured (the eager wall time stands alone then). What a step
    pays for the op inside a decode graph or a piecewise piece, without the eager launch cost a host-bound call adds."""
    if device.type != "cuda":
        return None
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize(device)
        ts = []
        for _ in range(batches):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(replays):
                graph.replay()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3 / replays)
        del graph
        return statistics.median(ts)
    except torch.OutOfMemoryError:
        raise
    except Exception:  # noqa: BLE001 - an op that cannot be captured keeps its eager time only
        torch.cuda.synchronize(device)
        return None


def _spin_cycles(seconds: float) -> int:
    """Cycles for ``torch.cuda._sleep`` to hold the GPU at least ``seconds`` (at most 0.5 s): counted at 2.1 GHz,
    above any current SM clock, so a slower clock only spins longer."""
    return int(min(seconds, 0.5) * 2.1e9)


def _queued_device_time(fn, device: torch.device, host_s: float, repeats: int = 5) -> float | None:
    """Seconds of ``fn``'s device work when the GPU never waits for the host: a spin kernel long enough to cover the
    host issue of ``repeats`` calls (``host_s`` each, measured eagerly, times 2) goes first, then the calls, timed
    between two CUDA events. For ops that cannot be captured in a CUDA graph (a host-to-device copy of per-call
    metadata, as FlashAttention-3's ``cu_seqlens``) and run eagerly between graph pieces, where a device-bound step
    hides their launch. None off CUDA or where torch has no spin kernel."""
    spin = getattr(torch.cuda, "_sleep", None)
    if device.type != "cuda" or spin is None:
        return None
    cycles = _spin_cycles(2.0 * host_s * repeats)
    fn()
    torch.cuda.synchronize(device)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spin(cycles)
    a.record()
    for _ in range(repeats):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / repeats


# ----------------------------------------------------------------------------- ops
def bench_sampler(compute_logits, vocab: int, hidden: int, device: torch.device, act: torch.dtype, repeats: int,
                  batches: list[int], gen: torch.Generator) -> list[dict]:
    """``sample`` points: what a step runs after its forward (ModelRunner.sample_on_device), the logits GEMM over the
    sampled rows' hidden states (``compute_logits``), then seeded sampling, no top-k / top-p, host generators
    (RequestState), the knobs on the host as the runner passes them; per batch its eager seconds (``time_s``: host
    and device, as a synchronous step pays them) and, on CUDA, its device work alone (``device_s``: launched behind a
    spin kernel, ``_queued_device_time``; a pipelined loop hides the rest, the per-row generator draws and the
    launches, under the device: H200 run 23's decode steps ran 2-6% under a model that took the eager seconds)."""
    clock = _Clock(device)
    out = []
    for b in batches:
        hid = torch.randn(b, hidden, generator=gen, device=device, dtype=torch.float32).to(act)
        temp = torch.full((b,), 0.8)
        top_k = torch.zeros((b,), dtype=torch.int64)
        top_p = torch.ones((b,))
        gens = [torch.Generator().manual_seed(i) for i in range(b)]
        fn = lambda: ops.sample(compute_logits(hid), temp, top_k, top_p, gens)  # noqa: E731
        ops.reset_used()
        with torch.inference_mode():
            t, spread = _median_time(fn, clock, repeats)
            dev_s = _queued_device_time(fn, device, t)
        out.append({"op": "sample", "batch": b, "vocab": vocab, "with_logits": True, "hidden": hidden, "time_s": t,
                    "spread": spread, "backend": ops.reset_used().get("sampling", "?"),
                    **({"device_s": dev_s} if dev_s is not None else {})})
    return out


def bench_gemm_shapes(engine: LLMEngine, rows: list[int], replays: int = 10) -> list[dict]:
    """``gemm`` points: each distinct FP8 weight GEMM of the engine's model (N x K, its own weights and scales) at
    every row count in ``rows``, the GEMM kernel alone on pre-quantised activations (``ops.fp8_gemm``, the library the
    registry picks), device seconds in a CUDA graph that calls it over enough weight copies that none stays in L2
    (as the committed op tables were timed, ``benchmarks/gpu/op_tables.py``; a step reads every weight once). The
    model's own table at the rows its steps run (the token buckets): a tiled GEMM is a staircase in rows that a table
    at powers of 2 cannot show, and each shape picks its own tiles (H200 run 26: one shape's staircase applied to
    all made the grid's device work worse). CUDA only; [] elsewhere or for a model without FP8 weights."""
    dev = engine.runner.device
    if dev.type != "cuda":
        return []
    shapes: dict[tuple[int, int], torch.nn.Module] = {}
    for mod in engine.runner.model.modules():
        w = getattr(mod, "weight", None)
        if isinstance(w, torch.Tensor) and w.dtype == torch.float8_e4m3fn and hasattr(mod, "weight_scale_inv"):
            shapes.setdefault((int(w.shape[0]), int(w.shape[1])), mod)
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for (n, k), mod in sorted(shapes.items()):
        copies = spill_copies(n * k, 16)
        ws = [(mod.weight, mod.weight_scale_inv)] + [(mod.weight.clone(), mod.weight_scale_inv.clone()) for _ in range(copies - 1)]
        for m in rows:
            x = torch.randn(m, k, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
            with torch.inference_mode():
                xq, xs = ops.quant_fp8_act(x)
                ops.reset_used()

                def fn(xq=xq, xs=xs):
                    for wq, sc in ws:
                        ops.fp8_gemm(xq, xs, wq, sc, torch.bfloat16)
                fn()
                backend = ops.used.get("fp8_gemm", "?")
                t = _graph_device_time(fn, dev, replays=replays)
            if t is not None:
                out.append({"op": "gemm", "m": int(m), "n": n, "k": k, "dtype": "fp8", "device_s": t / copies,
                            "time_s": t / copies, "copies": copies, "backend": backend})
            del x, xq, xs
        del ws
    torch.cuda.empty_cache()
    return out


def linear_rows(full: bool, buckets=()) -> list[int]:
    """Row counts the Linear is timed at: every factor of 2 from 8 to 8192 (run 22's grid, H200, left the held device
    work of eager steps -4..-5% at 256-304 rows and +3..+9% at 64-136 where the table had points every factor of 4),
    plus every token bucket the piecewise CUDA graphs pad a step to (``buckets``): a step's GEMMs run at exactly those
    rows, and a tiled GEMM's time is a staircase in rows (a 272-row bucket pays three 128-row tiles where 256 pays two)
    that interpolation between powers of 2 cannot see. ``full`` False (CPU, --quick): four sizes."""
    if not full:
        return [1, 8, 64, 256]
    return sorted({1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192} | {int(b) for b in buckets if 0 < int(b) <= 16384})


def bench_linear(engine: LLMEngine, rows: list[int], repeats: int) -> list[dict]:
    """The executor's Linear (K = hidden, N = 2 x hidden) over row counts: seconds, FLOPs, bytes."""
    from executor.layers import Linear
    from kernels import reference as ref

    spec = engine.cfg.spec
    dev = engine.runner.device
    fp8 = _is_fp8(engine)
    k = spec.hidden_size
    n = 2 * spec.hidden_size
    act = engine.runner.kv.dtype if dev.type == "cuda" else torch.float32
    lin = Linear(k, n, fp8=fp8).to(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(n, k, generator=g, device=dev, dtype=torch.float32) / k ** 0.5
    if lin.fp8:
        q, sc = ref.quant_fp8_weight(w)
        lin.weight.data.copy_(q)
        lin.weight_scale_inv.data.copy_(sc)
    else:
        lin.weight.data = w.to(act)
    wbytes = n * k * (1.0 if lin.fp8 else lin.weight.element_size())
    clock = _Clock(dev)
    out = []
    for m in rows:
        x = torch.randn(m, k, generator=g, device=dev, dtype=torch.float32).to(act)
        ops.reset_used()
        with torch.inference_mode():
            t, spread = _median_time(lambda: lin(x), clock, repeats)
            backend = ops.reset_used().get("fp8_gemm", "torch")
            dev_s = _graph_device_time(lambda: lin(x), dev)   # the GEMM as a decode graph or a piecewise piece runs it
        out.append({"op": "linear", "m": m, "k": k, "n": n, "dtype": "fp8" if lin.fp8 else str(act).replace("torch.", ""),
                    "time_s": t, "spread": spread, "flops": 2.0 * m * n * k,
                    "bytes": wbytes + 2.0 * m * (k + n) * x.element_size() / 2, "backend": backend,
                    **({"device_s": dev_s} if dev_s is not None else {})})
    return out


# the grid's cached levels of the ``attn_prefill_chunk`` table (beyond the largest, costmodels.calibration.PrefillChunkTable
# extrapolates along the last two levels' slope, flagged)
CHUNK_CACHED = [0, 1024, 2048, 4096, 6144]


def bench_prefill_chunks(mla, cache: torch.Tensor, max_len: int, timed, randn, news: list[int], cacheds: list[int],
                         expand_keys: list[int]) -> list[dict]:
    """``attn_prefill_chunk`` points (one prefill chunk's attention, ``new`` x ``cached`` tokens, as
    ``MLAAttention.prefill_attend`` runs it) and ``kv_expand`` points (the chunk's keys and values gathered and
    up-projected, ``MLAAttention.prefill_expand``, over ``expand_keys`` keys) of one MLA layer, shapes within
    ``max_len`` tokens. ``timed(fn) -> (seconds, spread)``, ``randn(*shape)``: the caller's clock and draws. On CUDA
    each point also carries ``device_s``, its device time with the launch hidden behind a spin kernel."""
    dev = cache.device
    page = cache.shape[1]
    pages = cache.shape[0]
    dqk, dv, dn, dr = mla.dn + mla.dr, mla.dv, mla.dn, mla.dr
    out: list[dict] = []
    for c in cacheds:
        for n in news:
            if n + c > max_len:
                continue
            s_keys = c + n
            qn = randn(n, mla.h, dn)
            qp = randn(n, mla.h, dr)
            kn = randn(s_keys, mla.h, dn)
            vv = randn(s_keys, mla.h, dv)
            kp = randn(s_keys, dr)
            pos = torch.arange(c, c + n, device=dev)
            qq = torch.cat((qn, qp), dim=-1)   # the piecewise graphs' query buffer holds them side by side
            ops.reset_used()
            try:
                t, spread = timed(lambda: mla.prefill_attend(qn, qp, kn, vv, kp, pos, None, q=qq))
            except RuntimeError as e:  # e.g. out of memory at the largest shape: keep the rest of the table
                out.append({"op": "attn_prefill_chunk_failed", "new": n, "cached": c, "time_s": 0.0, "error": str(e)[:200]})
                continue
            flops = 2.0 * mla.h * (dqk + dv) * (n * c + n * (n + 1) / 2)
            backend = ops.reset_used().get("attention_prefill", "?")
            with torch.inference_mode():   # the chunk's device time with its launch hidden, as a device-bound step
                dev_s = _queued_device_time(lambda: mla.prefill_attend(qn, qp, kn, vv, kp, pos, None, q=qq), dev, t)
            ops.reset_used()
            out.append({"op": "attn_prefill_chunk", "new": n, "cached": c, "heads": mla.h, "d_qk": dqk, "d_v": dv,
                        "time_s": t, "spread": spread, "flops": flops, "tflops": flops / t / 1e12, "backend": backend,
                        **({"device_s": dev_s} if dev_s is not None else {})})
            del qn, qp, kn, vv, kp, qq

    # the chunk's keys and values as the executor builds them (MLAAttention.prefill_expand: its sequence's latents
    # gathered at their cache slots and up-projected by kv_b_proj, BF16), over keys (cached + new): eager between the
    # piecewise graphs, on the real rows. The step model had priced it as an analytic BF16 GEMM, and the grid's
    # cached-context steps ran 0.91-0.96x the model (H200 run 18)
    for keys in expand_keys:
        need = -(-keys // page)
        if keys > max_len or need > pages - 1:
            continue
        slots = torch.arange(keys, device=dev)   # pages 0..need-1 in order: position p sits at slot p
        try:
            t, spread = timed(lambda: mla.prefill_expand(cache, slots))
        except RuntimeError as e:  # e.g. out of memory at the largest: keep the rest
            out.append({"op": "kv_expand_failed", "keys": keys, "time_s": 0.0, "error": str(e)[:200]})
            continue
        with torch.inference_mode():
            dev_s = _queued_device_time(lambda: mla.prefill_expand(cache, slots), dev, t)
        out.append({"op": "kv_expand", "keys": keys, "heads": mla.h, "d_nope": mla.dn, "d_v": mla.dv, "rank": mla.rank,
                    "time_s": t, "spread": spread, **({"device_s": dev_s} if dev_s is not None else {})})
    return out


def bench_ops(engine: LLMEngine, repeats: int, quick: bool = False) -> list[dict]:
    """Per-op micro-benchmarks of the engine's own kernels (whatever the registry picks), beyond ``Linear``:

    - ``mla_decode``: paged MLA decode over batch x context (KV bytes read -> achieved bandwidth);
    - ``attention_prefill``: causal prefill attention of one sequence over length (FLOPs -> TFLOP/s);
    - ``attn_prefill_chunk``: one prefill chunk's attention as ``MLAAttention.prefill_attend`` runs it, new x cached
      tokens; on CUDA also ``device_s``, its device time with the launch hidden behind a spin kernel (it cannot be
      captured: FA3 copies its ``cu_seqlens`` per call; H200 runs 11-13 fitted the eager table's scale at 0.8);
    - ``moe_experts``: one layer's routed experts over token counts, uniform routing (touched expert
      weights -> achieved bandwidth); on CUDA also ``device_s``, the same call's device time inside a CUDA graph
      (eager calls of a few tokens are launch-bound: H200 run 10 timed 1 token at 744 us eager);
    - ``sample``: the logits GEMM and top-k/top-p sampling over the vocabulary by batch size, as a step runs them
      after its forward (``with_logits``; before, the sampler alone over random logits);
    - ``decode_step``: one whole decode step replayed as a CUDA graph vs run eager, by batch size (the
      launch cost graphs remove).

    Each: one warm-up call, then the median of ``repeats`` synchronised timings. An op the model lacks
    is skipped. Points are plain dicts (``op``, shape fields, ``time_s``, ``backend``).
    """
    from executor.mla import MLAAttention
    from executor.moe import MoE

    runner = engine.runner
    dev = runner.device
    clock = _Clock(dev)
    model = runner.model
    act = runner.kv.dtype if dev.type == "cuda" else torch.float32
    g = torch.Generator(device=dev).manual_seed(1)
    out: list[dict] = []

    def timed(fn) -> tuple[float, float]:
        with torch.inference_mode():
            return _median_time(fn, clock, repeats)

    def randn(*shape: int) -> torch.Tensor:   # fp32 normal draws from ``g``, in the activation dtype
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(act)

    mla = next((m for m in model.modules() if isinstance(m, MLAAttention)), None)
    if mla is not None and runner.kv.latent is not None:
        cache = runner.kv.latent[mla.cache_layer]
        pages, page = cache.shape[0], cache.shape[1]
        width = mla.rank + mla.dr
        for b in ([1, 8, 32, 128] if not quick else [1, 8]):
            for ctx in ([256, 1024, 4096] if not quick else [64, 256]):
                need = -(-ctx // page)
                if b * need > pages - 1 or ctx >= engine.max_model_len:
                    continue
                table = (torch.arange(b * need, device=dev, dtype=torch.int32) % (pages - 1)).view(b, need)
                lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
                q = randn(b, 1, mla.h, width)
                ops.reset_used()
                t, spread = timed(lambda: ops.mla_decode(q, cache, table, lens, mla.scale, mla.rank))
                kv_bytes = float(b * ctx * width * cache.element_size())
                out.append({"op": "mla_decode", "batch": b, "context": ctx, "time_s": t, "spread": spread, "bytes": kv_bytes,
                            "tbps": kv_bytes / t / 1e12, "backend": ops.reset_used().get("mla_decode", "?")})
        dqk, dv = mla.dn + mla.dr, mla.dv
        for n in ([128, 512, 1024, 2048, 4096] if not quick else [32, 128]):
            q = randn(n, mla.h, dqk)
            k = randn(n, mla.h, dqk)
            v = randn(n, mla.h, dv)
            pos = torch.arange(n, device=dev)
            ops.reset_used()
            t, spread = timed(lambda: ops.attention_prefill(q, k, v, pos, mla.scale, bottom_right=True))   # as prefill_attend
            flops = 2.0 * mla.h * (dqk + dv) * n * (n + 1) / 2
            out.append({"op": "attention_prefill", "tokens": n, "time_s": t, "spread": spread, "flops": flops,
                        "tflops": flops / t / 1e12, "backend": ops.reset_used().get("attention_prefill", "?")})

        # one prefill chunk's attention over cached context, exactly the executor's own (MLAAttention.prefill_attend:
        # K assembly and masked SDPA): new x cached tokens, positions c..c+n-1, as serving resumes a prompt
        out += bench_prefill_chunks(mla, cache, engine.max_model_len, timed, randn,
                                    [128, 512, 1024, 2048, 4096, 6144, 8192] if not quick else [16, 64],
                                    CHUNK_CACHED if not quick else [0, 48],
                                    [512, 2048, 4096, 8192, 16384] if not quick else [16, 96])

    moe = next((m for m in model.modules() if isinstance(m, MoE)), None)
    if moe is not None:
        ex = moe.experts
        e, hidden = ex.w13.shape[0], ex.w13.shape[2]
        k = moe.cfg.top_k
        per_expert = float(ex.w13.numel() + ex.w2.numel()) / e * ex.w13.element_size()
        # 8192: the step grid's largest prefill; 128, 1024: no factor-4 gap left; 384 / 512: both sides of the Triton MoE's block switch (16 -> 64 rows
        # at 12 pairs per expert, kernels.triton_grouped_gemm.default_block_m), which interpolation must not straddle
        # 2047 / 2048: both sides of the registry's Triton -> DeepGEMM MoE switch (registry._FUSED_MOE_MIN_TOKENS)
        # 2-48: a decode graph's experts run its real rows and one padding row (pads route alike), so serving's decode
        # steps look the table up at 2-17 tokens and each bucket's top (H100 runs 47-50: serving's decode steps at 5-13
        # rows 0.08-0.16 ms over the model interpolated from 1 / 8 / 64, at 4 and 16 rows within 0.03 ms). Each count is
        # one random routing: its "touched" (distinct experts) goes with it, and the table prices time per expert that
        # draw touched (MoELayerTable.touched; run 51 timed these counts without it: per expected expert they zigzag by
        # +-7% and the denser table fitted worse than the sparse one)
        for n in ([1, 2, 3, 4, 6, 8, 10, 12, 14, 17, 24, 33, 48, 64, 128, 256, 384, 512, 1024, 2047, 2048, 4096, 8192]
                  if not quick else [1, 8, 64]):
            x = randn(n, hidden)
            ids = torch.rand(n, e, generator=g, device=dev).topk(k, dim=-1).indices.to(torch.int32)
            w = torch.full((n, k), 1.0 / k, device=dev, dtype=torch.float32)
            touched = int(torch.unique(ids).numel())
            scales = (ex.w13_scale_inv, ex.w2_scale_inv) if getattr(ex, "fp8", False) else (None, None)
            ops.reset_used()
            t, spread = timed(lambda: ops.moe_experts(x, w, ids, ex.w13, ex.w2, *scales))
            byts = touched * per_expert
            backend = ops.reset_used().get("moe_experts", "?")
            # the same call's device time inside a CUDA graph, as decode graphs and pieces run it; kept only when the
            # same implementation ran, and a vendor failure inside the capture must not switch the library off for
            # the rest of the calibration (the grid would then measure another engine)
            failed = dict(vendor.failures)
            with torch.inference_mode():
                dev_s = _graph_device_time(lambda: ops.moe_experts(x, w, ids, ex.w13, ex.w2, *scales), dev)
            if ops.reset_used().get("moe_experts", backend) != backend:
                dev_s = None
            vendor.failures.clear()
            vendor.failures.update(failed)
            out.append({"op": "moe_experts", "tokens": n, "top_k": k, "experts": e, "hidden": hidden,
                        "intermediate": int(ex.w2.shape[2]), "weight_dtype": "fp8" if scales[0] is not None else "bf16",
                        "touched": touched, "time_s": t,
                        "spread": spread, "bytes": byts, "tbps": byts / t / 1e12, "backend": backend,
                        **({"device_s": dev_s} if dev_s is not None else {})})

    out += bench_sampler(model.compute_logits, engine.vocab_size, engine.cfg.spec.hidden_size, dev, act, repeats,
                         # every row count a decode step of 1-16 rows samples, then the larger buckets: a staircase
                         # 1 / 4 / 16 cannot show (H100 runs 51-52: 0.16-0.19 ms more at 2 rows than at 1, which the
                         # sparse table interpolated as 0.05 and runs 47-50's launch table took up at 2 rows)
                         [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 24, 32, 48, 64, 96, 128] if not quick else [1, 8], g)

    graphs = getattr(runner, "graphs", None)
    if graphs is not None and graphs.captured:
        for b in [x for x in (1, 8, 32, 64) if x <= max(graphs.captured)]:
            plan = synthetic_plan(engine, [min(1024, engine.max_model_len // 2)] * b, [], f"op_step{b}_")
            try:
                for mode in ("graph", "eager"):
                    # "eager" turns off the piecewise graphs too: they take any batch that fits a token bucket,
                    # decode-only ones included, so without this the eager rows timed piecewise replays
                    saved = runner.graphs, getattr(runner, "piecewise", None)
                    runner.graphs = saved[0] if mode == "graph" else None
                    runner.piecewise = saved[1] if mode == "graph" else None
                    try:
                        t, spread = timed(lambda: runner.execute(plan))
                    finally:
                        runner.graphs, runner.piecewise = saved
                    out.append({"op": "decode_step", "mode": mode, "batch": b, "context": min(1024, engine.max_model_len // 2),
                                "time_s": t, "spread": spread, "backend": "cuda_graph" if mode == "graph" else "eager"})
            finally:
                for r in plan.decodes:
                    runner.remove_request(r.request_id)
    return out


def _is_fp8(engine: LLMEngine) -> bool:
    for mod in engine.runner.model.modules():
        if getattr(mod, "fp8", False):
            return True
    return False


def op_tables(points: list[dict], hw_name: str) -> dict[str, EffTable | PrefillChunkTable | MoELayerTable]:
    """Efficiency tables from the op micro-benchmarks: ``gemm_mem`` over bytes and ``gemm_compute`` over rows (executor
    Linear), ``attn_decode_mem`` over KV bytes (MLA decode), ``attn_prefill_compute`` over tokens (prefill attention),
    ``expert_mem`` over expert weight bytes (routed experts); a table needs two or more distinct x. Plus
    ``attn_prefill_chunk``: measured seconds of one prefill chunk's attention over new x cached tokens (two or more
    cached levels; device seconds where every point timed them, ``prefill_chunk_table``); ``sample``: the sampler's
    eager seconds over rows (``sample_table``); ``moe_layer``: one MoE layer's routed experts, device seconds over tokens (two or more counts timed
    in a CUDA graph)."""
    hw = get_hardware(hw_name)
    ok = [p for p in points if p["time_s"] > 0]
    by = lambda op: [p for p in ok if p["op"] == op]  # noqa: E731
    tables = linear_tables(points, hw_name)   # device seconds where every Linear point timed them
    tables["attn_decode_mem"] = eff_table([(p["bytes"], p["bytes"] / p["time_s"] / hw.hbm_bw) for p in by("mla_decode")],
                                           "KV bytes read by one decode attention kernel (measured: executor MLA decode)")
    tables["attn_prefill_compute"] = eff_table(
        [(p["tokens"], p["flops"] / p["time_s"] / (hw.bf16_tflops * 1e12)) for p in by("attention_prefill")],
        "tokens of one causal prefill attention kernel (measured: executor SDPA prefill)")
    tables["attn_prefill_chunk"] = prefill_chunk_table(points)   # device seconds where the points timed them
    # the executor's MoE layer at exact token counts, device time in a CUDA graph (points since 056fca2)
    tables["moe_layer"] = moe_layer_table(points)
    tables["sample"] = sample_table(points)   # the sampler the step runs after its forward, eager, over rows
    tables["kv_expand"] = kv_expand_table(points)   # a prefill chunk's keys and values built from the cached latents
    # at the same bytes (every expert touched) more tokens turn compute-bound: the best efficiency is the memory regime
    tables["expert_mem"] = eff_table([(p["bytes"], p["bytes"] / p["time_s"] / hw.hbm_bw) for p in by("moe_experts")],
                                      "expert weight bytes one MoE layer's routed experts read (measured: executor grouped GEMM, uniform routing)")
    return {k: t for k, t in tables.items() if t is not None}


# ----------------------------------------------------------------------------- synthetic steps
def step_grid(device: str, quick: bool, max_ctx: int, max_batch: int, max_tokens: int) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Shapes to measure: (decode contexts, prefill chunks). Covers batch size x context, prefill length x context, mixed."""
    if device == "cuda" and not quick:
        # sizes between the captured CUDA-graph sizes too: a batch of 12 replays the 16-row graph (padding)
        batches = [1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 44, 48, 64, 80, 96, 128]
        ctxs = [128, 1024, 4096]
        prefills = [64, 128, 256, 512, 768, 1024, 1536, 2048, 4096, 8192]
    elif device == "cuda":
        batches = [1, 4, 16, 64]
        ctxs = [128, 1024]
        prefills = [64, 512, 2048]
    else:  # CPU (CI): the reference kernels are slow; a handful of small shapes
        batches = [1, 4]
        ctxs = [32, 96]
        prefills = [16, 48]
    batches = [b for b in batches if b <= max_batch]
    ctxs = [c for c in ctxs if c < max_ctx] or [max(1, max_ctx // 2)]
    prefills = [p for p in prefills if p <= min(max_tokens, max_ctx - 1)]
    shapes: list[tuple[list[int], list[tuple[int, int]]]] = []
    rng = np.random.default_rng(0)
    for b in batches:
        for c in ctxs:
            # contexts spread +-50% around c: the batch of a real server is never uniform
            dc = np.clip(np.round(c * rng.uniform(0.5, 1.5, b)), 1, max_ctx - 2).astype(int).tolist()
            shapes.append((dc, []))
    for p in prefills:
        shapes.append(([], [(p, 0)]))
    if prefills:
        p = prefills[len(prefills) // 2]
        shapes.append(([], [(p, min(p, max_ctx - p - 1))]))                 # a later chunk of a long prompt
        n = max(2, min(8, max_tokens // max(p, 1)))
        shapes.append(([], [(p // 2, 0)] * n))                              # several short prompts
        if device == "cuda" and not quick:                                   # full token budgets of packed prompts
            for q, k in ((2048, 4), (1024, 8), (512, 16), (256, 8)):
                if q * k <= max_tokens and q < max_ctx:
                    shapes.append(([], [(q, 0)] * k))
            # later chunks of long prompts (and prefix hits): prefill attention over thousands of cached tokens
            for q, k in ((512, 4096), (2048, 2048), (1024, 6144), (4096, 4096)):
                if q <= max_tokens and q + k < max_ctx:
                    shapes.append(([], [(q, k)]))
            c = ctxs[len(ctxs) // 2]
            if 2048 + 4096 < max_ctx and 2048 + 16 <= max_tokens:
                shapes.append(([c] * 16, [(2048, 4096)]))
            shapes.append(([c] * 32, [(1024, 0)] * 7))
            shapes.append(([c] * 8, [(512, 0)] * 4))
            # what serving runs most between decode-only steps: one prompt chunk next to tens of decodes (eager)
            for nd in (2, 8, 24, 48):
                for q in (128, 512, 1024, 2048):
                    if nd <= max_batch and q + nd <= max_tokens and q < max_ctx:
                        dc = np.clip(np.round(c * rng.uniform(0.5, 1.5, nd)), 1, max_ctx - 2).astype(int).tolist()
                        shapes.append((dc, [(q, 0)]))
            # multi-turn agentic steps: a short chunk over a long cached conversation next to decodes at long
            # context (the composition run 3 under-priced by 28% while each part alone was within 5%)
            cl = ctxs[-1]
            for nd in (8, 24, 48):
                for q, k in ((128, 4096), (512, 4096), (256, 6144)):
                    if nd <= max_batch and q + nd <= max_tokens and q + k < max_ctx:
                        dc = np.clip(np.round(cl * rng.uniform(0.75, 1.5, nd)), 1, max_ctx - 2).astype(int).tolist()
                        shapes.append((dc, [(q, k)]))
            # the device-bound kind of the same: several chunks over long cached conversations next to tens of decodes
            # at long context (run 4: 1-4 chunks of 0.5-4k over 4-16k cached beside 30-60 decodes came out 6-19% fast;
            # the grid's cached-context points were host-bound or had no decodes, so they did not pin that cost)
            for nd, chunks in ((16, [(2048, 4096)]), (48, [(1024, 6144)] * 2), (32, [(512, 6144)] * 4), (48, [(1536, 4096)] * 3)):
                if nd <= max_batch and nd + sum(q for q, _ in chunks) <= max_tokens and all(q + k < max_ctx for q, k in chunks):
                    dc = np.clip(np.round(cl * rng.uniform(0.75, 1.5, nd)), 1, max_ctx - 2).astype(int).tolist()
                    shapes.append((dc, chunks))
        for b in [x for x in batches if x in (4, 32, 16)][:2]:
            c = ctxs[len(ctxs) // 2]
            shapes.append(([c] * b, [(min(prefills[-1], max_tokens - b), 0)]))  # decodes + a prefill chunk
            shapes.append(([c] * b, [(prefills[0], 0)]))
        if device == "cuda" and not quick:
            # a 256-token prompt beside decodes: 258-304 rows, past two of the Triton GEMM's 128-row tiles (H200 run
            # 22: reasoning's first-token steps, 7% over the model, where the grid had chunks of 128 and 512 only);
            # last, with their own draws, so every shape above keeps its contexts
            r2 = np.random.default_rng(1)
            c = ctxs[len(ctxs) // 2]
            for nd in (2, 8, 24, 48):
                if nd <= max_batch and 256 + nd <= max_tokens and 256 < max_ctx:
                    shapes.append((np.clip(np.round(c * r2.uniform(0.5, 1.5, nd)), 1, max_ctx - 2).astype(int).tolist(), [(256, 0)]))
    return shapes


def _finite_median(xs: list[float]) -> float | None:
    """Median of ``xs`` when every one is a number (None when any is NaN or there are none)."""
    return statistics.median(xs) if xs and all(x == x for x in xs) else None


def _held(runner, wall_s: float, repeats: int, call) -> list | None:
    """``call()``'s results over ``repeats`` runs, each issued behind a spin kernel that holds the GPU longer than the
    step's whole wall time ``wall_s`` (its issue cannot take longer unless it waits for the device): what its CUDA
    events then time is device work alone. None off CUDA or without a spin kernel."""
    spin = getattr(torch.cuda, "_sleep", None)
    if runner.device.type != "cuda" or spin is None:
        return None
    cycles = _spin_cycles(1.25 * wall_s + 1e-3)
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize(runner.device)
        spin(cycles)
        out.append(call())
    return out


def queued_forward(runner, run, wall_s: float, repeats: int = 2) -> dict:
    """An eager step's forward with the GPU held busy while the host issues it (``_held``), then the step (``run``).
    The forward's CUDA events then time its device work alone (``queued_forward_s``: the GPU never waits for a launch)
    and the host's clock times the forward call's issue alone (``queued_host_s``: no launch waits for the device,
    unless the forward itself synchronises, which shows as an issue time near the spin's). Median of ``repeats``; {}
    off CUDA, without a spin kernel, or when the runner recorded no forward. What separates a step's host from its
    device part by measurement (``costmodels.step_fit``), where the wall time alone only bounds their combination."""
    def call():
        run()
        rec = runner.step_records[0] if runner.step_records else {}
        return float(rec.get("forward_s", float("nan"))), float(rec.get("forward_host_s", float("nan")))
    got = _held(runner, wall_s, repeats, call)
    if got is None:
        return {}
    f, h = _finite_median([x[0] for x in got]), _finite_median([x[1] for x in got])
    return {} if f is None or h is None else {"queued_forward_s": f, "queued_host_s": h}


# the issue probe's step: 8 decodes at 1,024 tokens beside one 512-token prompt chunk (a mixed step, as serving's
# prompt-bearing steps are), its forward issued 7 times behind a spin kernel (median)
ISSUE_DECODES, ISSUE_CTX, ISSUE_CHUNK, ISSUE_REPEATS = 8, 1024, 512, 7


def issue_probe(engine, repeats: int = ISSUE_REPEATS) -> float | None:
    """Median host seconds the forward call of one fixed mixed step (``ISSUE_DECODES`` decodes at ``ISSUE_CTX`` tokens
    and an ``ISSUE_CHUNK``-token prompt chunk, fresh pages) takes to return while a spin kernel holds the GPU past the
    step's wall time: its issue alone, as the calibration grid's ``queued_host_s`` times it
    (``executor.calibrate.queued_forward``), after one unmeasured run. None off CUDA (the forward is the CPU's work
    there, not an issue), on an engine whose context or KV pages cannot hold the step, without a spin kernel, or where
    the runner recorded no forward. The step's requests are removed after, and its runs do not count as steps the
    engine ran."""
    if repeats < 1:
        raise ValueError(f"issue_probe: repeats must be >= 1, got {repeats}")
    runner = engine.runner
    if runner.device.type != "cuda":
        return None
    bs = engine.block_size
    pages = ISSUE_DECODES * -(-(ISSUE_CTX + 1) // bs) + -(-ISSUE_CHUNK // bs)
    if engine.max_model_len <= ISSUE_CTX + 1 or engine.scheduler.blocks.num_blocks < pages:
        return None   # an engine too small for the fixed step (a position past its RoPE table, pages it lacks): none
    plan = synthetic_plan(engine, [ISSUE_CTX] * ISSUE_DECODES, [(ISSUE_CHUNK, 0)], "issueprobe_")
    steps0 = getattr(runner, "num_steps_run", None)

    def run():
        return runner.execute(plan)
    try:
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize(runner.device)
        got = queued_forward(runner, run, time.perf_counter() - t0, repeats)
    finally:
        for r in plan.decodes + [c.request for c in plan.prefills]:
            runner.remove_request(r.request_id)
        if steps0 is not None:
            runner.num_steps_run = steps0
    return got.get("queued_host_s")


def issue_probe_or_none(engine, log=print) -> float | None:
    """``issue_probe``, a diagnostic: a failure is logged and read as no probe, not the end of a calibration or a
    validation."""
    try:
        return issue_probe(engine)
    except Exception as e:  # noqa: BLE001
        log(f"  issue probe failed: {type(e).__name__}: {e}")
        return None


def queued_launch(runner, plan, wall_s: float, repeats: int = 2) -> dict:
    """A CUDA-graph decode launched as the pipelined loop launches it (``executor.overlap.PipelinedRunner``: its inputs
    built and copied, the replay, the sampler, the sampled ids' read-back copy) behind a spin kernel that holds the GPU
    until the whole launch is issued (``_held``): the launch's device span from its first to its last event, as
    serving's ``device_s`` times it (``queued_launch_s``). Beside the held forward (``queued_forward``) and the sampler
    table it gives the device work a launch holds beyond the two (``step_fit.fit_launch_device``): H100 run 46's decode
    steps' serving device work ran 0.04-0.13 ms over the model of those two at 1-16 rows. Median of ``repeats``; {} off
    CUDA or without a spin kernel."""
    from executor.overlap import PipelinedRunner
    pr = PipelinedRunner(runner)

    def call():
        f = pr.launch(plan, None)
        pr.collect(f)
        runner.num_steps_run -= 1   # a measurement, not a step the engine ran
        return float(f.record.get("device_s", float("nan")))
    spans = _held(runner, wall_s, repeats, call)
    got = None if spans is None else _finite_median(spans)
    return {} if got is None else {"queued_launch_s": got}


def queued_split_text(points: list[StepPoint]) -> str:
    """One line on the eager grid steps' measured host/device split (``queued_forward``): how many are host-bound
    (issue longer than device work) and the forward's measured time against max(issue, device). '' when none was
    measured."""
    q = [p for p in points if p.graph_bs == 0 and p.queued_forward_s and p.queued_host_s is not None and p.forward_s]
    if not q:
        return ""
    host = np.array([p.queued_host_s for p in q])
    dev = np.array([p.queued_forward_s for p in q])
    fwd = np.array([p.forward_s for p in q])
    ratio = fwd / np.maximum(host, dev)
    return (f"eager steps' forward, issue vs device work measured apart (GPU held by a spin kernel): {int((host > dev).sum())} "
            f"of {len(q)} host-bound; forward / max(issue, device) median {np.median(ratio):.3f} "
            f"(p10 {np.percentile(ratio, 10):.3f}, p90 {np.percentile(ratio, 90):.3f})")


def _median_phases(phases: list[dict]) -> dict[str, float] | None:
    """Median seconds per host phase over repeats that all timed them (``step_record``'s ``host_phases``), rounded to
    0.1 us; None when one did not."""
    if not phases or not all(phases):
        return None
    return {k: round(statistics.median(float(p[k]) for p in phases), 7) for k in phases[0]}


def measure_steps(engine: LLMEngine, shapes, repeats: int, log=print, interleave: bool = False,
                  temperature: float = 0.0, span: tuple[int, int] | None = None) -> list[StepPoint]:
    """Median runner wall time of each shape (one warm-up run first).

    ``interleave``: before each timed run of an eager step (one with a prompt chunk), replay a CUDA-graph
    decode step, as serving does between prompt arrivals. Back-to-back repeats of one eager shape keep its
    host code paths hot; in serving they are not (H200 run 8: eager prompt-chunk steps 10% slower in
    serving than in a back-to-back grid). ``temperature``: how the plans' requests sample (``synthetic_steps``).
    ``span``: measure only shapes ``[start, stop)`` of ``shapes`` (lines keep their place in the whole grid)."""
    runner = engine.runner
    clock = _Clock(runner.device)
    L = engine.cfg.spec.num_layers
    points = []
    filler = None
    if interleave and getattr(runner, "graphs", None) is not None:
        filler = synthetic_plan(engine, [1000] * 8, [], "calfill_", temperature=temperature)
    try:
        lo, hi = span or (0, len(shapes))
        for j, (dc, pf) in enumerate(shapes):
            if not lo <= j < hi:
                continue
            plan = synthetic_plan(engine, dc, pf, f"cal{j}_", temperature=temperature)

            def run():
                return runner.execute(plan)

            walls, fwds, hosts, phases = [], [], [], []
            graph_bs = 0
            queued: dict = {}
            try:
                run()  # warm-up: kernel specialisations for this shape
                clock.sync()
                for _ in range(repeats):
                    if filler is not None and pf:
                        runner.execute(filler)
                        clock.sync()
                    res = run()
                    walls.append(float(res.step_durations[0]))
                    rec = runner.step_records[0] if runner.step_records else {}
                    graph_bs = int(rec.get("graph_bs", 0))
                    fwds.append(float(rec.get("forward_s", float("nan"))))
                    hosts.append(float(rec.get("forward_host_s", float("nan"))))
                    phases.append(rec.get("host_phases") or {})
                if pf or graph_bs:
                    # eager steps: their issue and device work apart; CUDA-graph decodes: the replay's device work
                    # without the wait for its launch that an idle GPU pays (H200, benchmarks/gpu/graph_launch_gap.py:
                    # 0.11-0.15 ms of every grid forward at 1-64 rows), which a pipelined loop hides
                    queued = queued_forward(runner, run, statistics.median(walls))
                if graph_bs and not pf:
                    # and the whole pipelined launch's device span: the copies around the replay and the sampler
                    # (a failure here costs the point its span, not the calibration)
                    try:
                        queued.update(queued_launch(runner, plan, statistics.median(walls)))
                    except Exception as e:  # noqa: BLE001
                        log(f"  held launch of step {j + 1} failed: {type(e).__name__}: {e}")
            finally:
                for r in plan.decodes + [c.request for c in plan.prefills]:
                    runner.remove_request(r.request_id)
            med = statistics.median(walls)
            st = gpu_state(runner.device)
            points.append(StepPoint(num_layers=L, decode_ctx=dc, prefill=pf, wall_s=med, repeats=repeats,
                                    spread=(max(walls) - min(walls)) / med, graph_bs=graph_bs,
                                    forward_s=_finite_median(fwds), forward_host_s=_finite_median(hosts),
                                    host_phases=_median_phases(phases), **queued, **st))
            log(f"  step {j + 1:3d}/{len(shapes)}: {len(dc):4d} decodes (ctx ~{int(np.mean(dc)) if dc else 0:5d}), "
                f"prefill {sum(a for a, _ in pf):6d} tok in {len(pf)}: {med * 1e3:8.2f} ms" + (f" (graph {graph_bs})" if graph_bs else "")
                + (f"; forward device {queued['queued_forward_s'] * 1e3:.2f}, issue {queued['queued_host_s'] * 1e3:.2f} ms"
                   if "queued_forward_s" in queued else "")
                + (f", launch device {queued['queued_launch_s'] * 1e3:.2f} ms" if "queued_launch_s" in queued else "") + _state_text(st))
    finally:
        if filler is not None:
            for r in filler.decodes:
                runner.remove_request(r.request_id)
    return points


def _settle(engine: LLMEngine, shapes, seconds: float, temperature: float = 0.0) -> float:
    """Run a decode-only and a prefill shape of the grid alternately for ``seconds`` (untimed), so the first
    measured steps see the same warm host and device as a serving engine's."""
    runner = engine.runner
    picks = [sh for sh in shapes if sh[0] and not sh[1]][len(shapes) // 8: len(shapes) // 8 + 1] + [sh for sh in shapes if sh[1]][:1]
    plans = [synthetic_plan(engine, dc, pf, f"settle{j}_", temperature=temperature) for j, (dc, pf) in enumerate(picks)]
    t0 = time.perf_counter()
    try:
        while plans and time.perf_counter() - t0 < seconds:
            for plan in plans:
                runner.execute(plan)
        _Clock(runner.device).sync()
    finally:
        for plan in plans:
            for r in plan.decodes + [c.request for c in plan.prefills]:
                runner.remove_request(r.request_id)
    return time.perf_counter() - t0


def measure_loop(engine: LLMEngine, batches: list[tuple[int, int, int]], temperature: float = 0.0) -> list[StepPoint]:
    """Closed batches ``(requests, prompt_len, output_len)`` through the real loop: runner steps as the server
    runs them (prefills packed by the scheduler, decodes at growing contexts), and each iteration's time
    minus the runner's = the loop's own time."""
    L = engine.cfg.spec.num_layers
    vocab = engine.vocab_size
    points = []
    for b, prompt_len, out_len in batches:
        eng = fresh_engine(engine, engine.scheduler.config)
        rng = np.random.default_rng(b * 131 + prompt_len)
        items = [(0.0, f"loop{b}_{prompt_len}_{i}", rng.integers(0, vocab, prompt_len).tolist(), out_len) for i in range(b)]
        # an unmeasured pass first: its chunked prefills (a chunk after cached context, several prompts packed) are
        # shapes the grid did not run, and a first-seen shape costs 2-40x (kernel specialisation; H200, Nov 29)
        replay(eng, [(t, "w" + rid, ids, n) for t, rid, ids, n in items], temperature=temperature)
        eng = fresh_engine(engine, engine.scheduler.config)
        res = replay(eng, items, temperature=temperature)
        for s in res.steps[1:]:  # the first iteration also adds the requests
            if s.num_steps != 1 or s.runner_s <= 0:
                continue
            points.append(StepPoint(num_layers=L, decode_ctx=s.decode_ctx, prefill=s.prefill, wall_s=s.runner_s,
                                    loop_s=max(s.iter_s - s.runner_s, 0.0), graph_bs=s.graph_bs, sm_clock_mhz=s.sm_clock_mhz,
                                    forward_s=s.forward_s if s.forward_s == s.forward_s else None,
                                    host_phases=_median_phases([s.host_phases])))
    return points


def measure_admission(engine: LLMEngine, lengths: list[int] | None = None, repeats: int = 7,
                      temperature: float = 0.0) -> tuple[dict[str, float], list[dict]]:
    """Host seconds of admitting one request (``LLMEngine.add_request``: the token-id checks, the prefix cache's block
    hashes, the runner's sampling state, the scheduler's entry) over prompt lengths, median of ``repeats`` each on a
    fresh scheduler; fitted as ``admit_s + admit_per_token_s x prompt tokens`` (NNLS). The loop points cannot see it:
    their requests all arrive before the first timed iteration, where serving admits each arrival in the iteration it
    runs (H200 matrix run 17: admissions made summarize iterations' loop 1.6-3.3 ms against the loop points' 0.3-0.8).

    Admitted as serving admits them: each request its own prompt, built before the measurement (a replay's prompts
    exist before its loop starts), and one runner step (a decode step of 8 sequences) before each admission, as an
    engine loop runs between two arrivals. Admitting one prompt list back to back, its ints and the admission's code
    hot, measured 17 us + 54 ns a token on the H200 (run 28), where serving's iterations admitted at 120-160 us +
    85-130 ns a token; on a CPU engine (``tiny``) the back-to-back measure read 45 / 107 / 266 us at 256 / 1024 / 3000
    tokens where a replay admitting one arrival per iteration read 168 / 278 / 514.
    Returns ({"admit_s", "admit_per_token_s"}, the points)."""
    cap = engine.max_model_len - 1
    lengths = sorted({min(n, cap) for n in (lengths or [16, 256, 1024, 4096, 8192])})
    vocab = engine.vocab_size
    rng = np.random.default_rng(11)
    step = synthetic_plan(engine, [min(256, cap)] * 8, [], "admstep_", temperature=temperature)
    pts = []
    try:
        for n in lengths:
            eng = fresh_engine(engine, engine.scheduler.config)
            prompts = [rng.integers(0, vocab, n).tolist() for _ in range(repeats + 1)]
            ts = []
            for i, ids in enumerate(prompts):
                engine.runner.execute(step)
                t0 = time.perf_counter()
                eng.add_request(f"adm{n}_{i}", ids, SamplingParams(temperature=temperature, max_tokens=4, ignore_eos=True))
                ts.append(time.perf_counter() - t0)
            pts.append({"prompt_tokens": n, "seconds": statistics.median(ts[1:]), "repeats": repeats})
            for i in range(repeats + 1):   # its requests' sampling state (the fresh schedulers go with them)
                engine.runner.remove_request(f"adm{n}_{i}")
    finally:
        drop_plan(engine, step)
    if len(pts) < 2:
        return {}, pts
    a = np.array([[1.0, p["prompt_tokens"]] for p in pts])
    y = np.array([p["seconds"] for p in pts])
    x = nnls_abs(a, y)
    return {"admit_s": float(x[0]), "admit_per_token_s": float(x[1])}, pts


def decay_profile(excess: list[float], first_probe: float, both_probes: bool) -> list[float]:
    """The seconds the j-th decode step after a prefill-bearing step pays, from each step's measured excess over a
    decode step among decode steps: a decay (each at most the one before it, the first at most what the decode probe
    measured, none below 0), and none at all unless both after-eager probes showed a cost (``after_eager_s``'s rule:
    on a busy CPU one probe alone read +122 ms)."""
    cap = max(0.0, first_probe) if both_probes else 0.0
    out = []
    for x in excess:
        cap = min(cap, max(0.0, x))
        out.append(cap)
    return out


AFTER_EAGER_DECODE_STEPS = 8   # decode steps timed one after another behind an eager step (the measured decay)


def after_eager_sizes(engine: LLMEngine) -> list[int]:
    """Prompt chunk sizes the decay after an eager step is also measured behind (``measure_after_eager``): 512, 2048
    and 4096 tokens, within half the context window and the step budget. In H200 runs 26 and 27 a decode step right
    after a prompt-bearing step ran over the model by ~0.05 ms after <= 512 tokens, 0.2-0.5 ms after 0.5-2k and
    0.5-0.7 ms after 2-8k (its forward, the runner's host part and the loop each a share), where the calibration
    measured the decay behind 1024 tokens only."""
    cap = min(engine.max_model_len // 2, engine.scheduler.config.max_num_batched_tokens)
    return [n for n in (512, 2048, 4096) if n <= cap]


def measure_after_eager(engine: LLMEngine, rounds: int = 16, temperature: float = 0.0, log=print) -> tuple[float, dict]:
    """Seconds a step pays right after a prefill-bearing step, beyond the same step right after a decode step (what
    the grid times every shape after): a decode step (8 decodes) and a mixed step (a chunk beside them), each timed
    after the decode step and after a mixed step of a fresh request (as serving admits them), rounds alternating;
    the smaller of the two probes' differences of medians, >= 0 (both steps must show it: on a busy CPU one probe
    alone read +122 ms). H200 (benchmarks/gpu/issue16_h200/
    after_step_probe_e4e32b0): +0.25-0.37 ms on a decode graph step, +0.37-0.45 on a mixed step, in the step's inputs
    and sampler, not its forward; the steps after eager ones in serving (run 17) ran 0.4-0.7 ms over the grid.
    Then the decay: ``rounds // 2`` eager steps, each followed by ``AFTER_EAGER_DECODE_STEPS`` decode steps timed one
    after another; the j-th one's median over the decode step after a decode step is what the j-th decode step after a
    prefill-bearing step pays (>= 0; ``HostTerms.after_eager_decode_s``). H200 run 20's serving: a decode step's host
    part ran +0.16-0.53 ms right after an eager step and settled over 4-8 steps.
    Returns (seconds, {"decode_ms": ms, "mixed_ms": ms, "rounds": n, "decode_after_ms": [ms per step]})."""
    runner = engine.runner
    mml = engine.max_model_len
    ctx, chunk, big = min(1024, mml // 4), min(512, mml // 4), min(1024, mml // 2)
    dec = synthetic_plan(engine, [ctx] * 8, [], "ae_d_", temperature=temperature)
    mixed = synthetic_plan(engine, [ctx] * 8, [(chunk, 0)], "ae_m_", temperature=temperature)
    for r in mixed.decodes:   # the mixed probe runs the decode probe's requests beside its chunk
        runner.remove_request(r.request_id)
    mixed.decodes[:] = dec.decodes
    clock = _Clock(runner.device)

    def timed(plan) -> float:
        res = runner.execute(plan)
        clock.sync()
        return float(res.step_durations[0])

    fresh = [0]

    def eager_step() -> None:
        fresh[0] += 1
        fresh_chunk_step(engine, dec, big, f"ae_n{fresh[0]}_", timed, temperature)

    out: dict[str, dict[str, list[float]]] = {"decode": {"graph": [], "eager": []}, "mixed": {"graph": [], "eager": []}}
    try:
        for _ in range(2):          # warm: every shape once
            timed(dec)
            timed(mixed)
            eager_step()
        for r in range(rounds):
            for name, plan in (("decode", dec), ("mixed", mixed)):
                for cond in (("graph", "eager") if r % 2 == 0 else ("eager", "graph")):
                    timed(dec)
                    if cond == "eager":
                        eager_step()
                    else:
                        timed(dec)
                    out[name][cond].append(timed(plan))
        seq: list[list[float]] = [[] for _ in range(AFTER_EAGER_DECODE_STEPS)]
        for _ in range(max(2, rounds // 2)):
            for _ in range(2):
                timed(dec)
            eager_step()
            for j in range(AFTER_EAGER_DECODE_STEPS):
                seq[j].append(timed(dec))
        # the same decay behind other chunk sizes (serving's steps after bigger prompt steps pay more, after_eager_sizes;
        # the profile prices the decay by the prompt step's size from them), sizes interleaved round by round
        by_size: dict[int, list[list[float]]] = {n: [[] for _ in range(AFTER_EAGER_DECODE_STEPS)]
                                                 for n in after_eager_sizes(engine)}
        for _ in range(max(2, rounds // 4)):
            for n, rows in by_size.items():
                for _ in range(2):
                    timed(dec)
                fresh[0] += 1
                fresh_chunk_step(engine, dec, n, f"ae_s{n}_{fresh[0]}_", timed, temperature)
                for j in range(AFTER_EAGER_DECODE_STEPS):
                    rows[j].append(timed(dec))
    finally:
        drop_plan(engine, dec)
        for c in mixed.prefills:
            runner.remove_request(c.request.request_id)
    diff = {k: statistics.median(v["eager"]) - statistics.median(v["graph"]) for k, v in out.items()}
    sec = max(0.0, float(min(diff.values())))
    base = statistics.median(out["decode"]["graph"])
    decay = decay_profile([statistics.median(x) - base for x in seq], diff["decode"], sec > 0)
    log(f"  after an eager step: decode step {diff['decode'] * 1e3:+.3f} ms, mixed step {diff['mixed'] * 1e3:+.3f} ms "
        f"over the same step after a decode step ({rounds} rounds): {sec * 1e3:.3f} ms priced; decode steps 1-{len(decay)} "
        f"after one: {' '.join(f'{x * 1e3:.3f}' for x in decay)} ms")
    sized = {}
    for n, rows in by_size.items():   # each size's decay by decay_profile's rule, capped by its own first step
        ex = [statistics.median(x) - base for x in rows]
        sized[str(n)] = [round(x * 1e3, 4) for x in decay_profile(ex, ex[0], sec > 0)]
    if sized:
        log("  decode steps 1-3 after a prompt chunk of " + "; ".join(
            f"{n} tokens: {' '.join(f'{x:+.3f}' for x in v[:3])} ms" for n, v in sized.items()) + " (over a decode step's)")
    return sec, {"decode_ms": round(diff["decode"] * 1e3, 4), "mixed_ms": round(diff["mixed"] * 1e3, 4), "rounds": rounds,
                 "decode_after_ms": [round(x * 1e3, 4) for x in decay], "chunk_tokens": big,
                 "decode_after_ms_by_tokens": sized}


# ----------------------------------------------------------------------------- calibrate
def build_engine(model: str, num_layers: int | None, device: str, dtype: str, max_num_seqs: int, max_model_len: int,
                 num_kv_blocks: int | None = None, seed: int = 0, max_batched_tokens: int | None = None) -> LLMEngine:
    """The engine calibrate/validate/tune measure (dummy weights)."""
    # the synchronous loop: calibration fits its host terms (loop_s = iteration - runner seconds)
    sc = validate(SchedulerConfig, dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched_tokens or token_budget_for(max_num_seqs, 8192),
                                        max_model_len=max_model_len, async_overlap=False), "scheduler options")
    return LLMEngine.from_args(model, load_format="dummy", device=device, dtype=dtype, seed=seed, max_model_len=max_model_len,
                               num_kv_blocks=num_kv_blocks, scheduler_config=sc, num_layers=num_layers)


def measure_grid(engine: LLMEngine, shapes, repeats: int, log, cuda: bool, quick: bool, max_num_seqs: int, max_model_len: int,
                 temperature: float) -> tuple[list[StepPoint], list[StepPoint], dict]:
    """The grid's step points, the loop's, and the step warm-up's summary, measured in this order:

    1. decode-only shapes (CUDA graphs, captured at engine start: nothing left to compile) on a GPU as cool as
       serving's: GPU Boost lowers the SM clock as the chip warms, and the warm-up and settle phases below run
       back-to-back 8k-token steps that serving does not (run 5: the grid's decodes 8-14% slower than serving's at
       the same batch, serving at 1955-1966 MHz; every point now logs its clock and temperature);
    2. the engine-loop batches (their own unmeasured pass first);
    3. the eager step warm-up (``warm_steps``) and the first-seen-shape probe;
    4. settle, then the eager shapes (prefill and mixed), each after a decode filler step as serving runs them."""
    dev = engine.runner.device
    k = next((j for j, sh in enumerate(shapes) if sh[1]), len(shapes))   # step_grid lists the decode-only shapes first
    t2 = time.perf_counter()
    log(f"  {'GPU' if dev.type == 'cuda' else 'device'} before the decode grid" + _state_text(gpu_state(dev)))
    pts = measure_steps(engine, shapes, repeats, log, interleave=False, temperature=temperature, span=(0, k))
    t3 = time.perf_counter()
    if cuda and not quick:
        loop_batches = [(b, p, 10) for p in (128, 1024) for b in (1, 4, 16, 64, 128)] + [(8, 32, 8), (32, 32, 8), (96, 32, 8)]
    else:
        loop_batches = [(1, 16, 4), (8, 16, 4)]
    loop_batches = [x for x in loop_batches if x[0] <= max_num_seqs and x[1] < max_model_len - x[2]]
    loop_pts = measure_loop(engine, loop_batches, temperature=temperature)
    log(f"  loop: {len(loop_pts)} iterations in {time.perf_counter() - t3:.1f} s" + _state_text(gpu_state(dev)))
    warm = {}
    if cuda:  # first-use costs (JIT keys, allocator growth) of the eager shapes, before any of them is timed
        rows = warm_steps(engine, log=log, temperature=temperature)
        warm = {"shapes": len(rows), "seconds": round(sum(r["first_s"] + r["second_s"] for r in rows), 1),
                "first_over_again_max": round(max((r["first_s"] / r["second_s"] for r in rows if r["second_s"] > 0), default=1.0), 2),
                "new_shape_probe": {k: round(v, 2) for k, v in probe_new_shape(engine, log=log, temperature=temperature).items()},
                **gpu_state(dev)}
        log("  GPU after the step warm-up" + _state_text(warm))
    if cuda and not quick:  # settle: steady back-to-back steps for a few seconds before the eager shapes are timed
        settle_s = _settle(engine, shapes, seconds=8.0, temperature=temperature)
        log(f"  settled {settle_s:.1f} s (decode and prefill steps back to back, untimed)" + _state_text(gpu_state(dev)))
    pts += measure_steps(engine, shapes, repeats, log, interleave=cuda and not quick, temperature=temperature, span=(k, len(shapes)))
    log(f"  steps: {len(pts)} shapes x {repeats} in {time.perf_counter() - t2:.1f} s (with the loop and warm-up)")
    return pts, loop_pts, warm


def calibrate(model: str, num_layers: int | None, device: str, dtype: str | None = None, *, quick: bool = False,
              repeats: int | None = None, max_model_len: int = 4096, max_num_seqs: int | None = None,
              command: str = "", log=print, engine: LLMEngine | None = None,
              temperature: float = MEASURE_TEMPERATURE) -> CalibrationProfile:
    """Measure and fit: a CalibrationProfile with op tables, a fitted step model and provenance.

    ``temperature``: how the grid's and the loop's requests sample (``executor.synthetic_steps``: what validation
    replays sample with too). On CUDA the eager step shapes serving will see run once first (``warm_steps``), and
    a first-seen chunk shape is probed for a per-shape cost left over (logged, kept in the provenance)."""
    dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    cuda = device == "cuda"
    max_num_seqs = max_num_seqs or (128 if cuda and not quick else 32)
    repeats = repeats or (5 if cuda else 3)
    t0 = time.perf_counter()
    if engine is None:
        bs = 64
        blocks = max_num_seqs * (-(-max_model_len // bs)) + 64
        engine = build_engine(model, num_layers, device, dtype, max_num_seqs, max_model_len, num_kv_blocks=blocks)
    build_s = time.perf_counter() - t0
    warm_s = engine.warmup() if cuda else 0.0
    hw = hardware_name(device)
    L = engine.cfg.spec.num_layers
    log(f"calibrate: {model} ({L} layers, {dtype}) on {device}, hardware basis {hw}; build {build_s:.1f} s, warm-up {warm_s:.1f} s"
        + _state_text(gpu_state(engine.runner.device)))
    probes = {"start": host_probe(engine.runner)}   # the host's speed now (executor/host_probe.py): again after the grid, at the end
    issues = {"start": issue_probe_or_none(engine, log)}   # and a fixed mixed step's forward issue, at the same points

    rows = linear_rows(cuda and not quick, getattr(getattr(engine.runner, "piecewise", None), "captured", ()) or ())
    t1 = time.perf_counter()
    try:
        op_pts = bench_linear(engine, rows, repeats=max(repeats, 10) if cuda else repeats)
    except Exception as e:  # noqa: BLE001  (an op benchmark failing must not lose the step calibration)
        log(f"  op benchmark failed: {type(e).__name__}: {e}")
        op_pts = []
    if cuda and not quick:
        try:   # the model's own FP8 GEMMs at every token bucket (costmodels.op_table.table_from_points)
            tg = time.perf_counter()
            gem = bench_gemm_shapes(engine, rows)
            op_pts += gem
            log(f"  GEMMs: {len({(p['n'], p['k']) for p in gem})} shapes x {len(rows)} rows in {time.perf_counter() - tg:.1f} s")
        except Exception as e:  # noqa: BLE001
            log(f"  GEMM shapes failed: {type(e).__name__}: {e}")
    try:
        more = bench_ops(engine, repeats=max(repeats, 10) if cuda else repeats, quick=quick or not cuda)
    except Exception as e:  # noqa: BLE001
        log(f"  op benchmarks failed: {type(e).__name__}: {e}")
        more = []
    op_pts += more
    log(f"  ops: {len(op_pts)} shapes ({', '.join(sorted({p['op'] for p in op_pts}))}) in {time.perf_counter() - t1:.1f} s")
    for p in more:
        if p["op"] == "decode_step":
            log(f"    decode step b={p['batch']}: {p['mode']} {p['time_s'] * 1e3:.2f} ms")

    shapes = step_grid(device, quick, max_model_len, max_num_seqs, engine.scheduler.config.max_num_batched_tokens)
    pts, loop_pts, warm = measure_grid(engine, shapes, repeats, log, cuda, quick, max_num_seqs, max_model_len, temperature)
    probes["after_grid"] = host_probe(engine.runner)
    issues["after_grid"] = issue_probe_or_none(engine, log)

    base = CalibrationProfile.default(get_hardware(hw))
    tables = op_tables(op_pts, hw)
    # the dense GEMM table rows of the library the engine ran (its measured Linear), not DeepGEMM's by default: the
    # Triton FP8 GEMM is 1.5-2.3x slower at decode rows, which the fit otherwise takes up as a dense-GEMM scale of 2
    # and the op points themselves: the step model prices from them what it prices from them when the saved profile
    # predicts (the model's own FP8 GEMM table, costmodels.op_table.table_from_points), so the fit's scales are fitted
    # on the pricing that uses them (without them here, run 27's fit priced GEMMs from the committed op table and its
    # predictions from its own table)
    # and the GPU it ran on (``measured_on``): the own GEMM table prices only on the GPU it was timed on
    # (``StepOps._gemm_table``), and the analytic defaults say H200; without it a calibration on another GPU (H100 run 45)
    # fitted its scales on the committed H200 op table's GEMMs and predicted with its own: graph device scale 1.076
    # where the forwards timed with the GPU held give 1.045 on the pricing that predicts, decode device work +0.9-2.3%
    prof = base.model_copy(update={"tables": {**base.tables, **tables}, "op_points": op_pts,
                                   "op_table_libs": CalibrationProfile.measured_libs(op_pts, dtype),
                                   "measured_on": hw if cuda else "cpu"})
    graphs = getattr(engine.runner, "graphs", None)
    graph_sizes = list(graphs.captured) if graphs is not None else []
    pieces = getattr(engine.runner, "piecewise", None)   # piecewise CUDA graphs: prefill/mixed steps pad to a token bucket
    step = fit_step_profile(prof, pts + loop_pts, model=model, dtype=dtype, device=device, hardware_basis=hw, graph_sizes=graph_sizes,
                            piecewise_sizes=list(pieces.captured) if pieces is not None else [])
    admit, admit_pts = measure_admission(engine, temperature=temperature)
    admit, held = clip_terms(LoopTerms, admit)   # a slow host's measurement past a bound is held at it, and said
    step.loop = step.loop.model_copy(update=admit)
    after_s, after = measure_after_eager(engine, rounds=16 if cuda and not quick else 3, temperature=temperature, log=log)
    by_tokens = sorted([(int(after.get("chunk_tokens", 0)), [x / 1e3 for x in after.get("decode_after_ms", [])])]
                       + [(int(n), [x / 1e3 for x in v]) for n, v in after.get("decode_after_ms_by_tokens", {}).items()])
    after_terms, held_after = clip_terms(HostTerms, {
        "after_eager_s": after_s, "after_eager_decode_s": [x / 1e3 for x in after.get("decode_after_ms", [])],
        # priced by the prompt step's size where more than one size was measured
        "after_eager_decode_by_tokens": by_tokens if len(by_tokens) > 1 else []})
    step.host = step.host.model_copy(update=after_terms)
    if held or held_after:
        step.notes.append("measured host terms past their bounds held at them (costmodels.step_profile): "
                              + ", ".join(held + held_after))
        log(f"  note: {step.notes[-1]}")
    split = queued_split_text(pts)
    if split:
        log(f"  {split}")
    if admit:
        log(f"  admission (add_request): {admit['admit_s'] * 1e6:.1f} us + {admit['admit_per_token_s'] * 1e9:.1f} ns/prompt token "
            "(" + ", ".join(f"{p['prompt_tokens']}: {p['seconds'] * 1e6:.0f} us" for p in admit_pts) + ")")
    power_ref = None
    if cuda and not quick:   # the board's power under its limit (costmodels.power): two loops of ~3 s
        try:
            from executor.power_ref import measure_power_reference
            power_ref = measure_power_reference(engine.runner, log=log)
        except Exception as e:  # noqa: BLE001  (a diagnostic phase: the profile stands without it)
            log(f"  power reference failed: {type(e).__name__}: {e}")
    probes["end"] = host_probe(engine.runner)
    issues["end"] = issue_probe_or_none(engine, log)
    issues = {k: round(v, 8) for k, v in issues.items() if v is not None}
    log("  host probe (a 64-sequence decode step's input build, median): "
        + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in probes.items()))
    if issues:
        log("  issue probe (a mixed step's forward issue, GPU held, median): "
            + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in issues.items()))
    moving = host_speed_note(probes)
    if moving:
        log("  warning: " + moving)
    kern = {}
    for p in op_pts:
        if p["op"] == "linear":
            kern.setdefault("linear", p.get("backend", "?"))
    kern.update({op: choice for op, choice in ops.reset_used().items()})
    prov = device_provenance(device)
    prov.update(command=command, model=model, num_layers=L, dtype=dtype, kernels=_kernel_choices(engine, device), seconds=round(time.perf_counter() - t0, 1),
                sampling_temperature=temperature, step_warmup=warm, admission=admit_pts, after_eager=after,
                host_probe_s={k: round(v, 8) for k, v in probes.items()}, **({"issue_probe_s": issues} if issues else {}))
    notes = list(base.notes) + [f"measured: {len(pts)} step shapes, {len(loop_pts)} loop iterations, {len(op_pts)} linear shapes on {prov.get('gpu')}"]
    if moving:
        notes.append(moving)
    gpu = prov.get("gpu", device)
    return prof.model_copy(update={
        "source": f"twinfer calibrate on {gpu}", "created": prov["date"],
        "notes": notes, "provenance": prov, "op_points": op_pts, "step": step, "power_ref": power_ref,
    })


def _kernel_choices(engine: LLMEngine, device: str) -> dict:
    """The backend the registry picks per op on this device (what the measured steps ran)."""
    out = {}
    try:
        from kernels import registry
        for op in ("fp8_gemm", "mla_decode", "attention_prefill", "moe_experts", "indexer_topk", "sampling", "gqa_decode"):
            try:
                ch = ops.choice(op, engine.runner.device)
                out[op] = [getattr(c, "name", str(c)) for c in ch.candidates][:3]
            except Exception:  # noqa: BLE001
                continue
        out["overrides"] = dict(getattr(registry, "_overrides", {}) or {})
    except Exception:  # noqa: BLE001
        pass
    return out
