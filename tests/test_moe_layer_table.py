"""The measured MoE-layer table (device seconds of one layer's routed experts over tokens, timed in a CUDA graph by
the calibration): lookup and extrapolation flags, field errors, building it from a calibration's points, and the step
model pricing the routed experts from it only for the MoE it measured on one GPU (issue 16: H200 run 11's MoE layer
took 4.09 ms at 1024 tokens and 5.56 ms at 4096 where the roofline gave 2.86 and 3.31)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from costmodels.calibration import CalibrationProfile, MoELayerTable, moe_layer_table
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.profiled import reduced_model
from costmodels.step import StepCostModel

V3 = dict(experts=256, top_k=8, hidden=7168, intermediate=2048)
RUN11 = {1: 1.748e-4, 8: 6.633e-4, 64: 2.365e-3, 256: 3.037e-3, 1024: 4.091e-3, 4096: 5.559e-3}   # device_s, H200


def table(**kw) -> MoELayerTable:
    args = dict(tokens=list(RUN11), seconds=list(RUN11.values()), **V3)
    args.update(kw)
    return MoELayerTable(**args)


def test_lookup_interpolates_in_log_space_and_flags_what_lies_beyond():
    t = table()
    sec, ext = t([1, 64, 4096])
    assert np.allclose(sec, [RUN11[1], RUN11[64], RUN11[4096]]) and not ext.any()
    # between counts: the time per expert touched, log-log in tokens, times the experts the count touches (uniform
    # routing, 8 of 256 per token: 1 - (31/32)^n of them)
    e = lambda n: 256 * (1 - (1 - 8 / 256) ** n)                      # noqa: E731
    mid, ext = t([128])     # halfway in log tokens between 64 and 256: the geometric mean of their per-expert times
    assert mid[0] == pytest.approx(e(128) * np.sqrt(RUN11[64] / e(64) * RUN11[256] / e(256))) and not ext[0]
    f = np.log(20 / 8) / np.log(8)
    dec, _ = t([20])        # a decode batch of 20 touches 121 experts: 40% of the way from 8 tokens' 57 to 64's 222
    assert dec[0] == pytest.approx(e(20) * (RUN11[8] / e(8)) ** (1 - f) * (RUN11[64] / e(64)) ** f)
    assert dec[0] > 1.1 * RUN11[8] ** (1 - f) * RUN11[64] ** f      # the time interpolated alone: >10% short there
    big, ext = t([8192, 0])
    slope = (RUN11[4096] - RUN11[1024]) / 3072                         # beyond, alone: the last segment's slope,
    assert big[0] == pytest.approx(RUN11[4096] + 4096 * slope) and ext[0]   # flagged
    assert big[1] == 0.0 and not ext[1]                                # no tokens, no MoE
    # with a reference model of the layer: its time at the last count's measured/reference ratio where that grows less
    ref = lambda x: 1e-6 * np.asarray(x, float)                        # noqa: E731
    far, ext = t([8192, 64], ref)
    assert far[0] == pytest.approx(RUN11[4096] + 4096 * slope) and ext[0]      # the slope grows less here
    assert far[1] == pytest.approx(RUN11[64]) and not ext[1]
    flat = lambda x: 0.0 * np.asarray(x, float) + 1e-3                 # noqa: E731  a reference that stops growing
    assert t([8192], flat)[0][0] == pytest.approx(RUN11[4096])
    # a quick calibration's table (1, 8, 64 tokens) carried to 4096 tokens by the reference, not by its steep slope
    quick = table(tokens=[1, 8, 64], seconds=[RUN11[1], RUN11[8], RUN11[64]])
    roof = lambda x: 2.4e-3 * np.minimum(np.asarray(x, float), 256) / 256 + 1e-7 * np.asarray(x, float)  # noqa: E731
    carried = quick([4096], roof)[0][0]                                 # experts saturate by 256 tokens in this roofline
    assert carried == pytest.approx(RUN11[64] * roof(4096) / roof(64)) and carried < quick([4096])[0][0] / 10
    low, ext = table(tokens=[8, 64], seconds=[RUN11[8], RUN11[64]])([2])
    assert low[0] == pytest.approx(RUN11[8]) and ext[0]                # below: the smallest point's time, flagged


@pytest.mark.parametrize("bad, field", [(dict(seconds=[1e-3] * 5), "one time per token count"),
                                        (dict(seconds=[0.0] + [1e-3] * 5), "> 0"),
                                        (dict(tokens=[1, 1, 64, 256, 1024, 4096]), "distinct")])
def test_bad_tables_name_the_problem(bad, field):
    with pytest.raises(ValidationError, match=field):
        table(**bad)


def test_built_from_device_timed_points_only_with_the_expert_shape():
    pts = [{"op": "moe_experts", "tokens": n, "top_k": 8, "experts": 256, "time_s": 2 * s, "device_s": s, **{k: V3[k] for k in ("hidden", "intermediate")}}
           for n, s in RUN11.items()]
    t = moe_layer_table(pts + [{"op": "linear", "m": 4, "time_s": 1.0}])
    assert t.tokens == sorted(RUN11) and t.seconds == [RUN11[n] for n in sorted(RUN11)] and t.matches(**V3)
    # run 11's points lack the shape: the calibrated model names it
    bare = [{k: v for k, v in p.items() if k not in ("hidden", "intermediate")} for p in pts]
    assert moe_layer_table(bare) is None and moe_layer_table(bare, "deepseek-v3").matches(**V3)
    # eager-only points (no device time, before 056fca2 or on a CPU) and a single count give no table
    assert moe_layer_table([{k: v for k, v in p.items() if k != "device_s"} for p in pts]) is None
    assert moe_layer_table(pts[:1]) is None
    assert moe_layer_table(bare, "no-such-model") is None                 # outside the catalog: shape unknown, no table
    assert moe_layer_table(bare, "deepseek-v3", "fp8").weight_dtype == "fp8"


def _cost(tab: MoELayerTable | None, model: str = "deepseek-v3", ep: int = 1):
    m = reduced_model(model, 5)
    lay = ParallelLayout(tp=ep, ep=ep, weight_dtype="fp8", kv_dtype="bf16")
    base = CalibrationProfile.default()
    cal = base if tab is None else base.model_copy(update={"tables": {**base.tables, "moe_layer": tab}})
    return StepCostModel(m, get_hardware("H200"), lay, cal)


def test_step_model_prices_routed_experts_from_the_table_of_its_own_moe():
    with_t, without = _cost(table()), _cost(None)
    moe_layers = with_t.n_moe_layers
    tok = np.array([1024.0, 64.0])
    a = with_t.experts(tok, moe_layers, "routed").time
    assert np.allclose(a, moe_layers * np.array([RUN11[1024], RUN11[64]]))
    assert not np.allclose(a, without.experts(tok, moe_layers, "routed").time)
    # another expert shape, or experts spread over ranks: the table did not time that, the roofline prices it
    other = _cost(table(intermediate=1024))
    assert np.allclose(other.experts(tok, moe_layers, "routed").time, without.experts(tok, moe_layers, "routed").time)
    assert _cost(table(), ep=8).moe_table is None
    assert _cost(table(), model="qwen3-235b-a22b").moe_table is None
    assert _cost(table(weight_dtype="bf16")).moe_table is None          # timed BF16 experts, priced FP8: not the table's
    assert _cost(table(weight_dtype="fp8")).moe_table is not None
    # the term says where its time came from, and when a count lies beyond the table
    assert "measured MoE layer table" in with_t.experts(np.array([64.0]), moe_layers, "routed").names[0]
    assert "extrapolated" in with_t.experts(np.array([8192.0]), moe_layers, "routed").names[0]


def test_refit_builds_the_table_from_the_profiles_own_points_and_fits_one_device_scale():
    """A profile whose MoE points timed their device time but carry no ``moe_layer`` table (run 11's) gets it at refit
    from those points; every fit variant prices the experts from it (ALWAYS_TABLES), and the graph forwards pin one
    device scale for every category, the table's experts included."""
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import ALWAYS_TABLES, refit_profile
    from costmodels.step_profile import FIT_CATEGORIES, HostTerms, StepPoint, StepProfile
    assert "moe_layer" in ALWAYS_TABLES
    base = CalibrationProfile.default()
    op_points = [{"op": "moe_experts", "tokens": n, "top_k": 8, "experts": 256, "time_s": 2 * v, "device_s": v}
                 for n, v in RUN11.items()]
    with_t = base.model_copy(update={"tables": {**base.tables, "moe_layer": table()}})
    truth = StepProfile(model="deepseek-v3", num_layers=5, dtype="fp8", device="cuda", graph_sizes=[1, 2, 4, 8, 16, 32, 64],
                        use_op_tables=True, op_tables=["moe_layer"], category_scale={c: 1.15 for c in FIT_CATEGORIES},
                        host=HostTerms(fixed_s=1e-3, graph_fixed_s=6e-4), overlap=0.3)
    cost = ProfiledStepCost(with_t, truth)
    pts = []
    for b in (1, 2, 4, 8, 16, 32, 64):
        ctx = np.full(b, 1000, np.int64)
        fwd = float(cost.graph_categories(ctx, b, logits=False) @ cost.k)
        p = StepPoint(num_layers=5, decode_ctx=[1000] * b, prefill=[], wall_s=1.0, graph_bs=b, forward_s=fwd)
        pts.append(p.model_copy(update={"wall_s": cost.point_time(p)}))
    for q in (256, 1024, 2048, 4096):
        for d in (0, 8):
            p = StepPoint(num_layers=5, decode_ctx=[1000] * d, prefill=[(q, 0)], wall_s=1.0)
            pts.append(p.model_copy(update={"wall_s": cost.point_time(p)}))
    stored = base.model_copy(update={"op_points": op_points, "step": truth.model_copy(update={"points": pts, "op_tables": []})})
    assert "moe_layer" not in stored.tables
    back = refit_profile(stored, "auto")
    st = back.step
    assert back.tables["moe_layer"].matches(**V3) and "moe_layer" in st.op_tables
    assert st.category_scale["expert_gemm"] == pytest.approx(1.15, rel=1e-3) == st.category_scale["dense_gemm"]
    assert st.fit.mape < 0.01


def test_a_bad_stored_table_names_its_own_fields_only(tmp_path):
    """Each stored table is parsed as the kind its fields say: a malformed MoE table's error is about that table, and
    every kind round-trips as itself."""
    from costmodels.calibration import EffTable, PrefillChunkTable
    base = CalibrationProfile.default()
    chunk = PrefillChunkTable(new=[128, 1024, 128, 1024], cached=[0, 0, 4096, 4096], seconds=[1e-4, 1e-3, 1e-3, 4e-3],
                              heads=128, d_qk=192, d_v=128)
    prof = base.model_copy(update={"tables": {**base.tables, "moe_layer": table(), "attn_prefill_chunk": chunk}})
    path = tmp_path / "p.json"
    prof.save(path)
    back = CalibrationProfile.load(path)
    assert isinstance(back.tables["moe_layer"], MoELayerTable) and isinstance(back.tables["attn_prefill_chunk"], PrefillChunkTable)
    assert all(isinstance(t, EffTable) for k, t in back.tables.items() if k not in ("moe_layer", "attn_prefill_chunk"))
    data = prof.model_dump(mode="json")
    data["tables"]["moe_layer"]["seconds"] = data["tables"]["moe_layer"]["seconds"][:-1]
    with pytest.raises(ValidationError) as e:
        CalibrationProfile.model_validate(data)
    msg = str(e.value)
    assert "tokens has 6 points but seconds has 5" in msg and "PrefillChunkTable" not in msg and "EffTable" not in msg


def test_a_points_own_routing_draw_sets_its_time_per_expert():
    """With each measured count's distinct experts recorded (``touched``, one random routing each), the table prices
    seconds per expert that draw touched, times the experts a count touches on average: a draw that touched 7% more
    experts than the expectation does not read as a 7% slower kernel (H100 run 51: per expected expert the table
    zigzagged 14.7-16.6 us from 10 to 33 tokens, per touched expert it falls smoothly 15.9 -> 15.2 us)."""
    e = lambda n: 256 * (1 - (1 - 8 / 256) ** n)                      # noqa: E731
    toks = [1, 8, 12, 17, 64]
    per = {1: 25.5e-6, 8: 16.2e-6, 12: 15.5e-6, 17: 15.6e-6, 64: 15.3e-6}   # seconds per touched expert, smooth
    drawn = {1: 8, 8: 55, 12: 87, 17: 101, 64: 221}                         # one draw's distinct experts
    sec = [per[n] * drawn[n] for n in toks]
    t = MoELayerTable(tokens=toks, seconds=sec, touched=[drawn[n] for n in toks], **V3)
    got, ext = t([12, 17, 40])
    assert got[0] == pytest.approx(per[12] * e(12)) and got[1] == pytest.approx(per[17] * e(17)) and not ext.any()
    f = np.log(40 / 17) / np.log(64 / 17)
    assert got[2] == pytest.approx(e(40) * per[17] ** (1 - f) * per[64] ** f)
    # without the draws: per expected expert, the 12-token draw (87 of 81 expected) reads 7% slow
    plain, _ = MoELayerTable(tokens=toks, seconds=sec, **V3)([12])
    assert plain[0] == pytest.approx(sec[2]) and plain[0] > 1.06 * got[0]
    # built from a calibration's points that record the draw; any point without it: the expectation for all
    pts = [{"op": "moe_experts", "tokens": n, "device_s": s, "touched": drawn[n], "top_k": 8, "experts": 256,
            "hidden": 7168, "intermediate": 2048, "weight_dtype": "fp8"} for n, s in zip(toks, sec)]
    assert moe_layer_table(pts).touched == [float(drawn[n]) for n in toks]
    assert moe_layer_table([{k: v for k, v in p.items() if k != "touched" or p["tokens"] != 12} for p in pts]).touched is None
    with pytest.raises(ValidationError, match="touched"):
        MoELayerTable(tokens=toks, seconds=sec, touched=[8, 55], **V3)
    with pytest.raises(ValidationError, match="touched"):
        MoELayerTable(tokens=toks, seconds=sec, touched=[8, 55, 87, 101, 300], **V3)
