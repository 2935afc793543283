"""Step cost model: hand-worked MLA arithmetic, monotonicity, decode_times == loop of step_time."""

import numpy as np
import pytest

from costmodels.batch import BatchShape
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.ops import CATEGORIES
from costmodels.step import StepCostModel


@pytest.fixture(scope="module")
def v3():
    return StepCostModel(get_model("deepseek-v3"), get_hardware("h200"), ParallelLayout(tp=8, weight_dtype="fp8"))


def test_mla_decode_flops_and_bytes(v3):
    b, ctx = 64, 4096
    sc = v3.step(BatchShape.decode(b, ctx))
    att = next(o for o in sc.ops if o.name == "attention_full")
    assert att.count == 61
    # absorbed decode, per GPU: 128/8 heads, q.k over 512+64 dims and p.v over 512 dims, each query reads ctx+1 latents
    per_layer_flops = 2 * 16 * (576 + 512) * b * (ctx + 1)
    per_layer_bytes = b * (ctx + 1) * 1152  # BF16 latent, replicated on every TP rank
    assert att.flops == pytest.approx(61 * per_layer_flops)
    assert att.bytes == pytest.approx(61 * per_layer_bytes)
    kvb = next(o for o in sc.ops if o.name == "kv_b_proj" and o.count == 58)
    assert kvb.flops == pytest.approx(58 * 2 * b * 512 * 128 * (128 + 128) / 8)


def test_breakdown_categories_sum_to_time(v3):
    for batch in (BatchShape.decode(32, 2048), BatchShape.prefill(1, 4096), BatchShape.from_lists([1, 1, 512], [100, 900, 0], [True, True, False])):
        sc = v3.step(batch)
        assert tuple(sc.breakdown) == CATEGORIES
        assert sum(sc.breakdown.values()) == pytest.approx(sc.time_s)
        assert v3.step_time(batch) == pytest.approx(sc.time_s)
        assert v3.mixed_step_time(batch.new_tokens, batch.context_lens, batch.is_decode) == pytest.approx(sc.time_s)


def test_the_fast_path_prices_a_prefill_steps_experts_as_step_does():
    """With measured grouped tables and no EP exchange (DeepSeek-V3 TP8 on the H100: its own TP-shard tables), a step
    with a prefill runs the contiguous layout: ``step()`` priced it so, the fast path (what simulate, plan and the UI
    read) priced the masked one, ``prefill:1x4096`` 149.2 ms against 159.7."""
    h100 = StepCostModel(get_model("deepseek-v3"), get_hardware("h100"), ParallelLayout(tp=8, weight_dtype="fp8"))
    assert h100.e_table is not None and h100.layout.ep == 1
    for batch in (BatchShape.prefill(1, 4096), BatchShape.from_lists([1, 1, 512], [100, 900, 0], [True, True, False]),
                  BatchShape.decode(32, 2048)):
        t = h100.step(batch).time_s
        assert h100.step_time(batch) == pytest.approx(t, rel=1e-12)
        assert h100.mixed_step_time(batch.new_tokens, batch.context_lens, batch.is_decode) == pytest.approx(t, rel=1e-12)


def test_more_context_more_attention_time(v3):
    prev = 0.0
    for ctx in (128, 1024, 8192, 65536):
        sc = v3.step(BatchShape.decode(64, ctx))
        assert sc.breakdown["attention"] > prev
        prev = sc.breakdown["attention"]


def test_more_tokens_more_time(v3):
    ts = [v3.step_time(BatchShape.decode(b, 2048)) for b in (1, 8, 64, 256)]
    assert ts == sorted(ts)
    assert v3.step_time(BatchShape.prefill(1, 8192)) > v3.step_time(BatchShape.prefill(1, 1024))


