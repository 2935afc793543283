"""Re-score a committed replay bench run with today's table model (issue 23): same measurements, same op tables.

``benchmarks/gpu/replay_bench.py`` writes, per workload and policy, the measured seconds and the table-based
prediction of that day's ``costmodels.replay_table``. This re-prices every row from the run's own committed op
tables (``benchmarks/gpu/replay_tables.py``'s file) with the model as it is now, next to:

- ``segments``: the run's own headline prediction where it has one (runs from the segments commit on: the forwards' pieces measured in
  the bench's process, ``costmodels.replay_segments``), re-priced from its ``segments`` record by today's queue;
- ``grid``: the prediction at unmeasured shapes where the run has one (runs with ``replay_grid``: the same kinds of
  pieces measured on a grid of shapes that holds out every workload shape, in the workload's rounds), re-priced from
  the workload's grid by today's ``costmodels.replay_grid`` (interpolated, queued as ``segments``);
- ``committed``: the prediction stored in the run (``table_predicted_s``);
- ``lump``: the first table model recomputed (a layer's glue before its first call, a call's kernels all issued at
  the end of its host time, the x + y launch gap): on a run priced by that model it gives ``committed`` back, which
  checks that the rows are priced as the run priced them;
- ``model``: today's model on the run's tables (glue spread over a layer's calls, a call's kernels issued one by one
  over its host time; the decoder-layer launch gap and the layer host over rows where the tables have them);
- ``probe``: today's model with the host speed of the probe the run took beside its timed rounds (runs after
  1aaf485), ``ExecTables.with_host``;
- ``layered``: ``probe`` (or ``model`` without a probe) with each layer's unit device times scaled to the whole-layer
  graph times the tables measured at that layer's rows (``layer_check``: tables after 1aaf485), a diagnostic of how
  units compose in a layer.

Then, per workload and policy, the measured change's resolution (``rounds_report``, lines after the summary): the change
from the medians of the rounds and paired round by round (this round's recompute over this round's policy), each with a
bootstrap 95% interval over the rounds (resampled jointly, seed 0), next to the predictions (``segments``, ``grid``, and
where the run has them ``segments_b2b``: the pieces' host times issued back to back, ``grid_iso``: the grid with its
isolated host times, ``grid_paired``: each grid sample's round priced off that sample alone, against the same round's
forwards; runs after 2026-12-03 keep every grid sample).

Nothing here reads a measured replay time to set a model term: measured seconds only enter the changes and their
difference in percentage points.

    python -m benchmarks.gpu.replay_rescore BENCH.json [--tables TABLES.json] [--json OUT]

``--tables`` defaults to the run's sibling file (``replay_bench_tables_X.json`` -> ``replay_tables_X.json``,
``replay_bench.json`` -> ``replay_tables.json``).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.gpu.replay_bench import _changes, _shape, bench_spec, policies, summary
from costmodels import replay_grid, replay_segments, replay_table
from costmodels.replay import prompt_chunks

MODELS = ("segments", "grid", "committed", "lump", "model", "probe", "layered")


def sibling_tables(bench: Path) -> Path:
    """The op tables committed next to a bench run: ``replay_bench_tables_X.json`` -> ``replay_tables_X.json``
    (``replay_bench.json.gz`` -> ``replay_tables.json``)."""
    name = bench.name.removesuffix(".gz").replace("replay_bench_tables_", "replay_tables_").replace("replay_bench", "replay_tables")
    return bench.with_name(name)


def read_json(path: Path):
    """A JSON file, gzip-compressed when its name ends in ``.gz`` (the large committed bench runs are)."""
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def parts_of(kind: str, w: dict) -> list[tuple[int, int]]:
    """(new, cached) of each chunk a workload's forward runs."""
    if kind == "prefix_hit":
        return [(int(w["new_tokens"]), int(w["context"]))]
    return prompt_chunks(int(w["prompt"]), int(w["chunk"]))


