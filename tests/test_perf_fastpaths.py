"""The simulator's fast paths give the same numbers as the straightforward code they replace.

No timing here (benchmarks/bench_sim.py measures speed): each fast path is checked against its
reference on random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.catalog import get_model
from costmodels.effective import EffectiveStepCost
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.moe_load import ExpertLoadSpec, cached_initial
from costmodels.step import StepCostModel
from scheduler.plan import ScheduledChunk, StepPlan, StepResult
from scheduler.request import Request
from costmodels.step_memo import MemoStepCost
from scheduler.metrics import LogHistogram, MetricsCollector

H200 = get_hardware("H200")
CASES = [
    ("deepseek-v3", ParallelLayout(tp=8, weight_dtype="fp8")),
    ("deepseek-v3", ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8", two_micro_batch=True)),
    ("deepseek-v3.2", ParallelLayout(tp=8, weight_dtype="fp8")),
    ("deepseek-v4-flash", ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8", expert_dtype="fp4", two_micro_batch=True)),
    ("qwen3-235b-a22b", ParallelLayout(tp=4, ep=4, weight_dtype="fp8")),
    ("llama-3.1-70b", ParallelLayout(tp=4, pp=2)),
    ("kimi-k2", ParallelLayout(tp=8, dp=2, ep=16, weight_dtype="fp8")),
]


def _batch(rng, mtp: bool, max_ctx: int = 40000):
    nd = int(rng.integers(0, 300))
    npre = int(rng.integers(0 if nd else 1, 4))
    draft = int(rng.integers(0, 3)) if mtp else 0
    new = np.concatenate([np.full(nd, 1 + draft), rng.integers(1, 9000, npre)]).astype(np.int64)
    ctx = rng.integers(0, max_ctx, nd + npre).astype(np.int64)
    dec = np.concatenate([np.ones(nd, bool), np.zeros(npre, bool)])
    return nd, draft, new, ctx, dec


@pytest.mark.parametrize("name,layout", CASES, ids=lambda x: x if isinstance(x, str) else x.describe().replace(" ", "-"))
def test_mixed_step_time_equals_op_by_op(name, layout):
    """Tabulated non-attention terms and summed attention agree with the op-by-op evaluation to float rounding."""
    cm = StepCostModel(get_model(name), H200, layout)
    rng = np.random.default_rng(7)
    for _ in range(120):
        nd, draft, new, ctx, dec = _batch(rng, bool(cm.model.mtp_layers))
        ref = cm._mixed_step_time_reference(new, ctx, dec)
        perm = rng.permutation(new.size)
        if cm.gqa_walks:
            # a GQA varlen call's tiles go out in batch order: a permuted batch is priced in its own order, and
            # decodes first, each kind in the permuted order, as the summaries take it
            ref_p = cm._mixed_step_time_reference(new[perm], ctx[perm], dec[perm])
            assert cm.mixed_step_time(new[perm], ctx[perm], dec[perm]) == pytest.approx(ref_p, rel=1e-12, abs=0)
            perm = perm[np.argsort(~dec[perm], kind="stable")]
            ref = cm._mixed_step_time_reference(new[perm], ctx[perm], dec[perm])
        # elsewhere request order does not matter
        assert cm.mixed_step_time(new[perm], ctx[perm], dec[perm]) == pytest.approx(ref, rel=1e-12, abs=0)
        if cm.gqa_walks:
            nd_p = dec[perm]
            fast = cm.chunked_step_time(ctx[perm][nd_p], draft, new[perm][~nd_p].tolist(), ctx[perm][~nd_p].tolist())
            assert fast == pytest.approx(ref, rel=1e-12, abs=0)
            continue
        fast = cm.chunked_step_time(ctx[:nd], draft, new[nd:].tolist(), ctx[nd:].tolist())
        assert fast == pytest.approx(ref, rel=1e-12, abs=0)


def test_mixed_step_time_matches_step_and_odd_batches():
    cm = StepCostModel(get_model("deepseek-v3"), H200, ParallelLayout(tp=8, weight_dtype="fp8"))
    # decodes verifying different draft lengths take the op-by-op path
    new, ctx, dec = np.array([2, 3, 500]), np.array([100, 200, 0]), np.array([True, True, False])
    assert cm.mixed_step_time(new, ctx, dec) == cm._mixed_step_time_reference(new, ctx, dec)
    from costmodels.batch import BatchShape

    b = BatchShape.from_lists([1] * 64 + [2048], [3000] * 64 + [512], [True] * 64 + [False])
    assert cm.mixed_step_time(b.new_tokens, b.context_lens, b.is_decode) == pytest.approx(cm.step(b).time_s, rel=1e-12)
    assert cm.mixed_step_time([], [], []) == 0.0 and cm.chunked_step_time(np.zeros(0, np.int64), 0, [], []) == 0.0


def test_mixed_step_time_with_expert_load_and_effective_wrapper():
    """The expert-load hook and EffectiveStepCost's chunked entry keep their semantics."""
    v3 = get_model("deepseek-v3")
    lay = ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8")
    load = cached_initial(ExpertLoadSpec(), v3.moe.n_routed_experts, 8, 0, False)
    rng = np.random.default_rng(3)
    for dp_balance in (False, True):
        eff = EffectiveStepCost(v3, H200, lay, expert_load=load, dp_balance=dp_balance)
        for _ in range(40):
            nd, draft, new, ctx, dec = _batch(rng, True)
            ref = eff.mixed_step_time(new, ctx, dec)
            base = eff._at(eff.dp_imbalance(new, ctx, dec))
            assert base.mixed_step_time(new, ctx, dec) == pytest.approx(base._mixed_step_time_reference(new, ctx, dec), rel=1e-12)
            assert eff.chunked_step_time(ctx[:nd], draft, new[nd:].tolist(), ctx[nd:].tolist()) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("name,layout", CASES, ids=lambda x: x if isinstance(x, str) else x.describe().replace(" ", "-"))
