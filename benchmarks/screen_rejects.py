"""The screen is a filter, not a judge (issue 19): simulate the layouts the screen kept from the simulator.

    python benchmarks/screen_rejects.py --hw h200 -g 8 --slo ttft_p90=2s,tpot_p90=50ms            # 8 x H200 chat
    python benchmarks/screen_rejects.py --hw gb300 -g 72 -w agentic --slo ttft_p90=2s,tpot_p90=50ms -n 12
    python benchmarks/screen_rejects.py ... --json out.json

For one plan question (the flags of ``twinfer plan``) it

1. runs ``plan_deployment`` as ``twinfer plan`` does (the recommended plan, its full-scale figure and the
   candidates the planner simulated);
2. rebuilds the planner's screen table (same layouts, operating points and combinations; checked against the
   screen figures the report carries for every simulated row);
3. takes the rejects nearest the frontier: rows within ``--band`` x the SLO (default 2; the planner's own
   "near" rule is ``search.NEAR_SLO`` = 1.5) that were not simulated, one per (mode, layouts, batch, MTP) by screened throughput (their
   chunk, async and pool-ratio variants are one layout choice), best screened first, ``-n`` of them;
4. simulates each reject's slice exactly as the planner simulates its finalists (``planner.simulate.build_job``
   with the same effects, router, acceptance, request cap and seed) at the planner's loads (0.9, then 0.7 x the
   screened rate), then lower ones (``--extra-loads``, default 0.5 and 0.35: a screen that overrates a layout's
   capacity would otherwise hide a layout that meets the SLO at a lower rate); one meeting it at 0.9 is also
   tried above the screened rate (``--up-loads``, 1.2, 1.5, 2: a screen that underrates a layout's capacity
   caps the figure the planner's slices can show); the winner's slice at the planner's loads (the report keeps
   the winner's full-scale figure, not its slice's);
5. a reject that meets the SLO on its slice above the winner's slice figure "beats the winner on slices"; the
   best ``--confirm`` of those are then simulated at full scale as the planner confirms its own pick
   (``planner.confirm``: the slice's rate, then 0.8 x), against the plan's full-scale figure.

Exit status 1 when a reject beats the plan at full scale (or, with ``--confirm 0``, on slices).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass
class Checked:
    """One simulated row: a reject, or the winner's slice."""

    row: int
    label: str
    screen_thr_gpu: float
    slice_thr_gpu: float = 0.0
    slice_ttft_s: float = math.inf
    slice_tpot_s: float = math.inf
    slice_load: float = 0.0
    slice_meets: bool = False
    full_thr_gpu: float | None = None   # full-scale run of its plan (beaters only)
    full_meets: bool | None = None
    full_ttft_s: float | None = None
    full_tpot_s: float | None = None
    full_step: float | None = None      # x the slice's rate


