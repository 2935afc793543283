"""Replay chunks priced from measured op tables (costmodels/replay_table.py) on synthetic tables, on the CPU.

Synthetic tables built from the analytic step model's own op times give the analytic chunk cost back; lookups
interpolate and flag extrapolated / scaled answers; the eager queue is host- or device-bound as worked by hand;
the calls' rows and first keys are the executor's (executor/swa_replay.py, executor/swa.py).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.model_spec import ModelSpec
from costmodels.params import attention_linears, ffn_linears
from costmodels.replay import LayerReplay, ReplayPolicy, chunk_cost, prefill_seconds, prompt_chunks
from costmodels.replay_table import (FORMAT, Op, TableError, attention_calls, eager_stream, first_key, forward_calls,
                                     from_dict, load, table_chunk_cost, table_prefill_cost)
from costmodels.step import StepCostModel
from costmodels.step_ops import SAMPLED, TOKENS

SPEC = ModelSpec(name="replay-bench-llama8b-4l", family="llama", num_layers=4, hidden_size=4096, vocab_size=32000,
                 num_attention_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336, attention="gqa",
                 layer_kinds=["sliding", "sliding", "sliding", "full"], sliding_window=128, max_context=32768)
POL = {"recompute": ReplayPolicy(default=LayerReplay(mode="recompute")), "persist": ReplayPolicy(),
       "replay:32": ReplayPolicy(default=LayerReplay(mode="replay", tokens=32)),
       "replay:384": ReplayPolicy(default=LayerReplay(mode="replay", tokens=384))}
ANALYTIC_RECIPE = {"start": [["embed", "step_rows"]],
                   "layer": [["gemm:q_proj", "rows"], ["gemm:kv_proj", "rows"], ["gemm:o_proj", "rows"],
                             ["gemm:dense_ffn", "rows"], ["rmsnorm", "rows"], ["rmsnorm", "rows"],
                             ["rope_res", "rows"], ["rope_res", "rows"], ["attention", "calls"]],
                   "end": [["gemm:lm_head", "one"], ["sampling", "one"]]}


@pytest.fixture(scope="module")
def ops():
    return StepCostModel(SPEC, get_hardware("h200"), ParallelLayout(tp=1, weight_dtype="bf16", kv_dtype="bf16"))


def analytic_doc(ops, cases) -> dict:
    """A tables file whose every point is the analytic step model's time of that op at that size (one layer's
    share), at exactly the sizes the ``cases`` ((policy, n, c)) call for: the table path must then give the analytic
    chunk cost back."""
    lins = {lin.name: lin for lin in attention_linears(SPEC, "sliding") + ffn_linears(SPEC, False)}
    gemms = {name: [lin.n, lin.k] for name, lin in lins.items()} | {"lm_head": [SPEC.vocab_size, SPEC.hidden_size]}
    points = []
    calls = [c for pol, n, ctx in cases for c in forward_calls(ANALYTIC_RECIPE, 1 << 30, SPEC, POL[pol].resolve(SPEC), n, ctx)]
    for call in calls:
        x = np.array([call.size])
        if call.unit.startswith("gemm:"):
            name = call.unit[5:]
            src = SAMPLED if name == "lm_head" else TOKENS
            fam = ops.gemms(src, x)
            i = fam.names.index(name)
            t = fam.time[i, 0] / fam.count[i, 0]
            points.append({"unit": "gemm", "m": call.size, "n": gemms[name][0], "k": gemms[name][1], "device_s": t})
        elif call.unit in ("rmsnorm", "rope_res"):
            fam = ops.elementwise(x, 1, 0)
            i = 0 if call.unit == "rmsnorm" else 1
            points.append({"unit": call.unit, "size": call.size, "device_s": fam.time[i, 0] / fam.count[i, 0]})
        elif call.unit == "embed":
            points.append({"unit": "embed", "size": call.size, "device_s": float(ops.embedding(x).total()[0])})
        elif call.unit == "sampling":
            points.append({"unit": "sampling", "size": 1, "device_s": float(ops.sampling(x, 0).total()[0])})
    # attention: the full rectangle of every (rows, keys - rows) the calls name, per kind (as the GPU side measures)
    for kind, layer in (("window", 0), ("causal", 3)):
        mine = [c for c in calls if c.unit == "attention" and c.kind == kind]
        geo = ops.att_groups[ops.att_layer[layer]][0]
        for r in {c.size for c in mine}:
            for b in {c.keys - c.size for c in mine}:
                t = ops._attn_one(geo, np.array([r]), np.array([b]), np.zeros(1, bool), 1.0)[2]
                points.append({"unit": f"attention:{kind}", "rows": r, "keys": r + b, "device_s": t})
    return {"format": FORMAT, "roofline_hw": "h200", "model": {"name": SPEC.name, "layers": SPEC.kinds()},
            "recipe": ANALYTIC_RECIPE, "gemms": gemms, "row_tile": 1 << 30, "points": points}


CASES = [("persist", 512, 4096), ("recompute", 512, 4096), ("persist", 2048, 8192), ("recompute", 2048, 8192),
         ("persist", 2048, 0)]


@pytest.mark.parametrize("pol,n,c", CASES)
def test_tables_built_from_the_analytic_model_give_the_analytic_chunk(ops, pol, n, c):
    tab = from_dict(analytic_doc(ops, CASES))
    res = POL[pol].resolve(SPEC)
    got = table_chunk_cost(tab, SPEC, res, n, c)
    want = chunk_cost(ops, res, n, c).seconds
    assert got.seconds == pytest.approx(want, rel=1e-9)
    assert got.device_s == pytest.approx(want, rel=1e-9) and got.host_s == 0   # no host times: the sum of devices
    assert got.sources == {"measured": got.ops}     # every lookup on a grid point (the layers' glue spread into them)
    assert chunk_cost(ops, res, n, c, tables=tab).seconds == pytest.approx(want, rel=1e-9)


def test_chunked_prompt_from_tables_is_one_stream_of_its_chunks(ops):
    parts = prompt_chunks(8192, 2048)
    cases = [(p, n, c) for p in ("persist", "recompute") for n, c in parts]
    tab = from_dict(analytic_doc(ops, cases))
    for pol in ("persist", "recompute"):
        res = POL[pol].resolve(SPEC)
        want = prefill_seconds(ops, res, 8192, 2048)
        assert prefill_seconds(ops, res, 8192, 2048, tables=tab) == pytest.approx(want, rel=1e-9)
        assert table_prefill_cost(tab, SPEC, res, parts).seconds == pytest.approx(want, rel=1e-9)


def test_without_tables_nothing_changes(ops):
    res = POL["replay:32"].resolve(SPEC)
    assert chunk_cost(ops, res, 512, 4096) == chunk_cost(ops, res, 512, 4096, tables=None)


# ---------------------------------------------------------------------------------------------- lookups and sources
def small_doc(**over) -> dict:
    """Hand-made tables: one GEMM family, one row unit, window and causal attention 2 x 2 grids."""
    pts = [{"unit": "gemm", "m": m, "n": 64, "k": 32, "device_s": t, "origin": o}
           for m, t, o in ((1, 1e-5, "grid"), (100, 1e-4, "grid"), (50, 3e-5, "workload"))]
    pts += [{"unit": "norm", "size": s, "device_s": t} for s, t in ((1, 2e-6), (1000, 2e-4))]
    for kind in ("window", "causal"):
        pts += [{"unit": f"attention:{kind}", "rows": r, "keys": r + b, "device_s": 1e-6 * r * (r + b)}
                for r in (4, 16) for b in (0, 8)]
    doc = {"format": FORMAT, "roofline_hw": "h200", "model": {"name": "toy"},
           "recipe": {"layer": [["norm", "rows"], ["gemm:w", "rows"], ["attention", "calls"]]},
           "gemms": {"w": [64, 32]}, "row_tile": 8, "points": pts, "host": {"norm": 1e-6}}
    return doc | over


def test_lookups_interpolate_log_log_and_flag_what_was_not_measured():
    tab = from_dict(small_doc())
    assert tab.device("gemm:w", 100).seconds[0] == pytest.approx(1e-4)
    assert tab.device("gemm:w", 50).source[0] == "measured"
    # between 1 and 50: a power law through the two points
    want = 1e-5 * (3e-5 / 1e-5) ** (math.log(10) / math.log(50))
    assert tab.device("gemm:w", 10).seconds[0] == pytest.approx(want)
    big = tab.device("gemm:w", 1000)
    assert big.source[0] == "extrapolated" and big.seconds[0] > 1e-4
    assert tab.device("norm", 10).seconds[0] == pytest.approx(2e-6 * 10 ** (math.log(100) / math.log(1000)))
    assert tab.device("norm", 5000).source[0] == "extrapolated"
    # an unmeasured GEMM shape: the nearest family, scaled by the roofline, flagged
    tab.gemm_shapes["gemm:other"] = (128, 32)
    assert tab.device("gemm:other", 100).source[0] == "scaled"
    # attention by (rows, keys): on the grid exactly; keys beyond it extrapolated
    assert tab.device("attention", 16, 24, "window").seconds[0] == pytest.approx(1e-6 * 16 * 24)
    assert tab.device("attention", 16, 40, "causal").source[0] == "extrapolated"


def test_generic_points_only_and_missing_pieces():
    generic = from_dict(small_doc(), ("grid",))
    assert list(generic.gemm.families[(64, 32)][0]) == [1, 100]
    tab = from_dict(small_doc())
    with pytest.raises(TableError, match="'nope'"):
        tab.device("nope", 3)
    with pytest.raises(TableError, match="format"):
        from_dict(small_doc(format="other"))
    # an attention cell that failed: the largest full rectangle is kept
    doc = small_doc()
    doc["points"] = [p for p in doc["points"] if not (p["unit"] == "attention:window" and p["rows"] == 16 and p["keys"] == 16)]
    win = from_dict(doc).attention["window"]
    assert win.seconds.shape in ((1, 2), (2, 1))


def test_load_reads_the_file_and_names_a_bad_one(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(small_doc()))
    assert load(p).gemm_shapes == {"gemm:w": (64, 32)}
    with pytest.raises(TableError, match="cannot read"):
        load(tmp_path / "missing.json")


def test_the_tables_refuse_another_model():
    tab = from_dict(small_doc(model={"name": "toy", "hidden": 64}))
    with pytest.raises(TableError, match="hidden 64 vs 4096"):
        table_chunk_cost(tab, SPEC, ReplayPolicy().resolve(SPEC), 8, 0)


# ---------------------------------------------------------------------------------------------- the eager queue
def test_eager_stream_host_bound_and_device_bound_by_hand():
    small = [Op("k", 1, 0, 2e-6, 5e-6, "measured")] * 4          # kernels shorter than their launches: host-bound
    assert eager_stream(small) == pytest.approx(4 * 5e-6 + 2e-6)
    big = [Op("g", 1, 0, 1e-3, 5e-6, "measured")] + [Op("k", 1, 0, 2e-6, 5e-6, "measured")] * 10
    assert eager_stream(big) == pytest.approx(5e-6 + 1e-3 + 10 * 2e-6)   # the host ran ahead during the GEMM
    assert eager_stream([Op("g", 1, 0, 1e-3, 0, "measured")] * 3) == pytest.approx(3e-3)


def test_an_eager_call_adds_its_kernels_launch_gaps_on_the_device():
    doc = small_doc(kernels={"norm": 5, "gemm:w": 1, "attention:window": 3}, eager_gap_s=1e-6)
    plain, gapped = from_dict(small_doc()), from_dict(doc)
    spec = ModelSpec(name="toy", family="llama", num_layers=1, hidden_size=64, vocab_size=256, num_attention_heads=4,
                     num_kv_heads=1, head_dim=16, intermediate_size=128, attention="gqa", layer_kinds=["sliding"],
                     sliding_window=8, max_context=1024)
    res = ReplayPolicy().resolve(spec)     # persist: one 4-row window call
    a, b = table_chunk_cost(plain, spec, res, 4, 12), table_chunk_cost(gapped, spec, res, 4, 12)
    assert b.device_s - a.device_s == pytest.approx((5 + 1 + 3) * 1e-6)


def test_host_glue_is_the_layer_call_less_its_ops_calls():
    tab = from_dict(small_doc(layer_host={"sliding": 10e-6, "full": 0.5e-6},
                              host={"norm": 1e-6, "gemm:w": 2e-6, "attention:window": 3e-6, "attention:causal": 3e-6}))
    assert tab.glue("sliding") == pytest.approx(4e-6)
    assert tab.glue("full") == 0.0          # never negative


# ---------------------------------------------------------------------------------------------- the executor's rows and keys
def test_first_key_is_the_executors():
    from executor.swa_replay import resume_layout
    spec = ModelSpec(name="t", family="llama", num_layers=4, hidden_size=64, vocab_size=256, num_attention_heads=4,
                     num_kv_heads=1, head_dim=16, intermediate_size=128, attention="gqa",
                     layer_kinds=["sliding", "full", "sliding", "sliding"], sliding_window=8, max_context=1024)
    sliding = [k == "sliding" for k in spec.kinds()]
    pols = list(POL.values()) + [ReplayPolicy(default=LayerReplay(mode="replay", tokens=w)) for w in (1, 7, 8, 9, 20)]
    pols.append(ReplayPolicy(layers={2: LayerReplay(mode="replay", tokens=5), 3: LayerReplay(mode="recompute")}))
    for pol in pols:
        res = pol.resolve(spec)
        for c in (1, 5, 8, 9, 30, 64):
            e = res.extra_tokens(c)
            for j, lay in enumerate(resume_layout(res, sliding, c)):
                want = max(lay.key_start, c - lay.extra - 8 + 1, 0) if lay.sliding else 0   # SlidingWindowAttention.forward
                assert first_key(res.modes, res.tokens, 8, sliding, j, c, int(e[j])) == want, (pol, c, j)


def test_attention_calls_tile_as_window_attention():
    # 5000 rows from position 100, keys from 0, window 128, tiles of 2048: three tiles, each from its window's reach
    assert attention_calls(True, 5000, 100, 0, 5100, 128, 2048) == [(2048, 2148), (2048, 2048 + 127), (904, 904 + 127)]
    assert attention_calls(False, 5000, 100, 0, 5100, 128, 2048) == [(5000, 5100)]
    assert attention_calls(True, 600, 4000, 3968, 4600, 128, 2048) == [(600, 632)]


def test_calls_carry_the_rows_the_executor_runs():
    """Per layer, the attention rows the calls price are SWAReplay's rows (rows_per_layer) on the tiny bench model."""
    torch = pytest.importorskip("torch")
    from benchmarks.gpu.replay_bench import bench_spec
    from benchmarks.gpu.replay_tables import RECIPE
    from executor.forward_batch import SeqInput
    from executor.kv_cache import KVCache
    from executor.model_config import ExecModelConfig
    from executor.swa_replay import SWAReplay
    spec = bench_spec(True)
    kv = KVCache(ExecModelConfig.build(spec), 8, 8, torch.device("cpu"), torch.float32)
    for pol in POL.values():
        for n, c in ((8, 32), (16, 16), (16, 0)):
            swa = SWAReplay(spec, pol)
            swa.prepare([SeqInput(list(range(n)), c, list(range(8)), False)], [list(range(c + n))], kv)
            calls = forward_calls(RECIPE, 2048, spec, pol.resolve(spec), n, c)
            per = [sum(x.size for x in calls if x.unit == "attention" and x.layer == j) for j in range(4)]
            assert per == list(swa.rows_per_layer), (pol, n, c)


