"""From per-layout operating points to whole-cluster candidates (aggregated and disaggregated), as columns.

The table is columnar (numpy arrays): a 72-GPU search has ~10^5 disaggregated combinations
(prefill point x decode point x pool ratio), far too many for Python objects; only the rows
the planner reports become :class:`Candidate` objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodels.hardware import Hardware
from planner.screen import PREFILL_MAX_UTIL, LayoutPoints, e2e_at, e2e_floor, kv_transfer_bytes
from planner.space import LayoutOption
from planner.workload_stats import WorkloadStats
from scheduler.metrics import SLO
from sim.scenario import MAX_INSTANCES

COLUMNS = ("mode", "opt", "inst", "B", "d", "async", "chunk", "popt", "pinst", "pchunk", "pasync",
           "rate", "thr_gpu", "tps_user", "ttft", "tpot", "e2e", "e2e_floor", "gpus", "kv_ok", "transfer", "adp")
AGG, DISAGG = 0, 1
# Pool sizes of a disaggregated split: every count up to this, then steps of POOL_STEP (relative). Every count
# made the table linear in the budget (a 100,000-GPU budget asked for ~10^8 rows and tens of GB); a 2% step
# in instances moves the pool ratio, hence throughput per GPU, by at most about 1% (half a step).
POOL_DENSE = 64
POOL_STEP = 0.02


@dataclass(frozen=True)
class Candidate:
    """One deployment: pools, their policies, and the screen's (or simulator's) numbers."""

    mode: str                  # aggregated | disaggregated
    option: int                # LayoutOption index of the mixed (aggregated) or decode pool
    instances: int
    batch_per_rank: int
    draft_len: int
    async_overlap: bool
    chunk_tokens: int
    prefill_option: int
    prefill_instances: int
    prefill_chunk: int
    prefill_async: bool
    rate: float                # requests/s of the whole deployment
    thr_gpu: float             # output tokens/s per GPU used
    tps_user: float            # output tokens/s each user sees (1 / TPOT)
    ttft_s: float
    tpot_s: float
    gpus: int                  # GPUs used
    kv_ok: bool
    transfer_s: float          # KV transfer per request (disaggregated)
    row: int = -1
    source: str = "screen"     # screen | simulation
    adp_balance: bool = False  # attention-DP prompts held until every rank takes one (scheduler.attention_dp.prefill)
    e2e_s: float = math.inf    # the screen's E2E at the SLO percentile (screen.e2e_at)

    def meets(self, slo: SLO) -> bool:
        return (self.kv_ok and self.ttft_s <= slo.ttft_s and self.tpot_s <= slo.tpot_s
                and (slo.e2e_s is None or self.e2e_s <= slo.e2e_s))


class Table:
    """Candidate columns plus helpers to select and materialise rows.

    ``enumerated`` counts every combination considered, including disaggregated ones dropped
    unevaluated because one of their pool operating points is dominated (see ``combine``).
    """

    def __init__(self, cols: dict[str, np.ndarray], enumerated: int | None = None, over_instances: int = 0):
        self.cols = cols
        self.n = int(cols["rate"].size)
        self.enumerated = self.n if enumerated is None else enumerated
        self.over_instances = over_instances  # deployments left out: a pool of more instances than a simulation holds

    def __len__(self) -> int:
        return self.n

    def meets(self, slo: SLO, e2e: str = "e2e") -> np.ndarray:
        """Rows the screen has meeting ``slo``: TTFT, TPOT and E2E (``e2e``: the estimate's column, or "e2e_floor", its
        lower bound, for the rows not ruled out on E2E) within their targets, seats fitting in KV."""
        c = self.cols
        return c["kv_ok"] & (c["ttft"] <= slo.ttft_s) & (c["tpot"] <= slo.tpot_s) & self.e2e_within(slo, col=e2e) & (c["rate"] > 0)

    def e2e_within(self, slo: SLO, margin: float = 1.0, col: str = "e2e") -> np.ndarray:
        """Rows whose screened E2E (``col``: "e2e", the estimate, or "e2e_floor", its lower bound; ``screen.e2e_at``)
        is within ``margin`` x the SLO's E2E target; every row where it sets none."""
        if slo.e2e_s is None:
            return np.ones(self.n, bool)
        return self.cols[col] <= margin * slo.e2e_s

    def candidate(self, i: int) -> Candidate:
        c = self.cols
        return Candidate(
            mode="aggregated" if c["mode"][i] == AGG else "disaggregated", option=int(c["opt"][i]), instances=int(c["inst"][i]),
            batch_per_rank=int(c["B"][i]), draft_len=int(c["d"][i]), async_overlap=bool(c["async"][i]), chunk_tokens=int(c["chunk"][i]),
            prefill_option=int(c["popt"][i]), prefill_instances=int(c["pinst"][i]), prefill_chunk=int(c["pchunk"][i]),
            prefill_async=bool(c["pasync"][i]), rate=float(c["rate"][i]), thr_gpu=float(c["thr_gpu"][i]),
            tps_user=float(c["tps_user"][i]), ttft_s=float(c["ttft"][i]), tpot_s=float(c["tpot"][i]), gpus=int(c["gpus"][i]),
            kv_ok=bool(c["kv_ok"][i]), transfer_s=float(c["transfer"][i]), row=i, adp_balance=bool(c["adp"][i]),
            e2e_s=float(c["e2e"][i]) if "e2e" in c else math.inf,
        )