@dataclass
class RejectCheck:
    """What ``check_rejects`` found."""

    question: str
    recommended: str
    plan_thr_gpu: float                  # the plan's own (full-scale) figure
    winner: Checked | None
    simulated_rows: int
    near_rows: int                       # near-SLO rows the screen computed (all variants)
    rejects_considered: int              # distinct near-SLO layout choices not simulated
    checked: list[Checked] = field(default_factory=list)
    beats_on_slices: list[int] = field(default_factory=list)
    beats_full_scale: list[int] = field(default_factory=list)
    cpu_s: float = 0.0

    def ok(self, confirmed: bool) -> bool:
        return not (self.beats_full_scale if confirmed else self.beats_on_slices)


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class _Search:
    """The planner's screen table and slice settings for ``req``, rebuilt from the planner's own pieces."""

    def __init__(self, req, workers: int):
        from costmodels.catalog import get_model
        from costmodels.hardware import get_hardware
        from planner.combine import combine
        from planner.parallel import Runner
        from planner.screen import ScreenContext
        from planner.search import _acceptance, _screen_job, host_cache_gb, prefix_router
        from planner.simulate import explicit_ranks
        from planner.space import enumerate_layouts
        from planner.workload_stats import workload_stats
        from sim.effects import EffectsSpec

        self.req = req
        self.model, self.hw = get_model(req.model), get_hardware(req.hardware)
        space = req.space
        self.stats = workload_stats(req.workload, req.seed)
        self.options, _ = enumerate_layouts(self.model, self.hw, req.gpus, space, mem_fraction=req.mem_fraction)
        drafts = space.draft_len if space.draft_len is not None else ((0, 1, 2, 3) if self.model.mtp_layers else (0,))
        if not self.model.mtp_layers:
            drafts = (0,)
        self.acceptance = _acceptance(max(drafts))
        ctx = ScreenContext(req.model, req.hardware, self.stats, req.expert_load, space.batch_per_rank, drafts,
                            space.async_overlap, space.chunk_tokens, self.acceptance, req.calibration,
                            adp_balance=explicit_ranks("aggregated", EffectsSpec(expert_load=req.expert_load)))
        with Runner(workers) as runner:
            self.points = runner.map(_screen_job, list(enumerate(self.options)), ctx)
        self.router = prefix_router(self.stats)
        self.table = combine(self.options, self.points, req.gpus, self.stats, self.hw, req.model, space.modes,
                             space.prefill_max_gpus, pooled_prefill=self.router.kind == "least_outstanding")
        self.effects = EffectsSpec(expert_load=req.expert_load, host_cache_gb=host_cache_gb(self.stats, self.hw, req.host_cache_fraction))
        self.workers = workers

    def _run(self, runner, rows: list[int], load: float) -> list:
        from planner.simulate import build_job, run_job

        req = self.req
        jobs = [build_job(self.table.candidate(i), self.options, model=req.model, hardware=req.hardware,
                          calibration=req.calibration, workload=req.workload, slo=req.slo, seed=req.seed,
                          effects=self.effects, router=self.router, mean_output=self.stats.mean_output, load=load,
                          max_requests=req.sim_requests, acceptance=self.acceptance, label=f"cand{i}")
                for i in rows]
        return runner.map(run_job, jobs, req.slo_percentile)

    def slices(self, rows: list[int], loads: tuple[float, ...], up: tuple[float, ...] = ()) -> dict[int, object]:
        """Each row's slice outcome: at the first of ``loads`` (x the screened rate) meeting the SLO, else the last;
        a row meeting it at the first load is then tried at each of ``up`` while it still meets, keeping the highest
        load met (a screen that underrates a layout's capacity would otherwise cap its figure)."""
        from planner.parallel import Runner
        from planner.simulate import meets

        out, pending = {}, list(rows)
        with Runner(self.workers) as runner:
            for k, load in enumerate(loads):
                if not pending:
                    break
                nxt = []
                for i, o in zip(pending, self._run(runner, pending, load)):
                    out[i] = o
                    if not meets(o, self.req.slo):
                        nxt.append(i)
                climb = [i for i in pending if i not in nxt] if k == 0 else []
                pending = nxt
                for hi in up:
                    if not climb:
                        break
                    better = []
                    for i, o in zip(climb, self._run(runner, climb, hi)):
                        if meets(o, self.req.slo):
                            out[i] = o
                            better.append(i)
                    climb = better
        return out

    def full_scale(self, row: int, o, steps: tuple[float, ...]) -> tuple[float, bool, float, float, float]:
        """(output tokens/s per GPU, meets the SLO, TTFT, TPOT, rate step) of the row's plan at full scale, as the
        planner confirms its pick (``planner.confirm``) at each of ``steps`` x the slice's rate until one meets the
        SLO (else the last step's run)."""
        from planner.confirm import confirm_plan
        from planner.search import _make_plan
        from planner.simulate import meets

        req, t = self.req, self.table
        ok = t.meets(req.slo)
        last = (0.0, False, math.inf, math.inf, 0.0)
        for step in steps:
            plan = _make_plan(req, t.candidate(row), self.options, self.stats, self.model, self.hw, self.router, self.effects,
                              o, t, ok, self.acceptance, {row: o}, self.points, rate_scale=step)
            full = confirm_plan(plan, row, float(t.cols["rate"][row]), req.slo_percentile)
            if full is None:
                continue
            last = (full.thr_gpu, meets(full, req.slo), full.ttft_s, full.tpot_s, step)
            if last[1]:
                break
        return last


