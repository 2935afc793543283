"""The measured key/value expansion of a prefill chunk (``MLAAttention.prefill_expand``: cached latents gathered and
up-projected by kv_b_proj) as a table over keys, and the step model pricing chunks' K/V up-projection from it in place
of the analytic BF16 GEMM (issue 16: H200 run 18's cached-context grid steps ran 0.91-0.96x the model)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from costmodels.calibration import CalibrationProfile, KvExpandTable, kv_expand_table
from costmodels.hardware import get_hardware
from costmodels.profiled import ProfiledStepCost
from costmodels.step_profile import FIT_CATEGORIES, StepProfile

V3 = dict(heads=128, d_nope=128, d_v=128, rank=512)
PTS = {512: 6.0e-5, 2048: 1.9e-4, 4096: 3.6e-4, 8192: 7.0e-4}


def table(**kw) -> KvExpandTable:
    return KvExpandTable(**{"keys": list(PTS), "seconds": list(PTS.values()), **V3, **kw})


def test_lookup_log_log_between_points_linear_beyond_and_flagged():
    t = table()
    sec, ext = t([512, 4096, 0])
    assert sec == pytest.approx([PTS[512], PTS[4096], 0.0]) and not ext.any()
    mid, ext = t([2896.3])       # the geometric middle of 2048 and 4096
    assert mid[0] == pytest.approx(np.sqrt(PTS[2048] * PTS[4096]), rel=1e-3) and not ext[0]
    far, ext = t([16384, 100])
    slope = (PTS[8192] - PTS[4096]) / 4096
    assert far[0] == pytest.approx(PTS[8192] + 8192 * slope) and ext[0]
    assert far[1] == pytest.approx(PTS[512]) and ext[1]            # below: the smallest point's time, flagged


@pytest.mark.parametrize("bad, says", [(dict(seconds=[1e-4] * 3), "one time per key count"),
                                       (dict(seconds=[0.0, 1e-4, 2e-4, 3e-4]), "> 0"),
                                       (dict(keys=[512, 512, 4096, 8192]), "distinct")])
def test_bad_tables_name_the_problem(bad, says):
    with pytest.raises(ValidationError, match=says):
        table(**bad)


def test_built_from_points_device_time_where_every_point_has_it_and_stored_in_a_profile(tmp_path):
    pts = [{"op": "kv_expand", "keys": k, **V3, "time_s": 2 * s, "device_s": s} for k, s in PTS.items()]
    t = kv_expand_table(pts + [{"op": "linear", "m": 4, "time_s": 1.0}])
    assert t.seconds == pytest.approx(list(PTS.values())) and t.matches(**V3) and not t.matches(**{**V3, "heads": 64})
    eager = kv_expand_table([{k: v for k, v in p.items() if k != "device_s"} for p in pts])
    assert eager.seconds == pytest.approx([2 * s for s in PTS.values()]) and "eager" in eager.x_is
    assert kv_expand_table(pts[:1]) is None
    prof = CalibrationProfile.default(get_hardware("H200")).model_copy(update={"tables": {"kv_expand": t}})
    path = tmp_path / "p.json"
    prof.save(path)
    back = CalibrationProfile.load(path).tables["kv_expand"]
    assert isinstance(back, KvExpandTable) and back.seconds == t.seconds


def _cost(with_table: bool) -> ProfiledStepCost:
    t = table()
    prof = CalibrationProfile.default(get_hardware("H200")).model_copy(update={"tables": {"kv_expand": t}})
    st = StepProfile(model="deepseek-v3", num_layers=5, dtype="fp8", use_op_tables=True,
                     op_tables=["kv_expand"] if with_table else ["sample"])
    return ProfiledStepCost(prof, st)


def test_the_step_model_prices_a_chunks_keys_from_the_table_and_leaves_decodes_alone():
    a, b = _cost(True), _cost(False)
    assert a.kv_expand is not None and b.kv_expand is None
    pa, dense = FIT_CATEGORIES.index("prefill_attention"), FIT_CATEGORIES.index("dense_gemm")
    new, ctx, dec = np.array([1, 1, 512]), np.array([900, 900, 4096 - 512]), np.array([True, True, False])
    ca, cb = a.category_times(new, ctx, dec), b.category_times(new, ctx, dec)
    # the chunk's 4096 keys: the table's seconds per layer x 5 layers, in prefill attention; the analytic GEMM over
    # those rows gone from the dense GEMMs (the decodes' absorbed projections stay)
    assert ca[pa] - cb[pa] == pytest.approx(5 * PTS[4096])
    assert ca[dense] < cb[dense]
    only_dec = (np.array([1, 1]), np.array([900, 900]), np.array([True, True]))
    assert a.category_times(*only_dec) == pytest.approx(b.category_times(*only_dec))
    # a table of another MLA shape is not used
    t = table(heads=64)
    prof = CalibrationProfile.default(get_hardware("H200")).model_copy(update={"tables": {"kv_expand": t}})
    st = StepProfile(model="deepseek-v3", num_layers=5, dtype="fp8", use_op_tables=True, op_tables=["kv_expand"])
    assert ProfiledStepCost(prof, st).kv_expand is None
