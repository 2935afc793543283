"""``twinfer validate``: a missing profile or bad --levels is the user's error (TwinferError: exit 2, one line), found
before the executor is built (minutes on a GPU), not an internal error after it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from twinfer.errors import TwinferError
from ui.cli import app
from ui.cmd_validate import parse_levels

PROF = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")


def test_parse_levels():
    assert parse_levels("0.3,0.8,2.0") == [0.3, 0.8, 2.0]
    for bad in ("a,b", "", "0,1", "-1", "0.5,x"):
        with pytest.raises(TwinferError, match=r"--levels .*comma-separated finite positive fractions"):
            parse_levels(bad)


def test_parse_levels_refuses_infinite_fractions():
    """'inf' made an infinite arrival rate and wrote rate_rps: Infinity into the report (not JSON)."""
    for bad in ("inf", "0.3,inf", "Infinity"):
        with pytest.raises(TwinferError, match=r"--levels .*comma-separated finite positive fractions"):
            parse_levels(bad)


def test_missing_profile_is_refused_before_the_engine_is_built(tmp_path, monkeypatch):
    import executor.calibrate as cal

    def no_build(*a, **k):
        raise AssertionError("engine built before the profile was checked")

    monkeypatch.setattr(cal, "build_engine", no_build)
    r = CliRunner().invoke(app, ["validate", "--profile", str(tmp_path / "missing.json")])
    assert isinstance(r.exception, TwinferError), r.output
    assert "--profile" in str(r.exception) and "no such file" in str(r.exception)


def test_max_model_len_beyond_what_the_engine_holds_is_refused(monkeypatch, tmp_path):
    """tiny's context is 4096 tokens: the engine capped --max-model-len 8192 to it and dropped every longer request
    the simulator served (measured 0 tok/s against a prediction, exit 0). Refused before any replay (the profile
    relabelled as tiny's: validate refuses a model its profile did not measure)."""
    import ui.cmd_validate as cv
    from costmodels.calibration import CalibrationProfile

    prof = CalibrationProfile.load(PROF)
    tiny = tmp_path / "tiny.json"
    prof.model_copy(update={"step": prof.step.model_copy(update={"model": "tiny"})}).save(tiny)

    def no_replay(*a, **k):
        raise AssertionError("replayed with requests the engine cannot hold")

    monkeypatch.setattr(cv, "run_levels", no_replay)
    r = CliRunner().invoke(app, ["validate", "-m", "tiny", "--profile", str(tiny), "--max-model-len", "8192", "-n", "2",
                                 "--levels", "1", "--no-warm"])
    assert isinstance(r.exception, TwinferError), r.output
    # the engine refuses it, as vLLM does (it capped it without a word)
    assert "max_model_len: 8,192 is past tiny's context of 4,096" in str(r.exception), str(r.exception)


def test_scheduler_limits_out_of_range_name_the_field():
    """--max-model-len past SchedulerConfig's bound was a pydantic ValidationError: an 'internal error' (exit 1)."""
    r = CliRunner().invoke(app, ["validate", "--profile", PROF, "--sim-only", "--max-model-len", "100000000"])
    assert isinstance(r.exception, TwinferError), r.output
    assert "max_model_len" in str(r.exception) and "16777216" in str(r.exception)


def test_out_in_a_missing_folder_is_refused_before_the_run(tmp_path, monkeypatch):
    """-o in a folder that does not exist failed only after every level had run (minutes to hours on the executor)."""
    import ui.cmd_validate as cv

    def no_run(*a, **k):
        raise AssertionError("ran before --out was checked")

    monkeypatch.setattr(cv, "run_levels", no_run)
    out = tmp_path / "missing" / "report.json"
    r = CliRunner().invoke(app, ["validate", "--profile", PROF, "--sim-only", "-o", str(out)])
    assert isinstance(r.exception, TwinferError), r.output
    assert f"--out {out}: no folder {out.parent}" in str(r.exception)


def test_bad_levels_through_the_command():
    r = CliRunner().invoke(app, ["validate", "--model", "deepseek-v3", "--profile", PROF, "--sim-only", "--levels", "a,b"])
    assert isinstance(r.exception, TwinferError) and "--levels 'a,b'" in str(r.exception)


def test_ctrl_c_says_what_was_kept(tmp_path, monkeypatch):
    """Ctrl-C during the levels: exit 130 and a line saying the printed levels stand and nothing was written."""
    import ui.cmd_validate as cv

    def cut(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cv, "run_levels", cut)
    prof = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
    out = tmp_path / "rep.json"
    r = CliRunner().invoke(app, ["validate", "--model", "deepseek-v3", "--num-layers", "5", "--profile", prof, "-n", "4", "--sim-only",
                                 "--out", str(out)], env={"COLUMNS": "200"})
    assert r.exit_code == 130 and "interrupted: the levels printed above are complete" in r.stderr and not out.exists()


def test_sim_only_validates_the_profiles_model_unless_told_otherwise(tmp_path):
    """--model defaulted to tiny: a --sim-only run on a DeepSeek-V3 profile printed 'validating tiny' and its report
    named tiny, though every figure was the profile's model's. Without --model it is the profile's, another is refused;
    with --calibrate (no profile yet) tiny."""
    import json

    out = tmp_path / "rep.json"
    r = CliRunner().invoke(app, ["validate", "--profile", PROF, "--sim-only", "-n", "4", "--levels", "0.5", "-o", str(out)],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "validating tiny" not in r.output
    assert json.loads(out.read_text())["model"] == "deepseek-v3"
    # another model's name over the profile's figures is refused (its report named tiny over DeepSeek-V3's figures)
    r = CliRunner().invoke(app, ["validate", "-m", "tiny", "--profile", PROF, "--sim-only", "-n", "4", "--levels", "0.5"],
                           env={"COLUMNS": "200"})
    assert isinstance(r.exception, TwinferError), r.output
    assert "--model tiny: --sim-only predicts the model the profile measured (deepseek-v3)" in str(r.exception)


def test_num_layers_past_the_models_depth_is_refused():
    """`validate --sim-only --num-layers 100000000` on a DeepSeek-V3 profile built a 100M-entry layer list (memory and
    time without bound); a model is cut to at most its own depth."""
    r = CliRunner().invoke(app, ["validate", "--profile", PROF, "--sim-only", "--num-layers", "100000000"])
    assert isinstance(r.exception, TwinferError), r.output   # exit 2 through the CLI's entry point
    assert "--num-layers 100000000: deepseek-v3 has 61 layers (give 1..61)" in str(r.exception)
