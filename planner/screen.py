"""The analytic screen: steady-state throughput and latency of every candidate from a few step times.

Per layout (one job, run in a worker process) the cost model gives three kinds of operating points:

- **decode point** (layout, batch per rank ``B``, draft ``d``, async): a decode step of
  ``n = B * dp`` requests at the workload's mean decode context; ``t_dec`` includes host
  overhead (``max`` with async overlap, ``+`` without); ``spt = 1 + sum(acceptance)`` tokens
  per request per step.
- **mixed point** (aggregated: + chunk size ``c``): in steady state every seat is busy and
  each step finishes ``r = n * spt / O`` requests' output, so it also admits ``r`` new prompts:
  the step carries the decodes plus ``r * new`` prefill tokens in chunks of at most ``c``
  (each on one DP rank: few chunks on many ranks is the attention-DP straggler).
  ``lambda = n * spt / (O * t_step)`` requests/s, TPOT = ``t_step / spt``, TTFT =
  ``(ceil(p90 new / c) + 0.5) * t_step``. Attention-DP layouts (dp > 1) also get **ADP-balance** mixed
  points (TensorRT-LLM ``enable_balance``, ``scheduler.attention_dp.prefill = balance``): prompts are held
  until every rank can take one, so a prefill step carries one chunk per rank (balanced, not a straggler)
  and only a share ``r * steps per prompt / dp`` of the steps prefills; TTFT adds the gathering wait
  (``_balance_point``).
- **prefill point** (disaggregated prefill pool): prefill-only steps of ``dp * c`` tokens;
  ``mu = R / t_pre`` requests/s per instance.

Disaggregated candidates combine a prefill point, a decode point and a pool ratio
``n_p : n_d``: ``lambda = min(0.85 * n_p * mu, n_d * n * spt / (t_dec * O), link capacity)``,
TPOT = ``t_dec / spt`` (no prefill interference), TTFT = prefill latency with M/D/1 queueing
at the prefill pool's utilisation + the KV transfer. Aggregated TTFT is the prefill chunks'
steps inflated by the share of time spent prefilling. E2E at the SLO's percentile ``p`` is
``TTFT + (O_p - 1) * TPOT`` of the same row (``e2e_at``), ``O_p`` the workload's output length at
``p``; pruning on E2E uses a lower bound instead, ``(O_p - 1)`` tokens at the fastest a request's
tokens can come on the layout (``e2e_floor``). These are screens, not predictions: the simulator
checks the best of them (``planner/simulate.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from costmodels.catalog import get_model
from costmodels.effective import EffectiveStepCost
from costmodels.calibration_source import profile_for
from costmodels.hardware import get_hardware
from costmodels.host import wall_time
from costmodels.memory import kv_rates
from costmodels.moe_load import ExpertLoadSpec, cached_initial
from planner.space import LayoutOption
from planner.workload_stats import WorkloadStats
from scheduler.config import AttentionDPConfig, SchedulerConfig

# A prefill pool is run at no more than this utilisation (queueing blows TTFT up beyond it).
PREFILL_MAX_UTIL = 0.85
# Requests must leave room in KV for the prefix cache: a seat counts mean prompt + output tokens
# and the batch may use this share of the KV pool.
KV_SHARE_FOR_BATCH = 0.9
# ADP balance's hold (batching_wait_iters, timeout_iters): the scheduler's defaults, as the planner deploys it
_ADP = AttentionDPConfig()


@dataclass(frozen=True)
class ScreenContext:
    """What every screening job needs (picklable: strings and frozen models)."""

    model: str
    hardware: str
    stats: WorkloadStats
    expert_load: ExpertLoadSpec
    batch_per_rank: tuple[int, ...]
    draft_len: tuple[int, ...]
    async_overlap: tuple[bool, ...]
    chunk_tokens: tuple[int, ...]
    acceptance: tuple[float, ...]   # marginal acceptance of draft position 1.. (the scheduler's default)
    calibration: str | None = None  # calibration profile JSON (None: the hardware's measured block, else the defaults)
    adp_balance: bool = False       # also screen attention-DP layouts under ADP balance (where the simulator schedules ranks)


@dataclass
class LayoutPoints:
    """Operating points of one layout (rows of small arrays; -1 / nan where infeasible)."""

    option_index: int
    # decode points: one row per (B, d, async)
    dec_B: np.ndarray
    dec_d: np.ndarray
    dec_async: np.ndarray
    dec_t: np.ndarray          # wall seconds per decode step
    dec_spt: np.ndarray
    dec_kv_ok: np.ndarray
    dec_tok_floor: np.ndarray  # fewest seconds per output token a request can see (``_token_floor``)
    # mixed points: one row per (B, d, async, chunk)
    mix_B: np.ndarray
    mix_d: np.ndarray
    mix_async: np.ndarray
    mix_chunk: np.ndarray
    mix_rate: np.ndarray       # requests/s per instance
    mix_ttft: np.ndarray
    mix_tpot: np.ndarray
    mix_kv_ok: np.ndarray
    mix_bal: np.ndarray        # ADP balance (True) or immediate prefill placement
    mix_tok_floor: np.ndarray
    # prefill points: one row per (chunk, async)
    pre_chunk: np.ndarray
    pre_async: np.ndarray
    pre_rate: np.ndarray       # requests/s per instance at full load
    pre_step: np.ndarray       # seconds per prefill step
    pre_steps_per_req: np.ndarray
    seconds: float = 0.0


@functools.lru_cache(maxsize=512)
def _cost(model: str, hardware: str, key: tuple, layout_json: str, eplb: str, tables: str, load: ExpertLoadSpec,
          calibration: str | None = None) -> EffectiveStepCost:
    from costmodels.layout import ParallelLayout

    m, hw = get_model(model), get_hardware(hardware)
    lay = ParallelLayout.model_validate_json(layout_json)
    el = None
    if m.moe is not None and lay.ep > 1:
        el = cached_initial(load, m.moe.n_routed_experts, lay.ep, lay.eplb_redundant_experts, eplb != "off")
    return EffectiveStepCost(m, hw, lay, profile_for(hw, calibration), expert_load=el, dp_balance=True, table_placement=tables)


def _host(sc: SchedulerConfig, n_req: float, n_tok: float) -> float:
    return sc.host_overhead_s(n_req, n_tok)


def _prefill_shape(stats: WorkloadStats, chunk: int) -> tuple[float, int, int]:
    """(tokens per prompt chunk, prompts per rank per step, steps per prompt) for mean new tokens."""
    new = max(stats.mean_new, 1.0)
    if new <= chunk:
        return new, max(1, int(chunk // new)), 1
    return float(chunk), 1, int(math.ceil(new / chunk))


def _mixed_step(cost: EffectiveStepCost, n: int, d: int, ctx_len: int, m: int, tok: int, hit_ctx: int) -> tuple[float, float]:
    """(device seconds, tokens) of a step of ``n`` decodes (``1 + d`` tokens over ``ctx_len`` each) and ``m`` prompt
    chunks of ``tok`` new tokens over ``hit_ctx`` cached ones."""
    new = np.concatenate([np.full(n, 1 + d), np.full(m, tok)]).astype(np.int64)
    cl = np.concatenate([np.full(n, ctx_len), np.full(m, hit_ctx)]).astype(np.int64)
    dec = np.concatenate([np.ones(n, bool), np.zeros(m, bool)])
    return cost.mixed_step_time(new, cl, dec), float(new.sum())


def _balanced_step(cost: EffectiveStepCost, n: int, d: int, ctx_len: int, hit_ctx: int, st: WorkloadStats, c: int,
                   r: float, dp: int) -> tuple[float, int, float, int, float]:
    """ADP balance's prefill step (device seconds, chunks, tokens, steps per prompt, share of steps prefilling):
    ``n`` decodes plus ``k`` chunks on every rank, ``k`` the fewest that carry the ``r * steps`` prompt chunks a step
    needs on average within ``dp * k`` chunk slots per prefill step. The decodes are spread round-robin and each chunk
    goes to the least-loaded rank, so the step is balanced (no straggler rank)."""
    new = max(st.mean_new, 1.0)
    steps = max(1, int(math.ceil(new / c)))
    tok = max(1, int(round(new / steps)))
    need = r * steps                              # prompt chunks per step, on average
    k = max(1, int(math.ceil(need / dp)))         # chunks per rank in a prefill step
    share = min(1.0, need / (dp * k))             # of the steps that prefill
    m = dp * k
    dev, n_tok = _mixed_step(cost, n, d, ctx_len, m, tok, hit_ctx)
    return dev, m, n_tok, steps, share


def _balance_point(step: tuple, t_dec: float, sc: SchedulerConfig, ov: bool, n: int, spt: float, st: WorkloadStats,
                   dp: int) -> tuple[float, float, float]:
    """(requests/s, TTFT, TPOT) of an instance under ADP balance (scheduler/dp_attention.py): a share of the steps
    prefill one chunk per rank (``_balanced_step``), the rest decode; TPOT is the mean step over tokens per step.
    TTFT: a prompt is held until ``dp`` prompts wait (the first waits for ``dp - 1`` more arrivals), then
    ``batching_wait_iters`` steps more while every rank decodes, at most ``timeout_iters`` steps in all; then
    its prefill steps and, as the spread points, half a step (plus one on a pipelined engine)."""
    dev_p, m, n_tok, steps, share = step
    t_pre = wall_time(dev_p, _host(sc, n + m, n_tok), ov)
    t_step = share * t_pre + (1.0 - share) * t_dec
    lam = n * spt / (max(st.mean_output, 1e-9) * t_step)
    wait = min((dp - 1) / max(lam, 1e-9) + _ADP.batching_wait_iters * t_step, _ADP.timeout_iters * t_step)
    p90_steps = max(1, int(math.ceil(st.p90_new / max(st.mean_new, 1.0) * steps)))
    ttft = wait + p90_steps * t_pre + (0.5 + (1.0 if ov else 0.0)) * t_step
    return lam, ttft, t_step / spt


def _token_floor(dev_alone: float, sc: SchedulerConfig, d: int, ov: bool) -> float:
    """Fewest seconds per output token a request can see on this layout: a decode step of that request alone
    (``dev_alone``: one request, a one-token context; its host work, async overlap as set) with every one of its
    ``d`` drafts accepted. Every step a request decodes in carries at least that request and its host work, and the
    cost model prices no step below the decode of one of its requests alone, so its TPOT is no lower than this
    (``tests/test_screen_e2e.py`` checks the bound against simulated E2E on a grid of rows and loads)."""
    return wall_time(dev_alone, _host(sc, 1, 1 + d), ov) / (1 + d)


def screen_layout(ctx: ScreenContext, index: int, opt: LayoutOption) -> LayoutPoints:
    """All operating points of one layout option (a worker job; deterministic)."""
    import time

    t0 = time.perf_counter()
    lay = opt.layout
    cost = _cost(ctx.model, ctx.hardware, opt.key, lay.model_dump_json(), opt.eplb, opt.table_placement, ctx.expert_load, ctx.calibration)
    st = ctx.stats
    dp = lay.dp
    sc = SchedulerConfig(host_workers=dp)  # one scheduler per attention-DP rank: host work in parallel
    ctx_len = max(st.mean_context, 1.0)
    per_seat = st.mean_prompt + st.mean_output
    hit_ctx = int(round(st.mean_prompt - st.mean_new))
    rows_d, rows_m = [], []
    dev_cache: dict[tuple[int, int], float] = {}
    floor_dev: dict[int, float] = {}   # device seconds of a decode step of one request alone, per draft length
    model = get_model(ctx.model)

    def kv_ok_at(B: int, d: int, c: int) -> bool:
        # the KV a rank has with the workspace of its scheduler (planner.simulate.scheduler_for: c + B(1+d) tokens, B seats)
        return B * per_seat <= KV_SHARE_FOR_BATCH * opt.kv_tokens_per_rank(model, c + B * (1 + d), B, mtp=d > 0)

    for B in ctx.batch_per_rank:
        n = B * dp
        for d in ctx.draft_len:
            # a decode pool's chunk is its prefill pool's, chosen later: its KV is checked at the largest
            kv_ok = kv_ok_at(B, d, max(ctx.chunk_tokens))
            spt = 1.0 + sum(ctx.acceptance[:d])
            dev = float(cost.decode_times(np.full(n, ctx_len), 1, d)[0])
            dev_cache[(B, d)] = dev
            if d not in floor_dev:
                floor_dev[d] = float(cost.decode_times(np.ones(1), 1, d)[0])
            host = _host(sc, n, n * (1 + d))
            # steady state at full seats: each step finishes n * spt / O requests' output, so it also
            # admits that many new prompts (mean new tokens each), split into chunks of at most c
            r = n * spt / max(st.mean_output, 1e-9)
            pre_tokens = r * max(st.mean_new, 1.0)
            mixes = {}
            for c in ctx.chunk_tokens:
                m_chunks = max(1, int(math.ceil(r)), int(math.ceil(pre_tokens / c)))
                tok = max(1, int(round(pre_tokens / m_chunks)))
                dev_mix, n_tok = _mixed_step(cost, n, d, int(ctx_len), m_chunks, tok, hit_ctx)
                mixes[c] = (dev_mix, m_chunks, n_tok)
            balanced = {c: _balanced_step(cost, n, d, int(ctx_len), hit_ctx, st, c, r, dp) for c in ctx.chunk_tokens} \
                if ctx.adp_balance and dp > 1 else {}
            for ov in ctx.async_overlap:
                t_dec = wall_time(dev, host, ov)
                floor = _token_floor(floor_dev[d], sc, d, ov)
                rows_d.append((B, d, ov, t_dec, spt, kv_ok, floor))
                for c in ctx.chunk_tokens:
                    dev_mix, m_chunks, n_tok = mixes[c]
                    t_step = wall_time(dev_mix, _host(sc, n + m_chunks, n_tok), ov)
                    lam = n * spt / (max(st.mean_output, 1e-9) * t_step)
                    tpot = t_step / spt
                    # a p90 prompt needs ceil(p90 / c) steps (one chunk per step); arrivals wait half a step, and a
                    # whole step more on a pipelined engine (its next step is scheduled already: sim/instance.py)
                    p90_steps = max(1, int(math.ceil(st.p90_new / c)))
                    ttft = (p90_steps + 0.5 + (1.0 if ov else 0.0)) * t_step
                    rows_m.append((B, d, ov, c, lam, ttft, tpot, kv_ok_at(B, d, c), False, floor))
                    if c in balanced:
                        lam, ttft, tpot = _balance_point(balanced[c], t_dec, sc, ov, n, spt, st, dp)
                        rows_m.append((B, d, ov, c, lam, ttft, tpot, kv_ok_at(B, d, c), True, floor))
    rows_p = []
    for c in ctx.chunk_tokens:
        tok, k, steps = _prefill_shape(st, c)
        m_chunks = dp * k
        new = np.full(m_chunks, int(round(tok)), np.int64)
        dev = cost.mixed_step_time(new, np.full(m_chunks, hit_ctx, np.int64), np.zeros(m_chunks, bool))
        for ov in ctx.async_overlap:
            t_pre = wall_time(dev, _host(sc, m_chunks, float(new.sum())), ov)
            rows_p.append((c, ov, (m_chunks / steps) / t_pre, t_pre, steps))

    def col(rows, i, dtype=float):
        return np.array([r[i] for r in rows], dtype=dtype)

    return LayoutPoints(
        option_index=index,
        dec_B=col(rows_d, 0, np.int64), dec_d=col(rows_d, 1, np.int64), dec_async=col(rows_d, 2, bool),
        dec_t=col(rows_d, 3), dec_spt=col(rows_d, 4), dec_kv_ok=col(rows_d, 5, bool), dec_tok_floor=col(rows_d, 6),
        mix_B=col(rows_m, 0, np.int64), mix_d=col(rows_m, 1, np.int64), mix_async=col(rows_m, 2, bool),
        mix_chunk=col(rows_m, 3, np.int64), mix_rate=col(rows_m, 4), mix_ttft=col(rows_m, 5), mix_tpot=col(rows_m, 6),
        mix_kv_ok=col(rows_m, 7, bool), mix_bal=col(rows_m, 8, bool), mix_tok_floor=col(rows_m, 9),
        pre_chunk=col(rows_p, 0, np.int64), pre_async=col(rows_p, 1, bool), pre_rate=col(rows_p, 2), pre_step=col(rows_p, 3),
        pre_steps_per_req=col(rows_p, 4, np.int64),
        seconds=time.perf_counter() - t0,
    )


def e2e_at(ttft: np.ndarray, tpot: np.ndarray, stats: WorkloadStats, percentile: int) -> np.ndarray:
    """The screen's end-to-end latency at the SLO's ``percentile``: ``TTFT + (O_p - 1) * TPOT`` (a central estimate).

    A request's E2E is its TTFT plus its other ``O - 1`` output tokens at its TPOT (the simulator's definitions,
    ``scheduler/metrics.py``: TPOT = (finish - first token) / (O - 1)). With the row's TTFT and TPOT as the screen
    has them (TTFT of a p90 new prompt, TPOT of the steady step at the max batch), E2E grows with ``O``, so its
    ``percentile`` is at ``O_p``, the workload's output length there (``WorkloadStats.output_at``, measured on the
    same sample as the other lengths). It inherits the screen's full-batch TPOT, so it runs high: slices simulated
    at 0.9 and 0.7 x the screened rate hold fewer requests and finish the long ones faster (qwen3-30b-a3b on 8 x
    H200 chat: up to 1.65x the simulated p90 at batch 256 per rank, 2.1x the p99).

    The rule, as for TTFT and TPOT: this figure is the screen's verdict (``Table.meets``: a row meets the E2E target
    when it is within it; the screen's frontier, its count of rows meeting the SLO, the plan when nothing is
    simulated). But it prunes nothing by itself, since it is no bound and its error exceeds the NEAR_SLO (1.5x) margin
    the planner gives TTFT and TPOT: a row leaves the simulator's reach on E2E only when its ``e2e_floor``, a lower
    bound, is over the target (``planner.search``)."""
    return ttft + np.maximum(stats.output_at(percentile) - 1.0, 0.0) * tpot


def e2e_floor(tok_floor: np.ndarray, stats: WorkloadStats, percentile: int) -> np.ndarray:
    """A lower bound on the simulated E2E at the SLO's ``percentile``: ``(O_p - 1) * tok_floor``.

    Each request takes at least ``tok_floor`` (``_token_floor``: its decode steps alone, every draft accepted) per
    output token after its first (its TTFT, left out, only adds), so its E2E is at least ``(O - 1) * tok_floor``; that
    grows with ``O``, so the ``percentile`` of E2E over the requests is at least that of ``(O - 1) * tok_floor``, which
    is ``(O_p - 1) * tok_floor`` for ``O_p`` the output length at that percentile of the requests simulated. The
    simulator draws them from the workload, but a run measures a few hundred of them, so ``O_p`` here is the
    workload's at a lower percentile that allows for that sample (``WorkloadStats.output_floor_at``: three standard
    errors of the quantile of 90 requests, p90 -> p80.5)."""
    return np.maximum(stats.output_floor_at(percentile) - 1.0, 0.0) * tok_floor


def kv_transfer_bytes(model_name: str, kv_dtype: str, prompt_tokens: float) -> float:
    """Bytes of one request's KV shipped from prefill to decode (one copy: MLA latents are replicated over TP)."""
    per_tok, fixed = kv_rates(get_model(model_name), kv_dtype)
    return prompt_tokens * per_tok + fixed