def rescore(bench: dict, tables: dict) -> dict:
    """A copy of ``bench`` whose rows carry ``{model}_predicted_s`` / ``_change`` / ``_diff_pp`` for ``MODELS`` and a
    ``summary`` over them; ``lump_vs_committed`` is the largest relative difference of the two (0 when the rows
    were priced as the run priced them)."""
    out = copy.deepcopy(bench)
    spec = bench_spec(str(bench.get("model", {}).get("name", "")).endswith("tiny"))
    ws = sorted({int(p.split(":")[1]) for p in bench.get("policies", []) if p.startswith("replay:")})
    resolved = {name: pol.resolve(spec) for name, pol in policies(ws)}
    lump = replay_table.from_dict(tables, glue_mode="lump", gap_from="add", split=False)
    model = replay_table.from_dict(tables)
    check = layer_check(tables)
    worst = 0.0
    for kind in ("prefix_hit", "chunked"):
        for w in out.get(kind, []):
            parts = parts_of(kind, w)
            priced = replay_segments.price_policies(w["segments"], sync=bench.get("device") == "cpu") if w.get("segments") else {}
            for r in w["rows"]:
                if r["policy"] in priced:
                    r["segments_predicted_s"] = priced[r["policy"]].seconds
            for name, (cost, ext) in grid_priced(w, spec, bench.get("device") == "cpu").items():
                for r in w["rows"]:
                    if r["policy"] == name:
                        r["grid_predicted_s"], r["grid_extrapolated"] = cost.seconds, ext
            tabs = {"lump": lump, "model": model}
            if w.get("host_probe"):
                tabs["probe"] = model.with_host(w["host_probe"])
            for r in w["rows"]:
                if "table_predicted_s" in r:
                    r["committed_predicted_s"] = r["table_predicted_s"]
                for name, tab in tabs.items():
                    cost = replay_table.table_prefill_cost(tab, spec, resolved[r["policy"]], parts)
                    r[f"{name}_predicted_s"] = cost.seconds
                    r[f"{name}_host_s"] = cost.host_s
                    r[f"{name}_graph_s"] = cost.device_s - cost.gaps_s
                if check:
                    base = tabs.get("probe", model)
                    r["layered_predicted_s"] = layered_cost(base, spec, resolved[r["policy"]], parts, check)
                if "committed_predicted_s" in r:
                    worst = max(worst, abs(r["lump_predicted_s"] / r["committed_predicted_s"] - 1))
            _changes(w["rows"], 1, MODELS)
    out["summary"] = summary(out, MODELS)
    out["layer_check"] = check
    out["lump_vs_committed"] = worst
    out["rescored_with"] = {"gap_source": model.gap_source, "eager_gap_s": model.eager_gap, "glue": model.glue_mode,
                            "split": model.split, "layer_host_rows": bool(model.layer_host_rows)}
    return out


def grid_priced(w: dict, spec, sync: bool) -> dict:
    """policy -> (SegmentCost, pieces extrapolated) off the workload's own grid (``w["grid"]``), {} without one."""
    pts = (w.get("grid") or {}).get("points")
    if not pts or not (w.get("segments") or {}).get("plan"):
        return {}
    return replay_grid.price_plan(replay_grid.from_dict(w["grid"]), w["segments"]["plan"],
                                  [k == "sliding" for k in spec.kinds()], sync)


def layer_factor(check: list[dict], kind: str, rows: float) -> float:
    """Measured layer graph over its units' sum for a layer of ``kind`` at ``rows`` (the layer check's cells of that
    kind, contexts averaged, log-interpolated over rows, the nearest cell outside them); 1 where none."""
    by: dict[int, list[float]] = {}
    for c in check:
        if c["kind"] == kind and c["units_s"] > 0:
            by.setdefault(int(c["rows"]), []).append(c["layer_graph_s"] / c["units_s"])
    if not by:
        return 1.0
    xs = sorted(by)
    fs = [float(np.mean(by[x])) for x in xs]
    return float(np.interp(np.log(max(rows, 1.0)), np.log(xs), fs))


