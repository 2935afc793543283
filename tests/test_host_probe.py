"""The host probe (executor/host_probe.py): a fixed decode step's input build timed, median seconds; bad sizes refused;
validate's ratio to the calibration's probes, and None for profiles that recorded none."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")


def test_host_probe_times_a_fixed_input_build():
    from executor.calibrate import build_engine
    from executor.host_probe import host_probe
    e = build_engine("tiny", None, "cpu", "fp32", 4, 256, num_kv_blocks=32)
    t = host_probe(e.runner, batch=8, ctx=100, repeats=20)
    assert 0 < t < 0.5
    with pytest.raises(ValueError, match="batch, ctx and repeats"):
        host_probe(e.runner, batch=0)


def test_probe_against_the_calibration():
    from ui.cmd_validate import probe_vs_calibration
    prof = SimpleNamespace(provenance={"host_probe_s": {"start": 1e-4, "after_grid": 2e-4, "end": 3e-4}})
    assert probe_vs_calibration([2e-4, 3e-4], prof) == [0.0, 0.5]
    assert probe_vs_calibration([2e-4], SimpleNamespace(provenance={})) is None


def test_validate_prints_the_probe_beside_the_host_drift():
    from rich.console import Console

    from ui.cmd_validate import _print_level
    figs = {"output_throughput": 100.0, "tpot_p50": 0.01}
    lv = SimpleNamespace(name="knee", rate_rps=2.0, fraction_of_capacity=0.8, requests=10, runs=[figs, figs], rel_error={},
                         measured=figs, predicted=figs, spread={}, step={},
                         diagnostics={"decode_host_vs_calibration": [0.1, -0.05], "host_probe_vs_calibration": [0.12, -0.031]})
    con = Console(record=True, width=200)
    _print_level(con, lv)
    text = con.export_text()
    assert "decode host vs calibration" in text and "+10.0% / -5.0%" in text
    assert "host probe vs calibration" in text and "+12.0% / -3.1%" in text
