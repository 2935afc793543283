"""The eager forward's host side in the replay table model, and the replay bench's measurement (issue 23), on the CPU.

A call's kernels are issued one by one over its host time; a layer's glue runs between its calls; a layer call's
host time is interpolated over rows; a host probe beside the runs rescales the host side; the launch gap of whole
layers is preferred; the bench times its policies interleaved and rotated; the re-scorer prices a committed run as
that run priced it (the first model) before pricing it with today's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodels.model_spec import ModelSpec
from costmodels.replay import ReplayPolicy
from costmodels.replay_table import (FORMAT, Op, TableError, eager_stream, forward_ops, from_dict, spread_glue,
                                     table_chunk_cost)

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "issue23_h200"
TOY = ModelSpec(name="toy", family="llama", num_layers=1, hidden_size=64, vocab_size=256, num_attention_heads=4,
                num_kv_heads=1, head_dim=16, intermediate_size=128, attention="gqa", layer_kinds=["sliding"],
                sliding_window=8, max_context=1024)


def doc(**over) -> dict:
    """One GEMM family, one row unit, window attention: a one-layer toy's tables."""
    pts = [{"unit": "gemm", "m": m, "n": 64, "k": 32, "device_s": t} for m, t in ((1, 1e-5), (100, 1e-4))]
    pts += [{"unit": "norm", "size": s, "device_s": t} for s, t in ((1, 2e-6), (1000, 2e-4))]
    pts += [{"unit": "attention:window", "rows": r, "keys": r + b, "device_s": 1e-6 * r * (r + b)}
            for r in (4, 16) for b in (0, 8)]
    base = {"format": FORMAT, "roofline_hw": "h200", "model": {"name": "toy"},
            "recipe": {"layer": [["norm", "rows"], ["gemm:w", "rows"], ["attention", "calls"]]},
            "gemms": {"w": [64, 32]}, "row_tile": 8, "points": pts,
            "host": {"norm": 1e-6, "gemm:w": 2e-6, "attention:window": 3e-6}, "layer_host": {"sliding": 12e-6}}
    return base | over


def op(host, dev, k=1, unit="u", layer=0):
    return Op(unit, 1, 0, dev, host, "measured", layer, 0.0, k)


# ---------------------------------------------------------------------------------------------- the eager queue
def test_a_calls_kernels_run_while_the_host_still_issues_the_rest():
    # 10 us of host, 10 us of device: as one launch at the end, 20 us; as two kernels issued 5 us apart, 15 us
    assert eager_stream([op(10e-6, 10e-6)]) == pytest.approx(20e-6)
    assert eager_stream([op(10e-6, 10e-6, k=2)]) == pytest.approx(15e-6)
    # host-bound: 20 one-microsecond kernels over 200 us of host end one kernel after the host, not twenty
    assert eager_stream([op(200e-6, 20e-6, k=20)]) == pytest.approx(201e-6)
    # device-bound: splitting changes nothing but the start (the first kernel's host share)
    assert eager_stream([op(1e-6, 1e-3, k=4)]) == pytest.approx(0.25e-6 + 1e-3)


def test_a_layers_glue_runs_between_its_calls():
    ops = [Op("glue", 1, 0, 0.0, 6e-6, "measured", 0), op(1e-6, 1e-4), op(1e-6, 1e-4), op(1e-6, 1e-4),
           Op("glue", 1, 0, 0.0, 3e-6, "measured", 1), op(1e-6, 1e-4, layer=1)]
    got = spread_glue(ops)
    assert [o.unit for o in got] == ["u"] * 4
    assert [o.host_s for o in got] == pytest.approx([3e-6, 3e-6, 3e-6, 4e-6])
    assert sum(o.host_s for o in got) == pytest.approx(sum(o.host_s for o in ops))
    # device-bound: all glue first, the first kernel waits 6 + 1 us of host; spread, 3 us
    assert eager_stream(ops) - eager_stream(got) == pytest.approx(4e-6)