def layered_cost(tab, spec, resolved, parts: list[tuple[int, int]], check: list[dict]) -> float:
    """The eager stream with each layer's device seconds (launch gaps aside) as its unit tables' times scaled to the
    whole-layer graph the tables measured at that layer's rows (``layer_factor``): what the forward would take if
    the units compose in a layer as the measured layers say. Uses the tables only, no replay time."""
    kinds = list(spec.kinds())
    ops = []
    for n, c in parts:
        e = resolved.extra_tokens(c) if (c and resolved.modes) else np.zeros(len(kinds), np.int64)
        for o in replay_table.forward_ops(tab, spec, resolved, int(n), int(c)):
            if o.layer >= 0:
                f = layer_factor(check, kinds[o.layer], n + int(e[o.layer]))
                o = replace(o, device_s=(o.device_s - o.gap_s) * f + o.gap_s)
            ops.append(o)
    return replay_table.price(ops).seconds


def layer_check(tables: dict) -> list[dict]:
    """The tables' whole decoder-layer calls (``layer_gap_points`` from position 0, ``layer_points`` after a cached
    context: graph seconds of one layer call) next to the same layer priced from the unit tables under persist (its
    device seconds without launch gaps): whether the units add up to the layer they make. A diagnostic; nothing is
    scaled by it."""
    pts = [p | {"context": 0} for p in tables.get("layer_gap_points") or []] + list(tables.get("layer_points") or [])
    if not pts:
        return []
    spec = bench_spec(str(tables.get("model", {}).get("name", "")).endswith("tiny"))
    tab = replay_table.from_dict(tables)
    persist = policies([])[-1][1].resolve(spec)
    kinds = list(spec.kinds())
    out = []
    for p in pts:
        j = kinds.index(p["kind"])
        ops = [o for o in replay_table.forward_ops(tab, spec, persist, int(p["rows"]), int(p["context"])) if o.layer == j]
        units = sum(o.device_s - o.gap_s for o in ops)
        out.append({"kind": p["kind"], "rows": p["rows"], "context": p["context"], "layer_graph_s": p["graph_s"],
                    "units_s": units, "units_over_layer": units / p["graph_s"], "eager_s": p.get("eager_s"),
                    "kernels": p.get("kernels")})
    return out


def report(res: dict) -> str:
    """Per workload: each policy's measured change and, per model, its predicted change's difference in pp; then
    the summary (W within 5 pp, largest |pp|)."""
    lines = [f"rescored with {res['rescored_with']}; lump vs committed: {res['lump_vs_committed']:.2e} (relative)"]
    for kind in ("prefix_hit", "chunked"):
        for w in res.get(kind, []):
            head = _shape(kind, w)
            lines.append(f"{kind} {head}" + ("  (host probe)" if w.get("host_probe") else ""))
            lines.append(f"  {'policy':>11} {'measured':>9} {'change':>8}" + "".join(f" {m:>17}" for m in MODELS))
            for r in w["rows"]:
                cells = "".join(f" {r[m + '_predicted_s'] * 1e3:8.3f} {r[m + '_diff_pp']:+7.1f}pp" if m + "_diff_pp" in r
                                else f" {'-':>17}" for m in MODELS)
                lines.append(f"  {r['policy']:>11} {r['measured_s'] * 1e3:9.3f} {r['measured_change']:+8.1%}{cells}")
    for name, by in res["summary"].items():
        lines.append(f"{name}: " + ", ".join(f"{m} {v['ws_within_5pp']} W (max {v['max_abs_pp']} pp)" for m, v in by.items()))
    for kind in ("prefix_hit", "chunked"):
        for w in res.get(kind, []):
            lines += pieces_report(kind, w)
            lines += grid_report(kind, w)
    for c in res.get("layer_check", []):
        eager = f", eager {c['eager_s'] * 1e3:.3f} ms, {c['kernels']} kernels" if c.get("eager_s") else ""
        lines.append(f"layer {c['kind']} {c['rows']} rows after {c['context']}: graph {c['layer_graph_s'] * 1e3:.3f} ms, "
                     f"units {c['units_s'] * 1e3:.3f} ms ({c['units_over_layer']:.3f}x){eager}")
    lines += rounds_report(res)
    return "\n".join(lines)


BOOT = 2000
PER_ROUND = ("segments", "grid", "segments_b2b", "grid_iso")