def reject_rows(table, options, slo, simulated: set[int], n: int, band: float = 2.0,
                match=None) -> tuple[list[int], int, int]:
    """(the ``n`` rejects nearest the frontier, rows within the band, distinct choices among them not simulated):
    rows the screen puts within ``band`` x the SLO (KV fitting; the planner's own "near" is ``search.NEAR_SLO``,
    1.5; an E2E target by the screen's lower bound, ``e2e_floor``) that the planner did not simulate, the best screened row of each (mode, layout, prefill layout, batch,
    MTP) whose choice no simulated row shares (``match(row)``, if given, must hold too), ordered by the screen's
    Pareto layers of (output tokens/s per GPU, tokens/s per user): the rejects' own frontier first (best
    throughput first), then the frontier of the rest, and so on."""
    from planner.pareto import pareto_front

    c = table.cols
    # an E2E target, where the SLO sets one, by the screen's lower bound (no row above it can meet it), as the planner's own near rule
    # (``search._near_slo``: the E2E estimate is no bound)
    near = (c["kv_ok"] & (c["rate"] > 0) & (c["ttft"] <= band * slo.ttft_s) & (c["tpot"] <= band * slo.tpot_s)
            & table.e2e_within(slo, col="e2e_floor"))

    def key(i: int) -> tuple:
        return (int(c["mode"][i]), options[int(c["opt"][i])].key, int(c["popt"][i]) if c["mode"][i] else -1,
                int(c["B"][i]), int(c["d"][i]))

    taken = {key(i) for i in simulated}
    rows = np.flatnonzero(near)
    best: dict[tuple, int] = {}
    for r in rows[np.lexsort((rows, -c["thr_gpu"][rows]))].tolist():
        k = key(r)
        if k not in taken and k not in best and (match is None or match(r)):
            best[k] = r
    left = np.array(sorted(best.values()), dtype=np.int64)
    order: list[int] = []
    while left.size and len(order) < n:
        mask = np.zeros(table.n, bool)
        mask[left] = True
        layer = pareto_front(c["thr_gpu"], c["tps_user"], mask)
        order += layer.tolist()
        left = np.setdiff1d(left, layer)
    return order[:n], int(near.sum()), len(best)


def beats_on_slices(winner: Checked, checked: list[Checked]) -> list[int]:
    """Rows meeting the SLO on their slice above the winner's slice figure: the simulator ranks them higher."""
    return [x.row for x in checked if x.slice_meets and x.slice_thr_gpu > winner.slice_thr_gpu]


# beyond the planner's own loads (search.LOADS): a reject whose screened capacity is too optimistic may still
# meet the SLO at a lower rate than the planner tries
EXTRA_LOADS = (0.5, 0.35)
# above the screened rate, for a reject meeting the SLO at the planner's first load: a screen that underrates a
# layout's capacity caps the figure the planner's slices can show
UP_LOADS = (1.2, 1.5, 2.0)


# the full-scale runs of a beater: the planner's rate steps (confirm.CONFIRM_RATE_STEPS: 1.0, 0.8 x the slice's
# rate), then lower, since a mirrored slice of a wide attention-DP instance is optimistic
FULL_STEPS = (1.0, 0.8, 0.65, 0.5)


