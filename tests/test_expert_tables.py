"""The routed experts priced from the measured grouped-GEMM tables (``costmodels.op_table.ExpertGemms``) and the layout
kernels around them (``StepOps._moe_glue``): the table's rows back exactly, between expert counts interpolated, on
another GPU transferred under its ceilings, used only where it measured the layout's shape, and checked against the
H200 executor's own measured MoE layer, which nothing was fitted to."""

import csv

import numpy as np
import pytest

from costmodels import op_table
from costmodels.calibration_source import profile_for
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.op_table import MASKED_MAX_ROWS, ExpertGemms
from costmodels.step_ops import StepOps

V3 = get_model("deepseek-v3")
WHOLE = [(4096, 7168), (7168, 2048)]   # DeepSeek-V3's gate_up and down, one expert whole


def _ops(hw="H200", **lay):
    h = get_hardware(hw)
    return StepOps(V3, h, ParallelLayout(**{"tp": 1, "weight_dtype": "fp8", **lay}), profile_for(h), expert_imbalance=1.0)


def _masked_rows():
    with open(op_table.DATA / "h200" / "grouped_gemm_masked_fp8.csv", newline="") as f:
        return [r for r in csv.DictReader(f)]


def test_the_measured_rows_come_back_exactly():
    """Every masked row within one tile (m <= 64), at every measured expert count, is the table's time: gate_up and
    down of the same (experts, rows) summed."""
    et = ExpertGemms.on(op_table.load("H200"), get_hardware("H200"), WHOLE, 0.856, 0.662)
    assert et is not None and et.same_gpu and et.contig_experts == []
    rows = {(int(r["groups"]), int(r["m"]), int(r["n"])): float(r["device_us"]) * 1e-6 for r in _masked_rows()}
    n = 0
    for (g, m, nn), t in rows.items():
        if nn != 4096 or m > MASKED_MAX_ROWS:
            continue
        want = t + rows[(g, m, 7168)]
        assert et.seconds(np.array([m]), np.array([g]))[0] == pytest.approx(want, rel=1e-9)
        n += 1
    assert n == 18   # 1-64 rows x 8, 32, 256 experts
    # zero rows or zero experts: no time
    assert et.seconds(np.array([0.0, 4.0]), np.array([8.0, 0.0])).tolist() == [0.0, 0.0]


def test_between_and_beyond_the_measured_expert_counts():
    """Per expert, interpolated in log-log between the measured counts (8, 32, 256) and held outside them; beyond the
    largest rows the roofline at the last point's efficiency carries it."""
    et = ExpertGemms.on(op_table.load("H200"), get_hardware("H200"), WHOLE, 0.856, 0.662)
    per = lambda g: et.seconds(np.array([16.0]), np.array([g]))[0] / g   # noqa: E731
    assert per(32) > per(100) > per(256)          # per-expert cost falls with more experts in one launch (tails)
    assert per(300) == pytest.approx(per(256)) and per(4) == pytest.approx(per(8))
    t512, t256 = et.seconds(np.array([512.0, 256.0]), np.array([256.0, 256.0]))
    assert 1.7 < t512 / t256 < 2.0               # past two tiles mostly compute: about twice the rows, twice the math


def test_routings_spread_over_row_tiles():
    """Above one tile's worth the experts' counts spread (Poisson at the mean) over 128-row tiles, each expert paying
    the table's time at its tiles' rows: at a mean of 128 rows, P(c > 128) = 0.48 of the experts run two tiles."""
    from scipy.stats import poisson
    et = ExpertGemms.on(op_table.load("H200"), get_hardware("H200"), WHOLE, 0.856, 0.662)
    rows = {(int(r["groups"]), int(r["m"]), int(r["n"])): float(r["device_us"]) * 1e-6 for r in _masked_rows()}
    per = lambda m: (rows[(256, m, 4096)] + rows[(256, m, 7168)]) / 256   # noqa: E731
    q = 1 - poisson.cdf(128, 128)
    assert 0.47 < q < 0.49
    got = et.seconds(np.array([128.0]), np.array([256.0]))[0] / 256
    assert got == pytest.approx((1 - q) * per(128) + q * per(256), rel=1e-6)
    # at 64 rows an expert the spread changes nothing: the table at the mean
    assert et.seconds(np.array([64.0]), np.array([256.0]))[0] / 256 == pytest.approx(per(64), rel=1e-9)


