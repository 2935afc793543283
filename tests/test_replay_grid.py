"""Replay forwards priced off a held-out grid of measured pieces (costmodels/replay_grid.py, benchmarks/gpu/replay_grid.py)."""

import json

import numpy as np
import pytest

from benchmarks.gpu.replay_bench import bench_spec, policies, shapes
from benchmarks.gpu.replay_grid import grid_steps
from costmodels import replay_grid as G
from costmodels.replay import ReplayPolicy, chunk_cost, depth_correction, prefill_seconds, prompt_chunks


def _workload_features(tiny: bool) -> dict[str, set]:
    """Every piece (features) of every policy's forward of the bench's workloads, from costmodels alone."""
    spec, sh = bench_spec(tiny), shapes(tiny)
    sl = [k == "sliding" for k in spec.kinds()]
    parts = [[(n, c)] for c, n in sh["prefix_hit"]] + [prompt_chunks(p, k) for p, k in sh["chunked"]]
    out = {}
    for name, pol in policies(sh["ws"] + [64, 256]):
        r = pol.resolve(spec)
        out[name] = {f for ps in parts for n, c in ps
                     for f in G.step_features(sl, r.window, tuple(r.modes), tuple(r.tokens),
                                              [int(x) for x in r.extra_tokens(c)], n, c)}
    return out


def _grid_features(tiny: bool) -> set:
    spec = bench_spec(tiny)
    sl = [k == "sliding" for k in spec.kinds()]
    pols = {"persist": ReplayPolicy().resolve(spec), "recompute": policies([])[0][1].resolve(spec)}
    out = set()
    for pol, n, c, kinds in grid_steps(tiny):
        r = pols[pol]
        e = [int(x) for x in r.extra_tokens(c)] if c else [0] * len(sl)
        out |= {f for f in G.step_features(sl, r.window, tuple(r.modes), tuple(r.tokens), e, n, c) if f[0] in kinds}
    return out


@pytest.mark.parametrize("tiny", [False, True])
def test_the_grid_holds_out_every_workload_shape(tiny):
    grid, work = _grid_features(tiny), _workload_features(tiny)
    assert grid and all(not (grid & fs) for fs in work.values())
    # and covers every kind the workloads run
    assert {k for k, _, _ in grid} >= {k for fs in work.values() for k, _, _ in fs}


def test_held_out_check_fails_on_a_workload_shape():
    sl = [True, True, True, False]
    plan = {"p": ["embed|512|512", "layer3|544|512|512:4096:4608:0", "layer0|544|all|544:4064:4608:3968"]}
    assert G.features(plan["p"][1], sl) == ("fullsel", 512, 4096)
    assert G.features(plan["p"][2], sl) == ("sliding", 544, 96)
    G.assert_held_out({("embed", 384, 0)}, plan, sl)
    with pytest.raises(G.GridError, match="hold them out"):
        G.assert_held_out({("embed", 512, 0), ("full", 512, 4096)}, plan, sl)


def test_step_features_follow_the_executor_pieces():
    """The pieces the executor's preparation runs (the bench's piece keys) have the features costmodels derives."""
    pytest.importorskip("torch")
    import torch
    from benchmarks.gpu.replay_bench import Bench, Timer
    from benchmarks.gpu.replay_segments import piece_key
    from executor.swa_replay import SWAReplay
    spec, sh = bench_spec(True), shapes(True)
    b = Bench(spec, torch.device("cpu"), "fp32", sh["page"], 64, Timer(torch.device("cpu"), 0, 1), tiny=True)
    sl = [k == "sliding" for k in spec.kinds()]
    for _, pol in policies(sh["ws"]):
        swa, r = SWAReplay(spec, pol), pol.resolve(spec)
        for n, c in [(8, 32), (16, 16), (16, 0), (5, 21)]:
            prep = b.prepare(swa, n, c)
            keys = [piece_key("embed", prep)] + [piece_key("layer", prep, j) for j in range(4)] + [piece_key("end", prep)]
            e = [int(x) for x in r.extra_tokens(c)] if c else [0] * 4
            assert [G.features(k, sl) for k in keys] == G.step_features(sl, r.window, tuple(r.modes), tuple(r.tokens), e, n, c)