def _empty() -> dict[str, list]:
    return {k: [] for k in COLUMNS}


def _append(acc: dict[str, list], **cols) -> None:
    n = None
    for k in COLUMNS:
        v = np.asarray(cols[k])
        n = v.size if n is None else max(n, v.size)
    for k in COLUMNS:
        v = np.asarray(cols[k])
        acc[k].append(np.broadcast_to(v, (n,)).copy() if v.size != n else v.ravel())


def combine(options: list[LayoutOption], points: list[LayoutPoints], budget: int, stats: WorkloadStats,
            hw: Hardware, model_name: str, modes: tuple[str, ...], prefill_max_gpus: int, pooled_prefill: bool = False,
            percentile: int = 90) -> Table:
    """Every aggregated and disaggregated deployment of ``budget`` GPUs built from the operating points.

    ``percentile``: the SLO's; each row's E2E is estimated at it (``screen.e2e_at``).

    ``pooled_prefill``: the prefill router balances load (least outstanding), so the prefill pool queues as one
    pool of servers (``_prefill_wait``); else (a prefix-aware router keeps sessions on their instance, whose turns
    come in bursts) as one M/D/1 queue at the pool's utilisation, the conservative bound."""
    acc = _empty()
    O = max(stats.mean_output, 1e-9)
    over = 0  # a pool of more than MAX_INSTANCES instances: its plan could not be simulated (`twinfer simulate --plan`)
    if "aggregated" in modes:
        for p in points:
            opt = options[p.option_index]
            inst = budget // opt.gpus
            if inst < 1 or p.mix_rate.size == 0:
                continue
            if inst > MAX_INSTANCES:
                over += p.mix_rate.size
                continue
            gpus = inst * opt.gpus
            rate = p.mix_rate * inst
            _append(acc, mode=AGG, opt=p.option_index, inst=inst, B=p.mix_B, d=p.mix_d, **{"async": p.mix_async}, chunk=p.mix_chunk,
                    popt=-1, pinst=0, pchunk=0, pasync=False, rate=rate, thr_gpu=rate * O / gpus,
                    tps_user=1.0 / p.mix_tpot, ttft=p.mix_ttft, tpot=p.mix_tpot,
                    e2e=e2e_at(p.mix_ttft, p.mix_tpot, stats, percentile),
                    e2e_floor=e2e_floor(p.mix_tok_floor, stats, percentile), gpus=gpus, kv_ok=p.mix_kv_ok, transfer=0.0,
                    adp=p.mix_bal)
    enumerated = sum(a.size for a in acc["rate"])
    if "disaggregated" in modes:
        prefill = [p for p in points if options[p.option_index].gpus <= prefill_max_gpus and p.pre_rate.size]
        p90 = max(stats.p90_new, 1.0)
        # a pool operating point dominated by another of the same layout cannot make a better
        # deployment (the deployment's numbers are monotone in them): combine only the others
        dec_keep = {p.option_index: _front2(p.dec_B * options[p.option_index].dp * p.dec_spt / p.dec_t / options[p.option_index].gpus,
                                             p.dec_spt / p.dec_t, p.dec_kv_ok) for p in points if p.dec_t.size}
        pre_keep = {p.option_index: _front2(p.pre_rate, -p.pre_step * np.ceil(p90 / np.maximum(p.pre_chunk, 1)), np.ones(p.pre_rate.size, bool))
                    for p in prefill}
        for pp in prefill:
            popt = options[pp.option_index]
            xfer_bytes = kv_transfer_bytes(model_name, popt.layout.kv_dtype, stats.mean_prompt)
            for dp_ in points:
                dopt = options[dp_.option_index]
                if dp_.dec_t.size == 0:
                    continue
                # KV goes over scale-up links if the whole deployment fits in one scale-up domain
                link = hw.scaleup_bw if budget <= hw.scaleup_domain else hw.scaleout_bw
                lanes = popt.layout.tp * popt.layout.pp  # GPUs holding one DP rank's KV send in parallel
                bw = link * 0.8 * lanes
                transfer = xfer_bytes / bw + 20e-6
                n_d = _pool_ratios(budget, dopt.gpus, popt.gpus)
                if n_d.size == 0:
                    continue
                n_p = (budget - n_d * dopt.gpus) // popt.gpus
                held = (n_d <= MAX_INSTANCES) & (n_p <= MAX_INSTANCES)
                over += int((~held).sum()) * dp_.dec_t.size * pp.pre_rate.size
                okr = (n_p >= 1) & held
                n_d, n_p = n_d[okr], n_p[okr]
                if n_d.size == 0:
                    continue
                enumerated += n_d.size * dp_.dec_t.size * pp.pre_rate.size
                keep = dec_keep[dp_.option_index]
                if not keep.any():
                    continue
                dp_ = _subset(dp_, keep)
                gpus = n_d * dopt.gpus + n_p * popt.gpus
                # decode-point columns x ratio rows
                n_seats = dp_.dec_B * dopt.dp
                dec_rate = n_seats * dp_.dec_spt / dp_.dec_t / O                       # requests/s per decode instance
                link_rate = popt.layout.dp / max(transfer, 1e-12)                      # transfers/s per prefill instance
                for j in np.flatnonzero(pre_keep[pp.option_index]).tolist():
                    mu = min(pp.pre_rate[j], link_rate)
                    lam = np.minimum(PREFILL_MAX_UTIL * n_p[:, None] * mu, n_d[:, None] * dec_rate[None, :])
                    rho = np.minimum(lam / (n_p[:, None] * pp.pre_rate[j]), 0.95)
                    p90_steps = max(1, int(np.ceil(stats.p90_new / max(pp.pre_chunk[j], 1))))
                    wait = (_prefill_wait(rho, n_p[:, None], pp, j) if pooled_prefill else
                            p90_steps * pp.pre_step[j] * rho / (2.0 * (1.0 - rho)))
                    ttft = p90_steps * pp.pre_step[j] + wait + transfer + dp_.dec_t[None, :]
                    if pp.pre_async[j]:
                        # a pipelined prefill engine has its next step scheduled already: a prompt arriving while it is
                        # busy (share rho of the time) waits one more step (sim/instance.py, the admission lag)
                        ttft = ttft + rho * pp.pre_step[j]
                    tpot = np.broadcast_to(dp_.dec_t / dp_.dec_spt, lam.shape)
                    _append(acc, mode=DISAGG, opt=dp_.option_index, inst=np.repeat(n_d, dp_.dec_t.size),
                            B=np.tile(dp_.dec_B, n_d.size), d=np.tile(dp_.dec_d, n_d.size), **{"async": np.tile(dp_.dec_async, n_d.size)},
                            chunk=int(pp.pre_chunk[j]), popt=pp.option_index, pinst=np.repeat(n_p, dp_.dec_t.size), pchunk=int(pp.pre_chunk[j]),
                            pasync=bool(pp.pre_async[j]), rate=lam.ravel(), thr_gpu=(lam * O / gpus[:, None]).ravel(),
                            tps_user=(1.0 / tpot).ravel(), ttft=ttft.ravel(), tpot=tpot.ravel(),
                            e2e=e2e_at(ttft, tpot, stats, percentile).ravel(),
                            e2e_floor=np.broadcast_to(e2e_floor(dp_.dec_tok_floor, stats, percentile), lam.shape).ravel(), gpus=np.repeat(gpus, dp_.dec_t.size),
                            kv_ok=np.tile(dp_.dec_kv_ok, n_d.size), transfer=transfer, adp=False)
    cols = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in acc.items()}
    for k in ("mode", "opt", "inst", "B", "d", "chunk", "popt", "pinst", "pchunk", "gpus"):
        cols[k] = cols[k].astype(np.int64)
    for k in ("async", "pasync", "kv_ok", "adp"):
        cols[k] = cols[k].astype(bool)
    return Table(cols, enumerated, over)


