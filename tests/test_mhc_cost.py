"""DeepSeek-V4-class hyper-connections (mHC) in the step's cost (``StepOps._mhc_rows``, ``op_table.MhcKernels``): the
three kernels around each block counted per block and layer, priced by their bytes plus a launch where no table
holds the model's width and Sinkhorn iterations, from a measured table where one does (its rows back exactly, another
GPU under its own ceilings), and nothing moves for a model without them."""

import numpy as np
import pytest

from costmodels import op_table
from costmodels.calibration_source import profile_for
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.op_table import MHC_OPS, MhcKernels, OpTables, Series, mhc_bytes
from costmodels.step_ops import StepOps

V4 = get_model("deepseek-v4-flash")


def _ops(model=V4, hw="H200", **lay):
    h = get_hardware(hw)
    return StepOps(model, h, ParallelLayout(**{"tp": 8, "weight_dtype": "fp8", **lay}), profile_for(h))


def _rows(terms):
    return {n: (terms.count[i], terms.byts[i], terms.time[i]) for i, n in enumerate(terms.names)}


def test_every_block_runs_the_three_kernels_and_the_head_collapses_once():
    ops = _ops()
    tok = np.array([64.0, 0.0])
    rows = _rows(ops.elementwise(tok, V4.num_layers, 3))
    for op in MHC_OPS:
        count, byts, t = rows[op]
        assert count.tolist() == [2 * V4.num_layers, 0]
        assert byts[0] == pytest.approx(2 * V4.num_layers * mhc_bytes(op, 64.0, 4, V4.hidden_size))
        assert t[0] > 0 and t[1] == 0
    # the block's norms read the one stream it takes (not the four), and the residual add is the post kernel's
    assert rows["rmsnorm"][1][0] == pytest.approx(2 * V4.num_layers * 2 * 64 * V4.hidden_size * 2.0)
    assert "rope+act_quant" in rows and "rope+act_quant+residual" not in rows
    emb = _rows(ops.embedding(np.array([64.0])))
    assert emb["mhc_head"][0].tolist() == [1] and emb["embedding"][1][0] == pytest.approx(64 * V4.hidden_size * 2.0 * 5)


def test_the_streams_traffic_sets_large_steps_and_a_launch_each_small_ones():
    """Without a table: bytes at the streaming rate plus one launch each; the post kernel reads and writes all four
    streams (twice the pre kernel's traffic, near twice its time at prefill sizes)."""
    ops = _ops()
    if ops.mhc_k is not None:
        pytest.skip("a measured mHC table prices this width")
    rows = _rows(ops.elementwise(np.array([1.0, 8192.0]), 1, 1))
    lo = ops.cal.launch_overhead_s
    assert rows["mhc_pre"][2][0] / 2 == pytest.approx(lo, rel=0.05)          # one token: the launch
    big = {op: rows[op][2][1] / 2 for op in MHC_OPS}
    assert big["mhc_post"] / big["mhc_pre"] == pytest.approx(
        mhc_bytes("mhc_post", 8192, 4, V4.hidden_size) / mhc_bytes("mhc_pre", 8192, 4, V4.hidden_size), rel=0.05)
    assert "no table holds this width" in ops.mhc_note()


def test_a_model_without_hyper_connections_has_none_of_it():
    v3 = get_model("deepseek-v3")
    ops = _ops(v3)
    rows = _rows(ops.elementwise(np.array([64.0]), v3.num_layers, 58))
    assert not any(op in rows for op in MHC_OPS) and "rope+act_quant+residual" in rows
    assert ops.mhc_k is None and ops.mhc_note() is None
    assert "mhc_head" not in _rows(ops.embedding(np.array([64.0])))


def _table(gpu="H200", h=4096, iters=20):
    xs = np.array([1.0, 64.0, 4096.0])
    ser = {(op, 4, h, iters if op == "mhc_pre" else 0):
           Series(xs, np.array([6e-6, 8e-6, 60e-6]) * (1 + i), lambda t, op=op: mhc_bytes(op, t, 4, h), op)
           for i, op in enumerate(MHC_OPS)}
    return OpTables(gpu=gpu, provenance={}, gemm={}, masked_grouped={}, mla_decode={}, mhc=ser)