def test_the_h200s_contiguous_gemms_on_routings_own_rows():
    """Held out: issue 18's H200 run timed DeepGEMM's two contiguous grouped GEMMs on the rows real uniform routing
    needs, each expert's run padded to 128 (benchmarks/gpu/issue18_h200/moe_layout_63a44f9/README.md, 'GEMMs on
    tight rows'): 4.572 ms at 4,096 tokens, 7.474 at 8,192, 256 experts. The masked table with routing's spread over
    tiles prices them 9% and 15% short (the masked table at the mean, before the spread: 29% and 31%): the rest is the
    contiguous kernel's own cost over the masked one's at the same tiles (at 512 tokens, 16 rows an expert, one tile
    each: 3.580 ms against the masked table's 2.94, 18%), which the contiguous table measures."""
    et = ExpertGemms.on(op_table.load("H200"), get_hardware("H200"), WHOLE, 0.856, 0.662)
    t = et.seconds(np.array([128.0, 256.0]), np.array([256.0, 256.0]))
    rel = t / np.array([4.572e-3, 7.474e-3]) - 1
    assert (-0.17 < rel).all() and (rel < -0.05).all(), rel


def test_another_gpu_takes_the_table_under_its_own_ceilings():
    """On an H100 (same die, 3.35 TB/s) the H200's memory-bound rows slow to the H100's streaming ceiling; on a GPU
    without a table of its own the note says transferred."""
    h200, h100 = (ExpertGemms.on(op_table.load("H200"), get_hardware(g), WHOLE, 0.856, 0.662) for g in ("H200", "H100"))
    assert not h100.same_gpu
    m, g = np.array([1.0, 64.0]), np.array([256.0, 256.0])
    t100, t200 = h100.seconds(m, g), h200.seconds(m, g)
    byts = sum(g * op_table.gemm_bytes(m, n, k) for n, k in WHOLE)
    assert (t100 >= byts / (0.856 * 3.35e12) * (1 - 1e-9)).all() and (t100 > t200).all()
    note = _ops("B200", dp=8, ep=8).expert_note()   # a B200 has no grouped tables, nor a measured GPU of its kind
    assert "grouped FP8 GEMM tables of H200" in note and "transferred from H200" in note
    # an H800 is an H100's die and memory: the H100's tables as measured, the same times
    h800, h100 = _ops("H800", dp=8, ep=8), _ops("H100", dp=8, ep=8)
    assert h800.e_table.measured_on == "H100" and h800.e_table.same_gpu
    assert "tables of H100 at this layout's expert shapes (N x K 4096x7168, 7168x2048), measured on the H100, this " \
        "H800's die and memory" in h800.expert_note()
    tok = np.array([16.0, 128.0, 4096.0])
    for pre in (False, True):
        assert h800.experts(tok, 1, "routed_experts", pre).time[0] == pytest.approx(
            h100.experts(tok, 1, "routed_experts", pre).time[0], rel=1e-12)


def test_a_gpu_with_its_own_grouped_tables_takes_them():
    """The H100's grouped tables (costmodels/data/op_tables/h100: masked whole and TP-split, contiguous at 256 and 32
    experts) price its experts as measured, TP splits included; above 64 rows an expert the contiguous table answers
    at the counts it measured, with the spread in it."""
    et = _ops("H100", dp=8, ep=8).e_table
    assert et.measured_on == "H100" and et.same_gpu and et.contig_experts == [32, 256]
    tp8 = _ops("H100", tp=8)
    assert tp8.e_table.shapes == [(512, 7168), (7168, 256)] and tp8.e_table.contig_experts == [256]
    assert "tables of H100 at this layout's expert shapes (N x K 512x7168, 7168x256), measured" in tp8.expert_note()
    assert "Steps with a prefill (contiguous layout): the contiguous table (measured at 256 experts a GPU" in tp8.expert_note()
    rows = {}
    with open(op_table.DATA / "h100" / "grouped_gemm_contig_fp8.csv", newline="") as f:
        for r in csv.DictReader(f):
            rows.setdefault((int(r["groups"]), int(r["tokens"])), {})[(int(r["n"]), int(r["k"]))] = (
                float(r["m"]), float(r["device_us"]) * 1e-6)
    n = 0
    for (g, tok), by_nk in rows.items():
        if (4096, 7168) not in by_nk:
            continue
        pairs, t_gu = by_nk[(4096, 7168)]
        want = t_gu + by_nk[(7168, 2048)][1]
        got = et.seconds(np.array([pairs / g]), np.array([float(g)]), contiguous=True)[0]
        assert got == pytest.approx(want, rel=1e-9)
        n += 1
    assert n == 14   # 7 token counts x 256 and 32 experts