def _power_grid(a=2e-6, host=1e-3):
    """Device seconds a * rows^1.5 * (1 + ctx / 4096), host constant: a grid the interpolation must reproduce."""
    pts = []
    for kind in G.KINDS:
        for rows in (256, 1024, 4096):
            for ctx in ((0,) if kind in ("embed", "end") else (0, 4096, 8192)):
                pts.append(G.Point(kind, rows, ctx, host, a * rows ** 1.5 * (1 + ctx / 4096), ((1.0, 1.0),)))
    return G.ReplayGrid(pts)


def test_interpolation_loglog_in_rows_linear_in_context_and_flags_beyond():
    g = _power_grid()
    p = g.piece("full", 1024, 4096)
    assert not p.extrapolated and p.segment.device_s == pytest.approx(2e-6 * 1024 ** 1.5 * 2)
    p = g.piece("full", 600, 6000)   # between grid points: the power law exactly in rows, linear in context
    assert not p.extrapolated and p.segment.device_s == pytest.approx(2e-6 * 600 ** 1.5 * (1 + 6000 / 4096))
    assert p.segment.host_s == pytest.approx(1e-3)
    p = g.piece("sliding", 8192, 0)   # beyond: the end pair's slope, flagged
    assert p.extrapolated and p.segment.device_s == pytest.approx(2e-6 * 8192 ** 1.5)
    p = g.piece("full", 1024, 12288)
    assert p.extrapolated and p.segment.device_s == pytest.approx(2e-6 * 1024 ** 1.5 * 4)
    with pytest.raises(G.GridError, match="no 'full'"):
        G.ReplayGrid([G.Point("embed", 1, 0, 1.0, 1.0)]).piece("full", 1, 0)
    # extrapolation never falls with rows, never rises faster than rows^2
    falling = G.ReplayGrid([G.Point("embed", 100, 0, 1.0, 2.0), G.Point("embed", 200, 0, 1.0, 1.0)])
    assert falling.piece("embed", 400, 0).segment.device_s == pytest.approx(1.0)
    steep = G.ReplayGrid([G.Point("embed", 100, 0, 1.0, 1.0), G.Point("embed", 200, 0, 1.0, 64.0)])
    assert steep.piece("embed", 400, 0).segment.device_s == pytest.approx(64.0 * 4)


def test_repeats_are_merged_and_prices_queue_like_segments():
    one = ((1.0, 1.0),)   # one kernel, launched at the end of the piece's host time
    g = G.ReplayGrid([G.Point("embed", 100, 0, 1.0, 1.0, one), G.Point("embed", 100, 0, 3.0, 5.0, one),
                      G.Point("embed", 200, 0, 2.0, 2.0, one)])
    assert g.piece("embed", 100, 0).segment.device_s == pytest.approx(3.0)
    cost, ext = g.price([("embed", 100, 0), ("embed", 200, 0)])
    # host-bound: the second piece's one kernel is issued after 2 + 2 s of host, the first ends at 2 + 3
    assert ext == 0 and cost.seconds == pytest.approx(max(2.0 + 3.0, 4.0) + 2.0)
    assert g.price([("embed", 100, 0)], sync=True)[0].seconds == pytest.approx(3.0)


