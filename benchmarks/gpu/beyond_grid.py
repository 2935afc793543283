"""Held-out shapes beyond the calibration grid, timed on the engine a calibration just measured (issue 16).

The calibration times one prefill chunk's attention (``attn_prefill_chunk``) at cached levels up to
``executor.calibrate.CHUNK_CACHED[-1]`` (6,144) and its step grid's chunks over at most 6,144 cached tokens; beyond that
the cost model extrapolates (``costmodels.calibration.PrefillChunkTable``). The matrix's longctx class runs its
continuation chunks at ~8,190 cached tokens, where its prompt-bearing steps came out 5.8% slower than priced on an
H200 (runs 61 and 63) against ~3% on the grid's own levels. This probe measures what the extrapolation stands for,
with nothing fitted to it:

- ``ops``: the chunk's attention and its K/V expansion at cached levels on both sides of the grid's last one, the same
  code the calibration runs (``executor.calibrate.bench_prefill_chunks``);
- ``steps``: decode-only steps (CUDA-graph replays) at contexts in and beyond the grid's, and whole prompt-bearing
  steps (eager, each after a decode-graph filler as serving runs them) of one chunk over cached context in and beyond
  the grid, and the same beside 8 decodes at 9k context: the calibration's own ``measure_steps`` (wall, the forward's
  device time behind a held GPU, clock and temperature).

``benchmarks/beyond_grid_check.py`` prices each against the run's calibration (the extrapolation flagged) and
prints the error in and beyond the grid. ``scripts/device_matrix.py --beyond-probe`` runs it right after calibrating.
"""

from __future__ import annotations

import sys
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
# decode-only steps (CUDA-graph replays): the grid's decodes reach ~6k context (4,096 +-50%), FlashMLA's op table far
# beyond; batch x context on both sides
DECODE_BATCHES = (1, 2, 8, 32)
# a prompt step right after a long one (serving's continuation chunks: the first chunk of 8,192 tokens, then the rest
# over it): runs 56-64 priced those ~5% short on every board, where the same shapes after a decode step are priced
# within a point or two. Each trial rests REST_S idle, runs the step before (a decode step, the long prompt step, or
# the long step and IDLE_S idle) and then the shape, timed by the runner's CUDA events
AFTER_SHAPES = ((2048, 8192), (1024, 0))
AFTER_LONG = (8192, 0)
REST_S, IDLE_S = 0.3, 0.3
# and after LOAD_S of back-to-back decode steps before the long one, as serving's decode load between prompts: the
# governor prices the continuation's clock from that average (run 65: from rest its board model says full clock)
LOAD_S = 0.5
DECODE_CONTEXTS = (1024, 4096, 10000, 12000)


def shapes(max_len: int) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """The probe's step shapes that fit a ``max_len`` window."""
    out = [([c] * b, []) for b in DECODE_BATCHES for c in DECODE_CONTEXTS if c < max_len - 2]
    out += [([], [(q, k)]) for k in STEP_CACHED for q in STEP_NEW if q + k < max_len]
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
    after = after_long(engine, repeats, log)
    return {"ops": ops, "steps": [p.model_dump() for p in pts], "after_long": after, "seconds": time.perf_counter() - t0,
            "grid_cached_max": max(CHUNK_CACHED)}


# the limiter's clock around a long prompt step (``clock_trace``): NVML read every TRACE_DT s on a thread while the
# steps run; each sequence starts from REST_S + 0.2 s idle and ends with TRACE_TAIL_S idle
TRACE_DT, TRACE_TAIL_S = 0.0005, 0.5
TRACE_SEQUENCES = (("long, next", ("long", "next")), ("long x3, next", ("long", "long", "long", "next")),
                   ("next x6", ("next",) * 6))


def _nvml():
    """(read, names): ``read()`` gives (SM MHz, instant board W, 1 if the power cap holds the clock now) via NVML, or
    None where NVML cannot be read (no GPU, no pynvml)."""
    try:
        import pynvml
        # the current device's handle as torch maps it (CUDA_VISIBLE_DEVICES), as replay_segments' clock reader takes it
        h = torch.cuda._get_pynvml_handler(torch.cuda.current_device())
        field = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", 186)
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
        sw_cap = getattr(pynvml, "nvmlClocksEventReasonSwPowerCap", 0x4)

        def read():
            mhz = float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
            try:
                v = pynvml.nvmlDeviceGetFieldValues(h, [field])[0]
                w = float(v.value.uiVal) / 1000.0 if v.nvmlReturn == 0 else float("nan")
            except Exception:  # noqa: BLE001  (no instant field: the averaged reading)
                w = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            return mhz, w, 1 if reasons(h) & sw_cap else 0

        read()
        return read
    except Exception:  # noqa: BLE001
        return None


