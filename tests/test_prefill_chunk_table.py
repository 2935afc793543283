"""The measured prefill-chunk attention table (new x cached tokens): lookup, extrapolation flags, field errors,
and the step model pricing prefill attention from it (issue 16: mixed steps over long cached contexts)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from costmodels.calibration import CalibrationProfile, PrefillChunkTable
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.profiled import reduced_model
from costmodels.step import StepCostModel


def table(**kw) -> PrefillChunkTable:
    # two cached levels; time = a * new * (cached + new) (the rectangle masked SDPA visits) + 20 us
    pts = [(n, c) for c in (0, 4096) for n in (128, 1024, 4096)]
    args = dict(new=[n for n, _ in pts], cached=[c for _, c in pts],
                seconds=[2e-11 * n * (c + n) + 20e-6 for n, c in pts], heads=128, d_qk=192, d_v=128)
    args.update(kw)
    return PrefillChunkTable(**args)


def test_lookup_on_grid_between_levels_and_beyond():
    t = table()
    sec, ext = t([128, 4096, 1024], [0, 4096, 4096])
    assert np.allclose(sec, [2e-11 * 128 * 128 + 20e-6, 2e-11 * 4096 * 8192 + 20e-6, 2e-11 * 1024 * 5120 + 20e-6])
    assert not ext.any()
    # halfway between the levels: linear in cached
    mid, ext = t([1024], [2048])
    assert mid[0] == pytest.approx(0.5 * (t([1024], [0])[0][0] + t([1024], [4096])[0][0])) and not ext[0]
    # beyond the largest cached level: on along the last two levels' slope in cached, flagged
    far, ext = t([1024], [8192])
    lo, hi = t([1024], [0])[0][0], t([1024], [4096])[0][0]
    assert far[0] == pytest.approx(hi + (hi - lo)) and ext[0]
    assert far[0] == pytest.approx(2e-11 * 1024 * (8192 + 1024) + 20e-6)   # the table's own law, linear in cached
    # beyond the largest new: work ratio at that level, flagged; below the smallest: the smallest time, flagged
    big, ext = t([8192, 16], [0, 0])
    assert big[0] == pytest.approx(t([4096], [0])[0][0] * 4) and big[1] == pytest.approx(t([128], [0])[0][0])
    assert ext.all()


@pytest.mark.parametrize("bad, field", [(dict(seconds=[1e-3] * 5), "one entry per point"),
                                        (dict(seconds=[0.0] + [1e-3] * 5), "> 0"),
                                        (dict(cached=[-1, 0, 0, 4096, 4096, 4096]), "cached >= 0")])
def test_bad_tables_name_the_problem(bad, field):
    with pytest.raises(ValidationError, match=field):
        table(**bad)


def test_profile_round_trips_the_chunk_table(tmp_path):
    base = CalibrationProfile.default()
    prof = base.model_copy(update={"tables": {**base.tables, "attn_prefill_chunk": table()}})
    path = tmp_path / "p.json"
    prof.save(path)
    back = CalibrationProfile.load(path)
    assert isinstance(back.tables["attn_prefill_chunk"], PrefillChunkTable)
    assert json.loads(path.read_text())["tables"]["attn_prefill_chunk"]["heads"] == 128


def _costs(tab: PrefillChunkTable | None):
    m = reduced_model("deepseek-v3", 5)
    lay = ParallelLayout(tp=1, weight_dtype="fp8", kv_dtype="bf16")
    base = CalibrationProfile.default()
    cal = base if tab is None else base.model_copy(update={"tables": {**base.tables, "attn_prefill_chunk": tab}})
    return StepCostModel(m, get_hardware("H200"), lay, cal), m


def test_step_model_prices_prefill_attention_from_the_table():
    tab = table()
    with_t, m = _costs(tab)
    without, _ = _costs(None)
    new, ctx, dec = np.array([1024, 2048]), np.array([4096, 1024]), np.array([False, False])
    a = with_t.attention(new, ctx, dec, 0, 1.0)
    b = without.attention(new, ctx, dec, 0, 1.0)
    full_layers = sum(c for g, c in with_t.att_groups if g.prefill_upproj)
    want = full_layers * float(tab(new, ctx)[0].sum())  # V3: 128 heads x (192 + 128): the table's own shape
    assert a.sum() == pytest.approx(want) and a.sum() != pytest.approx(b.sum())
    # decode attention is not the table's
    d = np.array([True, True])
    assert with_t.attention(np.array([1, 1]), ctx, d, 0, 1.0).sum() == pytest.approx(without.attention(np.array([1, 1]), ctx, d, 0, 1.0).sum())
    # the whole step: only the prefill attention term moved (the K/V up-projection stays a GEMM)
    t_with = with_t.mixed_step_time(new, ctx, dec)
    t_without = without.mixed_step_time(new, ctx, dec)
    assert t_with - t_without == pytest.approx(a.sum() - b.sum(), rel=1e-6)


def test_table_scales_with_heads_and_dims():
    tab = table(heads=64)   # measured at half the heads: the same chunk on 128 heads costs twice as much
    with_t, _ = _costs(tab)
    new, ctx, dec = np.array([1024]), np.array([2048]), np.array([False])
    full_layers = sum(c for g, c in with_t.att_groups if g.prefill_upproj)
    assert with_t.attention(new, ctx, dec, 0, 1.0).sum() == pytest.approx(2 * full_layers * float(tab(new, ctx)[0][0]))


def test_calibration_grid_has_chunks_over_long_cached_contexts():
    pytest.importorskip("torch")
    from executor.calibrate import step_grid

    shapes = step_grid("cuda", False, 8192, 128, 8192)
    chunks = [ch for _, chs in shapes for ch in chs]
    assert {(512, 4096), (2048, 2048), (1024, 6144)} <= set(chunks)
    assert all(n + c < 8192 for n, c in chunks)
    # the mixed step: a long prompt's later chunk next to decodes
    assert any(dec and chs == [(2048, 4096)] for dec, chs in shapes)


def test_step_fit_always_prices_prefill_chunks_with_the_measured_table():
    """The chunk table times the executor's own prefill attention at the step's shapes: every fit variant uses it
    (the efficiency tables stay a model choice), and the prefill-attention scale multiplies its times."""
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import fit_step_profile
    from costmodels.step_profile import FIT_CATEGORIES, HostTerms, StepPoint, StepProfile

    base = CalibrationProfile.default()
    prof = base.model_copy(update={"tables": {**base.tables, "attn_prefill_chunk": table()}})
    truth = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", graph_sizes=[1, 2, 4, 8], overlap=0.0,
                        use_op_tables=True, op_tables=["attn_prefill_chunk"], host=HostTerms(fixed_s=1e-3, graph_fixed_s=2e-4),
                        category_scale=dict(zip(FIT_CATEGORIES, (1.2, 1.0, 1.3, 1.0, 1.1))))
    cost = ProfiledStepCost(prof, truth)
    pts = [StepPoint(num_layers=4, decode_ctx=[256] * n, wall_s=1.0, graph_bs={1: 1, 2: 2, 3: 4, 4: 4, 6: 8, 8: 8}[n])
           for n in (1, 2, 3, 4, 6, 8)]
    pts += [StepPoint(num_layers=4, decode_ctx=[256] * d, prefill=[(q, c)], wall_s=1.0)
            for q in (256, 1024, 4096) for c in (0, 2048, 4096) for d in (0, 16)]
    pts = [p.model_copy(update={"wall_s": cost.point_time(p)}) for p in pts]
    st = fit_step_profile(prof, pts, model="deepseek-v3", dtype="fp8", device="cuda", graph_sizes=[1, 2, 4, 8])
    assert st.use_op_tables and "attn_prefill_chunk" in st.op_tables
    assert st.fit.mape < 0.02 and st.category_scale["prefill_attention"] == pytest.approx(1.0, rel=0.1)


def _chunk_points(device: bool | list[bool]):
    pts = []
    for i, (n, c) in enumerate((n, c) for c in (0, 2048) for n in (128, 1024)):
        dev = device if isinstance(device, bool) else device[i]
        eager = 2e-11 * n * (c + n) + 60e-6            # the eager clock carries each call's launch
        pts.append({"op": "attn_prefill_chunk", "new": n, "cached": c, "heads": 128, "d_qk": 192, "d_v": 128,
                    "time_s": eager, "backend": "fa3", **({"device_s": eager - 50e-6} if dev else {})})
    return pts


def test_chunk_table_reads_device_time_where_every_point_has_it():
    from costmodels.calibration import prefill_chunk_table

    dev = prefill_chunk_table(_chunk_points(True))
    assert dev.seconds == pytest.approx([p["device_s"] for p in _chunk_points(True)])
    assert dev.x_is.startswith("device seconds") and "fa3" in dev.x_is
    # one point without a device time (an older calibration, or a CPU run): the whole table stays on the eager clock
    mixed = prefill_chunk_table(_chunk_points([True, True, False, True]))
    assert mixed.seconds == pytest.approx([p["time_s"] for p in _chunk_points(False)])
    assert mixed.x_is.startswith("eager seconds")
    # fewer than two cached levels: no table
    assert prefill_chunk_table([p for p in _chunk_points(True) if p["cached"] == 0]) is None


def test_refit_rebuilds_the_chunk_table_from_the_device_points(monkeypatch):
    """A profile whose stored table was built from eager times is refitted with this revision's table: device seconds
    where its points timed them (what `matrix_offline.py --refit` evaluates)."""
    from costmodels.calibration import prefill_chunk_table
    from costmodels.step_fit import refit_profile

    prof = CalibrationProfile.default(get_hardware("H200"))
    pts = _chunk_points(True)
    eager = prefill_chunk_table(_chunk_points(False))
    prof = prof.model_copy(update={"op_points": pts, "tables": {"attn_prefill_chunk": eager}})
    captured = {}
    import costmodels.step_fit as sf

    from costmodels.step_profile import HostTerms, LoopTerms, StepProfile

    def fake_fit(p, points, **kw):
        captured["table"] = p.tables["attn_prefill_chunk"]
        return StepProfile(model="deepseek-v3", num_layers=5)

    class _St:
        points, model, dtype, device, graph_sizes, piecewise_sizes = [], "deepseek-v3", "fp8", "cuda", [], []
        loop, host = LoopTerms(admit_s=2e-5), HostTerms(after_eager_s=1e-4)   # measured apart: a refit keeps them

    prof2 = prof.model_copy(update={"step": _St()})
    monkeypatch.setattr(sf, "fit_step_profile", fake_fit)
    st = refit_profile(prof2).step
    assert captured["table"].seconds == pytest.approx([p["device_s"] for p in pts])
    assert st.loop.admit_s == 2e-5 and st.host.after_eager_s == 1e-4


def test_beyond_the_last_level_the_slope_needs_both_levels_measured_at_that_new():
    # the last level measured new up to 1024 only: a 4096-token chunk over more cached context than any level takes
    # the rectangle from the last level, not a slope between two levels each extrapolated differently in new
    pts = [(n, 0) for n in (128, 1024, 4096)] + [(n, 4096) for n in (128, 1024)]
    t = PrefillChunkTable(new=[n for n, _ in pts], cached=[c for _, c in pts],
                          seconds=[2e-11 * n * (c + n) + 20e-6 for n, c in pts], heads=128, d_qk=192, d_v=128)
    last, _ = t([4096], [4096])
    far, ext = t([4096], [8192])
    assert far[0] == pytest.approx(last[0] * (8192 + 4096) / (4096 + 4096)) and ext[0]
    # where both levels measured it, the slope
    lo, hi = t([1024], [0])[0][0], t([1024], [4096])[0][0]
    assert t([1024], [8192])[0][0] == pytest.approx(hi + (hi - lo))