def test_grid_file_round_trip_and_errors(tmp_path):
    regimes = {"a": [{"kind": "embed", "rows": 10, "ctx": 0, "host_s": 1.0, "device_s": 2.0, "trace": [[1, 1]]}],
               "b": [{"kind": "embed", "rows": 10, "ctx": 0, "host_s": 3.0, "device_s": 4.0, "trace": []}]}
    pts = G.pooled(regimes)
    assert pts == [{"kind": "embed", "rows": 10, "ctx": 0, "host_s": 2.0, "device_s": 3.0, "trace": [[1, 1]]}]
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"points": pts, "regimes": regimes, "window": 8, "layers": ["sliding"]}))
    assert G.load(path).piece("embed", 10, 0).segment.host_s == 2.0
    assert G.load(path, regime="b").piece("embed", 10, 0).segment.host_s == 3.0
    with pytest.raises(G.GridError, match="no regime 'c'"):
        G.load(path, regime="c")
    with pytest.raises(G.GridError, match="needs kind"):
        G.from_dict({"points": [{"kind": "embed"}]})
    with pytest.raises(G.GridError, match="expected one of"):
        G.from_dict({"points": [{"kind": "mlp", "rows": 1, "ctx": 0, "host_s": 1, "device_s": 1}]})
    with pytest.raises(G.GridError, match="cannot read"):
        G.load(tmp_path / "missing.json")


def test_chunk_cost_and_depth_correction_take_the_grid():
    """The replay cost the simulator and tune use reads the grid where it is given one measured on the model, and
    stays analytic otherwise (the default path is untouched)."""
    from costmodels.hardware import get_hardware
    from costmodels.layout import ParallelLayout
    from costmodels.step import StepCostModel
    spec = bench_spec(False)
    g = _power_grid()
    g = G.ReplayGrid(g.points, window=spec.sliding_window, layers=spec.kinds(),
                     model={"name": spec.name, "hidden": spec.hidden_size})
    ops = StepCostModel(spec, get_hardware("h200"), ParallelLayout(tp=1, weight_dtype="bf16", kv_dtype="bf16"))
    persist, rec = ReplayPolicy().resolve(spec), policies([])[0][1].resolve(spec)
    got = chunk_cost(ops, persist, 512, 4096, tables=g)
    sl = [k == "sliding" for k in spec.kinds()]
    want = g.price(G.step_features(sl, spec.sliding_window, tuple(persist.modes), tuple(persist.tokens),
                                   [0] * 4, 512, 4096))[0].seconds
    assert got.seconds == pytest.approx(want) and got.breakdown["extrapolated_pieces"] == 0
    assert prefill_seconds(ops, rec, 8192, 2048, tables=g) > prefill_seconds(ops, persist, 8192, 2048, tables=g)
    assert chunk_cost(ops, persist, 512, 4096).seconds != got.seconds   # analytic without the grid
    other = bench_spec(True)
    with pytest.raises(G.GridError, match="not on 'replay-bench-tiny'"):
        G.ReplayGrid(g.points, window=other.sliding_window, layers=other.kinds(), model={"hidden": 4096}).check_model(other)

    class Prof:   # a calibration profile carrying the grid
        replay_grid = {"points": [{"kind": p.kind, "rows": p.rows, "ctx": p.ctx, "host_s": p.host_s,
                                   "device_s": p.device_s} for p in g.points],
                       "window": spec.sliding_window, "layers": spec.kinds()}
    assert G.for_profile(None) is None and G.for_profile(object()) is None
    assert G.for_profile(Prof()).matches(spec)
    # the depth correction (what the simulator subtracts for replayed rows only the lower layers need) off the grid
    from costmodels.replay import DepthCorrection, StepOps
    from types import SimpleNamespace
    deep = _deep_replay(spec)
    assert DepthCorrection.needed(deep)
    lay = ParallelLayout(tp=1, weight_dtype="bf16", kv_dtype="bf16")
    so = StepOps(spec, get_hardware("h200"), lay, None)
    ch = SimpleNamespace(replayed=int(deep.extra_tokens(4096)[0]), num_new_tokens=512 + int(deep.extra_tokens(4096)[0]),
                         context_len=4096 - int(deep.extra_tokens(4096)[0]))
    on, off = DepthCorrection(so, deep, grid=G.for_profile(Prof()))([ch]), DepthCorrection(so, deep)([ch])
    e = [int(x) for x in deep.extra_tokens(4096)]
    want = (g.step_seconds(spec, deep, 512, 4096, [e[0]] * 4).seconds - g.step_seconds(spec, deep, 512, 4096).seconds)
    assert on == pytest.approx(want) and on > 0 and on != off
    assert depth_correction(spec, get_hardware("h200"), lay, None, deep).grid is None