def test_a_tiled_recompute_places_each_tile_and_a_short_layer_selects_its_rows():
    from benchmarks.gpu.replay_tables import RECIPE
    calls = forward_calls(RECIPE, 2048, SPEC, POL["recompute"].resolve(SPEC), 2048, 8192)
    layer0 = [c.unit for c in calls if c.layer == 0]
    assert layer0.count("attention") == 5 and layer0.count("attn_out") == 5 + 1   # 10240 rows: 5 tiles + the layer's
    top = [c for c in calls if c.layer == 3]
    assert [c.unit for c in top][:2] == ["glue", "row_select"] and top[1].size == 2048
    assert [(c.unit, c.size) for c in top[-2:]] == [("row_clone", 10240), ("row_scatter", 2048)]
    assert [c for c in top if c.unit == "attention"][0].keys == 10240      # the full layer reads every key


def test_plan_measures_the_workloads_shapes_first_and_marks_the_generic_grid():
    from benchmarks.gpu.replay_bench import bench_spec, shapes, workload_calls
    from benchmarks.gpu.replay_tables import OPTIONAL, first_workload, plan
    spec, sh = bench_spec(False), shapes(False)
    calls = workload_calls(spec, sh, sh["ws"])
    sizes, att = plan(spec, False, 16384, calls)
    gemm_rows = {int(c.size) for c in calls if c.unit.startswith("gemm:")}
    assert all(sizes["gemm"][m] in ("workload", "both") for m in gemm_rows)
    assert sizes["gemm"][2048] == "both" and sizes["gemm"][2080] == "workload" and sizes["gemm"][181] == "grid"
    for kind in ("window", "causal"):
        used = {(int(c.size), int(c.keys - c.size)) for c in calls if c.unit == "attention" and c.kind == kind}
        assert all(att[kind][cell] in ("workload", "both") for cell in used)
        order = [o for _, o in first_workload(att[kind])]
        assert order.index(next(o for o in order if o in OPTIONAL)) == sum(o not in OPTIONAL for o in order)
    assert att["window"][(2048, 127)] == "both" and att["window"][(16, 0)] == "grid"