def check_rejects(req, n: int = 12, *, workers: int = 1, confirm: int = 1, extra_loads: tuple[float, ...] = EXTRA_LOADS,
                  full_steps: tuple[float, ...] = FULL_STEPS, up_loads: tuple[float, ...] = UP_LOADS, band: float = 2.0,
                  only: str | None = None) -> RejectCheck:
    """Plan ``req``, then simulate its ``n`` screen rejects nearest the frontier against the recommended plan."""
    from planner.explain import describe_row
    from planner.search import LOADS, plan_deployment
    from planner.simulate import meets

    c0 = _cpu()
    rep = plan_deployment(req, workers=workers)
    question = f"{rep.model} on {rep.gpus} x {rep.hardware}, {rep.workload}, {rep.slo}"
    if rep.recommended is None:
        raise SystemExit(f"{question}: the planner recommends nothing ({rep.status}: {rep.message})")
    s = _Search(req, workers)
    t, opts = s.table, s.options
    # the rebuilt table is the planner's: every simulated row has the screen figure the report gave it
    for p in rep.simulated:
        if p.screen_output_tokens_per_s_per_gpu != float(t.cols["thr_gpu"][p.row]) or describe_row(t, opts, p.row) != p.label:
            raise RuntimeError(f"rebuilt screen table differs from the planner's at row {p.row} ({p.label})")
    label = rep.message.removeprefix("recommended: ")
    win_row = next(p.row for p in rep.simulated if p.label == label)
    simulated = {p.row for p in rep.simulated}
    match = None if not only else (lambda r: only in describe_row(t, opts, r))
    rows, n_near, n_rej = reject_rows(t, opts, req.slo, simulated, n, band, match)
    # the winner gets the same rate ladder as the rejects (up included), so neither is judged at a rate the
    # other is not offered
    outs = {**s.slices([win_row], LOADS, tuple(up_loads)), **s.slices(rows, LOADS + tuple(extra_loads), tuple(up_loads))}

    def checked(i: int) -> Checked:
        o = outs[i]
        return Checked(i, describe_row(t, opts, i), float(t.cols["thr_gpu"][i]), o.thr_gpu, o.ttft_s, o.tpot_s, o.load,
                       meets(o, req.slo))

    winner = checked(win_row)
    res = RejectCheck(question, label, rep.recommended.predicted.output_tokens_per_s_per_gpu, winner, len(simulated),
                      n_near, n_rej, [checked(i) for i in rows])
    res.beats_on_slices = beats_on_slices(winner, res.checked)
    for x in sorted((x for x in res.checked if x.row in res.beats_on_slices), key=lambda x: -x.slice_thr_gpu)[:confirm]:
        x.full_thr_gpu, x.full_meets, x.full_ttft_s, x.full_tpot_s, x.full_step = s.full_scale(x.row, outs[x.row], full_steps)
        if x.full_meets and x.full_thr_gpu > res.plan_thr_gpu:
            res.beats_full_scale.append(x.row)
    if res.beats_full_scale and winner.slice_load > LOADS[0]:
        # the winner also met the SLO above the planner's rate: its plan at that rate is the fair bar
        winner.full_thr_gpu, winner.full_meets, winner.full_ttft_s, winner.full_tpot_s, winner.full_step = s.full_scale(
            win_row, outs[win_row], full_steps)
        bar = max(res.plan_thr_gpu, winner.full_thr_gpu if winner.full_meets else 0.0)
        res.beats_full_scale = [r for r in res.beats_full_scale
                                if next(x for x in res.checked if x.row == r).full_thr_gpu > bar]
    res.cpu_s = _cpu() - c0
    return res