def _counts(most: int) -> np.ndarray:
    """1..``most``: every count up to POOL_DENSE, then geometric steps of POOL_STEP (``most`` included)."""
    dense = np.arange(1, min(most, POOL_DENSE) + 1)
    if most <= POOL_DENSE:
        return dense
    num = int(np.ceil(np.log(most / POOL_DENSE) / np.log1p(POOL_STEP))) + 1
    return np.unique(np.concatenate([dense, np.round(np.geomspace(POOL_DENSE, most, num)).astype(np.int64)]))


def _pool_ratios(budget: int, d_gpus: int, p_gpus: int) -> np.ndarray:
    """Decode instance counts to try beside prefill pools of the GPUs left: dense where either pool is small (a
    split with 1, 2, 3 prefill instances is as likely the best as one with 1, 2, 3 decode ones), geometric between."""
    most_d, most_p = (budget - p_gpus) // d_gpus, (budget - d_gpus) // p_gpus
    if most_d < 1 or most_p < 1:
        return np.zeros(0, np.int64)
    from_p = (budget - _counts(most_p) * p_gpus) // d_gpus
    n_d = np.unique(np.concatenate([_counts(most_d), from_p]))
    return n_d[(n_d >= 1) & (n_d <= most_d)]


def _prefill_wait(rho: np.ndarray, n_p: np.ndarray, pp: LayoutPoints, j: int) -> np.ndarray:
    """Mean queueing wait of a prompt at a prefill pool of ``n_p`` instances at utilisation ``rho``.

    The pool is ``c`` deterministic servers: each instance runs ``slots`` prompts at once (one chunk per slot per step,
    ``pre_rate * pre_step * steps per prompt``) for ``steps`` steps each. Sakasegawa's M/G/c approximation
    (Wq = rho^(sqrt(2(c+1)) - 1) / (c (1 - rho)) x (ca^2 + cs^2) / 2 x service, Poisson arrivals ca^2 = 1,
    deterministic service cs^2 = 0) is Pollaczek-Khinchine's M/D/1 wait at c = 1; the screen used M/D/1 for the
    whole pool, which overstated the wait of a pool of many instances many-fold (issue 19: 5 x DEP8 prefill screened
    at TTFT 2.03 s, simulated 0.67 s). Plus the wait for a busy instance's step boundary (half a step, share rho)."""
    service = float(pp.pre_step[j] * pp.pre_steps_per_req[j])
    slots = max(1.0, round(float(pp.pre_rate[j] * service)))
    c = n_p * slots
    wq = rho ** (np.sqrt(2.0 * (c + 1.0)) - 1.0) / (c * (1.0 - rho)) * 0.5 * service
    return wq + 0.5 * rho * float(pp.pre_step[j])


def _front2(x: np.ndarray, y: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Mask of the points of ``ok`` not dominated in (x, y), both maximised."""
    from planner.pareto import pareto_front

    mask = np.zeros(x.size, bool)
    mask[pareto_front(x, y, ok)] = True
    return mask


def _subset(p: LayoutPoints, keep: np.ndarray) -> LayoutPoints:
    """``p`` with only the decode points in ``keep``."""
    from dataclasses import replace

    return replace(p, dec_B=p.dec_B[keep], dec_d=p.dec_d[keep], dec_async=p.dec_async[keep], dec_t=p.dec_t[keep],
                   dec_spt=p.dec_spt[keep], dec_kv_ok=p.dec_kv_ok[keep], dec_tok_floor=p.dec_tok_floor[keep])