def test_a_measured_table_comes_back_exactly_and_transfers_under_the_target_ceilings():
    h200 = get_hardware("H200")
    k = MhcKernels.on(_table(), h200, 4, 4096, 20, 0.856, 0.749)
    assert k is not None and k.same_gpu
    assert k.seconds("mhc_post", np.array([64.0, 0.0])).tolist() == pytest.approx([24e-6, 0.0])
    assert "mhc_pre" not in MhcKernels.on(_table(), h200, 4, 4096, 10, 0.856, 0.749).series   # other iterations
    # another width: the measured kernel at the token count that moves the same bytes (25% more a token at 5120)
    kw = MhcKernels.on(_table(), h200, 4, 5120, 20, 0.856, 0.749)
    assert (kw.n_m, kw.h_m) == (4, 4096) and not kw.same_shape
    assert kw.seconds("mhc_post", np.array([51.2]))[0] == pytest.approx(24e-6)
    assert kw.equal_tokens("mhc_pre", np.array([100.0]))[0] == pytest.approx(
        100 * mhc_bytes("mhc_pre", 1.0, 4, 5120) / mhc_bytes("mhc_pre", 1.0, 4, 4096))
    assert MhcKernels.on(OpTables(gpu="H200", provenance={}, gemm={}, masked_grouped={}, mla_decode={}), h200, 4, 4096,
                         20, 0.856, 0.749) is None   # no mHC stage at all
    b200 = get_hardware("B200")
    kb = MhcKernels.on(_table(), b200, 4, 4096, 20, 0.856, 0.749)
    t = np.array([1.0, 64.0, 4096.0, 65536.0])
    for op in MHC_OPS:
        got = kb.seconds(op, t)
        assert (got >= mhc_bytes(op, t, 4, 4096) / (0.856 * b200.hbm_bw) - 1e-15).all()
        assert np.all(np.diff(got) > 0)
    # one token moves a few kilobytes: the post kernel's launch and dependent steps stay as measured (no tensor cores),
    # the projection's GEMM tail follows the BF16 peak ratio as the GEMM tables' does
    assert kb.seconds("mhc_post", t[:1])[0] == pytest.approx(k.seconds("mhc_post", t[:1])[0], rel=1e-3)
    t1, w = k.seconds("mhc_prenorm_gemm", t[:1])[0], mhc_bytes("mhc_prenorm_gemm", 1.0, 4, 4096)
    t_bw = w / (0.856 * h200.hbm_bw)
    assert kb.seconds("mhc_prenorm_gemm", t[:1])[0] == pytest.approx(
        (t1 - t_bw) * h200.tflops("bf16") / b200.tflops("bf16") + t_bw * h200.hbm_bw / b200.hbm_bw)
    # from an H100 to an H200 (same BF16 peak, 43% more bandwidth): the share of the time the H100's streaming ceiling
    # accounts for moves by the bandwidth ratio, the rest stays
    h100 = get_hardware("H100")
    kh = MhcKernels.on(_table("H100"), h200, 4, 4096, 20, 0.856, 0.749)
    t_m = 180e-6                                                   # the synthetic post kernel at 4,096 tokens
    t_bw = mhc_bytes("mhc_post", 4096.0, 4, 4096) / (0.856 * h100.hbm_bw)
    assert t_bw < t_m
    assert kh.seconds("mhc_post", np.array([4096.0]))[0] == pytest.approx((t_m - t_bw) + t_bw * h100.hbm_bw / h200.hbm_bw)
    assert kh.seconds("mhc_post", np.array([1.0]))[0] == pytest.approx(18e-6, rel=1e-3)   # a launch: as measured


def test_the_committed_tables_price_v4_where_they_measured_it():
    """Wherever a committed op-table folder holds the mHC stage at V4-Flash's width, its own GPU reads it as measured
    and the note names the table."""
    for gpu in op_table.measured_gpus():
        tabs = op_table.load(gpu)
        if ("mhc_pre", 4, V4.hidden_size, V4.hc_sinkhorn_iters) not in tabs.mhc:
            continue
        ops = _ops(hw=gpu)
        assert ops.mhc_k is not None and ops.mhc_k.same_gpu
        assert f"from the mHC table of {tabs.gpu}, measured here" in ops.mhc_note()
        ser = tabs.mhc[("mhc_post", 4, V4.hidden_size, 0)]
        assert ops.mhc_k.seconds("mhc_post", ser.xs).tolist() == pytest.approx(ser.ts.tolist())


