"""One report and one plot for a validation matrix made of one or more device calls (issue 16).

Each call of ``scripts/device_matrix.sh`` calibrates once and validates a few workload classes at three loads; a
matrix that covers every class takes several calls (the device's 10-minute limit). This reads their
``matrix_*.json`` (each call's own report: every level's relative errors, its per-step MAPE, its command and
provenance) and writes the matrix as one table, one JSON report and one heatmap:

    python3 benchmarks/matrix_report.py benchmarks/gpu/issue16_h200/run3{1,2,3}_* [--json M.json] [--plot M.html]

Rows are run x class, columns level x figure; a cell's colour is its error over the target (``sim.validate.TARGETS``:
step MAPE 5%, throughput and TPOT p50 5%, TTFT p50/p90 10%), so everything above 1 misses. Nothing is re-simulated:
the figures are what the device printed (``scripts/matrix_offline.py RUN`` re-simulates one run at HEAD).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.validate import TARGETS, on_a_step  # noqa: E402

FIGURES = ("output_throughput", "tpot_p50", "ttft_p50", "ttft_p90", "step_mape")
SHORT = {"output_throughput": "thr", "tpot_p50": "TPOT p50", "ttft_p50": "TTFT p50", "ttft_p90": "TTFT p90",
         "step_mape": "step MAPE"}
LEVELS = ("low", "knee", "past saturation")


def load_run(run: Path) -> dict:
    """A run's matrix report (``matrix_*.json``) as {run, command, loop, fp8_gemm, gpu, created, cells}."""
    files = sorted(Path(run).glob("matrix_*.json"))
    if not files:
        raise FileNotFoundError(f"{run}: no matrix_*.json (a folder written by scripts/device_matrix.py)")
    doc = json.loads(files[0].read_text())
    prov = doc.get("provenance") or {}
    gemm = ((prov.get("kernels") or {}).get("fp8_gemm") or ["?"])[0]
    cells = []
    for cls, c in (doc.get("classes") or {}).items():
        for lv in c.get("levels", []):
            err = lv.get("rel_error") or {}
            sens = lv.get("sensitivity") or {}   # (matrix files since 2026-12-06)
            cells.append({"class": cls, "level": lv.get("name"), **{k: err.get(k) for k in FIGURES if k != "step_mape"},
                          "step_mape": (lv.get("step") or {}).get("mape"),
                          "sensitivity": {k: sens.get(k) for k in FIGURES if k != "step_mape" and sens.get(k) is not None}})
    return {"run": Path(run).name, "command": doc.get("command", ""),
            "loop": "pipelined" if doc.get("async_overlap") else "synchronous", "fp8_gemm": gemm,
            "gpu": prov.get("gpu", prov.get("device", "?")), "created": doc.get("created", ""), "cells": cells}


def matrix(runs: list[dict]) -> dict:
    """The combined report: every cell with its run, each figure's worst cell and how many cells meet its target."""
    cells = [{"run": r["run"], **c} for r in runs for c in r["cells"]]
    worst, met = {}, {}
    for k in FIGURES:
        vals = [c for c in cells if c.get(k) is not None]
        if not vals:
            continue
        w = max(vals, key=lambda c: abs(c[k]))
        worst[k] = {"value": w[k], "run": w["run"], "class": w["class"], "level": w["level"]}
        met[k] = {"met": sum(abs(c[k]) <= TARGETS[k] for c in vals), "cells": len(vals), "target": TARGETS[k],
                  # misses where the prediction itself moves past the target with every step 2% off (marked '!')
                  "misses_on_a_step": sum(abs(c[k]) > TARGETS[k] and _on_a_step(c, k) for c in vals)}
    return {"runs": [{k: v for k, v in r.items() if k != "cells"} for r in runs], "cells": cells, "worst": worst,
            "met": met, "targets": {k: TARGETS[k] for k in FIGURES}}


def _on_a_step(cell: dict, k: str) -> bool:
    """Whether the cell's predicted figure ``k`` moves by more than its target with every step 2% longer or shorter
    (``sim.validate.on_a_step``; matrix files since 2026-12-06 record the move)."""
    return on_a_step((cell.get("sensitivity") or {}).get(k), k)