def test_chunked_step_time_from_the_context_sum_is_exact_where_offered(name, layout):
    """Where a cost model says a prefill step depends on the decodes' contexts only through their sum
    (mixed_sum_only), pricing from the sum gives exactly the per-context price; the memo offers it then."""
    cm = StepCostModel(get_model(name), H200, layout)
    spec = get_model(name)
    eff = EffectiveStepCost(spec, H200, layout, dp_balance=False)
    memo = MemoStepCost(eff)
    assert (memo.chunked_sum is not None) == cm.mixed_sum_only == eff.mixed_sum_only
    if not cm.mixed_sum_only:   # windowed / indexed attention, or FA3's longest key walk: per-request contexts matter
        assert name in ("deepseek-v3.2", "deepseek-v4-flash") or cm._pre_table or cm.gqa_walks
        return
    rng = np.random.default_rng(11)
    for _ in range(120):
        nd, draft, new, ctx, dec = _batch(rng, bool(cm.model.mtp_layers))
        pn, pc = new[nd:].tolist(), ctx[nd:].tolist()
        s = int(ctx[:nd].sum())
        assert cm.chunked_step_time_sum(nd, s, draft, pn, pc) == cm.chunked_step_time(ctx[:nd], draft, pn, pc)
        assert memo.chunked_sum(nd, s, draft, pn, pc) == memo.chunked_step_time(ctx[:nd], draft, pn, pc)
    # the attention-DP split prices each rank's own requests: it needs the contexts
    assert EffectiveStepCost(spec, H200, layout, dp_balance=True).mixed_sum_only is (layout.dp == 1)


def test_memo_chunked_entry_falls_back_without_fast_path():
    """A cost model without chunked_step_time (or a memo overriding mixed_step_time) is asked with arrays."""
    calls = []

    class Plain:
        def mixed_step_time(self, new, ctx, dec):
            calls.append((new.tolist(), ctx.tolist(), dec.tolist()))
            return 1.0

        def decode_times(self, ctx, k, d=0):
            return np.full(k, float(np.sum(ctx)))

    memo = MemoStepCost(Plain())
    assert memo.chunked_step_time(np.array([5, 6]), 1, [100], [7]) == 1.0
    assert calls == [([2, 2, 100], [5, 6, 7], [True, True, False])]

    class Overriding(MemoStepCost):
        def mixed_step_time(self, new, ctx, dec):
            return 2.0

    cm = StepCostModel(get_model("deepseek-v3"), H200, ParallelLayout(tp=8, weight_dtype="fp8"))
    assert Overriding(cm).chunked_step_time(np.array([5]), 0, [100], [0]) == 2.0


def _plan(rng, nd, k, draft=0, prefill=0):
    reqs = [Request(f"r{i}", 0.0, 10, 10) for i in range(nd)]
    chunks = [ScheduledChunk(Request("p", 0.0, prefill, 5), prefill, 0, True)] if prefill else []
    return StepPlan(0, prefills=chunks, decodes=reqs, decode_context_lens=np.zeros(nd, np.int64), num_steps=k, draft_len=draft)


