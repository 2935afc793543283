"""An error band only where a validation measured the same thing (issue 19)."""

from __future__ import annotations

import json
from pathlib import Path

from sim.bands import applicable_band_line, mismatch
from sim.scenario import builtin_scenario


def test_full_model_analytic_run_gets_no_band_from_the_5_layer_twin():
    line = applicable_band_line("auto", builtin_scenario("default"))
    assert "no band" in line and "5 layers" in line and "61 layers" in line and "±" not in line


def _one_gpu(sc, async_overlap: bool = True):
    """``sc`` on one GPU, one instance (what `twinfer validate` runs), with the validated loop."""
    return sc.model_copy(update={"layout": sc.layout.model_copy(update={"tp": 1, "dp": 1, "ep": 1, "pp": 1}), "instances": 1,
                                 "scheduler": sc.scheduler.model_copy(update={"async_overlap": async_overlap, "draft_len": 0})})


def test_a_report_applies_only_to_its_model_depth_dtype_and_profile(tmp_path):
    sc = _one_gpu(builtin_scenario("default"))
    head = {"model": "deepseek-v3", "num_layers": 61, "dtype": sc.layout.weight_dtype, "profile": "/x/cal_v3.json"}
    assert "analytic cost model" in mismatch(head, sc)
    cal = sc.model_copy(update={"calibration": str(tmp_path / "cal_v3.json")})
    assert mismatch(head, cal) == ""
    assert "5 layers" in mismatch({**head, "num_layers": 5}, cal)
    assert "other.json" in mismatch({**head, "profile": "other.json"}, cal)
    # and only to what `twinfer validate` ran: one instance on one GPU, its loop, no MTP drafting
    full = builtin_scenario("default").model_copy(update={"calibration": str(tmp_path / "cal_v3.json")})
    assert "one instance on one GPU, this run is 1 instance(s) of 8 GPU(s) (tp 8" in mismatch(head, full)
    assert "this run is 4 instance(s)" in mismatch(head, cal.model_copy(update={"instances": 4}))
    ran = {**head, "scheduler": {"async_overlap": True, "draft_len": 0}}
    assert mismatch(ran, cal) == ""
    assert "async overlap True, this run has False" in mismatch(ran, _one_gpu(cal, async_overlap=False))
    mtp = cal.model_copy(update={"scheduler": cal.scheduler.model_copy(update={"draft_len": 2})})
    assert "MTP draft length 0, this run has 2" in mismatch(ran, mtp)
    # a named file that does not apply says so instead of printing its band
    rep = tmp_path / "validation_x.json"
    rep.write_text(json.dumps({**head, "num_layers": 5, "levels": [], "device": "cuda"}))
    assert "no band" in applicable_band_line(str(rep), cal)


def _report(path, created: str, tpot: float, head: dict):
    base = json.loads((Path(__file__).resolve().parents[1] / "profiles/h200/validation_deepseek-v3-5layers_fp8.json").read_text())
    base.update(head, created=created, bands={**base["bands"], "tpot_p50": tpot})
    path.write_text(json.dumps(base))
    return path


def test_every_applicable_report_counts_and_the_newest_is_by_date(tmp_path, monkeypatch):
    """A validation matrix writes one report per workload class: the band a simulation prints is the largest over
    every report that applies (the worst class sets it), and 'newest' is the latest ``created``, not the last name."""
    import sim.bands as bands
    from sim.validate import band_text, find_reports

    head = {"model": "deepseek-v3", "num_layers": 61, "dtype": "fp8", "profile": "/x/cal_v3.json"}
    base = json.loads((Path(__file__).resolve().parents[1] / "profiles/h200/validation_deepseek-v3-5layers_fp8.json").read_text())
    sc = _one_gpu(builtin_scenario("default"), async_overlap=base["scheduler"]["async_overlap"])
    assert sc.layout.weight_dtype == "fp8"
    d = tmp_path / "h200"
    d.mkdir()
    old = _report(d / "validation_run9_chat.json", "2026-11-29T14:00:00+00:00", 0.04, head)
    new = _report(d / "validation_run18_agentic.json", "2026-12-03T03:17:00+00:00", 0.075, head)
    assert find_reports("H200", tmp_path) == [new, old]
    # offsets compare as instants, an absent date sorts oldest
    east = _report(d / "validation_a.json", "2026-12-03T05:00:00+03:00", 0.05, head)    # 02:00 UTC: before run18
    none = _report(d / "validation_z.json", None, 0.05, head)
    assert find_reports("H200", tmp_path) == [new, east, old, none]
    east.unlink()
    none.unlink()
    monkeypatch.setattr(bands, "find_reports", lambda hw: find_reports(hw, tmp_path))
    cal = sc.model_copy(update={"calibration": str(tmp_path / "cal_v3.json")})
    line = bands.applicable_band_line("auto", cal)
    assert "largest over 2 reports, newest validation_run18_agentic.json" in line
    assert f"TPOT p50 {band_text({'tpot_p50': 0.075}, 'tpot_p50')}" in line


def _five_layer_model(tmp_path) -> str:
    """deepseek-v3 cut to the 5 layers `twinfer validate` measured, as a user writes it (a ModelSpec YAML)."""
    import yaml

    from costmodels.catalog import get_model

    path = tmp_path / "dsv3_5layers.yaml"
    path.write_text(yaml.safe_dump(get_model("deepseek-v3").model_copy(update={"num_layers": 5}).model_dump(mode="json")))
    return str(path)


def test_committed_h100_reports_band_the_h100_profile_and_only_it(tmp_path):
    """profiles/h100 holds runs 45-51's per-class reports (seven H100 boards) and run 50's profile: a 5-layer H100 run
    priced by that profile prints the largest error over all of them; the same run priced by the H200's profile (same
    file name) gets no band, and the reason names both GPUs."""
    from sim.validate import PROFILES, band_text, find_reports, load_bands

    reports = find_reports("H100")
    assert len(reports) >= 11 and all("H100" in load_bands(p)[1] for p in reports)
    sc = _one_gpu(builtin_scenario("default")).model_copy(update={"model": _five_layer_model(tmp_path), "hardware": "H100"})
    mine = sc.model_copy(update={"calibration": str(PROFILES / "h100" / "calibration_deepseek-v3-5layers_fp8.json")})
    line = applicable_band_line("auto", mine)
    assert f"largest over {len(reports)} reports" in line and "H100" in line
    for key, label in (("tpot_p50", "TPOT p50"), ("ttft_p50", "TTFT p50"), ("output_throughput", "throughput")):
        assert f"{label} {band_text({key: max(load_bands(p)[0][key] for p in reports)}, key)}" in line
    other = sc.model_copy(update={"calibration": str(PROFILES / "h200" / "calibration_deepseek-v3-5layers_fp8.json")})
    line = applicable_band_line("auto", other)
    assert "no band" in line and "±" not in line
    assert "measured on NVIDIA H100 80GB HBM3" in line and "was measured on NVIDIA H200" in line
    # and the H200's reports still band the H200's profile on an H200
    h200 = other.model_copy(update={"hardware": "H200"})
    assert "largest over" in applicable_band_line("auto", h200)
