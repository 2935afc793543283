"""Held-out shapes beyond the calibration grid, timed on the engine a calibration just measured (issue 16).

The calibration times one prefill chunk's attention (``attn_prefill_chunk``) at cached levels up to
``executor.calibrate.CHUNK_CACHED[-1]`` (6,144) and its step grid's chunks over at most 6,144 cached tokens; beyond that
the cost model extrapolates (``costmodels.calibration.PrefillChunkTable``). The matrix's longctx class runs its
continuation chunks at ~8,190 cached tokens, where its prompt-bearing steps came out 5.8% slower than priced on an
H200 (runs 61 and 63) against ~3% on the grid's own levels. This probe measures what the extrapolation stands for,
with nothing fitted to it:

- ``ops``: the chunk's attention and its K/V expansion at cached levels on both sides of the grid's last one, the same
  code the calibration runs (``executor.calibrate.bench_prefill_chunks``);
- ``steps``: whole prompt-bearing steps (eager, each after a decode-graph filler as serving runs them) of one chunk
  over cached context in and beyond the grid, and the same beside 8 decodes at 9k context, the calibration's own
  ``measure_steps`` (wall, the forward's device time behind a held GPU, clock and temperature).

``benchmarks/beyond_grid_check.py`` prices each against the run's calibration (the extrapolation flagged) and
prints the error in and beyond the grid. ``scripts/device_matrix.py --beyond-probe`` runs it right after calibrating.
"""

from __future__ import annotations

import time

import torch

# (new, cached) of the op points: the grid's last two levels and three beyond it, up to 12k + 4k in a 16k window
OP_NEW = (512, 1024, 2048, 4096)
OP_CACHED = (4096, 6144, 8192, 10240, 12288)
EXPAND_KEYS = (4096, 6144, 8192, 10240, 12288, 16384)
# steps: one chunk of q tokens over k cached, alone and beside 8 decodes at ~9k context
STEP_NEW = (512, 2048, 3584)
STEP_CACHED = (2048, 4096, 6144, 8192, 10240)
DECODE_CTX = 9000


def shapes(max_len: int) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """The probe's step shapes that fit a ``max_len`` window."""
    out = [([], [(q, k)]) for k in STEP_CACHED for q in STEP_NEW if q + k < max_len]
    out += [([DECODE_CTX] * 8, [(2048, k)]) for k in (4096, 8192) if 2048 + k < max_len and DECODE_CTX < max_len - 2]
    return out


def probe(engine, repeats: int = 5, log=print) -> dict:
    """``{"ops": [...], "steps": [StepPoint dicts], "seconds": s}`` on ``engine`` (CUDA, an MLA model)."""
    from executor.calibrate import CHUNK_CACHED, _Clock, _median_time, bench_prefill_chunks, measure_steps
    from executor.mla import MLAAttention

    t0 = time.perf_counter()
    runner = engine.runner
    dev = runner.device
    mla = next((m for m in runner.model.modules() if isinstance(m, MLAAttention)), None)
    if mla is None or runner.kv.latent is None:
        raise ValueError("the beyond-grid probe needs an MLA model (its prefill chunks' attention)")
    cache = runner.kv.latent[mla.cache_layer]
    act = runner.kv.dtype
    g = torch.Generator(device=dev).manual_seed(7)
    clock = _Clock(dev)

    def timed(fn):
        with torch.inference_mode():
            return _median_time(fn, clock, max(repeats, 5))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(act)

    ops = bench_prefill_chunks(mla, cache, engine.max_model_len, timed, randn, list(OP_NEW), list(OP_CACHED), list(EXPAND_KEYS))
    for p in ops:
        log(f"  beyond-grid op {p['op']}: " + (f"new {p['new']} cached {p['cached']}" if "new" in p else f"keys {p.get('keys')}")
            + f": {p['time_s'] * 1e6:.0f} us" + (f", device {p['device_s'] * 1e6:.0f} us" if "device_s" in p else ""))
    sh = shapes(engine.max_model_len)
    pts = measure_steps(engine, sh, repeats, log=log, interleave=True)
    return {"ops": ops, "steps": [p.model_dump() for p in pts], "seconds": time.perf_counter() - t0,
            "grid_cached_max": max(CHUNK_CACHED)}