def table(m: dict) -> str:
    """The matrix as text: one line per run, class and level; a '*' marks a miss, a '!' a figure whose prediction
    moves by more than its target with every step 2% longer or shorter."""
    head = f"{'run':44} {'class':10} {'level':16}" + "".join(f" {SHORT[k]:>10}" for k in FIGURES)
    lines = [head]
    for c in m["cells"]:
        row = f"{c['run'][:44]:44} {c['class']:10} {c['level']:16}"
        for k in FIGURES:
            v = c.get(k)
            sign = "" if k == "step_mape" else "+"    # a MAPE has no sign
            mark = ("*" if abs(v) > TARGETS[k] else " ") + ("!" if _on_a_step(c, k) else " ") if v is not None else ""
            row += f" {'n/a':>11}" if v is None else f" {v * 100:{sign}8.1f}%{mark}"
        lines.append(row)
    lines.append("met: " + ", ".join(f"{SHORT[k]} {v['met']}/{v['cells']}" for k, v in m["met"].items())
                 + "; misses marked ! (the prediction moves past its target with steps 2% off): "
                 + str(sum(v["misses_on_a_step"] for v in m["met"].values())))
    lines.append("worst: " + ", ".join(f"{SHORT[k]} {w['value'] * 100:{'' if k == 'step_mape' else '+'}.1f}% "
                                       f"({w['run']} {w['class']} {w['level']})"
                                       for k, w in m["worst"].items()))
    return "\n".join(lines)


def figure(m: dict):
    """The heatmap: rows run x class, columns level x figure, colour |error| / target (capped at 2), text the error."""
    import plotly.graph_objects as go

    rows = list(dict.fromkeys((c["run"], c["class"]) for c in m["cells"]))
    cols = [(lv, k) for lv in LEVELS for k in FIGURES]
    by = {(c["run"], c["class"], c["level"]): c for c in m["cells"]}
    z, text = [], []
    for run, cls in rows:
        zr, tr = [], []
        for lv, k in cols:
            v = (by.get((run, cls, lv)) or {}).get(k)
            zr.append(None if v is None else min(abs(v) / TARGETS[k], 2.0))
            tr.append("" if v is None else f"{v * 100:.1f}" if k == "step_mape" else f"{v * 100:+.1f}")
        z.append(zr)
        text.append(tr)
    fig = go.Figure(go.Heatmap(
        z=z, x=[f"{lv}<br>{SHORT[k]}" for lv, k in cols], y=[f"{run.split('_')[0]} {cls}" for run, cls in rows],
        text=text, texttemplate="%{text}", zmin=0, zmax=2,
        colorscale=[[0, "#2e7d32"], [0.5, "#fdd835"], [0.5001, "#fb8c00"], [1, "#c62828"]],
        colorbar={"title": "|error| / target"}))
    runs = "; ".join(f"{r['run'].split('_')[0]}: {r['loop']} loop, {r['fp8_gemm']} GEMMs" for r in m["runs"])
    fig.update_layout(title=f"twinfer validation matrix: relative error (%) per cell, above 1 on the scale misses"
                            f"<br><sub>{runs}</sub>", height=160 + 36 * len(rows), width=1500,
                      yaxis={"autorange": "reversed"})
    return fig


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders, each with a matrix_*.json")
    ap.add_argument("--json", default=None, help="write the combined report here")
    ap.add_argument("--plot", default=None, help="write the heatmap here (.html: self-contained; images need kaleido)")
    a = ap.parse_args(argv)
    if a.plot:
        from twinfer.errors import TwinferError
        from ui.cmd_validate import check_plot_path
        try:
            check_plot_path(Path(a.plot))
        except TwinferError as e:
            ap.error(str(e))
    try:
        runs = [load_run(Path(r)) for r in a.runs]
    except FileNotFoundError as e:
        ap.error(str(e))
    m = matrix(runs)
    print(table(m))
    if a.json:
        Path(a.json).write_text(json.dumps(m, indent=1))
        print(f"report: {a.json}")
    if a.plot:
        fig = figure(m)
        if Path(a.plot).suffix.lower() == ".html":
            fig.write_html(a.plot, include_plotlyjs=True)
        else:
            fig.write_image(a.plot)
        print(f"plot: {a.plot}")
    return m


if __name__ == "__main__":
    main()