def _deep_replay(spec):
    from costmodels.replay import LayerReplay
    return ReplayPolicy(default=LayerReplay(mode="replay", tokens=256), layers={1: LayerReplay(mode="persist"),
                                                                             2: LayerReplay(mode="persist")}).resolve(spec)


def test_a_layer_piece_reads_only_points_with_as_many_row_tiles():
    """One row past a tile costs a tile's launches (run_4e31ccf: a sliding layer 2.12 ms at 2048 rows, 2.30 at 2080):
    a 2080-row piece is read off the two-tile points, not across the step."""
    pts = [G.Point("sliding", r, 0, 1.0, d) for r, d in ((1024, 1.0), (2040, 2.0), (2144, 2.5), (3072, 3.0))]
    tiled, smooth = G.ReplayGrid(pts, row_tile=2048), G.ReplayGrid(pts)
    got = tiled.piece("sliding", 2080, 0)
    assert got.extrapolated and got.segment.device_s == pytest.approx(2.5 * (2080 / 2144) ** (np.log(3.0 / 2.5) / np.log(3072 / 2144)))
    assert smooth.piece("sliding", 2080, 0).segment.device_s == pytest.approx(2.0 * (2080 / 2040) ** (np.log(1.25) / np.log(2144 / 2040)))
    assert tiled.piece("sliding", 1500, 0).segment.device_s < 2.0 and not tiled.piece("sliding", 1500, 0).extrapolated
    assert G.ReplayGrid([G.Point("embed", 1, 0, 1.0, 1.0)], row_tile=2048).tiles("embed", 5000) == 0
    assert tiled.tiles("full", 2048) == 1 and tiled.tiles("full", 2049) == 2 and tiled.tiles("full", 99999) == 3


def test_host_time_is_the_kinds_per_tile_class_not_read_off_by_shape():
    """A piece's host time (its kernels' launches) is the median over the grid's points of its kind and tile class,
    whatever its rows and context; device time still follows the shape. Shape-read host times carried the grid's
    noise (+16 to +26% against the same piece at its own shape, run_d1473e5)."""
    pts = [G.Point("sliding", r, c, h, 1e-6 * r) for (r, c, h) in
           ((64, 0, 1.0), (128, 0, 1.4), (256, 0, 0.9), (64, 512, 1.1), (128, 512, 5.0))]
    pts += [G.Point("sliding", 300, 0, 3.0, 1e-6 * 300), G.Point("sliding", 500, 0, 3.2, 1e-6 * 500)]   # 2 tiles of 256
    g = G.ReplayGrid(pts, row_tile=256)
    one = g.piece("sliding", 100, 300).segment
    assert one.host_s == pytest.approx(1.1) and one.device_s == pytest.approx(1e-6 * 100, rel=1e-6)
    assert g.piece("sliding", 400, 0).segment.host_s == pytest.approx(3.1)     # the 2-tile class's median
    assert g.piece("sliding", 1000, 0).segment.host_s == pytest.approx(3.1)    # no 3+-tile point: the nearest class


def _pt(kind, rows, ctx, host, dev, b2b=None):
    return G.Point(kind, rows, ctx, host, dev, (), b2b)


