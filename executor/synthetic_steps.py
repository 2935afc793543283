"""Synthetic steps on the real runner: plans of given decode contexts and prefill chunks, and the eager-shape warm-up.

``synthetic_plan`` builds a ``StepPlan`` on fresh KV pages with random prompt tokens (calibration's grid runs them).
``warm_steps`` runs the eager step shapes serving will see once each before anything is timed, vLLM-style
(its start-up compiles and profiles over token-count buckets), printing one line per shape:

- every first-use cost the executor has is keyed on the step's shape: Triton specialises integer arguments on
  ``== 1`` and divisibility by 16 (token counts, chunk lengths, strides) and compiles on a new key; block sizes
  and split counts chosen from the shape are ``constexpr`` keys; DeepGEMM JITs per tile configuration chosen from
  M; the caching allocator grows a new segment (``cudaMalloc``) the first time a step needs more than it holds;
- so the buckets cover token counts of both divisibility classes from 1 to the step budget, 1 to 16 chunks over
  cached context up to the model window, and decodes beside a chunk, with the largest step last-but-probe (the
  allocator's peak);
- ``probe_new_shape`` then times a (new tokens, cached tokens) chunk shape the warm-up did not run, twice: a
  first call well above the second is a per-shape cost the warm-up cannot cover (cuDNN SDPA planned one per
  shape before ``kernels.torch_fast`` pinned the prefill backends; H200 matrix run 4).

Sampling: ``MEASURE_TEMPERATURE`` is what calibration and validation sample with (seeded, so CPU runs repeat). The grid
feeds its decode rows random prompt tokens; serving feeds back what it samples. With dummy weights greedy decoding may
collapse onto a few tokens, and the router then sends a decode batch to a few experts (run 4: serving decodes 3-8.5%
faster than the grid at the same batch; ``routing_probe`` measures it). Real weights on real text spread tokens over
the experts (DeepSeek-V3 balances expert load in training), as random tokens do. So both sides draw uniform tokens:
temperature 1e4 (``SamplingParams``' maximum) flattens the dummy logits whatever their scale, the sampled tokens are
uniform like the grid's, and grid and serving pay the same sampler (softmax and one seeded host draw per row; no
vocabulary sort without top-k / top-p).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from executor.engine import LLMEngine, SamplingParams
from scheduler.plan import ScheduledChunk, StepPlan
from scheduler.request import Request

MEASURE_TEMPERATURE = 1e4   # calibration's grid and loop, validation's replays: uniform tokens (0: greedy)


class _Pages:
    """Hands out KV page ids; wraps around (pages shared) when a shape needs more than the cache has."""

    def __init__(self, num_blocks: int):
        self.n, self.next = num_blocks, 0

    def take(self, count: int) -> list[int]:
        ids = [(self.next + i) % self.n for i in range(count)]
        self.next = (self.next + count) % self.n
        return ids


def synthetic_plan(engine: LLMEngine, decode_ctx: list[int], prefill: list[tuple[int, int]], tag: str, draft_len: int = 0,
                   temperature: float = 0.0, seed: int = 0) -> StepPlan:
    """A StepPlan of decodes at the given contexts and prefill chunks (new, cached) on fresh pages.

    ``temperature`` > 0: its requests are registered with the runner to sample (per-request seeds from ``seed`` and
    the request id); the caller removes them (``drop_plan``). 0: the runner's default for unknown requests (greedy)."""
    bs = engine.block_size
    vocab = engine.vocab_size
    pages = _Pages(engine.scheduler.blocks.num_blocks)
    rng = np.random.default_rng(len(decode_ctx) * 7919 + len(prefill))
    decodes = []
    for i, c in enumerate(decode_ctx):
        r = Request(f"{tag}d{i}", 0.0, c, 1 << 20, prompt_token_ids=rng.integers(0, vocab, max(c, 1)).tolist())
        r.block_ids = pages.take(-(-(c + 1 + draft_len) // bs))
        decodes.append(r)
    chunks = []
    for i, (new, ctx) in enumerate(prefill):
        r = Request(f"{tag}p{i}", 0.0, ctx + new, 1 << 20, prompt_token_ids=rng.integers(0, vocab, ctx + new).tolist())
        r.block_ids = pages.take(-(-(ctx + new) // bs))
        chunks.append(ScheduledChunk(r, new, ctx, True))
    if temperature > 0:
        for r in decodes + [c.request for c in chunks]:
            engine.runner.add_request(r.request_id, SamplingParams(temperature=temperature, max_tokens=1 << 20,
                                                                   ignore_eos=True, seed=None))
    return StepPlan(0, prefills=chunks, decodes=decodes, decode_context_lens=np.asarray(decode_ctx, np.int64), draft_len=draft_len)


def fresh_chunk_step(engine: LLMEngine, decodes: StepPlan, chunk: int, tag: str, run, temperature: float = 0.0):
    """Run (``run(plan)``) one mixed step: a fresh request's ``chunk``-token prompt beside the decodes of the decode
    plan ``decodes`` (same requests, pages and sampling state), as serving admits a request; the fresh request is
    forgotten after. Returns what ``run`` returned."""
    p = synthetic_plan(engine, [int(c) for c in decodes.decode_context_lens], [(chunk, 0)], tag, temperature=temperature)
    for r in p.decodes:   # its own decode requests (registered to sample) give way to ``decodes``'
        engine.runner.remove_request(r.request_id)
    p.decodes[:] = decodes.decodes
    try:
        return run(p)
    finally:
        for c in p.prefills:
            engine.runner.remove_request(c.request.request_id)


def drop_plan(engine: LLMEngine, plan: StepPlan) -> None:
    """Forget a synthetic plan's requests in the runner (sampling state, drafts)."""
    for r in plan.decodes + [c.request for c in plan.prefills]:
        engine.runner.remove_request(r.request_id)


# ----------------------------------------------------------------------------- warm-up over buckets
def token_buckets(max_tokens: int) -> list[int]:
    """Prefill token counts to warm: powers of two from 16 to the step budget, each with an odd neighbour (the other
    divisibility-by-16 class of every Triton integer argument that carries a token count), and 1."""
    out, m = {1}, 16
    while m <= max_tokens:
        out.update((m, m - 1 if m > 16 else 17))
        m *= 2
    out.add(max_tokens)
    out.add(max_tokens - 3)
    return sorted(x for x in out if 1 <= x <= max_tokens)


def warm_shapes(max_tokens: int, max_ctx: int, max_batch: int) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """(decode contexts, prefill chunks) to run once at start: single chunks over the token buckets, then the budget
    split into 2..16 chunks over cached context (short and long), then decodes beside a chunk; the largest last."""
    shapes: list[tuple[list[int], list[tuple[int, int]]]] = []
    for n in token_buckets(max_tokens):
        if n < max_ctx:
            shapes.append(([], [(n, 0)]))
    for k in (2, 4, 8, 16):
        q = max_tokens // k
        if q < 1:
            continue
        for frac in (0.0, 0.5, 1.0):   # cached context: none, half the room left, all of it (the longest S)
            ctx = int((max_ctx - 1 - q) * frac)
            if q + ctx < max_ctx and ctx >= 0:
                shapes.append(([], [(q - (i % 2), ctx) for i in range(k)]))   # odd and even lengths side by side
    mid_ctx = max(1, min(max_ctx // 2, max_ctx - 2))
    for b in sorted({1, 7, 16, 33, max(1, max_batch // 2), max_batch}):
        if b > max_batch:
            continue
        q = max(1, min(max_tokens - b, 2048))
        shapes.append(([mid_ctx] * b, [(q, 0)]))
        shapes.append(([mid_ctx] * b, [(max(1, (max_tokens - b) // 4), min(max_ctx // 2, max_ctx - 1 - max_tokens // 4))] * 4))
    return [(dc, [(n, c) for n, c in pf if n >= 1 and n + c < max_ctx]) for dc, pf in shapes if pf]


def warm_steps(engine: LLMEngine, shapes=None, log=print, temperature: float = MEASURE_TEMPERATURE) -> list[dict]:
    """Run each eager shape twice on the runner (untimed by anything else); rows: shape, first and second seconds.

    The first run pays whatever is new for the shape; the second is the steady cost. Shapes default to
    :func:`warm_shapes` for the engine's scheduler budget, window and batch."""
    cfg = engine.scheduler.config
    shapes = shapes if shapes is not None else warm_shapes(cfg.max_num_batched_tokens, engine.max_model_len, cfg.max_num_seqs)
    runner = engine.runner
    cuda = runner.device.type == "cuda"
    rows = []
    t_all = time.perf_counter()
    log(f"step warm-up: {len(shapes)} eager shapes (token buckets x chunks x cached context, decodes beside a chunk)")
    for j, (dc, pf) in enumerate(shapes):
        plan = synthetic_plan(engine, dc, pf, f"warm{j}_", temperature=temperature)
        times = []
        try:
            for _ in range(2):
                t0 = time.perf_counter()
                runner.execute(plan)
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        finally:
            drop_plan(engine, plan)
        tok = sum(n for n, _ in pf)
        rows.append({"decodes": len(dc), "tokens": tok, "chunks": len(pf), "cached": sum(c for _, c in pf),
                     "first_s": times[0], "second_s": times[1]})
        log(f"  [{j + 1}/{len(shapes)}] {len(dc):3d} decodes + {tok:5d} tokens in {len(pf):2d} chunks "
            f"(cached {sum(c for _, c in pf):6d}): first {times[0] * 1e3:7.1f} ms, again {times[1] * 1e3:7.1f} ms")
    log(f"step warm-up done in {time.perf_counter() - t_all:.1f} s")
    return rows


def probe_new_shape(engine: LLMEngine, log=print, temperature: float = MEASURE_TEMPERATURE) -> dict:
    """Time two chunk shapes the warm-up did not run, each twice: what a first-seen shape still costs once.

    Returns {first_ms, again_ms, extra_ms} averaged over the two shapes; extra near 0 means no per-shape cost left."""
    cfg = engine.scheduler.config
    w = engine.max_model_len
    n = max(1, min(cfg.max_num_batched_tokens // 3, w // 3) - 5)     # odd lengths no bucket has
    shapes = [([], [(n, min(w // 3 + 7, w - n - 1))]), ([], [(n + 2, 0), (n - 2, min(w // 5 + 3, w - n - 1))])]
    firsts, agains = [], []
    for j, (dc, pf) in enumerate(shapes):
        rows = warm_steps(engine, [(dc, pf)], log=lambda s: None, temperature=temperature)
        firsts.append(rows[0]["first_s"])
        agains.append(rows[0]["second_s"])
    first, again = float(np.mean(firsts)) * 1e3, float(np.mean(agains)) * 1e3
    log(f"first-seen prefill shape: first {first:.1f} ms, again {again:.1f} ms (one-time cost {first - again:+.1f} ms)")
    return {"first_ms": first, "again_ms": again, "extra_ms": first - again}


# ----------------------------------------------------------------------------- routing diversity
def routing_probe(engine: LLMEngine, log=print, batch: int = 64, steps: int = 16) -> dict:
    """Experts a decode batch of ``batch`` rows touches (mean over MoE layers): the grid's random tokens against
    serving's sampled tokens, greedy, at temperature 1 and at ``MEASURE_TEMPERATURE`` (a replay of ``batch`` 64-token prompts; decode steps of
    exactly ``batch`` rows). What decides whether grid and serving decodes cost the same: fewer distinct experts read
    fewer expert weights. {} without MoE layers."""
    from executor.moe import MoE

    moes = [m for m in engine.runner.model.modules() if isinstance(m, MoE)]
    if not moes:
        return {}

    def touched() -> float:
        return float(np.mean([int(torch.unique(m.last_ids[:batch]).numel()) for m in moes if m.last_ids is not None]))

    # eager: a graph replay does not reassign ``MoE.last_ids`` (it would hold the last eager step's ids); routing is
    # the same function of the tokens either way
    runner = engine.runner
    saved = {k: getattr(runner, k) for k in ("graphs", "piecewise") if hasattr(runner, k)}
    for k in saved:
        setattr(runner, k, None)
    try:
        return _routing_counts(engine, touched, batch, steps, log)
    finally:
        for k, v in saved.items():
            setattr(runner, k, v)


def _routing_counts(engine: LLMEngine, touched, batch: int, steps: int, log) -> dict:
    """``routing_probe``'s three measurements on an engine running eagerly."""
    from executor.replay import fresh_engine, replay

    out = {}
    plan = synthetic_plan(engine, [min(512, engine.max_model_len // 2)] * batch, [], "route_")
    try:
        engine.runner.execute(plan)
        out["grid_random_tokens"] = touched()
    finally:
        drop_plan(engine, plan)
    rng = np.random.default_rng(7)
    plen = min(64, engine.max_model_len // 2)
    items = [(0.0, f"route{i}", rng.integers(0, engine.vocab_size, plen).tolist(), steps) for i in range(batch)]
    for name, temp in (("serving_greedy", 0.0), ("serving_temperature_1", 1.0), ("serving_measured_temperature", MEASURE_TEMPERATURE)):
        seen: list[float] = []

        def on_plan(_i, _start, recs, _stats):
            if len(recs) == 1 and recs[0].get("num_decodes") == batch and not recs[0].get("num_prefills"):
                seen.append(touched())
        replay(fresh_engine(engine, engine.scheduler.config), items, temperature=temp, on_plan=on_plan)
        out[name] = float(np.mean(seen[1:])) if len(seen) > 1 else float("nan")   # the first decode follows the prompts
    log("experts touched per MoE layer by a decode batch of %d: grid (random tokens) %.1f, serving greedy %.1f, "
        "serving temperature 1 %.1f, serving temperature %g %.1f" % (batch, out["grid_random_tokens"], out["serving_greedy"],
                                                                   out["serving_temperature_1"], MEASURE_TEMPERATURE,
                                                                   out["serving_measured_temperature"]))
    return out