def bootstrap(rows: list[dict], boot: int = BOOT, seed: int = 0) -> dict[str, dict]:
    """policy -> {n, medians: (change, lo, hi), paired: (change, lo, hi)} from the rows' per-round forward samples
    (``measured_samples_s``, the first row the recompute): the change from the rounds' medians and the median of the
    per-round changes, each with its bootstrap 95% interval (rounds resampled with replacement, the same rounds for
    every policy: a round's forwards stay together). {} where the rows lack equal-length samples."""
    ts = [[float(x[0]) for x in r.get("measured_samples_s") or []] for r in rows]
    n = len(ts[0]) if ts else 0
    if n < 2 or any(len(t) != n for t in ts):
        return {}
    t = np.array(ts)
    idx = np.random.default_rng(seed).integers(0, n, (boot, n))
    med = np.median(t[:, idx], axis=2)                     # policy x resample
    ratio = t[0] / t - 1                                   # policy x round
    pmed = np.median(ratio[:, idx], axis=2)
    out = {}
    for i, r in enumerate(rows):
        ch = med[0] / med[i] - 1
        out[r["policy"]] = {"n": n, "medians": (float(np.median(t[0]) / np.median(t[i]) - 1), *map(float, np.percentile(ch, [2.5, 97.5]))),
                            "paired": (float(np.median(ratio[i])), *map(float, np.percentile(pmed[i], [2.5, 97.5])))}
    return out


def grid_paired(w: dict, sync: bool) -> dict[str, tuple[float, float, int]]:
    """policy -> (median measured change, median predicted change, rounds) over the rounds the grid was sampled in:
    each such round's forwards against the plan priced off that round's grid sample alone (``replay_grid.round_grids``,
    back-to-back host where measured): host-mode drift lands on both. {} for grids with medians only."""
    g, plan = w.get("grid") or {}, (w.get("segments") or {}).get("plan")
    rows = w.get("rows") or []
    if not plan or not rows or not rows[0].get("measured_samples_s"):
        return {}
    rgs = replay_grid.round_grids(g)
    spec = bench_spec(False)
    sl = [k == "sliding" for k in spec.kinds()]
    meas: dict[str, list[float]] = {}
    pred: dict[str, list[float]] = {}
    base = rows[0]
    for r_i, grid in rgs:
        priced = replay_grid.price_plan(grid, plan, sl, sync)
        if base["policy"] not in priced or r_i >= len(base["measured_samples_s"]):
            continue
        for r in rows[1:]:
            if r["policy"] in priced and r_i < len(r.get("measured_samples_s") or []):
                meas.setdefault(r["policy"], []).append(base["measured_samples_s"][r_i][0] / r["measured_samples_s"][r_i][0] - 1)
                pred.setdefault(r["policy"], []).append(priced[base["policy"]][0].seconds / priced[r["policy"]][0].seconds - 1)
    return {p: (float(np.median(meas[p])), float(np.median(pred[p])), len(meas[p])) for p in meas}