def test_the_h100_table_prices_the_sinkhorn_chain_it_measured():
    """The committed H100 table (run mhc_61809e1): the projection and post kernels as measured; its first pre kernel
    (31% of the HBM peak at 16,384 tokens) only for the chain, 0.15 us an iteration at one token; the pre kernel then
    its bytes at the streaming rate plus a launch plus the iterations' chain, so more iterations cost more."""
    tabs = op_table.load("H100")
    if ("mhc_post", 4, V4.hidden_size, 0) not in tabs.mhc:
        pytest.skip("no H100 mHC table")
    ops = _ops(hw="H100")
    k = ops.mhc_k
    assert "mhc_pre" not in k.series and 0.12e-6 < k.chain_s < 0.2e-6
    tok = np.array([1.0, 8192.0])
    pre = _rows(ops.elementwise(tok, 1, 1))["mhc_pre"][2] / 2
    want = mhc_bytes("mhc_pre", tok, 4, V4.hidden_size) / ops._stream + ops._lo + 20 * k.chain_s
    assert pre.tolist() == pytest.approx(want.tolist())
    assert "Sinkhorn chain measured on the H100" in ops.mhc_note()
    more = _ops(V4.model_copy(update={"hc_sinkhorn_iters": 40}), hw="H100")
    assert _rows(more.elementwise(tok, 1, 1))["mhc_pre"][2][0] / 2 == pytest.approx(pre[0] + 20 * k.chain_s)


def test_the_rewritten_pre_kernel_holds_out_the_chain_and_the_decode_price():
    """The rewritten Triton pre kernel (run mhc_pre_v2_0107b33, rows ``mhc_pre_v2``, priced nowhere) is a second
    measurement: its Sinkhorn chain per iteration at one token within 15% of the first kernel's (the chain the cost
    model charges), and at 1-16 tokens and 20 iterations (V4's decode) the cost model's pre kernel (bytes, a launch,
    the chain) within 15% of its measured time, for both widths. From 64 tokens up that kernel is slower than the
    price (it runs the chain once per 512-column program; at 16,384 tokens 16% of the HBM peak): the price is a fused
    engine kernel's, at the streaming rate the post kernel reaches on the same traffic."""
    tabs = op_table.load("H100")
    v1, v2 = op_table.MHC_CHAIN_OP, op_table.MHC_PRE_V2_OP
    if (v2, 4, V4.hidden_size, 20) not in tabs.mhc:
        pytest.skip("no rewritten pre kernel in the H100 table")
    hw = get_hardware("H100")
    for model in (V4, get_model("deepseek-v4.1-flash")):
        h = model.hidden_size
        per_it = {op: float(tabs.mhc[(op, 4, h, 20)].ts[0] - tabs.mhc[(op, 4, h, 1)].ts[0]) / 19 for op in (v1, v2)}
        assert per_it[v2] == pytest.approx(per_it[v1], rel=0.15), (h, per_it)
        ops = _ops(model, hw="H100")
        assert ops.mhc_k.chain_s == pytest.approx(per_it[v1])
        meas = tabs.mhc[(v2, 4, h, 20)]
        tok = np.array([x for x in meas.xs if x <= 16.0])
        assert len(tok) == 3
        priced = _rows(ops.elementwise(np.append(tok, 0.0), 1, 1))["mhc_pre"][2][:-1] / 2
        ratio = priced / meas.time(tok).seconds
        assert np.all(np.abs(ratio - 1.0) < 0.15), (h, ratio)
        big = np.array([16384.0])
        assert _rows(ops.elementwise(big, 1, 1))["mhc_pre"][2][0] / 2 < 0.5 * meas.time(big).seconds[0]
    assert hw.name == tabs.gpu


def test_sinkhorn_iterations_between_and_beyond_the_measured_counts():
    """The pre kernel measured at 1 and 20 iterations: other counts linear in the iterations (more never cheaper), the
    other two kernels whatever the count."""
    tabs = _table()
    xs = np.array([1.0, 64.0, 4096.0])
    tabs.mhc[("mhc_pre", 4, 4096, 1)] = Series(xs, np.array([4e-6, 6e-6, 50e-6]), lambda t: mhc_bytes("mhc_pre", t, 4, 4096),
                                              "pre at 1")
    h200 = get_hardware("H200")
    at = {it: MhcKernels.on(tabs, h200, 4, 4096, it, 0.856, 0.749).seconds("mhc_pre", xs) for it in (1, 5, 20, 100)}
    t1, t20 = np.array([4e-6, 6e-6, 50e-6]), np.array([12e-6, 16e-6, 120e-6])
    assert at[1].tolist() == pytest.approx(t1.tolist()) and at[20].tolist() == pytest.approx(t20.tolist())
    assert at[5].tolist() == pytest.approx((t1 + 4 * (t20 - t1) / 19).tolist())
    assert at[100].tolist() == pytest.approx((t1 + 99 * (t20 - t1) / 19).tolist())
    post = {it: MhcKernels.on(tabs, h200, 4, 4096, it, 0.856, 0.749).seconds("mhc_post", xs).tolist() for it in (1, 100)}
    assert post[1] == post[100]