def test_the_spread_over_tiles_against_the_h100s_contiguous_table():
    """On one H100, the masked table with routing's spread over tiles against the contiguous table measured in the same
    run (uniform routing, 256 experts whole): 15-18% short where one tile holds each expert (the contiguous kernel
    streams the weights at 2.3 TB/s where the masked one reaches 2.7), 18% at 128 rows an expert, 29-31% at 256-512
    (the tiles' math): what the H200's prefill-sized layers, priced that way until its own contiguous table is
    measured, leave out."""
    tabs = op_table.load("H100")
    masked_only = op_table.OpTables(gpu="H100", provenance={}, gemm={}, masked_grouped=tabs.masked_grouped, mla_decode={})
    et = ExpertGemms.on(masked_only, get_hardware("H100"), WHOLE, 0.856, 0.662)
    full = ExpertGemms.on(tabs, get_hardware("H100"), WHOLE, 0.856, 0.662)
    lam = np.array([16.0, 64.0, 128.0, 256.0, 512.0])
    g = np.full(lam.size, 256.0)
    rel = et.seconds(lam, g, contiguous=True) / full.seconds(lam, g, contiguous=True) - 1
    assert (rel > -0.33).all() and (rel < -0.14).all(), rel


def test_the_tables_price_only_what_they_measured():
    """FP8 experts at a measured shape take the table (a TP split no H200 table holds: the H100's, moved here); FP4/BF16
    experts and a measured profile's fit keep the bandwidth ramp."""
    assert _ops(dp=8, ep=8).e_table is not None and _ops().e_table is not None
    assert _ops(tp=8).e_table.measured_on == "H100"                        # 512x7168 / 7168x256: not in the H200 table
    assert _ops(dp=8, ep=8, expert_dtype="bf16", weight_dtype="bf16").e_table is None
    h = get_hardware("B300")
    assert StepOps(V3, h, ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8", expert_dtype="fp4"), profile_for(h)).e_table is None
    fit = StepOps(V3, get_hardware("H200"), ParallelLayout(tp=1, weight_dtype="fp8"), profile_for(get_hardware("H200")),
                  profile_fit=True)
    assert fit.e_table is None
    assert fit.experts(np.array([64.0]), 1, "routed_experts").names[1:] == []   # nor the layout rows
    note = _ops(dp=8, ep=8).expert_note()
    assert "grouped FP8 GEMM tables of H200" in note and "N x K 4096x7168, 7168x2048), measured" in note
    assert "Decode steps (masked layout): the masked table at the mean rows an expert up to 64, above that each " \
        "expert's count Poisson at the mean over 128-row tiles. Steps with a prefill (contiguous layout): the masked " \
        "table as in decode (the contiguous kernel's own cost" in note


def test_the_layout_kernels_move_their_bytes_once_a_layer():
    """permute: each token's BF16 row read once, each pair written in FP8 with its 1x128 scales; SiLU-and-mul: each
    pair's gate/up read, the product written in FP8; combine: each pair's BF16 output read, each token's row written.
    At the streaming rate plus one launch each."""
    ops = _ops()
    tok = np.array([4096.0])
    fam = ops.experts(tok, 2, "mtp_routed_experts")
    assert fam.names[1:] == ["mtp_moe_permute", "mtp_moe_silu_mul", "mtp_moe_combine"]
    pairs, h, i = 4096 * 8, 7168, 2048
    want = [4096 * h * 2 + pairs * h * (1 + 4 / 128), pairs * i * (4 + 1 + 4 / 128), pairs * h * 2 + 4096 * h * 2]
    assert fam.byts[1:, 0] == pytest.approx([2 * b for b in want], rel=1e-12)
    assert fam.time[1:, 0] == pytest.approx([2 * (b / ops._stream + ops._lo) for b in want], rel=1e-12)
    from costmodels.ops import CATEGORIES
    assert [CATEGORIES[c] for c in fam.cats] == ["expert_gemm", "other", "other", "other"]


# The H200 executor's MoE layer (ops.moe_experts: the two grouped GEMMs and their layout kernels, Triton fused MoE below
# 2,048 tokens), device time inside a CUDA graph, 256 experts top-8 on one GPU, uniform routing: run 44's calibration
# (benchmarks/gpu/issue16_h200/run44_async_deepgemm_summarize_agentic_907dba7/reports.tgz, its moe_experts points).
RUN44_MOE_MS = {64: 2.46427, 128: 2.87858, 256: 3.00959, 384: 3.11593, 512: 3.30371, 1024: 3.62305, 2048: 4.49109,
                4096: 5.6017, 8192: 8.00364}


def test_the_h200_executors_measured_moe_layer_is_met_where_one_tile_holds_each_expert():
    """Held out: the masked table and the layout kernels against the executor's whole layer. From 64 to 384 tokens
    (2-12 rows an expert) within 5%. From 512 tokens on the executor pays more than the masked table at the mean: at
    512-1,024 tokens (16-32 rows an expert) its Triton MoE is 10-20% over; from 2,048 its DeepGEMM path runs the
    contiguous layout on the no-sync upper bound of rows (65,280 at 4,096 tokens for 32,768 pairs: issue 18 timed those
    GEMMs 1.0 ms over the same GEMMs on routing's own rows at 4,096), 15-45% over. The contiguous table (``op_tables
    --tables contig``: real routing's counts) is the source there."""
    ops = _ops()
    tok = np.array(sorted(RUN44_MOE_MS), float)
    t = ops.experts(tok, 1, "routed_experts").time.sum(axis=0)
    rel = dict(zip(tok.tolist(), np.round(np.array([RUN44_MOE_MS[int(x)] for x in tok]) * 1e-3 / t - 1, 3).tolist()))
    near = {k: v for k, v in rel.items() if k <= 384}
    assert all(abs(v) <= 0.05 for v in near.values()), rel
    assert all(0.05 < v < 0.65 for k, v in rel.items() if k >= 512), rel


def test_the_layout_follows_the_step_not_the_batch_size():
    """Decode steps run the masked layout at any batch (as low-latency dispatch delivers it), steps with a prefill the
    contiguous one: no jump between 128 and 129 decodes a GPU (the executor's own switch is by tokens, and its measured
    MoE layer prices it), and on the H100 a prefill of the same tokens costs the contiguous kernel's extra."""
    ops = _ops("H100", tp=8)
    dec = ops.experts(np.array([128.0, 129.0]), 1, "routed_experts").time[0]
    assert dec[1] / dec[0] - 1 < 0.01
    pre = ops.experts(np.array([128.0, 129.0]), 1, "routed_experts", True).time[0]
    assert (pre > 1.1 * dec).all()
    from costmodels.step import StepCostModel
    sm = StepCostModel(V3, get_hardware("H100"), ParallelLayout(tp=8, weight_dtype="fp8"), profile_for(get_hardware("H100")))
    d = sm.chunked_step_time(np.full(129, 512), 0, [], [])
    d0 = sm.chunked_step_time(np.full(128, 512), 0, [], [])
    assert 1.0 < d / d0 < 1.02


def test_a_shard_no_nearer_table_holds_comes_from_the_nearest_measured_gpu():
    """DeepSeek-V3's TP8 expert shards (gate_up 512 x 7168, down 7168 x 256) were measured on the H100 only. Every other
    GPU took the bandwidth ramp for them: the H200 priced them 1.8x faster than the H100's measured kernels (bandwidth
    ratio 1.43x), and a user GPU that is an H100 with 3.30 TB/s came out 13% faster than the H100 itself. Now a shape
    no nearer table holds comes from the nearest measured GPU's table (``op_table.nearest``), moved by ``transferred``:
    the near-twin prices within 2% of the H100, slower, and the H200 between the two rules' ends."""
    h100 = get_hardware("H100")
    twin = h100.model_copy(update={"name": "H100-3.30", "hbm_tbps": 3.30, "measured": None})
    assert op_table.nearest(twin)[0] == "H100" and op_table.nearest(get_hardware("H200"))[0] == "H200"
    tok = np.array([64.0, 4096.0])
    t = {}
    for name, hw in (("H100", h100), ("twin", twin), ("H200", get_hardware("H200"))):
        ops = StepOps(V3, hw, ParallelLayout(tp=8, weight_dtype="fp8"), profile_for(hw), expert_imbalance=1.0)
        assert ops.e_table is not None and ops.e_table.measured_on == "H100", name
        t[name] = ops._expert_roofline(tok)[0]
    assert (t["twin"] >= t["H100"]).all() and (t["twin"] <= 1.02 * t["H100"]).all()
    ratio = t["H100"] / t["H200"]
    assert (ratio > 1.15).all() and (ratio < 1.45).all()   # the bandwidth ratio at most: the kernels' latency stays
