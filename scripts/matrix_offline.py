"""The simulator at HEAD against measured validation-matrix figures, offline (no GPU): issue 16's matrix runs keep
the calibration profile and what was measured at each class and load; this re-simulates every level with today's
simulator on that profile (same requests, same rates) and prints the relative errors and the worst per figure.

Measured figures come from ``validation_<class>_*.json`` (``levels[].measured``) or from ``measured_recovered.json``
(run 2: the per-class reports did not come back from the device; measured = the run's own prediction at 55e619c /
(1 + its relative error), re-simulated exactly with that commit's code).

    python3 scripts/matrix_offline.py benchmarks/gpu/issue16_h200/run2_pipelined [--no-lag] [--sync]

``--no-lag``: without the pipelined engine's one-step admission lag (sim/instance.py), to see what it changes.
``--sync``: the engine's loop was synchronous (async overlap off; run 3).
``--replay N``: against replay N's figures instead of the median (per-class reports keep them).
``--refit auto|none|LO,HI``: refit the run's step model from its own calibration points (no validation data) with
those category-scale bounds (costmodels.step_fit.fit_step_profile) before simulating; default: the run's profile as is.
``--linear-eager``: with ``--refit``, build the dense GEMM tables from the Linear's eager seconds even where its points
timed the device work too (calibrations since 25bf3ae): the two tables side by side on the same held-out run.
``--sensitivity``: beside each error, how far the prediction moves with every step 2% longer or shorter
(``sim.validate.step_sensitivity``), marked ``!`` where that exceeds the figure's target, and the misses counted in
marked cells and elsewhere.
``--op-table-gemms``: the FP8 GEMMs from the committed op table even where the calibration timed the model's own GEMM
shapes at its token buckets (``gemm`` points).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BS, MML = 64, 8192                      # scripts/device_matrix.py's engine: block size, default max model length


def kv_blocks(mml: int = MML) -> int:
    """device_matrix.py's KV blocks (128 seats of ``mml`` tokens, plus 64)."""
    return 128 * (-(-mml // BS)) + 64


BLOCKS = kv_blocks()


def engine_config(sync: bool, mml: int = MML):
    """device_matrix.py's scheduler (64 of the engine's 128 seats); ``sync``: its synchronous loop (no async overlap)."""
    from scheduler.config import SchedulerConfig
    return SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=mml, block_size=BS, async_overlap=not sync)


def class_requests(cls: str, nreq: int, mml: int = MML) -> list:
    """The requests device_matrix.py replays for class ``cls`` (its preset and overrides, seed 0, clamped to the class
    caps and the window ``mml``)."""
    from device_matrix import CLASSES, PRESET, _clamp
    from sim.workload import generate, preset
    name, over = PRESET.get(cls, (cls, {}))
    return _clamp(generate(preset(name, num_requests=nreq, **over), np.random.default_rng(0), BS), *CLASSES[cls], mml, BS)


def level_requests(reqs: list, rate_rps: float) -> list:
    """Fresh copies of ``reqs`` with arrivals scaled to ``rate_rps`` (a level of the matrix)."""
    from sim.validate import copy_requests, natural_rate
    return copy_requests(reqs, natural_rate(reqs) / rate_rps)


def predict_level(cost, cfg, reqs: list, rate_rps: float, blocks: int = BLOCKS) -> dict:
    """The simulated figures (``sim.validate.metric_values``) of one level."""
    from sim.validate import metric_values, simulate_requests
    return metric_values(simulate_requests(cost, cfg, blocks, level_requests(reqs, rate_rps), seed=0))


def measured_levels(run: Path, replay: int | None = None) -> dict:
    """{class: {level: {rate_rps, measured}}}; ``replay``: that replay's figures (1-based) instead of the median,
    from the per-class reports' ``runs`` (classes whose report did not come back are left out)."""
    rec = run / "measured_recovered.json"
    if rec.exists() and replay is None:
        return json.loads(rec.read_text())
    out = {}
    for f in sorted(run.glob("validation_*_*.json")):
        d = json.loads(f.read_text())
        lv_runs = {lv["name"]: lv.get("runs") or [] for lv in d["levels"]}
        if replay is not None and any(len(r) < replay for r in lv_runs.values()):
            continue
        out[d["workload"]] = {lv["name"]: {"rate_rps": lv["rate_rps"],
                                           "measured": lv["measured"] if replay is None else lv_runs[lv["name"]][replay - 1]}
                              for lv in d["levels"]}
    if rec.exists():   # classes only the recovered medians have
        out = {**json.loads(rec.read_text()), **out}
    return out


def _command_int(run: Path, flag: str, default: int) -> int:
    """An integer option of the run's matrix report's command (``flag N``); ``default`` if it does not say."""
    for f in run.glob("matrix_*.json"):
        m = re.search(rf"{flag} (\d+)", json.loads(f.read_text()).get("command", ""))
        if m:
            return int(m.group(1))
    return default


def run_requests(run: Path) -> int:
    """Requests per level of the run: its matrix report's command (``--requests N``); 48 for runs 1-3."""
    return _command_int(run, "--requests", 48)


def run_class_requests(run: Path) -> dict[str, int]:
    """Per-class request counts the run's command overrode (``--class-requests cls=N,...``)."""
    for f in run.glob("matrix_*.json"):
        m = re.search(r"--class-requests (\S+)", json.loads(f.read_text()).get("command", ""))
        if m:
            return {c: int(n) for c, _, n in (t.partition("=") for t in m.group(1).split(",") if "=" in t)}
    return {}


def run_max_model_len(run: Path) -> int:
    """The engine window of the run (``--max-model-len N``; 8192 when the command does not say)."""
    return _command_int(run, "--max-model-len", MML)


def run_replays(run: Path) -> int:
    """Replays per level: the matrix report's command (``--runs N``); 1 if it does not say."""
    return _command_int(run, "--runs", 1)


def recover(run: Path, nreq: int, cost, cfg) -> None:
    """measured_recovered.json from the matrix report's relative errors and this code's prediction (run it at the
    commit the run was made with); classes with a validation report keep its measured figures."""
    from device_matrix import FIGURES

    matrix = json.loads(next(run.glob("matrix_*.json")).read_text())
    have = measured_levels(run)
    out = {}
    for cls, c in matrix["classes"].items():
        if cls in have:
            out[cls] = have[cls]
            continue
        reqs = class_requests(cls, nreq)
        out[cls] = {}
        for lv in c["levels"]:
            p = predict_level(cost, cfg, reqs, lv["rate_rps"])
            out[cls][lv["name"]] = {"rate_rps": lv["rate_rps"],
                                    "measured": {f: p[f] / (1 + lv["rel_error"][f]) for f in FIGURES if f in lv["rel_error"]}}
    (run / "measured_recovered.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {run / 'measured_recovered.json'} ({', '.join(out)})")


def main(argv: list[str] | None = None) -> dict[str, tuple[float, str]]:
    """Print every level's relative errors; returns the worst per figure: {figure: (error, "class level")}."""
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--no-lag", action="store_true")
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--no-power-limit", action="store_true",
                    help="prompt steps at the op tables' full clock (costmodels.power off), as before 2026-12-05")
    ap.add_argument("--power-kind", action="store_true",
                    help="price the power limit with the GPU kind's median board (costmodels/data/power) where the run's "
                         "calibration has no reference loops of its own board (runs before 2026-12-05)")
    ap.add_argument("--idle-graph-forwards", action="store_true",
                    help="with --refit: pin the device scale to the CUDA-graph forwards timed on an idle GPU, setting "
                         "aside those timed with the GPU held busy (queued_forward_s, calibrations since ae91d90), which "
                         "the fit prefers since 2026-12-04")
    ap.add_argument("--refit", default=None)
    ap.add_argument("--op-table-gemms", action="store_true",
                    help="price the FP8 GEMMs from the committed op table even where the calibration timed the model's "
                         "own GEMM shapes at its token buckets (the two side by side on one held-out run)")
    ap.add_argument("--linear-eager", action="store_true",
                    help="with --refit: the dense GEMM tables from the Linear's eager seconds, not its device work")
    ap.add_argument("--sparse-tables", action="store_true",
                    help="with --refit: the sampler and MoE tables from the row and token counts calibrations timed "
                         "before d9e76bd (1/4/16/... rows, 1/8/64/... tokens), the rest set aside (the two on one run)")
    ap.add_argument("--replay", type=int, default=None,
                    help="compare with replay N's measured figures (1-based; classes whose report kept per-replay figures) "
                         "instead of the median: a level's first replay pays a one-time cost on its largest eager steps")
    ap.add_argument("--sensitivity", action="store_true",
                    help="mark (!) each figure whose prediction moves by more than its target with every step 2%% longer or "
                         "shorter (sim.validate.step_sensitivity), print that move, and count the misses in marked cells")
    ap.add_argument("--recover", action="store_true",
                    help="write measured_recovered.json for classes whose validation report did not come back: measured = "
                         "the prediction / (1 + the matrix report's relative error); exact only at the run's own commit")
    a = ap.parse_args(argv)

    import sim.instance as inst
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from device_matrix import FIGURES, sensitive_mark
    from sim.validate import TARGETS, natural_rate, step_sensitivity
    from ui.cmd_validate import sim_config

    from sim.timeline_check import unpacked_run
    try:
        run = unpacked_run(a.run)   # reports.tgz unpacked to a temporary copy where needed
    except FileNotFoundError as e:
        ap.error(str(e))
    if a.linear_eager and a.refit is None:
        ap.error("--linear-eager refits the step model: give --refit auto|none|LO,HI")
    try:
        prof = run_profile(run, a.refit, linear_eager=a.linear_eager, own_gemms=not a.op_table_gemms,
                           idle_graph=a.idle_graph_forwards, sparse_tables=a.sparse_tables)
    except ValueError as e:
        ap.error(str(e))
    if a.refit is not None:
        st2 = prof.step
        print(f"refit ({a.refit}): in-sample MAPE {st2.fit.mape * 100:.2f}%, tables {st2.op_tables or 'none'}, scales "
              + ", ".join(f"{c} {v:.3g}" for c, v in st2.category_scale.items()))
    power = not a.no_power_limit
    if a.power_kind and prof.power_ref is None:
        from costmodels.power import power_model
        power = power_model(prof.step.hardware_basis) or power
    cost = ProfiledStepCost(prof, power=power)
    mml = run_max_model_len(run)
    cfg = sim_config(engine_config(a.sync, mml), prof)
    if a.no_lag:
        init = inst.Instance.__init__

        def no_lag(self, *args, **kw):
            init(self, *args, **kw)
            self._lag = False
        inst.Instance.__init__ = no_lag
    nreq = run_requests(run)
    if a.recover:
        recover(run, nreq, cost, cfg)
        return {}
    worst: dict[str, tuple[float, str]] = {}
    print(f"{'class':10} {'level':16} " + " ".join(f"{f:>18}" for f in FIGURES))
    have = measured_levels(run, a.replay)
    if a.replay is not None:
        have = {c: v for c, v in have.items() if any(f.name.startswith(f"validation_{c}_") for f in run.glob("validation_*_*.json"))}
        if not have:
            raise SystemExit(f"{run}: no validation report with {a.replay} replays per level")
    per_class = run_class_requests(run)
    misses = {"marked": 0, "unmarked": 0}
    for cls, levels in have.items():
        reqs = class_requests(cls, per_class.get(cls, nreq), mml)
        for name, lv in levels.items():
            p = predict_level(cost, cfg, reqs, lv["rate_rps"], kv_blocks(mml))
            errs = {f: p[f] / lv["measured"][f] - 1 for f in FIGURES if lv["measured"].get(f)}
            for f, e in errs.items():
                if f not in worst or abs(e) > abs(worst[f][0]):
                    worst[f] = (e, f"{cls} {name}")
            if not a.sensitivity:
                print(f"{cls:10} {name:16} " + " ".join(f"{errs[f] * 100:+17.1f}%" for f in FIGURES))
                continue
            sens = step_sensitivity(cost, cfg, kv_blocks(mml), reqs, natural_rate(reqs) / lv["rate_rps"], p)
            cells = []
            for f in FIGURES:
                mark = sensitive_mark(sens.get(f), f)
                if f in errs and abs(errs[f]) > TARGETS[f]:
                    misses["marked" if mark else "unmarked"] += 1
                cells.append(f"{errs[f] * 100:+.1f}% (\u00b1{sens[f] * 100:.1f}){mark or '  '}" if f in errs else "-")
            print(f"{cls:10} {name:16} " + " ".join(f"{c:>18}" for c in cells))
    print("worst: " + ", ".join(f"{f} {e * 100:+.1f}% ({where})" for f, (e, where) in worst.items()))
    if a.sensitivity:
        print(f"misses: {misses['marked']} where the figure moves by more than its target with steps \u00b12% (marked !), "
              f"{misses['unmarked']} elsewhere")
    return worst


if __name__ == "__main__":
    main()