def test_back_to_back_host_is_used_where_measured_and_older_grids_read_as_before():
    old = [_pt("embed", 100, 0, 1e-4, 1e-5), _pt("embed", 400, 0, 3e-4, 4e-5)]
    new = [_pt("embed", 100, 0, 1e-4, 1e-5, 0.5e-4), _pt("embed", 400, 0, 3e-4, 4e-5, 1.5e-4)]
    g_old, g_new = G.ReplayGrid(old), G.ReplayGrid(new)
    g_iso = G.ReplayGrid(new, b2b=False)
    assert not g_old.b2b and g_new.b2b and not g_iso.b2b
    assert g_old.piece("embed", 200, 0).segment.host_s == pytest.approx(2e-4)      # median of the kind's points
    assert g_iso.piece("embed", 200, 0).segment.host_s == pytest.approx(2e-4)
    assert g_new.piece("embed", 200, 0).segment.host_s == pytest.approx(1e-4)
    assert g_new.piece("embed", 200, 0).segment.device_s == g_old.piece("embed", 200, 0).segment.device_s
    d = {"kind": "embed", "rows": 100, "ctx": 0, "host_s": 1e-4, "device_s": 1e-5}
    assert G.point_from_dict(d).host_b2b_s is None
    assert G.point_from_dict(d | {"host_b2b_s": 2e-5}).host_b2b_s == 2e-5
    pooled = G.pooled({"a": [d | {"host_b2b_s": 2e-5}], "b": [d | {"host_b2b_s": 4e-5}], "c": [d]})
    assert pooled[0]["host_b2b_s"] == pytest.approx(3e-5)
    assert "host_b2b_s" not in G.pooled({"a": [d]})[0]


def test_round_grids_price_each_grid_sample_alone():
    pts = [{"kind": "embed", "rows": r, "ctx": 0, "host_s": 1.0, "device_s": 1.0,
            "rounds": [[1e-4 * r, 1e-5], [2e-4 * r, 1e-5]], "b2b_rounds": [[[5e-5 * r, 1e-5]], [[1e-4 * r, 1e-5]]]}
           for r in (100, 400)]
    got = G.round_grids({"points": pts, "rounds_at": [0, 4]})
    assert [r for r, _ in got] == [0, 4]
    assert got[1][1].piece("embed", 100, 0).segment.host_s == pytest.approx(2 * got[0][1].piece("embed", 100, 0).segment.host_s)
    assert got[0][1].b2b
    iso = G.round_grids({"points": pts, "rounds_at": [0, 4]}, b2b=False)
    assert not iso[0][1].b2b
    assert G.round_grids({"points": [{k: v for k, v in p.items() if k != "rounds"} for p in pts]}) == []   # medians only


def test_the_bench_selects_workloads():
    from benchmarks.gpu.replay_bench import select_workloads
    sh = shapes(False)
    assert select_workloads(sh, "prefix")["prefix_hit"] == sh["prefix_hit"]
    assert select_workloads(sh, "prefix")["chunked"] == []
    assert select_workloads(sh, "all") == sh
    assert select_workloads(sh, "8192+2048,16384/2048")["prefix_hit"] == [(8192, 2048)]
    with pytest.raises(ValueError):
        select_workloads(sh, "1+1")


def test_the_grid_probe_keeps_every_sample_and_its_back_to_back_host_on_the_cpu():
    torch = pytest.importorskip("torch")
    from benchmarks.gpu.replay_bench import Bench, Timer
    from benchmarks.gpu.replay_grid import GridProbe
    b = Bench(bench_spec(True), torch.device("cpu"), "fp32", 8, 48, Timer(torch.device("cpu"), 0, 1), tiny=True)
    with torch.inference_mode():
        b.fill(40)
        gp = GridProbe(b, tiny=True, every=2)
        for _ in range(3):
            gp.sample()
    assert gp.rounds_at == [0, 2]
    pts = gp.points()
    assert pts and all(len(p["rounds"]) == 2 and len(p["b2b_rounds"]) == 2 and p["host_b2b_s"] > 0 for p in pts)
    assert len(G.round_grids({"points": pts, "rounds_at": gp.rounds_at})) == 2