class NvmlSampler:
    """``read()`` (``_nvml``) every ``TRACE_DT`` s on a thread while the ``with`` block runs: ``samples`` as (seconds
    from ``t0``, MHz, W, capped); a reading NVML refuses ends the samples there."""

    def __init__(self, read):
        import threading

        self.read, self.samples, self._stop = read, [], threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self.t0 = 0.0

    def __enter__(self) -> "NvmlSampler":
        self.t0 = time.perf_counter()
        self._th.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter() - self.t0, *self.read()))
            except Exception:  # noqa: BLE001  (a reading NVML refuses mid-trace: the samples so far)
                return
            time.sleep(TRACE_DT)

    def now(self) -> float:
        """Seconds since the sampler started."""
        return time.perf_counter() - self.t0

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._th.join()


def clock_trace(engine, log=print) -> list[dict]:
    """The SM clock, the board's instant power and whether the power cap holds the clock, read through NVML every
    ``TRACE_DT`` s while an 8,192-token prompt step (``AFTER_LONG``) and the 2,048-over-8,192 continuation run from
    rest (``TRACE_SEQUENCES``), then ``TRACE_TAIL_S`` idle: how fast the limiter takes the clock down and gives it back
    (``costmodels.power``: the governor's control window and release). Per sequence: the steps' host spans (after
    a device synchronize) with their CUDA-event device seconds, and the samples (seconds from the trace's start, MHz,
    W, capped). Empty where NVML cannot be read."""
    from executor.synthetic_steps import drop_plan, synthetic_plan

    read = _nvml()
    if read is None or AFTER_LONG[0] + AFTER_LONG[1] >= engine.max_model_len:
        return []
    runner = engine.runner
    plans = {"long": synthetic_plan(engine, [], [AFTER_LONG], "ctLong_"),
             "next": synthetic_plan(engine, [], [AFTER_SHAPES[0]], "ctNext_")}
    out = []
    try:
        for p in plans.values():
            runner.execute(p)   # warm
        for name, seq in TRACE_SEQUENCES:
            torch.cuda.synchronize()
            time.sleep(REST_S + 0.2)
            with NvmlSampler(read) as sampler:
                time.sleep(0.03)   # the idle clock before the first step
                spans = []
                for step in seq:
                    a = sampler.now()
                    runner.execute(plans[step])
                    torch.cuda.synchronize()
                    spans.append({"step": step, "t0": a, "t1": sampler.now(),
                                  "device_s": float(runner.step_records[0].get("device_s", float("nan")))})
                time.sleep(TRACE_TAIL_S)
            rows = [[round(t, 5), m, round(w, 1), c] for t, m, w, c in sampler.samples]
            out.append({"sequence": name, "spans": spans, "samples": rows})
            for sp in spans:
                inside = [r for r in rows if sp["t0"] <= r[0] <= sp["t1"]]
                mhz = sorted(r[1] for r in inside)
                log(f"  trace {name}: {sp['step']} device {sp['device_s'] * 1e3:.2f} ms, SM "
                    + (f"{mhz[len(mhz) // 2]:.0f} MHz median, {mhz[0]:.0f} min, capped {sum(r[3] for r in inside)}/"
                       f"{len(inside)} samples, {max(r[2] for r in inside):.0f} W max" if inside else "no samples"))
            tail = [r for r in rows if r[0] > spans[-1]["t1"]]
            back = next((r[0] - spans[-1]["t1"] for r in tail if r[1] >= max(x[1] for x in rows)), None)
            log(f"  trace {name}: idle after: {len(tail)} samples, back at the top clock after "
                + (f"{back * 1e3:.0f} ms" if back is not None else "never in the tail"))
    finally:
        for p in plans.values():
            drop_plan(engine, p)
    return out


def sm_mhz() -> float | None:
    """The SM clock now (NVML through torch; the driver updates it about every 0.1 s), None where it cannot be read."""
    try:
        return float(torch.cuda.clock_rate())
    except Exception:  # noqa: BLE001  (pynvml absent: no clock reading)
        return None