def rounds_report(res: dict) -> list[str]:
    """Per workload: each policy's measured change with its bootstrap 95% interval, from the rounds' medians and
    paired round by round, next to each prediction's change and its difference in pp (medians against medians;
    ``segments_paired`` / ``segments_b2b_paired`` / ``grid_paired`` against the paired change); then per prediction the
    W within 5 pp and the median interval width (a prediction can be judged at 5 pp only where that is about 10 pp or
    less)."""
    out = []
    sync = res.get("device") == "cpu"
    for kind in ("prefix_hit", "chunked"):
        for w in res.get(kind, []):
            rows = w.get("rows") or []
            bs = bootstrap(rows)
            if not bs:
                continue
            gp = grid_paired(w, sync)
            n = next(iter(bs.values()))["n"]
            out.append(f"rounds {kind} {_shape(kind, w)}: {n} rounds; measured change % [bootstrap 95%] from medians and "
                       f"paired; predictions % (pp); grid sampled in {len(replay_grid.round_grids(w.get('grid') or {}))} rounds")
            within: dict[str, int] = {}
            widths: dict[str, list[float]] = {"medians": [], "paired": []}
            for r in rows[1:]:
                b = bs[r["policy"]]
                m, p = b["medians"], b["paired"]
                widths["medians"].append(100 * (m[2] - m[1]))
                widths["paired"].append(100 * (p[2] - p[1]))
                cells = []
                for name in PER_ROUND:
                    if f"{name}_predicted_s" in r and f"{name}_predicted_s" in rows[0]:
                        ch = rows[0][f"{name}_predicted_s"] / r[f"{name}_predicted_s"] - 1
                        cells.append((name, ch, 100 * (m[0] - ch)))
                for name in ("segments", "segments_b2b"):
                    if f"{name}_change_paired" in r and "measured_change_paired" in r:
                        cells.append((f"{name}_paired", r[f"{name}_change_paired"],
                                      100 * (r["measured_change_paired"] - r[f"{name}_change_paired"])))
                if r["policy"] in gp:
                    mm, pp, k = gp[r["policy"]]
                    cells.append(("grid_paired", pp, 100 * (mm - pp)))
                for name, _, d in cells:
                    if r["policy"].startswith("replay:") and abs(d) <= 5:
                        within[name] = within.get(name, 0) + 1
                    within.setdefault(name, 0)
                out.append(f"  {r['policy']:>11} medians {100 * m[0]:+7.1f} [{100 * m[1]:+7.1f},{100 * m[2]:+7.1f}]  paired "
                           f"{100 * p[0]:+7.1f} [{100 * p[1]:+7.1f},{100 * p[2]:+7.1f}]  "
                           + "  ".join(f"{name} {100 * ch:+7.1f} ({d:+6.1f})" for name, ch, d in cells))
            out.append(f"  interval width median (max) pp: medians {np.median(widths['medians']):.1f} ({max(widths['medians']):.1f}), "
                       f"paired {np.median(widths['paired']):.1f} ({max(widths['paired']):.1f}); W within 5 pp: "
                       + ", ".join(f"{k} {v}" for k, v in within.items()))
    return out


def grid_report(kind: str, w: dict) -> list[str]:
    """The grid's diagnostics of one workload: points, errors, pieces extrapolated per policy, and per kind of piece
    how the grid's reading of each workload piece compares with that piece measured at its own shape in the same
    rounds (median and worst grid / own - 1, host and device): the interpolation's error, piece by piece."""
    head = _shape(kind, w)
    g = w.get("grid") or {}
    if not g and not w.get("grid_error"):
        return []
    out = [f"grid {kind} {head}: {len(g.get('points', []))} points, sampled every {g.get('every')} rounds, traced "
           f"{g.get('traced')}, error {w.get('grid_error')}, trace error {w.get('grid_trace_error')}; extrapolated pieces "
           + str({r['policy']: r.get('grid_extrapolated') for r in w.get('rows', [])})]
    seg = (w.get("segments") or {}).get("segments")
    if not g.get("points") or not seg:
        return out
    spec = bench_spec(False)
    sl = [k == "sliding" for k in spec.kinds()]
    grid = replay_grid.from_dict(g)
    err: dict[str, list[tuple[float, float]]] = {}
    for key, s in seg.items():
        try:
            f = replay_grid.features(key, sl)
            got = grid.piece(*f).segment
        except replay_grid.GridError:
            continue
        err.setdefault(f[0], []).append((got.host_s / s["host_s"] - 1, got.device_s / s["device_s"] - 1))
    for k, xs in sorted(err.items()):
        hs, ds = [x[0] for x in xs], [x[1] for x in xs]
        out.append(f"  {k:>8}: {len(xs):3d} pieces, grid/own - 1: host median {100 * float(np.median(hs)):+6.1f}% "
                   f"(worst {100 * max(hs, key=abs):+6.1f}%), device median {100 * float(np.median(ds)):+6.1f}% "
                   f"(worst {100 * max(ds, key=abs):+6.1f}%)")
    return out


