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