@pytest.mark.parametrize("name,layout", [
    ("deepseek-v3", ParallelLayout(tp=8, weight_dtype="fp8")),
    ("deepseek-v3.2", ParallelLayout(dp=8, ep=8, weight_dtype="fp8", two_micro_batch=True)),
    ("deepseek-v4-flash", ParallelLayout(tp=4, weight_dtype="fp8", expert_dtype="fp4", kv_dtype="fp4")),
    ("qwen3-30b-a3b", ParallelLayout(tp=2)),
    ("llama-3.1-8b", ParallelLayout()),
])
@pytest.mark.parametrize("draft", [0, 1])
def test_decode_times_equals_loop(name, layout, draft):
    m = get_model(name)
    if draft and not m.mtp_layers:
        pytest.skip("no MTP head")
    cm = StepCostModel(m, get_hardware("h200"), layout)
    ctx = np.random.default_rng(1).integers(1, 3000, 37)
    times = cm.decode_times(ctx, 20, draft)
    g = 1 + draft
    loop = [cm.step_time(BatchShape.from_lists(np.full(37, g), ctx + s * g, np.ones(37, bool))) for s in range(20)]
    np.testing.assert_allclose(times, loop, rtol=1e-5)
    assert np.all(np.diff(times) >= -1e-12)


def test_sparse_attention_caps_reads():
    cm = StepCostModel(get_model("deepseek-v3.2"), get_hardware("h200"), ParallelLayout(tp=8, weight_dtype="fp8"))
    a = cm.step(BatchShape.decode(64, 16384))
    b = cm.step(BatchShape.decode(64, 65536))
    att = lambda sc: next(o for o in sc.ops if o.name == "attention_full")  # noqa: E731
    assert att(a).bytes == pytest.approx(att(b).bytes)    # top-2048 read either way
    assert b.breakdown["indexer"] > 1.5 * a.breakdown["indexer"]  # the indexer scores every past token


def test_expert_weights_read_grow_with_tokens_then_saturate(v3):
    def expert_op(b):
        return next(o for o in v3.step(BatchShape.decode(b, 1024)).ops if o.name.startswith("routed_experts"))
    assert expert_op(1).bytes < expert_op(16).bytes < expert_op(256).bytes
    touched = lambda o: float(o.name.split("(")[1].split()[0])  # noqa: E731
    # 1 token x top-8: 8 experts touched; expected distinct experts saturate at all 256
    assert touched(expert_op(1)) == pytest.approx(256 * (1 - (1 - 1 / 256) ** 8), abs=0.5)
    assert touched(expert_op(4096)) == pytest.approx(256, abs=0.5)


def test_wide_ep_crosses_scaleout():
    m = get_model("deepseek-v3")
    h = get_hardware("h200")
    t8 = StepCostModel(m, h, ParallelLayout(dp=8, ep=8, weight_dtype="fp8")).step(BatchShape.decode(512, 2048))
    t32 = StepCostModel(m, h, ParallelLayout(dp=32, ep=32, weight_dtype="fp8")).step(BatchShape.decode(2048, 2048))
    assert t32.breakdown["expert_gemm"] < t8.breakdown["expert_gemm"]   # fewer experts per GPU to read
    assert t32.breakdown["communication"] > t8.breakdown["communication"]  # all-to-all leaves the NVLink domain


def test_other_hardware_is_scaled_and_faster():
    m = get_model("deepseek-v3")
    lay = ParallelLayout(tp=8, weight_dtype="fp8")
    h200 = StepCostModel(m, get_hardware("h200"), lay)
    b200 = StepCostModel(m, get_hardware("b200"), lay)
    batch = BatchShape.decode(64, 4096)
    assert b200.step_time(batch) < h200.step_time(batch)
    assert any("scaled by datasheet ratios" in n for n in b200.step(batch).notes)


def test_memory_method(v3):
    assert v3.memory().fits


