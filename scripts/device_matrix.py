"""The twin's validation matrix (issue 16): ONE calibration, then several workload classes at three loads each,
every level replayed ``--runs`` times (median reported), no refit between them. What scripts/device_matrix.sh
runs on the H200; ``--device cpu --model tiny`` is the CPU smoke form.

    python3 scripts/device_matrix.py --out DIR [--classes chat,summarize,reasoning,agentic] [--runs 3]
        [--class-requests reasoning=64] [--no-level-warmup] [--temperature T] [--max-model-len 16384 --classes longctx]

Each class is a built-in workload preset with its lengths clamped to what the engine holds (the caps below
keep the class's character: summarize = long shared-prefix prompts, reasoning = long decodes, agentic =
multi-turn sessions with a shared system prompt; longctx = contexts beyond the calibration grid, which needs
``--max-model-len 16384``). Output: ``matrix_<tag>.json`` (every level's predicted vs measured figures and the
worst error per figure over the whole matrix; rewritten after each class, so a time-out keeps the classes done)
and the per-class validation reports.

Methodology (stated in every report's notes): calibration runs the eager step shapes once first
(``executor.synthetic_steps.warm_steps``) and logs what a first-seen chunk shape still costs; each level's trace is
replayed once unmeasured before its ``--runs`` measured replays (``--no-level-warmup`` drops that); calibration
and the replays sample at the same seeded temperature (``executor.synthetic_steps.MEASURE_TEMPERATURE``: diverse
tokens reach the router, as real weights' would).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402

# class -> (max input tokens, max output tokens) inside the engine's 8192-token window, the class's shape kept
# (agentic: the 4096-token shared system prompt plus the turns' growing context)
CLASSES = {"chat": (1024, 128), "summarize": (3072, 96), "reasoning": (256, 768), "agentic": (6144, 128),
           "longctx": (12000, 256)}
# class -> (built-in preset, overrides); longctx: prompts of 8.5-12k tokens, so decodes run at 8.5-12k context where the
# calibration grid's decode rows stop near 6k (4096 +-50%) and its chunks' cached context at 6144
PRESET = {"longctx": ("long-context", {"input_len": {"kind": "uniform", "min": 8500, "max": 12000},
                                       "output_len": {"kind": "uniform", "min": 64, "max": 256}})}
FIGURES = ("output_throughput", "tpot_p50", "ttft_p50", "ttft_p90")


def worst_errors(reports: dict) -> dict:
    """The largest |relative error| of each figure over every class and level, with where it happened."""
    worst = {}
    for cls, rep in reports.items():
        for lv in rep.levels:
            for fig, err in lv.rel_error.items():
                if err is None:
                    continue
                if fig not in worst or abs(err) > abs(worst[fig]["rel_error"]):
                    worst[fig] = {"rel_error": err, "class": cls, "level": lv.name}
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--num-layers", type=int, default=5)
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--requests", type=int, default=64, help="requests per class")
    ap.add_argument("--levels", default="0.3,0.8,2.0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--async-overlap", action=argparse.BooleanOptionalAction, default=True,
                    help="the executor's pipelined loop (serving's default) or the synchronous one; predicted the same way")
    ap.add_argument("--samples", action=argparse.BooleanOptionalAction, default=True,
                    help="write every level's per-step samples (compact columns) to samples_<class>_<tag>.json")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--quick", action="store_true", help="quick calibration (CPU smoke)")
    ap.add_argument("--class-requests", default="", help="per-class request counts overriding --requests, e.g. reasoning=64")
    ap.add_argument("--level-warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="replay each level's trace once unmeasured before the measured replays")
    ap.add_argument("--host-speed", default="calibration",
                    help="the host each level is priced on (twinfer validate --host-speed): calibration, probe, or a ratio")
    ap.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature of calibration and replays (default: executor.synthetic_steps.MEASURE_TEMPERATURE)")
    ap.add_argument("--beyond-probe", action="store_true",
                    help="after calibrating, time held-out chunk ops and steps in and beyond the grid's cached levels "
                         "(benchmarks/gpu/beyond_grid.py) into beyond_grid_<tag>.json")
    a = ap.parse_args()
    classes = a.classes.split(",")
    per_class = _class_requests(a.class_requests, classes, a.requests)
    _check_classes(classes, a.max_model_len)

    import numpy as np

    from costmodels.profiled import ProfiledStepCost
    from executor.calibrate import build_engine, calibrate
    from scheduler.config import SchedulerConfig
    from sim.workload import generate, preset
    from ui.cmd_validate import run_levels

    con = Console(width=120)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{a.model}-{a.num_layers}layers_{a.dtype}"
    cmd = "python3 scripts/device_matrix.py " + " ".join(sys.argv[1:])
    bs, max_seqs = 64, (128 if not a.quick else 16)
    blocks = max_seqs * (-(-a.max_model_len // bs)) + 64
    t0 = time.perf_counter()
    engine = build_engine(a.model, a.num_layers, a.device, a.dtype, max_seqs, a.max_model_len, num_kv_blocks=blocks)
    if engine.max_model_len < a.max_model_len:   # the model's own context caps the window (e.g. tiny: 4096)
        con.print(f"note: {a.model} holds {engine.max_model_len} tokens, not --max-model-len {a.max_model_len}", highlight=False)
        _check_classes(classes, engine.max_model_len)
        a.max_model_len = engine.max_model_len
    kw = {} if a.temperature is None else {"temperature": a.temperature}
    prof = calibrate(a.model, a.num_layers, a.device, a.dtype, engine=engine, quick=a.quick, max_model_len=a.max_model_len,
                     max_num_seqs=max_seqs, command=cmd, log=lambda x: con.print(x, highlight=False), **kw)
    ppath = out / f"calibration_{tag}.json"
    prof.save(ppath)
    con.print(f"calibrated once in {time.perf_counter() - t0:.1f} s; fit MAPE {prof.step.fit.mape * 100:.1f}% "
              f"(in-sample); every class below is held out", highlight=False)
    routing = {}
    if a.device == "cuda":   # do grid and serving decodes read the same experts? (executor.synthetic_steps)
        from executor.synthetic_steps import routing_probe
        routing = routing_probe(engine, log=lambda x: con.print(x, highlight=False))
    if a.beyond_probe and a.device == "cuda":   # held out: nothing fitted reads it (benchmarks/beyond_grid_check.py)
        from benchmarks.gpu.beyond_grid import probe
        try:
            got = probe(engine, log=lambda x: con.print(x, highlight=False))
            (out / f"beyond_grid_{tag}.json").write_text(json.dumps({"command": cmd, "profile": ppath.name, **got}) + "\n",
                                                         encoding="utf-8")
            con.print(f"beyond-grid probe: {len(got['ops'])} ops, {len(got['steps'])} steps in {got['seconds']:.1f} s", highlight=False)
        except Exception as e:  # noqa: BLE001  (the probe must not cost the matrix)
            con.print(f"beyond-grid probe failed: {type(e).__name__}: {e}", highlight=False)
    cost = ProfiledStepCost(prof)
    base = SchedulerConfig(max_num_seqs=min(64, max_seqs), max_num_batched_tokens=8192, max_model_len=a.max_model_len, block_size=bs,
                           async_overlap=a.async_overlap)
    fracs = [float(x) for x in a.levels.split(",")]
    reports = {}
    for cls in classes:
        max_in, max_out = CLASSES[cls]
        name, over = PRESET.get(cls, (cls, {}))
        reqs = generate(preset(name, num_requests=per_class[cls], **over), np.random.default_rng(0), bs)
        reqs = _clamp(reqs, max_in, max_out, a.max_model_len, bs)
        t1 = time.perf_counter()
        rep, _ = run_levels(cost, prof, reqs, base, blocks, fracs, engine, device=a.device, model=a.model, dtype=a.dtype,
                            workload=cls, profile_path=str(ppath), log=con, runs=a.runs, level_warm=a.level_warmup,
                            warm=not a.level_warmup, temperature=a.temperature, host_speed=a.host_speed)   # a level's own warm replay covers the class-wide one
        rep.command = cmd
        reports[cls] = rep
        (out / f"validation_{cls}_{tag}.json").write_text(json.dumps(rep.model_dump(exclude={"levels": {"__all__": {"samples"}}}),
                                                                     indent=1) + "\n", encoding="utf-8")
        if a.samples:   # every step's composition, measured and predicted (compact columns, one line)
            (out / f"samples_{cls}_{tag}.json").write_text(json.dumps({lv.name: lv.samples for lv in rep.levels}) + "\n",
                                                           encoding="utf-8")
        con.print(f"[{cls}] {len(reqs)} requests, {len(fracs)} levels x {a.runs} runs"
                  + (" (+1 unmeasured each)" if a.level_warmup else "") + f" in {time.perf_counter() - t1:.1f} s", highlight=False)
        doc = _matrix_doc(cmd, prof, ppath, a, reports)
        doc["routing_probe"] = routing
        (out / f"matrix_{tag}.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    _print_table(con, reports, doc["worst"])
    con.print(f"total {time.perf_counter() - t0:.1f} s")


def _matrix_doc(cmd: str, prof, ppath: Path, a, reports: dict) -> dict:
    """The matrix file: provenance, each class's levels (errors, spreads, step errors) and the worst figures."""
    return {
        "command": cmd, "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "provenance": prof.provenance, "profile": ppath.name, "fit_mape_in_sample": prof.step.fit.mape,
        "async_overlap": a.async_overlap, "level_warmup": a.level_warmup,
        "sampling_temperature": prof.provenance.get("sampling_temperature"), "step_warmup": prof.provenance.get("step_warmup"),
        "classes": {c: {"caps": CLASSES[c], "levels": [{"name": lv.name, "rate_rps": lv.rate_rps, "fraction": lv.fraction_of_capacity,
                                                         "rel_error": lv.rel_error, "spread": lv.spread, "step": lv.step,
                                                         # each predicted figure's move with every step 2% longer or shorter
                                                         "sensitivity": lv.sensitivity,
                                                         # per replay: the decode steps' host part against the model's
                                                         "decode_host_vs_calibration": (lv.diagnostics or {}).get("decode_host_vs_calibration"),
                                                         "eager_issue_vs_calibration": (lv.diagnostics or {}).get("eager_issue_vs_calibration")}
                                                        for lv in r.levels]} for c, r in reports.items()},
        "worst": worst_errors(reports),
    }