def test_the_model_and_the_first_model_differ_only_in_placement():
    res = ReplayPolicy().resolve(TOY)
    today = table_chunk_cost(from_dict(doc(kernels={"norm": 3})), TOY, res, 4, 12)
    first = table_chunk_cost(from_dict(doc(kernels={"norm": 3}), glue_mode="lump", split=False), TOY, res, 4, 12)
    assert today.host_s == pytest.approx(first.host_s) and today.device_s == pytest.approx(first.device_s)
    assert [o.unit for o in forward_ops(from_dict(doc(), glue_mode="lump"), TOY, res, 4, 12)][0] == "glue"
    assert "glue" not in [o.unit for o in forward_ops(from_dict(doc()), TOY, res, 4, 12)]
    assert today.seconds < first.seconds      # the host-bound toy: the device starts earlier
    with pytest.raises(TableError, match="glue_mode"):
        from_dict(doc(), glue_mode="middle")


# ---------------------------------------------------------------------------------------------- host terms
def test_layer_host_over_rows_interpolates_and_does_not_extrapolate():
    tab = from_dict(doc(layer_host_rows={"sliding": {"1": 1e-3, "512": 2e-3}}))
    assert tab.layer_host_at("sliding", 1) == pytest.approx(1e-3)
    assert tab.layer_host_at("sliding", 512) == pytest.approx(2e-3)
    assert tab.layer_host_at("sliding", 512 ** 0.5) == pytest.approx(2 ** 0.5 * 1e-3)   # log-log midpoint
    assert tab.layer_host_at("sliding", 1e5) == pytest.approx(2e-3)
    assert tab.glue("sliding", 512) == pytest.approx(2e-3 - 6e-6)
    assert from_dict(doc()).layer_host_at("sliding", 512) == pytest.approx(12e-6)   # no row series: the 1-row call


def test_a_probe_beside_the_runs_sets_the_host_speed():
    tab = from_dict(doc(layer_host_rows={"sliding": {"1": 12e-6, "16": 15e-6, "2048": 30e-6}}))
    fast = tab.with_host({"sliding": {"1": 6e-6, "16": 7.5e-6, "64": 9e-6}})       # the CPU ran twice as fast
    assert fast.host == pytest.approx({"norm": 0.5e-6, "gemm:w": 1e-6, "attention:window": 1.5e-6})
    assert fast.layer_host_at("sliding", 64) == pytest.approx(9e-6)        # the probe's own figure
    assert fast.layer_host_at("sliding", 2048) == pytest.approx(15e-6)     # a row it did not probe: scaled
    assert fast.glue("sliding", 1) == pytest.approx(tab.glue("sliding", 1) / 2)
    res = ReplayPolicy().resolve(TOY)
    assert table_chunk_cost(fast, TOY, res, 4, 12).host_s == pytest.approx(table_chunk_cost(tab, TOY, res, 4, 12).host_s / 2)


def test_the_launch_gap_of_whole_layers_is_preferred():
    both = doc(eager_gap_s=2e-6, layer_eager_gap_s=0.5e-6)
    assert from_dict(both).eager_gap == 0.5e-6 and from_dict(both).gap_source == "layer"
    assert from_dict(both, gap_from="add").eager_gap == 2e-6
    assert from_dict(doc(eager_gap_s=2e-6)).gap_source == "add"


def test_the_layer_gap_is_eager_minus_graph_over_kernels_where_device_bound():
    from benchmarks.gpu.replay_tables import Tables
    tab = Tables(None, None, None, {})
    tab.doc |= {"kernels": {"layer:sliding:2048": 100, "layer:full:2048": 50},
                "layer_host_rows": {"sliding": {"512": 1e-3}, "full": {"512": 3e-3}},
                "layer_gap_points": [{"kind": "sliding", "rows": 2048, "graph_s": 2e-3, "eager_s": 2.05e-3, "how": "graph"},
                                     {"kind": "full", "rows": 2048, "graph_s": 2e-3, "eager_s": 2.2e-3, "how": "graph"}]}
    tab.finish()
    assert tab.doc["layer_eager_gap_s"] == pytest.approx(0.5e-6)   # the full layer's host (3 ms) outruns its device
    assert "gap_per_kernel_s" not in tab.doc["layer_gap_points"][1]