def test_decode_times_speed(v3):
    import time
    ctx = np.random.default_rng(0).integers(100, 8000, 256)
    v3.decode_times(ctx, 64)
    t0 = time.perf_counter()
    for _ in range(200):
        v3.decode_times(ctx, 64)
    per_call = (time.perf_counter() - t0) / 200
    assert per_call < 1e-3  # generous bound for loaded CI machines; ~20-60 us typical


def test_ep_dispatch_rows_low_latency_vs_normal():
    from math import comb

    from costmodels.comm import dispatch_rows_per_token as rows

    # low-latency (decode): one copy per expert on another rank
    assert rows(256, 8, 8, 8, 4) == pytest.approx(7.0) and rows(256, 8, 1, 8, 4, normal=True) == 0.0
    # normal (prefill), DeepSeek-V3's group-limited routing: docs/ep.md's routing simulation gave 0.98 / 2.34 / 3.46
    for ep, sim in ((2, 0.98), (4, 2.34), (8, 3.46)):
        assert rows(256, 8, ep, 8, 4, normal=True) == pytest.approx(sim, rel=0.02)
    # no group limit, experts contiguous: a remote rank is missed when none of the top_k falls in its E/ep experts
    assert rows(128, 8, 8, normal=True) == pytest.approx(7 * (1 - comb(112, 8) / comb(128, 8)))
    # never more than a copy per expert, and growing with EP width
    prev = 0.0
    for ep in (2, 3, 4, 6, 8, 16, 32, 64, 72, 144):
        r = rows(256, 8, ep, 8, 4, normal=True)
        assert prev < r <= rows(256, 8, ep, 8, 4) + 1e-12
        prev = r


def test_prefill_steps_dispatch_once_per_rank_and_fast_path_agrees():
    hw = get_hardware("H200")
    lay = ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8")
    cm = StepCostModel(get_model("deepseek-v3"), hw, lay)
    pre = BatchShape.from_lists([4096], [0], [False])
    dec = BatchShape.from_lists([1] * 64, [2048] * 64, [True] * 64)

    def comm(shape, kind):
        return {o.name: o for o in cm.step(shape).ops if o.name.startswith(kind)}

    p, d = comm(pre, "ep_dispatch"), comm(dec, "ep_dispatch")
    assert list(p) == ["ep_dispatch(ep8, normal)"] and list(d) == ["ep_dispatch(ep8, low-latency)"]
    per_tok_p = p["ep_dispatch(ep8, normal)"].bytes / 4096
    per_tok_d = d["ep_dispatch(ep8, low-latency)"].bytes / 64
    assert per_tok_p / per_tok_d == pytest.approx(3.5 / 7.0, rel=0.05)  # imbalance factors differ slightly by token count
    # the tabulated fast path prices a step with a prefill chunk with the normal-mode tables
    new, ctx, isd = np.array([1] * 16 + [900, 300]), np.array([1500] * 16 + [0, 64]), np.array([True] * 16 + [False, False])
    assert cm.mixed_step_time(new, ctx, isd) == pytest.approx(cm._mixed_step_time_reference(new, ctx, isd), rel=1e-9)
    assert cm.decode_times(np.full(16, 1500.0), 1)[0] == pytest.approx(cm._mixed_step_time_reference(new[:16], ctx[:16], isd[:16]), rel=1e-9)


def test_async_overlap_rule_one_function_for_floats_and_runs():
    from costmodels.host import exposed_host, partial_overlap, wall_time

    dev = np.array([0.010, 0.002, 0.010])
    for host in (0.004, 0.020):
        for overlap in (False, True):
            for cold in (False, True):
                run = wall_time(dev, host, overlap, cold)
                one = [wall_time(float(d), host, overlap, cold and i == 0) for i, d in enumerate(dev)]
                assert run.tolist() == one
                # warm steps: the exposed host time is what the rule adds to the device time
                assert one[1] == pytest.approx(dev[1] + exposed_host(float(dev[1]), host, overlap))
                assert float(partial_overlap(host, dev[1], 0.0 if overlap else 1.0)) == pytest.approx(one[1])
    assert wall_time(0.010, 0.004, True) == 0.010 and wall_time(0.010, 0.004, False) == pytest.approx(0.014)


