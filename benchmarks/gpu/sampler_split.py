"""Issue 23: the step's sampler (DeepSeek-V3's logits GEMM over the sampled rows, then seeded sampling with one host
generator per row, as ``ModelRunner.sample_on_device`` runs it) by batch: eager seconds and, apart, its device work
launched behind a spin kernel -- calibrate's ``bench_sampler``, the points a calibration's ``sample`` table is built
from (``SampleTable.device_seconds``: what a pipelined loop cannot hide). No engine: the lm_head is a random BF16
[vocab, hidden] weight, as the 5-layer engine's dummy one.

    python -m benchmarks.gpu.sampler_split OUT.json [--batches 1,4,16,32,64,128] [--repeats 20]

``python -m benchmarks.gpu.sampler_split --into CALIBRATION.json POINTS.json`` writes a copy of a calibration whose
``sample`` table carries the measured device seconds (batches matched), to re-predict an archived run offline.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VOCAB, HIDDEN = 129280, 7168   # deepseek-v3


def measure(batches: list[int], repeats: int) -> list[dict]:
    import torch

    from executor.calibrate import bench_sampler

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    act = torch.bfloat16 if dev.type == "cuda" else torch.float32
    g = torch.Generator(device=dev).manual_seed(1)
    w = (torch.randn(VOCAB, HIDDEN, generator=g, device=dev, dtype=torch.float32) / HIDDEN ** 0.5).to(act)
    logits = lambda h: torch.nn.functional.linear(h, w).float()  # noqa: E731  (ModelBase.compute_logits)
    return bench_sampler(logits, VOCAB, HIDDEN, dev, act, repeats, batches, g)


def merge(calibration: str, points: str, out: str) -> dict:
    """A copy of ``calibration`` whose ``sample`` table takes ``points``' device seconds (its own eager seconds kept)."""
    from costmodels.calibration import CalibrationProfile, SampleTable

    prof = CalibrationProfile.load(calibration)
    pts = {float(p["batch"]): p for p in json.loads(Path(points).read_text())["points"] if p.get("device_s")}
    t = prof.tables.get("sample")
    if not isinstance(t, SampleTable) or any(b not in pts for b in t.batch):
        raise SystemExit(f"{calibration}: no sample table, or its batches {getattr(t, 'batch', None)} are not all in {points}")
    dev = [min(float(pts[b]["device_s"]), s) for b, s in zip(t.batch, t.seconds)]
    prof.tables["sample"] = t.model_copy(update={"device_seconds": dev})
    prof.tables["sample"] = SampleTable.model_validate(prof.tables["sample"].model_dump())
    for p in prof.op_points or []:   # and the points a refit rebuilds the table from
        if p.get("op") == "sample" and float(p.get("batch", 0)) in pts:
            p["device_s"] = min(float(pts[float(p["batch"])]["device_s"]), float(p["time_s"]))
    prof.save(out)
    return {"batch": t.batch, "seconds": t.seconds, "device_seconds": dev}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--batches", default="1,4,16,32,64,128")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--into", default=None, metavar="CALIBRATION", help="merge OUT (a points file) into CALIBRATION, "
                    "writing CALIBRATION's copy next to it as *_sampler_split.json")
    a = ap.parse_args(argv)
    if a.into:
        dst = str(Path(a.into).with_name(Path(a.into).stem + "_sampler_split.json"))
        doc = merge(a.into, a.out, dst)
        print(f"{dst}: sample table device seconds {[round(x * 1e3, 3) for x in doc['device_seconds']]} ms "
              f"(eager {[round(x * 1e3, 3) for x in doc['seconds']]})")
        return doc
    import torch

    t0 = time.perf_counter()
    pts = measure([int(x) for x in a.batches.split(",")], a.repeats)
    for p in pts:
        d = p.get("device_s")
        print(f"batch {p['batch']:4d}: eager {p['time_s'] * 1e3:.3f} ms, device {d * 1e3 if d else float('nan'):.3f} ms "
              f"({(d / p['time_s']) if d else float('nan'):.2f} of it), backend {p['backend']}", flush=True)
    doc = {"benchmark": "sampler_split", "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "vocab": VOCAB, "hidden": HIDDEN, "repeats": a.repeats, "points": pts,
           "total_s": round(time.perf_counter() - t0, 2), "command": "python -m benchmarks.gpu.sampler_split " + " ".join(argv or sys.argv[1:])}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


if __name__ == "__main__":
    main()
