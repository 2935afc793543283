"""Tune the Triton block-scaled FP8 GEMM's tiles on this GPU (issue 18: "the Triton kernels stay the portable fallback
and are tuned"), per GEMM shape and row count, and write the table ``kernels.gemm_tuning`` reads.

Shapes: every distinct FP8 weight GEMM (N x K) of DeepSeek-V3 as the executor runs it (q_a, kv_a, q_b, o_proj, the
dense and shared-expert MLPs) and as the committed op table names them (``benchmarks/gpu/op_tables.py`` V3_GEMMS:
fused qkv_a and gate_up), at M = 1 .. 8192 rows. Candidates per M: 64-row tiles with BLOCK_N 64/128/256 and split-K
1/2/4/8 up to 64 rows (few output tiles: split-K fills the SMs), 64- and 128-row tiles with split-K 1/2/4 up to 256,
then 128-row tiles (and 64 x 256); 3 or 4 pipeline stages. Each is timed as the op tables time GEMMs: device seconds
per call in a CUDA graph of back-to-back calls cycling weight copies that spill L2, median of replays; a config that
fails to compile or launch is skipped. The untuned choice (``triton_fp8_gemm.default_config``) is timed the same way,
and the winner is checked against the torch reference (relative error).

    python -m benchmarks.gpu.tune_fp8_gemm --out-dir OUT [--quick]

Writes ``OUT/triton_fp8_gemm.json`` (this GPU's entry merged into the committed table's other GPUs, with provenance)
and ``OUT/tune_fp8_gemm.csv`` (every shape and M: the untuned and tuned device microseconds, the tuned config, the
winner's relative error). ``TWINFER_TRITON_GEMM_CONFIGS=OUT/triton_fp8_gemm.json`` serves with it before it is
committed as ``kernels/configs/triton_fp8_gemm.json``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

M_GRID = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# the executor's DeepSeek-V3 FP8 Linears (N, K): its calibration's `gemm` points list exactly these
EXECUTOR_GEMMS = {"kv_a": (576, 7168), "q_a": (1536, 7168), "shared_gate": (2048, 7168), "shared_down": (7168, 2048),
                  "o_proj": (7168, 16384), "dense_down": (7168, 18432), "dense_gate": (18432, 7168), "q_b": (24576, 1536),
                  "linear_14336": (7168, 14336)}


def candidates(m: int) -> list[tuple[int, int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, warps, stages, split_k) to try at ``m`` rows."""
    out = []
    if m <= 64:
        for bn in (64, 128, 256):
            for st in (3, 4):
                for sk in (1, 2, 4, 8):
                    out.append((64, bn, 4, st, sk))
    elif m <= 256:
        for bm, warps in ((64, 4), (128, 8)):
            for bn in (128, 256):
                for st in (3, 4):
                    for sk in (1, 2, 4):
                        out.append((bm, bn, warps, st, sk))
    else:
        for bm, bn, warps in ((128, 128, 8), (128, 256, 8), (64, 256, 4), (128, 64, 4)):
            for st in (3, 4):
                out.append((bm, bn, warps, st, 1))
    return out


def shapes() -> dict[str, tuple[int, int]]:
    from benchmarks.gpu.op_tables import V3_GEMMS
    out = dict(EXECUTOR_GEMMS)
    for name, nk in V3_GEMMS.items():
        if nk not in out.values():
            out[f"table:{name}"] = nk
    return out


def tune(out_dir: Path, m_grid=M_GRID, quick: bool = False, log=print) -> dict:
    import torch

    from benchmarks.gpu.op_tables import copies_for, graph_time_us, reps_for
    from kernels import gemm_tuning
    from kernels import reference as R
    from kernels.triton_fp8_gemm import default_config, fp8_gemm
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()
    rows, entry = [], {}
    todo = shapes()
    if quick:
        todo = dict(list(todo.items())[:2])
        m_grid = (1, 64, 512)
    t0 = time.perf_counter()
    for sname, (n, k) in todo.items():
        w = torch.randn(n, k, device=dev) * 0.02
        wq, ws = R.quant_fp8_weight(w)
        del w
        ncop = copies_for(n * k)
        wlist = [(wq.clone(), ws.clone()) for _ in range(ncop - 1)] + [(wq, ws)]
        tuned = {}
        for m in m_grid:
            x = torch.randn(m, k, device=dev)
            xq, xs = R.quant_fp8_act(x)
            del x

            def device_us(cfg):
                fns = [lambda a=a, b=b: fp8_gemm(xq, xs, a, b, torch.bfloat16, config=cfg) for a, b in wlist]
                guess = graph_time_us(fns[:1], 4, 3)
                return graph_time_us(fns, reps_for(guess))

            base_cfg = default_config(m)
            base = device_us(base_cfg)
            best, best_cfg, tried, failed = base, base_cfg, 0, 0
            for cfg in candidates(m):
                if cfg == base_cfg:
                    continue
                try:
                    t = device_us(cfg)
                except Exception:  # noqa: BLE001 - a config that cannot compile or launch here is skipped
                    failed += 1
                    continue
                tried += 1
                if t < best:
                    best, best_cfg = t, cfg
            got = fp8_gemm(xq[:256], xs[:256], wq, ws, torch.float32, config=best_cfg)
            want = R.fp8_gemm_blockscaled(xq[:256], xs[:256], wq, ws, torch.float32)
            rel = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
            tuned[str(m)] = list(best_cfg)
            rows.append({"name": sname, "m": m, "n": n, "k": k, "default_us": round(base, 3), "tuned_us": round(best, 3),
                         "speedup": round(base / best, 3), "config": "x".join(map(str, best_cfg)), "tried": tried,
                         "failed": failed, "rel_err": f"{rel:.2e}", "tflops": round(2 * m * n * k / best / 1e6, 2)})
            log(f"  {sname:22s} M={m:5d}: untuned {base:8.2f} us -> {best:8.2f} us ({base / best:4.2f}x) "
                f"{'x'.join(map(str, best_cfg))} ({tried} tried, {failed} failed) rel err {rel:.1e}  "
                f"[{time.perf_counter() - t0:.0f} s]")
            del xq, xs
        entry[f"{n},{k}"] = tuned
        del wlist, wq, ws
        torch.cuda.empty_cache()
    base = gemm_tuning.load(gemm_tuning.DEFAULT_PATH) if gemm_tuning.DEFAULT_PATH.exists() else {"devices": {}}
    table = {"provenance": dict(base.get("provenance", {})), "devices": dict(base.get("devices", {}))}
    table["devices"][name] = entry
    table["provenance"][name] = {
        "command": "python -m benchmarks.gpu.tune_fp8_gemm " + " ".join(sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
        "triton": __import__("triton").__version__, "cuda": torch.version.cuda,
        "method": "device us per call in a CUDA graph of back-to-back calls over L2-spilling weight copies (median of "
                  "replays, benchmarks/gpu/op_tables.graph_time_us); the fastest candidate per (N, K, M)",
        "seconds": round(time.perf_counter() - t0, 1)}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "triton_fp8_gemm.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    with open(out_dir / "tune_fp8_gemm.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    return table


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--quick", action="store_true", help="two shapes at three row counts (a smoke run)")
    a = ap.parse_args(argv)
    import os

    from kernels import gemm_tuning
    os.environ[gemm_tuning.ENV] = "off"   # every timed config is explicit; the untuned choice is the baseline
    gemm_tuning.reset()
    tune(Path(a.out_dir), quick=a.quick)
    print(f"wrote {a.out_dir}/triton_fp8_gemm.json and tune_fp8_gemm.csv")


if __name__ == "__main__":
    main()