def pieces_report(kind: str, w: dict) -> list[str]:
    """The pieces' diagnostics of one workload (runs with a ``segments`` record): per policy the measured forward, its
    CUDA graph, the pieces' prediction and its device waits, the paired changes, the forward run piece by piece
    (its host and device end) against the isolated pieces' host sum, the median SM clock of the forward and of its
    pieces; the caching allocator's device allocations during the rounds; the profile's longest device waits."""
    seg = w.get("segments")
    if not seg:
        return []
    head = _shape(kind, w)
    out = [f"pieces {kind} {head}: {len(seg.get('segments', {}))} pieces, traced {seg.get('traced')}, "
           f"allocator during rounds {w.get('allocator_during_rounds')}, errors: segments {w.get('segment_error')} "
           f"trace {seg.get('trace_error')} timeline {seg.get('timeline_error')}",
           f"  {'policy':>11} {'measured':>9} {'graph':>8} {'pieces':>8} {'wait':>7} {'tl.dev':>8} {'tl.host':>8} "
           f"{'iso.host':>8} {'meas.MHz':>8} {'pc.MHz':>7} {'paired meas/pred/pp':>22} {'clocked pp':>10}"]
    segs = seg.get("segments", {})
    for r in w["rows"]:
        p = r["policy"]
        keys = seg.get("plan", {}).get(p, [])
        tl = seg.get("timeline", {}).get(p) or {}
        iso = sum(segs[k]["host_s"] for k in keys if k in segs)
        clk = [c for c in r.get("measured_clocks_mhz") or [] if c]
        pclk = [segs[k]["clock_mhz"] for k in keys if k in segs and segs[k].get("clock_mhz")]

        def ms(x):
            return f"{x * 1e3:8.3f}" if isinstance(x, (int, float)) else f"{'-':>8}"
        paired = (f"{100 * r['measured_change_paired']:+6.1f}/{100 * r['segments_change_paired']:+6.1f}/"
                  f"{r['segments_paired_diff_pp']:+5.1f}" if "segments_paired_diff_pp" in r else "-")
        clocked = f"{r['segments_clocked_paired_diff_pp']:+.1f}" if "segments_clocked_paired_diff_pp" in r else "-"
        out.append(f"  {p:>11} {ms(r['measured_s'])} {ms(r.get('measured_graph_s'))} {ms(r.get('segments_predicted_s'))} "
                   f"{ms(r.get('segments_wait_s'))[1:]} {ms((tl.get('device_end_s') or [None])[-1])} "
                   f"{ms((tl.get('host_end_s') or [None])[-1])} {ms(iso)} "
                   f"{(sum(clk) / len(clk)) if clk else float('nan'):8.0f} {(sum(pclk) / len(pclk)) if pclk else float('nan'):7.0f} "
                   f"{paired:>22} {clocked:>10}")
        prof = r.get("profile")
        if isinstance(prof, dict) and prof.get("top_waits_us_before_after_index"):
            out.append(f"  {'':>11} profile: {prof.get('kernels')} kernels, idle {prof.get('idle_s', 0) * 1e3:.2f} ms; "
                       "longest waits (us, kernel before -> after, index): "
                       + "; ".join(f"{g} {a[:28]} -> {b[:28]} @{i}" for g, a, b, i in prof["top_waits_us_before_after_index"][:6]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", help="a replay_bench JSON (benchmarks/gpu/issue23_h200/replay_bench_tables_*.json)")
    ap.add_argument("--tables", default=None, help="its op tables (default: the sibling replay_tables_*.json)")
    ap.add_argument("--json", default=None, help="write the re-scored run here")
    a = ap.parse_args(argv)
    bench_path = Path(a.bench)
    tables_path = Path(a.tables) if a.tables else sibling_tables(bench_path)
    if tables_path == bench_path:
        print(f"replay_rescore: {bench_path}: no sibling replay_tables file by name; give --tables", file=sys.stderr)
        return 2
    try:
        bench = read_json(bench_path)
        tables = read_json(tables_path)
    except (OSError, ValueError) as e:
        print(f"replay_rescore: cannot read {e}", file=sys.stderr)
        return 2
    try:
        res = rescore(bench, tables)
    except (replay_table.TableError, replay_grid.GridError, KeyError) as e:
        print(f"replay_rescore: {bench_path} with {tables_path}: {e}", file=sys.stderr)
        return 2
    print(report(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