def _print(res: RejectCheck, confirmed: bool) -> None:
    w = res.winner
    print(res.question)
    print(f"recommended: {res.recommended}")
    print(f"  plan at full scale {res.plan_thr_gpu:,.0f} output tok/s/GPU; its slice {w.slice_thr_gpu:,.0f} "
          f"(TTFT {w.slice_ttft_s:.2f} s, TPOT {w.slice_tpot_s * 1e3:.1f} ms at {w.slice_load:.0%} load); screen {w.screen_thr_gpu:,.0f}")
    if w.full_thr_gpu is not None:
        print(f"  the winner's plan at its slice's {w.slice_load:.0%} load, full scale: {w.full_thr_gpu:,.0f}"
              + ("" if w.full_meets else " (misses the SLO)"))
    print(f"{res.simulated_rows} rows simulated by the planner; {res.near_rows:,} screen rows within the band of the SLO, "
          f"{res.rejects_considered:,} distinct layout choices among them not simulated; the best {len(res.checked)} simulated here:")
    print(f"  {'row':>7s} {'screen':>7s} {'slice':>7s} {'TTFT s':>7s} {'TPOT ms':>8s} {'load':>5s} {'meets':>5s} {'full':>7s}  deployment")
    for x in res.checked:
        full = "-" if x.full_thr_gpu is None else f"{x.full_thr_gpu:,.0f}" + ("" if x.full_meets else "!")
        if x.full_thr_gpu is not None:
            flag_full = (f"; full scale at {x.full_step:g} x its slice's rate: TTFT {x.full_ttft_s:.2f} s, TPOT {x.full_tpot_s * 1e3:.1f} ms"
                         + ("" if x.full_meets else ", misses the SLO"))
        else:
            flag_full = ""
        flag = " <- beats the winner's slice" if x.row in res.beats_on_slices else ""
        print(f"  {x.row:>7d} {x.screen_thr_gpu:>7,.0f} {x.slice_thr_gpu:>7,.0f} {x.slice_ttft_s:>7.2f} {x.slice_tpot_s * 1e3:>8.1f} "
              f"{x.slice_load:>5.0%} {'yes' if x.slice_meets else 'no':>5s} {full:>7s}  {x.label}{flag}{flag_full}")
    verdict = ("no reject beats the plan" if res.ok(confirmed) else
               f"{len(res.beats_full_scale if confirmed else res.beats_on_slices)} reject(s) beat the plan"
               + (" at full scale" if confirmed else " on slices"))
    print(f"{verdict} ({res.cpu_s:.0f} s CPU)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="[deepseek-v3]")
    ap.add_argument("--hardware", "--hw", default=None, help="[gb300]")
    ap.add_argument("-g", "--gpus", type=int, default=None)
    ap.add_argument("--config", default=None, help="PlanRequest YAML/JSON, as twinfer plan --config (flags override it)")
    ap.add_argument("-w", "--workload", default=None, help="preset or workload file [chat]")
    ap.add_argument("--slo", default=None, help="e.g. ttft_p90=2s,tpot_p90=50ms")
    ap.add_argument("--modes", default=None, help="agg,disagg [both]")
    ap.add_argument("--simulate", type=int, default=None, help="the planner's --simulate")
    ap.add_argument("--sim-requests", type=int, default=None)
    ap.add_argument("-n", "--rejects", type=int, default=12, help="rejects to simulate, nearest the frontier first")
    ap.add_argument("--confirm", type=int, default=1, help="beaters on slices to run at full scale (0: judge on slices)")
    ap.add_argument("--extra-loads", default="0.5,0.35", help="loads (x screened rate) tried on rejects after the planner's 0.9, 0.7")
    ap.add_argument("--up-loads", default="1.2,1.5,2", help="loads tried above the screened rate on rejects meeting the SLO at 0.9")
    ap.add_argument("--band", type=float, default=2.0, help="rejects within this many x the SLO in the screen [2; the planner's own: 1.5]")
    ap.add_argument("--only", default=None, help="only rejects whose deployment text contains this (e.g. 'x DEP8 ')")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the result here")
    a = ap.parse_args(argv)
    from ui.cmd_plan import build_request

    req = build_request(a.config, model=a.model, hardware=a.hardware, gpus=a.gpus, workload=a.workload, slo=a.slo,
                        modes=a.modes, simulate=a.simulate, sim_requests=a.sim_requests)
    extra = tuple(float(x) for x in a.extra_loads.split(",") if x.strip())
    up = tuple(float(x) for x in a.up_loads.split(",") if x.strip())
    res = check_rejects(req, a.rejects, workers=a.workers, confirm=a.confirm, extra_loads=extra, up_loads=up, band=a.band,
                        only=a.only)
    _print(res, a.confirm > 0)
    if a.json:
        Path(a.json).write_text(json.dumps(asdict(res), indent=1, default=float), encoding="utf-8")
    return 0 if res.ok(a.confirm > 0) else 1


if __name__ == "__main__":
    raise SystemExit(main())