def _median(xs: list) -> float | None:
    """The middle of ``xs`` (None when empty or any is None)."""
    return sorted(xs)[len(xs) // 2] if xs and all(x is not None for x in xs) else None


def after_long(engine, repeats: int = 5, log=print) -> list[dict]:
    """Each of ``AFTER_SHAPES`` timed right after a decode step, right after the long prompt step ``AFTER_LONG``, after
    the long step and ``IDLE_S`` idle, and after ``LOAD_S`` of decode steps and the long step: rows of the shape, the condition, the median step device seconds
    (``device_s``, the runner's CUDA events), its forward's, the SM clock read just before it, and the long step's own
    device seconds (from rest)."""
    from executor.synthetic_steps import drop_plan, synthetic_plan

    runner = engine.runner
    rows: list[dict] = []
    if AFTER_LONG[0] + AFTER_LONG[1] >= engine.max_model_len:
        return rows
    big = synthetic_plan(engine, [], [AFTER_LONG], "alBig_")
    fill = synthetic_plan(engine, [1000] * 8, [], "alFill_")
    try:
        runner.execute(big)
        runner.execute(fill)
        for q, k in AFTER_SHAPES:
            if q + k >= engine.max_model_len:
                continue
            plan = synthetic_plan(engine, [], [(q, k)], f"alS{q}_{k}_")
            try:
                runner.execute(plan)   # warm
                for cond in ("after a decode step", "after the long step", f"after the long step and {IDLE_S} s idle",
                             f"after {LOAD_S} s of decode steps and the long step"):
                    dev, fwd, mhz, long_dev = [], [], [], []
                    for _ in range(repeats):
                        torch.cuda.synchronize()
                        time.sleep(REST_S)
                        if cond.endswith("decode steps and the long step"):
                            t_load = time.perf_counter()
                            while time.perf_counter() - t_load < LOAD_S:
                                runner.execute(fill)
                        runner.execute(fill if cond.startswith("after a decode") else big)
                        if not cond.startswith("after a decode"):
                            long_dev.append(float(runner.step_records[0].get("device_s", float("nan"))))
                        if "idle" in cond:
                            time.sleep(IDLE_S)
                        mhz.append(sm_mhz())
                        runner.execute(plan)
                        rec = runner.step_records[0]
                        dev.append(float(rec.get("device_s", float("nan"))))
                        fwd.append(float(rec.get("forward_s", float("nan"))))
                    row = {"new": q, "cached": k, "condition": cond, "device_s": _median(dev), "forward_s": _median(fwd),
                           "device_all_s": dev, "mhz_before": _median(mhz), "long_device_s": _median(long_dev)}
                    rows.append(row)
                    log(f"  {q} over {k} {cond}: device {row['device_s'] * 1e3:.2f} ms"
                        + (f", SM {row['mhz_before']:.0f} MHz before it" if row["mhz_before"] else "")
                        + (f" (long step {row['long_device_s'] * 1e3:.1f} ms)" if row["long_device_s"] else ""))
            finally:
                drop_plan(engine, plan)
    finally:
        drop_plan(engine, big)
        drop_plan(engine, fill)
    return rows


def main() -> None:
    """The probe alone (no calibration, no matrix): ``python3 -m benchmarks.gpu.beyond_grid --out DIR`` on the matrix's
    engine (5-layer DeepSeek-V3 FP8, a 16,384-token window). Its rows read against each other (decode steps over
    context, a prompt step after a decode step or a long one); ``benchmarks/beyond_grid_check.py`` prices them where a
    run folder also holds a calibration. Then the limiter's clock around a long prompt step (``clock_trace``);
    ``--trace-only``: that alone."""
    import argparse
    import json
    from pathlib import Path

    from executor.calibrate import build_engine

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--num-layers", type=int, default=5)
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--trace-only", action="store_true", help="the clock trace alone (clock_trace), not the probe")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    bs, seqs = 64, 128
    engine = build_engine(a.model, a.num_layers, "cuda", a.dtype, seqs, a.max_model_len,
                          num_kv_blocks=seqs * (-(-a.max_model_len // bs)) + 64)
    warm = engine.warmup()
    print(f"engine built and warmed in {time.perf_counter() - t0:.1f} s (warm-up {warm:.1f} s)", flush=True)
    got = {"ops": [], "steps": [], "after_long": [], "seconds": 0.0} if a.trace_only else probe(engine)
    got["clock_trace"] = clock_trace(engine)
    (out / f"beyond_grid_{a.model}-{a.num_layers}layers_{a.dtype}.json").write_text(
        json.dumps({"command": "python3 -m benchmarks.gpu.beyond_grid " + " ".join(sys.argv[1:]), "profile": None,
                    "gpu": torch.cuda.get_device_name(), **got}) + "\n", encoding="utf-8")
    print(f"probe: {len(got['ops'])} ops, {len(got['steps'])} steps in {got['seconds']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
