"""``twinfer tune --gpus N --calibration PROFILE`` (issue 23): a measured calibration profile prices the --gpus search
(its efficiencies, op tables and, where measured on --model, its replay grid), loaded as ``simulate --calibration``
loads it; the result and the plan name the file; bad files and --profile with it are refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from costmodels import replay_grid as G
from costmodels.calibration import CalibrationProfile
from costmodels.model_spec import ModelSpec
from ui.cli import app

GRID = Path(__file__).resolve().parents[1] / "benchmarks/gpu/issue23_h200/run_d1473e5/replay_grid.json"
# the model the committed grid was measured on (as tests/test_replay_grid_profile.py): 4 layers, window 128
BENCH = ModelSpec(name="replay-bench-llama8b-4l", family="llama", num_layers=4, hidden_size=4096, vocab_size=32000,
                  num_attention_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336, attention="gqa",
                  layer_kinds=["sliding", "sliding", "sliding", "full"], sliding_window=128, max_context=32768)
SMALL = ["--hw", "h200", "-g", "1", "--ep-widths", "1", "--async", "off", "--batch-per-rank", "16", "--chunk-tokens", "2048",
         "--sim-requests", "100", "--plan-requests", "200", "--rounds", "1"]


@pytest.fixture
def bench(tmp_path):
    """The bench model as a ModelSpec file and a calibration profile carrying the grid measured on it."""
    model, prof = tmp_path / "bench.json", tmp_path / "prof.json"
    model.write_text(BENCH.model_dump_json())
    G.attach(CalibrationProfile.default(), GRID, BENCH).save(prof)
    return model, prof


def _tune(args: list[str]) -> str:
    r = CliRunner().invoke(app, ["tune", *args], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    return " ".join(r.stdout.split())


def _priced_replay(text: str) -> str:
    """The replay line's priced prefill of the mean prompt: 'A ms -> B ms'."""
    return text.split("of the mean prompt")[1].split("cached) ")[1].split(";")[0]


def test_the_profiles_grid_prices_the_replay_and_the_result_and_plan_name_the_file(bench, tmp_path):
    model, prof = bench
    args = ["-m", str(model), *SMALL, "--replay-tokens", "0,64", "-w", "agentic"]
    plain = _tune(args)
    plan, out = tmp_path / "plan.yaml", tmp_path / "out.json"
    cal = _tune(args + ["--calibration", str(prof), "--plan-out", str(plan), "--out", str(out)])
    assert "priced prefill (measured replay grid)" in cal and "measured replay grid" not in plain
    assert _priced_replay(cal) != _priced_replay(plain)
    assert f"efficiencies from calibration profile {prof}" in cal
    assert f"replay: priced from the replay grid in {prof}" in cal and f"priced with calibration {prof}" in cal
    written = yaml.safe_load(plan.read_text())
    assert written["calibration"] == str(prof)
    assert any("measured replay grid" in line for line in written["why"])   # the plan's reasons priced off the grid
    doc = json.loads(out.read_text())
    assert doc["calibration"] == str(prof) and any("replay grid" in n for n in doc["calibration_notes"])


def test_a_grid_measured_on_another_model_is_said_not_to_apply(bench):
    _, prof = bench
    text = _tune(["-m", "tiny", *SMALL, "--calibration", str(prof)])
    assert f"the replay grid in {prof} does not apply (measured on replay-bench-llama8b-4l, not on tiny)" in text
    assert "efficiencies and op tables still apply" in text and "measured replay grid" not in text


@pytest.mark.parametrize("content, words", [
    (None, "no such file"),
    ('{"mem_eff": "x"}', "mem_eff: Input should be a valid number"),
    ("not json", "not valid JSON"),
    ("grid", "replay_grid: replay grid: no points"),
])
def test_a_missing_or_bad_profile_exits_2_naming_the_file_and_field(cli_exit_2, tmp_path, content, words):
    path = tmp_path / "cal.json"
    if content == "grid":   # a profile whose stored grid has no points
        CalibrationProfile.default().model_copy(update={"replay_grid": {"points": []}}).save(path)
    elif content is not None:
        path.write_text(content)
    err = cli_exit_2("tune", "-m", "tiny", *SMALL, "--calibration", str(path))
    assert f"--calibration: {path}: " in err and words in err, err


def test_profile_and_calibration_together_are_refused(cli_exit_2, bench):
    _, prof = bench
    err = cli_exit_2("tune", "-m", "tiny", "--profile", str(prof), "--calibration", str(prof))
    assert "--calibration and --profile: give one of them" in err


def test_help_names_the_option():
    r = CliRunner().invoke(app, ["tune", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "--calibration" in r.stdout and "replay grid" in " ".join(r.stdout.split())
