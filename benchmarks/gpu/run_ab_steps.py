"""Where two engine configurations differ, step by step: `twinfer run --step-log` files of A/B passes of one workload
(``scripts/device_run_ab.sh``), grouped by step kind and size, and the one-off slow steps (a first-call kernel compile
mid-run shows as a step many times its group's median).

    python -m benchmarks.gpu.run_ab_steps OFF.jsonl TUNED.jsonl [MORE.jsonl ...] [--labels off,tuned,...]
    python -m benchmarks.gpu.run_ab_steps STEPS.jsonl        # one pass: its groups and its one-off slow steps

Groups: decode-only steps as the CUDA graph or piecewise bucket they replayed (eager otherwise) by decode batch;
prompt-bearing steps by their token count (bins); per pass the steps, the median and mean wall ms, and the total
seconds; the last columns compare each pass with the first (ratio of medians, total seconds more). Outliers: steps
over ``--outlier`` x their group's median in that pass (default 5), with their size and wall.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

TOKEN_BINS = (128, 512, 1024, 2048, 4096, 8192)


def load(path: Path) -> list[dict]:
    """The step log's rows (one JSON object per line; blank lines skipped)."""
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise SystemExit(f"{path}:{i}: not a JSON line ({e})") from None
    return rows


def group(rec: dict) -> str:
    """A step's group: decode-only by batch and how it ran, prompt-bearing by token bin."""
    if not rec.get("num_prefills"):
        how = "graph" if rec.get("cuda_graph") else "pieces" if rec.get("piecewise_bs") else "eager"
        b = int(rec.get("num_decodes", 0))
        return f"decode {how} b={'1' if b <= 1 else '2-8' if b <= 8 else '9-32' if b <= 32 else '33+'}"
    t = int(rec.get("num_tokens", 0))
    for b in TOKEN_BINS:
        if t <= b:
            return f"prompt <= {b} tok"
    return f"prompt > {TOKEN_BINS[-1]} tok"


def summarise(passes: list[list[dict]]) -> dict[str, list[dict]]:
    """{group: [per pass {"n", "median_ms", "mean_ms", "total_s"}]} over the groups any pass has."""
    names = sorted({group(r) for p in passes for r in p})
    out = {}
    for g in names:
        row = []
        for p in passes:
            w = [float(r["wall_s"]) for r in p if group(r) == g]
            row.append({"n": len(w), "median_ms": statistics.median(w) * 1e3 if w else None,
                        "mean_ms": statistics.fmean(w) * 1e3 if w else None, "total_s": sum(w)})
        out[g] = row
    return out


def outliers(steps: list[dict], factor: float) -> list[tuple[str, dict, float]]:
    """Steps over ``factor`` x their group's median wall in this pass: (group, step, ratio)."""
    by: dict[str, list[float]] = {}
    for r in steps:
        by.setdefault(group(r), []).append(float(r["wall_s"]))
    med = {g: statistics.median(w) for g, w in by.items()}
    out = []
    for r in steps:
        g = group(r)
        if med[g] > 0 and float(r["wall_s"]) > factor * med[g]:
            out.append((g, r, float(r["wall_s"]) / med[g]))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--labels", default=None, help="comma list, one per log [the file names]")
    ap.add_argument("--outlier", type=float, default=5.0)
    a = ap.parse_args(argv)
    labels = a.labels.split(",") if a.labels else [p.stem for p in a.logs]
    if len(labels) != len(a.logs):
        ap.error(f"--labels: {len(labels)} labels for {len(a.logs)} logs")
    passes = [load(p) for p in a.logs]
    summ = summarise(passes)
    print(f"{'group':24s} " + " | ".join(f"{lb:>30s}" for lb in labels) + " | vs " + labels[0])
    for g, row in summ.items():
        cells = [f"{c['n']:5d} x {c['median_ms']:8.2f} ms, {c['total_s']:6.2f} s" if c["n"] else f"{'-':>30s}" for c in row]
        base = row[0]
        cmp = [f"x{c['median_ms'] / base['median_ms']:.3f} ({c['total_s'] - base['total_s']:+.2f} s)"
               for c in row[1:] if c["n"] and base["n"]]
        print(f"{g:24s} " + " | ".join(cells) + " | " + " ".join(cmp))
    totals = [sum(float(r["wall_s"]) for r in p) for p in passes]
    print("total step seconds: " + ", ".join(f"{lb} {t:.2f}" for lb, t in zip(labels, totals)))
    out = {"groups": summ, "totals": dict(zip(labels, totals)), "outliers": {}}
    for lb, p in zip(labels, passes):
        o = outliers(p, a.outlier)
        out["outliers"][lb] = [{"group": g, "num_tokens": r.get("num_tokens"), "wall_ms": float(r["wall_s"]) * 1e3,
                                "x_median": x} for g, r, x in o]
        if o:
            print(f"{lb}: {len(o)} steps over {a.outlier:g}x their group's median, "
                  f"{sum(float(r['wall_s']) for _, r, _ in o):.2f} s in all; largest: "
                  + ", ".join(f"{g} {r.get('num_tokens')} tok {float(r['wall_s']) * 1e3:.0f} ms (x{x:.0f})"
                              for g, r, x in sorted(o, key=lambda t: -t[2])[:4]))
    return out


if __name__ == "__main__":
    main()