def test_a_pipeline_send_carries_every_stream():
    tok = np.array([64.0])
    v4 = _rows(_ops(tp=4, pp=2).pp_sends(tok))["pp_send"][1][0]
    assert v4 == pytest.approx(64 * V4.hidden_size * 2.0 * V4.hc_mult)


def test_mtp_rows_are_named_apart():
    ops = _ops()
    names = [n for t in ops.mtp_terms(np.array([8.0]), 1) for n in t.names]
    assert "mtp_mhc_post" in names and "mtp_rmsnorm" in names and "mhc_post" not in names


def _v4(**over):
    return V4.model_copy(update=over)


def test_more_streams_and_more_iterations_never_cost_less_on_any_gpu():
    """With the committed tables: the step's mHC time grows with the streams (a shape no table holds is the measured
    kernel at equal bytes, with the Sinkhorn chain) and with the iterations at every stream count, on every catalog GPU;
    no kernel's launch-bound time falls under the measured post kernel's (1.6 us on the H100)."""
    from costmodels.hardware import list_hardware

    if not any(MhcKernels.shapes(op_table.load(g)) for g in op_table.measured_gpus()):
        pytest.skip("no committed mHC table")
    tok = np.array([1.0, 16.0, 64.0, 256.0, 1024.0, 8192.0])

    def mhc(ops):
        rows = _rows(ops.elementwise(tok, 1, 1))
        return sum(rows[op][2] for op in MHC_OPS)

    for hw in [h.name for h in list_hardware()]:
        by_n = [mhc(_ops(_v4(hc_mult=n), hw=hw)) for n in (2, 3, 4, 6, 8)]
        # within 2%: at one token the projection of 8 streams is the table's at ~200 tokens, where the measured curve
        # is flatter than its bytes, so the bandwidth share a transfer moves is larger (H200: -1.1% against 6 streams)
        assert all((b >= 0.98 * a).all() for a, b in zip(by_n, by_n[1:])), (hw, by_n)
        assert all((b[-1] > a[-1]) for a, b in zip(by_n, by_n[1:])), (hw, by_n)   # prefill: the streams' traffic
        for n in (2, 4, 8):
            by_it = [mhc(_ops(_v4(hc_mult=n, hc_sinkhorn_iters=i), hw=hw)) for i in (1, 20, 1000)]
            assert all((b > a).all() for a, b in zip(by_it, by_it[1:])), (hw, n, by_it)
        ops = _ops(hw=hw)
        assert ops.mhc_k is not None
        one = _rows(ops.elementwise(np.array([1.0]), 1, 1))
        for op in MHC_OPS:
            assert one[op][2][0] / 2 > 1.5e-6, (hw, op)


def test_the_projection_takes_the_gpus_tf32_rate():
    """A GPU's ``tf32_tflops`` (the MI355X: CDNA 4 lists none, so its FP32 matrix rate, 157.3 TF) bounds the mixing
    projection; without one, half the BF16 peak (NVIDIA's Hopper and Blackwell)."""
    mi, gb = get_hardware("MI355X"), get_hardware("GB300")
    assert mi.tf32_rate == pytest.approx(157.3e12) and gb.tf32_rate == pytest.approx(0.5 * gb.bf16_tflops * 1e12)
    tok = np.array([65536.0])
    for hw in (mi, gb):
        ops = _ops(hw=hw.name)
        t = ops.mhc_k.seconds("mhc_prenorm_gemm", tok)[0]
        math_s = op_table.mhc_flops("mhc_prenorm_gemm", tok, 4, V4.hidden_size)[0] / (ops.mhc_k.compute_eff * hw.tf32_rate)
        assert t >= math_s * (1 - 1e-9)
    # the same 8 TB/s: the GB300 streams the projection's 2.3 GB at 65,536 tokens, the MI355X is bound by its math
    gb_t, mi_t = (_ops(hw=g).mhc_k.seconds("mhc_prenorm_gemm", tok)[0] for g in ("GB300", "MI355X"))
    assert mi_t > 1.2 * gb_t
    assert mi_t == pytest.approx(op_table.mhc_flops("mhc_prenorm_gemm", tok, 4, V4.hidden_size)[0]
                                 / (_ops(hw="MI355X").mhc_k.compute_eff * mi.tf32_rate))
    assert "a TF32/FP32-input GEMM, at 157 TFLOP/s" in _ops(hw="MI355X").mhc_note()
