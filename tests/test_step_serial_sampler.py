"""Two measured terms of the executor twin's step model (issue 16): the sampler (and the logits GEMM) from its own
table, priced as measured outside the fitted scales, and the serial host of a step that is not a decode-graph replay
(wall less forward less sampler, measured on the calibration's eager points), added to max(host, device). CPU only,
synthetic points with planted truths."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from costmodels.calibration import CalibrationProfile, SampleTable, sample_table
from costmodels.hardware import get_hardware
from costmodels.profiled import ProfiledStepCost, point_sample_s
from costmodels.step_fit import fit_serial, fit_step_profile
from costmodels.step_profile import FIT_CATEGORIES, HostTerms, StepPoint, StepProfile

VOCAB = 129280   # deepseek-v3's


def _points(logits: bool = True):
    return [{"op": "sample", "batch": b, "vocab": VOCAB, "time_s": 2.5e-4 + 4e-6 * b, "backend": "torch",
             **({"with_logits": True} if logits else {})} for b in (1, 32, 128)]


def test_sample_table_lookup_extrapolation_and_errors():
    t = sample_table(_points())
    assert t.includes_logits and "logits GEMM" in t.x_is
    sec, ext = t([0, 1, 16, 128, 256])
    assert sec[0] == 0 and not ext[0]
    assert sec[1:4] == pytest.approx([2.54e-4, 2.5e-4 + 4e-6 * 16, 2.5e-4 + 4e-6 * 128]) and not ext[1:4].any()
    assert sec[4] == pytest.approx(2.5e-4 + 4e-6 * 256) and ext[4]      # on along the last segment, flagged
    assert not sample_table(_points(logits=False)).includes_logits
    assert sample_table(_points()[:1]) is None                          # one batch size: no table
    with pytest.raises(ValidationError, match="batch has 2 points but seconds has 3"):
        SampleTable(batch=[1, 2], seconds=[1e-4, 2e-4, 3e-4], vocab=VOCAB)
    with pytest.raises(ValidationError, match="distinct"):
        SampleTable(batch=[1, 1], seconds=[1e-4, 2e-4], vocab=VOCAB)
    # a stored profile keeps it as a sample table (the tables union tells the kinds apart by their fields)
    prof = CalibrationProfile.default(get_hardware("H200")).model_copy(update={"tables": {"sample": t}})
    back = CalibrationProfile.model_validate_json(prof.model_dump_json())
    assert isinstance(back.tables["sample"], SampleTable) and back.tables["sample"].includes_logits


def _profile(logits: bool = True) -> CalibrationProfile:
    return CalibrationProfile.default(get_hardware("H200")).model_copy(update={"tables": {"sample": sample_table(_points(logits))}})


def _step(**kw) -> StepProfile:
    return StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", use_op_tables=True, **kw)


def test_the_table_replaces_the_analytic_sampler_and_the_logits_gemm():
    dec = dict(decode_context_lens=np.array([200] * 8), draft_len=0, prefill_new=[], prefill_ctx=[])
    without = ProfiledStepCost(_profile(), _step())                  # the table is not among the step's op tables
    with_ = ProfiledStepCost(_profile(), _step(op_tables=["sample"]))
    sampler_only = ProfiledStepCost(_profile(logits=False), _step(op_tables=["sample"]))
    assert without.sample is None and with_.sample is not None
    t_tab = 2.5e-4 + 4e-6 * 8
    # the categories lose the logits GEMM and the sampling row; the step gains the table's time, unscaled
    cats = with_.category_times(np.ones(8, np.int64), np.full(8, 200), np.ones(8, bool))
    h = float(with_.step.host(4, 8, 8, 0))
    assert with_.chunked_step_time(**dec) == pytest.approx(float(with_.step.combine(h, float(cats @ with_.k) + t_tab)))
    dense = FIT_CATEGORIES.index("dense_gemm")
    c_with = with_.category_times(np.ones(8, np.int64), np.full(8, 200), np.ones(8, bool))
    c_smp = sampler_only.category_times(np.ones(8, np.int64), np.full(8, 200), np.ones(8, bool))
    c_none = without.category_times(np.ones(8, np.int64), np.full(8, 200), np.ones(8, bool))
    assert c_with[dense] < c_smp[dense] == pytest.approx(c_none[dense])   # logits GEMM gone only when the table timed it
    p = StepPoint(num_layers=4, decode_ctx=[200] * 8, prefill=[(300, 0)], wall_s=1.0)
    assert point_sample_s(with_, p) == pytest.approx(2.5e-4 + 4e-6 * 9)   # 8 decodes + one chunk's last token


def test_serial_host_is_added_to_eager_steps_only():
    st = _step(graph_sizes=[8], host=HostTerms(fixed_s=1e-3, graph_fixed_s=2e-4, serial_s=5e-4, serial_per_request_s=1e-5,
                                               serial_per_prefill_s=3e-5, serial_per_token_s=1e-7))
    base = _step(graph_sizes=[8], host=HostTerms(fixed_s=1e-3, graph_fixed_s=2e-4))
    a, b = ProfiledStepCost(_profile(), st), ProfiledStepCost(_profile(), base)
    mixed = dict(decode_context_lens=np.array([200] * 4), draft_len=0, prefill_new=[256], prefill_ctx=[0])
    assert a.chunked_step_time(**mixed) - b.chunked_step_time(**mixed) == pytest.approx(5e-4 + 5 * 1e-5 + 3e-5 + 256 * 1e-7)
    graph = dict(decode_context_lens=np.array([200] * 8), draft_len=0, prefill_new=[], prefill_ctx=[])
    assert a.chunked_step_time(**graph) == pytest.approx(b.chunked_step_time(**graph))   # a graph replay: its own host


def test_fit_measures_the_serial_host_and_recovers_a_planted_step_model():
    prof = _profile()
    truth = _step(op_tables=["sample"], graph_sizes=[1, 2, 4, 8, 16],
                  category_scale=dict(zip(FIT_CATEGORIES, (1.15, 1.0, 1.15, 1.15, 1.15))),
                  host=HostTerms(fixed_s=4e-3, per_prefill_s=2e-4, graph_fixed_s=3e-4, graph_per_request_s=5e-6,
                                 graph_per_kv_token_s=1e-9, serial_s=6e-4, serial_per_request_s=8e-6,
                                 serial_per_prefill_s=5e-5, serial_per_token_s=1.2e-7), overlap=0.2)
    cost = ProfiledStepCost(prof, truth)
    pts = []
    for q in (64, 256, 1024, 3000):
        for d in (0, 3, 12):
            p = StepPoint(num_layers=4, decode_ctx=[500] * d, prefill=[(q, 0)] * (1 + (q == 64)), wall_s=1.0)
            wall = cost.point_time(p)
            serial = float(truth.host.serial(p.num_requests, len(p.prefill), sum(n for n, _ in p.prefill)))
            pts.append(p.model_copy(update={"wall_s": wall, "forward_s": wall - serial - point_sample_s(cost, p)}))
    pts += [StepPoint(num_layers=4, decode_ctx=[c] * b, prefill=[], wall_s=1.0, graph_bs=g)
            for b, g in ((1, 1), (2, 2), (3, 4), (7, 8), (12, 16)) for c in (300, 4000)]
    pts = [p if not p.graph_bs else p.model_copy(update={"wall_s": cost.point_time(p)}) for p in pts]
    serial = fit_serial(pts, np.array([point_sample_s(cost, p) for p in pts]))
    # per prefill token too: the chunk's ids, positions and KV slots built on the host (H200 runs 14-17: 96-141 ns)
    assert serial == pytest.approx({"serial_s": 6e-4, "serial_per_request_s": 8e-6, "serial_per_prefill_s": 5e-5,
                                    "serial_per_token_s": 1.2e-7}, rel=1e-6)
    st = fit_step_profile(prof.model_copy(update={"op_points": []}), pts, model="deepseek-v3", dtype="fp8", device="cuda",
                          graph_sizes=[1, 2, 4, 8, 16], scale_bounds=None)
    assert st.host.serial_s == pytest.approx(6e-4, rel=1e-6) and "sample" in st.op_tables
    assert st.fit.mape < 0.01
    # the graph steps' host: per sequence and per context token of the batch (block tables) told apart
    assert st.host.graph_per_kv_token_s == pytest.approx(1e-9, rel=0.05)
    assert st.host.graph_per_request_s == pytest.approx(5e-6, rel=0.05)
    # fewer than eight eager points that timed their forward: no serial term (older profiles predict as before)
    few = [p.model_copy(update={"forward_s": None}) if i > 3 and not p.graph_bs else p for i, p in enumerate(pts)]
    assert fit_serial(few, np.zeros(len(few))) == {}


def test_a_stored_profile_without_the_new_terms_predicts_as_before():
    """The run 7 H200 profile (no sampler table, no serial or per-context host terms; the committed one until
    2026-12-03) predicts exactly what it did before those terms existed (values from 21e0d9c's code on the same file)."""
    from pathlib import Path

    prof = CalibrationProfile.load(Path(__file__).parents[1] / "profiles/h200/calibration_deepseek-v3-5layers_fp8_run7.json")
    c = ProfiledStepCost(prof)
    shapes = [([], [512], [0]), ([300] * 8, [], []), ([1000] * 64, [], []), ([800] * 4, [256], [0]),
              ([2000] * 16, [2048], [4096]), ([500] * 3, [64, 64], [0, 1000])]
    before = [0.02666791279510296, 0.006073486165555151, 0.01154321574162746, 0.025211829838034973,
              0.06518856658601348, 0.024496631264521014]
    got = [c.chunked_step_time(np.array(d, np.int64), 0, n, cc) for d, n, cc in shapes]
    assert got == pytest.approx(before, rel=1e-12)
    assert list(c.decode_times(np.full(12, 700.0), 3)) == pytest.approx(
        [0.007031215113451348, 0.007031261579237575, 0.0070313080450238015], rel=1e-12)


def test_a_pipelined_loop_hides_the_sampler_host_part_where_its_device_work_was_timed_apart():
    """The sampler's eager seconds (launches, per-row generator draws, the device work) add up in a synchronous step;
    a pipelined loop issues them under the device, so only the device work (``device_s``, timed behind a spin kernel)
    lengthens a device-bound step: H200 run 23's decode steps ran 2-6% under the all-device rule."""
    pts = _points()
    for p in pts:
        p["device_s"] = 0.6 * p["time_s"]
    t = sample_table(pts)
    assert t.device_seconds == pytest.approx([0.6 * p["time_s"] for p in pts])
    assert t.device([32])[0] == pytest.approx(0.6 * t([32])[0][0])
    assert sample_table(_points()).device([32]) is None                 # not timed apart: no split
    with pytest.raises(ValidationError, match="at most its eager seconds"):
        SampleTable(batch=[1, 2], seconds=[1e-4, 2e-4], device_seconds=[2e-4, 2e-4], vocab=VOCAB)
    prof_split = CalibrationProfile.default(get_hardware("H200")).model_copy(update={"tables": {"sample": t}})
    st = _step(op_tables=["sample"], graph_sizes=[8], host=HostTerms(fixed_s=1e-3, graph_fixed_s=2e-5))
    split, whole = ProfiledStepCost(prof_split, st), ProfiledStepCost(_profile(), st)
    graph = dict(decode_context_lens=np.array([200] * 8), draft_len=0, prefill_new=[], prefill_ctx=[])
    t8 = 2.5e-4 + 4e-6 * 8
    assert split.chunked_step_time(**graph) == pytest.approx(whole.chunked_step_time(**graph))       # synchronous: same
    ps, pw = split.pipelined(), whole.pipelined()
    assert ps.sample_split(8) == pytest.approx((0.6 * t8, 0.4 * t8)) and pw.sample_split(8) == pytest.approx((t8, 0.0))
    # device-bound (the host is 20 us plus the loop): the step is shorter by the sampler's host part
    assert pw.chunked_step_time(**graph) - ps.chunked_step_time(**graph) == pytest.approx(0.4 * t8)
    assert float(pw.decode_times(np.array([200] * 8), 1)[0] - ps.decode_times(np.array([200] * 8), 1)[0]) == pytest.approx(0.4 * t8)