def test_itl_buffer_gives_the_histogram_of_direct_adds():
    """Buffered ITL samples (flushed in bulk) give the same bins and counts as adding each plan's samples."""
    rng = np.random.default_rng(0)
    col = MetricsCollector()
    col.ITL_BUFFER = 64  # force several flushes
    col._itl_v, col._itl_w = np.empty(64), np.empty(64)
    ref = LogHistogram()
    t = 0.0
    for i in range(400):
        k = int(rng.integers(1, 100)) if i % 3 else 1
        nd = int(rng.integers(0, 20))
        d = rng.uniform(0.001, 0.2, k)
        if i % 7 == 0 and nd:
            tok = rng.integers(0, 2, (k, nd))  # an executor's decodes that made no token
        else:
            tok = np.ones((k, nd), np.int64)
        # (a plan without decodes runs on another instance: decodes waiting behind it would add the wait to their gaps)
        col.on_step(0 if nd else 1, t, _plan(rng, nd, k, prefill=int(rng.integers(0, 2)) * 300), StepResult(d, tok), 10, 100)
        if nd:
            ref.add(d, (tok > 0).sum(axis=1))
        t += float(d.sum())
    got = col.itl
    np.testing.assert_array_equal(got.weights, ref.weights)
    assert got.total_w == ref.total_w
    assert got.sum_wx == pytest.approx(ref.sum_wx, rel=1e-12)
    assert col.summarize(8, None).itl_s == got.stat()


def _decode_plan(rng, nd, k, ctx_scale, backend):
    """A decode plan, with the backend's host cost per step set to one of three values."""
    reqs = [Request(f"r{i}", 0.0, 10, 10) for i in range(nd)]
    ctx = rng.integers(1, ctx_scale, nd).astype(np.int64)
    backend.host_coeffs = (float(rng.choice([0.0, 0.03, 0.2])), 0.0, 0.0)
    return StepPlan(0, decodes=reqs, decode_context_lens=ctx, num_steps=k)


@pytest.mark.parametrize("overlap", [True, False])
def test_execute_until_equals_pricing_all_steps_then_cutting(overlap):
    """The step-by-step decode run of ``execute(plan, stop_at)`` (memo block boundaries included) gives the
    times and ends of the vectorised path."""
    from sim.backend import SimBackend

    cm = EffectiveStepCost(get_model("deepseek-v3"), H200, ParallelLayout(tp=8, weight_dtype="fp8"))
    backend = SimBackend(cm, np.random.default_rng(0), (), overlap)
    # the per-step path (a pipelined loop prices a plan's steps from it, then moves its launches: test_pipelined_launch)
    backend.lead = False
    rng = np.random.default_rng(5)
    for trial in range(300):
        nd, k = int(rng.integers(1, 40)), int(rng.integers(2, 300))
        plan = _decode_plan(rng, nd, k, 4000, backend)
        cold = bool(rng.integers(0, 2))
        start = float(rng.uniform(0, 100))
        backend.clock = lambda: start
        full = backend.step_times(plan, cold)
        ends_full = start + np.cumsum(full)
        stop = float(rng.uniform(start, ends_full[-1] + 1.0)) if trial % 5 else float(ends_full[int(rng.integers(0, k))])
        backend._busy_until = -np.inf if cold else start   # the device idled before this plan, or not
        times = backend.execute(plan, stop).step_durations
        n = min(int(np.searchsorted(ends_full, stop, side="left")) + 1, k)
        np.testing.assert_array_equal(times, full[:n])
        np.testing.assert_array_equal(np.asarray(backend.ends), ends_full[:n])
        backend._busy_until = -np.inf if cold else start
        assert backend.execute(plan).step_durations.tolist() == full.tolist()


def test_single_step_float_paths_equal_array_paths():
    from sim.backend import SimBackend
    from costmodels.host import wall_time

    cm = EffectiveStepCost(get_model("deepseek-v3"), H200, ParallelLayout(tp=8, weight_dtype="fp8"))
    backend = SimBackend(cm, np.random.default_rng(0), (), True)
    rng = np.random.default_rng(9)
    for _ in range(200):  # contexts up to 3000: the decode runs cross memo blocks of 512 grid points
        plan = _decode_plan(rng, int(rng.integers(1, 60)), 1, 3000, backend)
        cold = bool(rng.integers(0, 2))
        ref = wall_time(backend.device_times(plan), backend.host_time(plan), True, cold)
        assert backend.step_times(plan, cold).tolist() == ref.tolist()
    memo = backend.cost
    for n in (1, 7, 64):
        for s in (0, 511 * n, 512 * n - 1, 1023 * n + 3, 5000):  # grid points either side of block boundaries
            ctx = np.full(n, s // n, np.int64)
            ctx[: s % n] += 1
            assert memo.decode_time(n, 0, int(ctx.sum())) == memo.decode_times(ctx, 1, 0)[0]