@pytest.mark.parametrize("name,layout", [("deepseek-v3", ParallelLayout(tp=8, weight_dtype="fp8")),
                                         ("deepseek-v3", ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8", two_micro_batch=True)),
                                         ("llama-3.1-70b", ParallelLayout(tp=4, pp=2))])
def test_tables_are_the_op_families_evaluated_over_counts(name, layout):
    """A table entry is the step_ops families at that count: the same functions the breakdown evaluates at one point."""
    from costmodels import step as st

    cm = StepCostModel(get_model(name), get_hardware("h200"), layout)
    for x in (1, 37, 511, 512, 4097):
        for f in (1.0, 0.5):
            fams = cm.main_terms(np.array([x * f]), prefill=False)
            t, a = cm._look(st._T_MAIN, f, 0, x)
            assert t == pytest.approx(sum(float(fam.total()[0]) for fam in fams), rel=1e-15)  # same arithmetic (SIMD aside)
            assert a == pytest.approx(sum(float(p[0]) for p in (fam.a2a_total() for fam in fams) if p is not None), rel=1e-15, abs=0)
    # and the breakdown's op list adds up to its step time (no second formula behind either)
    sc = cm.step(BatchShape.from_lists([1] * 48 + [700], [2000] * 48 + [300], [True] * 48 + [False]))
    if not cm.tbo_applies(49):
        assert sum(o.time_s for o in sc.ops) == pytest.approx(sc.time_s, rel=1e-12)


def test_mla_decode_attention_is_the_flashmla_table_at_the_batch_and_mean_context(v3):
    """Decode steps of a dense-latent MLA model read FlashMLA's measured time at (batch per rank, mean context); MTP
    verification (s_q > 1) at s_q x the heads (FlashMLA packs a request's queries with its heads: one draft at 16
    heads a GPU is the 32-head row; on the formula it read 1.8x the table's time for the same KV); prefill and
    profiles without op tables keep the formula, and the fast paths agree."""
    from costmodels import op_table
    from costmodels.calibration_source import profile_for
    assert v3.mla_table is not None and v3.mla_table.table_heads == 16
    assert any("FlashMLA" in n for n in v3.notes)
    ctx = np.array([1000, 3000, 8000, 4000] * 16)
    b = BatchShape(np.ones(64, np.int64), ctx, np.ones(64, bool))
    att = next(o for o in v3.step(b).ops if o.name == "attention_full")
    want = float(op_table.load("H200").mla_decode[16].time([64], [ctx.mean() + 1]).seconds[0])
    assert att.time_s / att.count == pytest.approx(want, rel=1e-12)
    assert v3.mixed_step_time(b.new_tokens, ctx, b.is_decode) == pytest.approx(v3.step(b).time_s, rel=1e-12)
    loop = [v3.step_time(BatchShape(np.ones(64, np.int64), ctx + k, np.ones(64, bool))) for k in range(5)]
    np.testing.assert_allclose(v3.decode_times(ctx, 5), loop, rtol=1e-12)
    verify = BatchShape(np.full(64, 2), ctx, np.ones(64, bool))     # one draft token verified: s_q = 2
    att2 = next(o for o in v3.step(verify).ops if o.name == "attention_full")
    want2 = float(op_table.load("H200").mla_decode[32].time([64], [ctx.mean() + 2]).seconds[0])
    assert att2.time_s / att2.count == pytest.approx(want2, rel=1e-12)
    assert want2 >= want * 0.99 and v3.mla_for(2).table_heads == 32    # the same KV, twice the query rows
    np.testing.assert_allclose(v3.decode_times(ctx, 3, draft_len=1),
                               [v3.step_time(BatchShape(np.full(64, 2), ctx + 2 * k, np.ones(64, bool))) for k in range(3)],
                               rtol=1e-6)   # (the draft paths' sums differ by 0.5 ppm, before the table as after)
    mtp = next(o for o in v3.step(verify).ops if o.name == "mtp_attention_full")   # MTP draft pass: one query each
    want = float(op_table.load("H200").mla_decode[16].time([64], [ctx.mean() + 3]).seconds[0])
    assert mtp.time_s / mtp.count == pytest.approx(want, rel=1e-12)
    formula = StepCostModel(get_model("deepseek-v3"), get_hardware("h200"), ParallelLayout(tp=8, weight_dtype="fp8"),
                            profile_for(get_hardware("h200")).model_copy(update={"op_tables": None}))
    assert formula.mla_table is None and formula.step(b).time_s != v3.step(b).time_s
    gqa = StepCostModel(get_model("qwen3-235b-a22b"), get_hardware("h200"), ParallelLayout(tp=8, weight_dtype="fp8"))
    assert gqa.mla_table is None


def test_decode_attention_off_the_flashmla_table_streams_as_its_kernel_does():
    """Decode attention the FlashMLA table does not price was on a formula whose streaming rate came from two points
    measured at 128 heads a GPU (compute-bound): about half the table's rate at 0.2-0.9 GB. So an FP8 KV cache made
    DeepSeek-V3's decode slower than the BF16 one the table priced (6.58 against 5.80 ms at 64 x 4,096 on 8 x H200),
    Llama-3.1-8B's GQA decode read its KV at 0.50 of an H100's bandwidth, and the MI355X at one request was faster
    than the GB300 with the same bandwidth. It now streams as the measured kernel at 16 heads (memory-bound) reading
    the same bytes over the same batch (StepOps.stream_time)."""
    def attn(model, hw, lay, batch, **kw):
        m = StepCostModel(get_model(model), get_hardware(hw), ParallelLayout(**lay))
        return sum(o.time_s for o in m.step(batch).ops if o.name.endswith("attention_full")), m

    b = BatchShape.decode(64, 4096)
    bf16, v3 = attn("deepseek-v3", "h200", dict(tp=8, weight_dtype="fp8"), b)
    fp8, v3f = attn("deepseek-v3", "h200", dict(tp=8, weight_dtype="fp8", kv_dtype="fp8"), b)
    assert v3.mla_table is not None and v3f.mla_table is None and v3f.decode_stream is not None
    assert 0.5 * bf16 < fp8 < 0.85 * bf16      # 57% of the bytes
    one16, _ = attn("deepseek-v3", "h200", dict(tp=8, weight_dtype="fp8"), BatchShape.decode(1, 4096))
    one8, _ = attn("deepseek-v3", "h200", dict(tp=8, weight_dtype="fp8", kv_dtype="fp8"), BatchShape.decode(1, 4096))
    assert 0.8 * one16 < one8 <= one16       # one request: the kernel's latency, not its bytes
    # Llama-3.1-8B on one H100, 64 x 4,096: 1.07 GB of KV a layer at 0.7-0.9 of the bandwidth
    t, llama = attn("llama-3.1-8b", "h100", dict(tp=1), b)
    per_layer = t / llama.model.num_layers
    kv = 64 * 4096 * 2 * 8 * 128 * 2
    assert 0.7 < kv / per_layer / get_hardware("h100").hbm_bw < 0.9
    # the MI355X and the GB300 (8 TB/s each) within 40% of each other at one request and at 64
    for bb in (BatchShape.decode(1, 4096), b):
        mi, _ = attn("deepseek-v3", "mi355x", dict(tp=8, weight_dtype="fp8"), bb)
        gb, _ = attn("deepseek-v3", "gb300", dict(tp=8, weight_dtype="fp8"), bb)
        assert 1 / 1.4 < mi / gb < 1.4, (bb.num_requests, mi, gb)
