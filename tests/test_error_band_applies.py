"""An error band only where a validation measured the same thing (issue 19)."""

from __future__ import annotations

import json

from sim.bands import applicable_band_line, mismatch
from sim.scenario import builtin_scenario


def test_full_model_analytic_run_gets_no_band_from_the_5_layer_twin():
    line = applicable_band_line("auto", builtin_scenario("default"))
    assert "no band" in line and "5 layers" in line and "61 layers" in line and "±" not in line


def test_a_report_applies_only_to_its_model_depth_dtype_and_profile(tmp_path):
    sc = builtin_scenario("default")
    head = {"model": "deepseek-v3", "num_layers": 61, "dtype": sc.layout.weight_dtype, "profile": "/x/cal_v3.json"}
    assert "analytic cost model" in mismatch(head, sc)
    cal = sc.model_copy(update={"calibration": str(tmp_path / "cal_v3.json")})
    assert mismatch(head, cal) == ""
    assert "5 layers" in mismatch({**head, "num_layers": 5}, cal)
    assert "other.json" in mismatch({**head, "profile": "other.json"}, cal)
    # a named file that does not apply says so instead of printing its band
    rep = tmp_path / "validation_x.json"
    rep.write_text(json.dumps({**head, "num_layers": 5, "levels": [], "device": "cuda"}))
    assert "no band" in applicable_band_line(str(rep), cal)
