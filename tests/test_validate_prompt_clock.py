"""The clock a validation's prompt steps ran at against the clock the calibration grid timed its prompt shapes at:
the step model prices device work at the grid's clock, and a GPU at its power cap runs prompt steps lower (H200 run
44: summarize's knee at 1,721 MHz against the grid's 1,935, its prompt steps predicted 7.4% short)."""

from __future__ import annotations

from types import SimpleNamespace

from costmodels.step_profile import StepPoint, StepProfile


def _point(prefill, mhz):
    return StepPoint(num_layers=5, decode_ctx=[], prefill=prefill, wall_s=0.03, sm_clock_mhz=mhz)


def _profile(points):
    return StepProfile.model_construct(points=points)


def test_the_grids_prompt_clock_is_the_median_of_its_device_bound_prompt_points():
    pts = [_point([[4096, 0]], 1935.0), _point([[2048, 1024]], 1905.0), _point([[2048, 0]], 1980.0),
           _point([[128, 0]], 1500.0),                 # short prompts (host-bound) do not count
           _point([[4096, 0]], None)]                  # nor points without a clock reading
    assert _profile(pts).prompt_clock_mhz() == 1935.0
    assert _profile([_point([[128, 0]], 1980.0)]).prompt_clock_mhz() is None
    assert _profile([_point([[128, 0]], 1980.0)]).prompt_clock_mhz(min_tokens=64) == 1980.0


def test_validate_prints_the_prompt_steps_clock_against_the_grids():
    from rich.console import Console

    from ui.cmd_validate import _print_level
    figs = {"output_throughput": 100.0, "tpot_p50": 0.01}

    def text(diag):
        lv = SimpleNamespace(name="knee", rate_rps=2.0, fraction_of_capacity=0.8, requests=10, runs=[figs, figs],
                             rel_error={}, measured=figs, predicted=figs, spread={}, step={}, diagnostics=diag)
        con = Console(record=True, width=200)
        _print_level(con, lv)
        return con.export_text()

    out = text({"prompt_sm_clock_mhz": 1721.0, "prompt_sm_clock_samples": 12, "grid_prompt_sm_clock_mhz": 1935.0})
    assert "prompt steps' SM clock vs the grid's" in out and "1,721 vs 1,935 MHz (-11.1%)" in out
    assert "SM clock" not in text({"prompt_sm_clock_mhz": 1721.0, "grid_prompt_sm_clock_mhz": None})   # a CPU run: none