# ---------------------------------------------------------------------------------------------- the bench's timing
def test_the_policies_are_timed_round_robin_rotated():
    import torch
    from benchmarks.gpu.replay_bench import Timer
    calls, probed = [], []

    class Probe:
        def sample(self):
            probed.append(len(calls))

    t = Timer(torch.device("cpu"), warm=1, reps=3)
    res = t.interleaved({n: (lambda n=n: calls.append(n)) for n in "abc"}, Probe())
    assert "".join(calls) == "abc" + "abc" + "bca" + "cab"
    assert probed == [6, 9, 12]
    assert all(len(r["samples"]) == 3 and r["host_s"] > 0 for r in res.values())


def test_the_host_probe_times_the_layer_calls_on_its_own_pages():
    torch = pytest.importorskip("torch")
    from benchmarks.gpu.replay_bench import bench_spec
    from benchmarks.gpu.replay_tables import HostProbe, layer_host_rows
    from executor.model_config import ExecModelConfig
    from executor.weights import build_model
    spec = bench_spec(True)
    cfg = ExecModelConfig.build(spec)
    model = build_model(cfg, torch.device("cpu"), "fp32", "dummy", seed=0, max_pos=64)
    with torch.inference_mode():
        probe = HostProbe(model, cfg, torch.device("cpu"), 8, torch.float32, True)
        probe.sample(calls=1)
    got = probe.result()
    assert set(got) == {"sliding", "full"} and all(set(by) == set(layer_host_rows(True)) for by in got.values())
    assert all(t > 0 for by in got.values() for t in by.values())


# ---------------------------------------------------------------------------------------------- the re-scorer
def test_the_rescorer_prices_the_committed_run_as_it_was_priced():
    from benchmarks.gpu.replay_rescore import main, rescore, sibling_tables
    bench_path = RUN / "replay_bench_tables_1aaf485.json"
    assert sibling_tables(bench_path).name == "replay_tables_1aaf485.json"
    res = rescore(json.loads(bench_path.read_text()), json.loads(sibling_tables(bench_path).read_text()))
    assert res["lump_vs_committed"] < 1e-12
    hit = res["prefix_hit"][1]["rows"]
    assert [r["policy"] for r in hit][:2] == ["recompute", "replay:32"]
    assert all("model_diff_pp" in r and "lump_diff_pp" in r for r in hit)
    assert res["summary"]["chunked 16384/2048"]["committed"]["ws_within_5pp"] == 5
    assert main([str(bench_path), "--tables", str(RUN / "missing.json")]) == 2


def test_the_layer_factor_is_the_measured_layer_over_its_units():
    from benchmarks.gpu.replay_rescore import layer_factor
    check = [{"kind": "full", "rows": 512, "layer_graph_s": 0.9, "units_s": 1.0},
             {"kind": "full", "rows": 512, "layer_graph_s": 1.1, "units_s": 1.0},     # two contexts: their mean
             {"kind": "full", "rows": 2048, "layer_graph_s": 0.8, "units_s": 1.0}]
    assert layer_factor(check, "full", 512) == pytest.approx(1.0)
    assert layer_factor(check, "full", 1024) == pytest.approx(0.9)        # halfway in log rows
    assert layer_factor(check, "full", 9000) == pytest.approx(0.8)        # the nearest cell outside
    assert layer_factor(check, "sliding", 512) == 1.0                     # no cell of that kind


def test_rounds_stop_at_the_deadline_but_not_before_the_minimum():
    import time

    import torch
    from benchmarks.gpu.replay_bench import MIN_ROUNDS, Timer
    calls = []
    t = Timer(torch.device("cpu"), warm=0, reps=50)
    t.deadline = time.monotonic() - 1.0        # already past: the minimum of rounds, each with every policy
    res = t.interleaved({n: (lambda n=n: calls.append(n)) for n in "ab"})
    assert len(calls) == 2 * MIN_ROUNDS and all(len(r["samples"]) == MIN_ROUNDS for r in res.values())