def test_sync_tables_add_device_and_glue():
    doc = small_doc(sync=True, layer_host={"sliding": 10e-6}, host={"norm": 1e-6, "gemm:w": 2e-6, "attention:window": 3e-6})
    tab = from_dict(doc)
    spec = ModelSpec(name="toy", family="llama", num_layers=1, hidden_size=64, vocab_size=256, num_attention_heads=4,
                     num_kv_heads=1, head_dim=16, intermediate_size=128, attention="gqa", layer_kinds=["sliding"],
                     sliding_window=8, max_context=1024)
    cost = table_chunk_cost(tab, spec, ReplayPolicy().resolve(spec), 4, 12)
    assert cost.host_s == pytest.approx(4e-6)                  # only the glue: units' walls already hold their host
    assert cost.seconds == pytest.approx(cost.device_s + 4e-6)


def test_units_run_the_executors_calls_on_the_cpu(monkeypatch):
    """Every unit's call runs at a few sizes (the GPU measures the same closures); GEMM weight copies are distinct."""
    torch = pytest.importorskip("torch")
    import benchmarks.gpu.replay_tables as rt
    from benchmarks.gpu.replay_bench import bench_spec
    u = rt.Units(bench_spec(True), torch.device("cpu"), "fp32", 8, 64)
    monkeypatch.setattr(rt, "L2_SPILL_BYTES", 3 * 128 * 64 * 4)    # three copies of a 128 x 64 fp32 weight
    u.spill = True
    with torch.inference_mode():
        fns = u.gemm(u.gemms["gate_proj"], 5)
        assert len(fns) == 3 and torch.equal(fns[0](), fns[2]())
        for unit in rt.ROW_UNITS:
            for m in (1, 7, 64):
                u.row_unit(unit, m)()
        u.row_unit("logits", 1)()
        for kind in ("window", "causal"):
            assert u.attention(kind, 5, 9)[0]().shape == (5, 4, 16)
        for kind in u.layer_of:
            u.layer_call(kind)()