def _class_requests(text: str, classes: list[str], default: int) -> dict[str, int]:
    """Requests per class: ``--requests`` unless ``--class-requests`` names the class (``cls=N,...``)."""
    out = {c: default for c in classes}
    for item in filter(None, (t.strip() for t in text.split(","))):
        cls, _, n = item.partition("=")
        if cls not in CLASSES or not n.isdigit() or int(n) < 1:
            _refuse(f"--class-requests {item!r}: expected CLASS=N with CLASS one of {', '.join(CLASSES)} and N >= 1")
        out[cls] = int(n)
    return out


def _refuse(msg: str) -> None:
    """Bad input: one line on stderr, exit code 2 (before the engine build)."""
    print(f"device_matrix: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _check_classes(classes: list[str], max_model_len: int) -> None:
    """Unknown classes, and classes whose prompts do not fit the engine's window, exit with one line."""
    for c in classes:
        if c not in CLASSES:
            _refuse(f"--classes {c!r}: expected some of {', '.join(CLASSES)}")
        if c == "longctx" and max_model_len < CLASSES[c][0] + CLASSES[c][1] + 2:
            _refuse(f"--classes longctx needs --max-model-len >= {CLASSES[c][0] + CLASSES[c][1] + 2} (got {max_model_len}); "
                    "use 16384")


def _clamp(reqs, max_in: int, max_out: int, max_model_len: int, bs: int):
    """Lengths clamped to the class caps and the engine's window; arrivals from zero (ui.cmd_validate.load_requests' rule)."""
    t0 = min(r.arrival_time for r in reqs)
    for r in sorted(reqs, key=lambda r: r.arrival_time):
        p = min(r.prompt_len, max_in, max_model_len - 2)
        r.prompt_len = p
        r.output_len = max(1, min(r.output_len, max_out, max_model_len - p - 1))
        r.arrival_time -= t0
        r.block_hashes = r.block_hashes[: p // bs]
    return sorted(reqs, key=lambda r: r.arrival_time)


def _print_table(con, reports: dict, worst: dict) -> None:
    from rich.table import Table

    from sim.validate import STEP_SHIFT

    t = Table(title="validation matrix: relative error (predicted - measured) / measured",
              caption=f"! the predicted figure moves by more than its target when every step runs {STEP_SHIFT * 100:g}% "
                      "longer or shorter (sim.validate.step_sensitivity)")
    t.add_column("class")
    t.add_column("level")
    for f in FIGURES:
        t.add_column(f, justify="right")
    for cls, rep in reports.items():
        for lv in rep.levels:
            t.add_row(cls, lv.name, *(f"{lv.rel_error[f] * 100:+.1f}%" + sensitive_mark(lv.sensitivity.get(f), f)
                                      if lv.rel_error.get(f) is not None else "-" for f in FIGURES))
    t.add_row("worst", "", *(f"{worst[f]['rel_error'] * 100:+.1f}%" if f in worst else "-" for f in FIGURES))
    con.print(t)


def sensitive_mark(sensitivity: float | None, figure: str) -> str:
    """The matrix table's mark (" !") where the predicted ``figure`` moves by more than its target with every step
    ``STEP_SHIFT`` longer or shorter (``sim.validate.on_a_step``); nothing elsewhere."""
    from sim.validate import on_a_step
    return " !" if on_a_step(sensitivity, figure) else ""


if __name__ == "__main__":
    from twinfer.errors import TwinferError
    try:
        main()
    except TwinferError as e:   # bad input (a model, layer count or length it cannot run): named, exit 2
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
