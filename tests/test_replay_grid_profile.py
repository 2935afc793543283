"""A measured replay grid reaches real use (issue 23): stored in a calibration profile (``twinfer calibrate
--replay-grid``), read by ``replay_grid.for_profile``, and priced by tune's replay explanation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from costmodels import replay_grid as G
from costmodels.calibration import CalibrationProfile
from costmodels.model_spec import ModelSpec
from planner.tune_explain import why_replay
from planner.tune_policies import Policy, Run, TuneSpace, make_context
from sim.workload import preset

GRID = Path(__file__).resolve().parents[1] / "benchmarks/gpu/issue23_h200/run_d1473e5/replay_grid.json"
# the model the committed grid was measured on (benchmarks/gpu/replay_bench.py): no catalog model has its layers
BENCH = ModelSpec(name="replay-bench-llama8b-4l", family="llama", num_layers=4, hidden_size=4096, vocab_size=32000,
                  num_attention_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336, attention="gqa",
                  layer_kinds=["sliding", "sliding", "sliding", "full"], sliding_window=128, max_context=32768)


def test_a_profile_round_trips_with_and_without_a_grid(tmp_path):
    plain = CalibrationProfile.default()
    assert plain.replay_grid is None and G.for_profile(plain) is None
    plain.save(tmp_path / "plain.json")
    assert CalibrationProfile.load(tmp_path / "plain.json").model_dump() == plain.model_dump()
    withg = G.attach(plain, GRID, BENCH)
    withg.save(tmp_path / "grid.json")
    back = CalibrationProfile.load(tmp_path / "grid.json")
    assert back.model_dump() == withg.model_dump() and back.replay_grid == json.loads(GRID.read_text())
    grid = G.for_profile(back)
    assert grid.matches(BENCH) and grid.keys() == G.load(GRID).keys()


def test_attach_refuses_a_file_that_is_not_a_grid_or_another_models(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"points": []}')
    with pytest.raises(G.GridError, match="no points"):
        G.attach(CalibrationProfile.default(), bad, BENCH)
    other = BENCH.model_copy(update={"name": "other", "sliding_window": 256})
    with pytest.raises(G.GridError, match="measured on replay-bench-llama8b-4l.*not on 'other'"):
        G.attach(CalibrationProfile.default(), GRID, other)


@pytest.mark.parametrize("content, words", [('[1, 2]', "a JSON object"), ('{"points": [{"kind": "embed"}]}', "needs kind, rows"),
                                            (None, "not on 'tiny'")])
def test_calibrate_replay_grid_gives_one_line_and_exit_2(tmp_path, content, words):
    from ui.cli import app

    path = GRID
    if content is not None:
        path = tmp_path / "g.json"
        path.write_text(content)
    r = CliRunner().invoke(app, ["calibrate", "--model", "tiny", "--out", str(tmp_path / "p.json"), "--replay-grid", str(path)])
    assert r.exit_code != 0 and not (tmp_path / "p.json").exists()   # refused before measuring
    err = str(r.exception)
    assert err.startswith("--replay-grid: ") and str(path) in err and words in err and "\n" not in err
    # the console script maps it to exit 2 (ui.cli.main: TwinferError)
    from twinfer.errors import TwinferError
    assert isinstance(r.exception, TwinferError)


def test_why_replay_prices_the_prefill_off_the_profiles_grid(tmp_path):
    model = tmp_path / "bench.json"
    model.write_text(BENCH.model_dump_json())
    prof = tmp_path / "prof.json"
    G.attach(CalibrationProfile.default(), GRID, BENCH).save(prof)
    wl = preset("chat", num_requests=300)
    space = TuneSpace(ep_widths=(1,), batch_per_rank=(16,), chunk_tokens=(2048,))
    pols = [Policy(1, False, w, "all", 16, 2048) for w in (0, 64)]
    runs = [Run(p) for p in pols]
    lines = {}
    for name, cal in (("analytic", None), ("grid", str(prof))):
        ctx = make_context(str(model), "h200", 1, wl, space, calibration=cal)
        lines[name] = why_replay(ctx, *runs)
    assert "measured replay grid" in lines["grid"] and "measured replay grid" not in lines["analytic"]
    priced = {k: v.split("cached) ")[1].split(";")[0] for k, v in lines.items()}
    assert priced["grid"] != priced["analytic"]
    # a grid measured on another model is not applied to this one: the analytic figure stays
    other = BENCH.model_copy(update={"name": "bench-w256", "sliding_window": 256})
    model.write_text(other.model_dump_json())
    ctx = make_context(str(model), "h200", 1, wl, space, calibration=str(prof))
    assert "measured replay grid" not in why_replay(ctx, *runs)


def test_the_simulators_depth_correction_takes_the_grid_from_a_stored_profile(tmp_path):
    # the path simulate --calibration takes (sim/runner.py): profile_for(file) -> depth_correction
    from costmodels.calibration_source import profile_for
    from costmodels.hardware import get_hardware
    from costmodels.layout import ParallelLayout
    from costmodels.replay import LayerReplay, ReplayPolicy, depth_correction

    hw, lay = get_hardware("h200"), ParallelLayout(tp=1, weight_dtype="bf16", kv_dtype="bf16")
    rep = ReplayPolicy(default=LayerReplay(mode="replay", tokens=64)).resolve(BENCH)
    prof = tmp_path / "prof.json"
    G.attach(CalibrationProfile.default(), GRID, BENCH).save(prof)
    on, off = (depth_correction(BENCH, hw, lay, profile_for(hw, p), rep) for p in (prof, None))
    assert on is not None and on.grid is not None and on.grid.keys() == G.load(GRID).keys()
    assert off.grid is None


def test_the_console_script_exits_2_with_one_line_naming_the_flag(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "ui.cli", "calibrate", "-m", "tiny", "-o", str(out), "--replay-grid", str(GRID)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and not out.exists()
    assert f"--replay-grid: replay grid {GRID} was measured on replay-bench-llama8b-4l" in " ".join(r.stderr.split())


def test_calibrate_stores_a_matching_grid_in_the_profile_it_writes(tmp_path):
    # the committed grid's points relabelled as measured on the tiny model's layers (no window, no widths named)
    from costmodels.catalog import get_model
    from ui.cli import app

    d = json.loads(GRID.read_text())
    d.update(layers=["full"] * get_model("tiny").num_layers, window=None, model={"name": "tiny-relabelled"})
    g, out = tmp_path / "g.json", tmp_path / "p.json"
    g.write_text(json.dumps(d))
    r = CliRunner().invoke(app, ["calibrate", "-m", "tiny", "--quick", "-o", str(out), "--replay-grid", str(g)])
    assert r.exit_code == 0, r.output
    # the summary names the measured admission and after-eager terms (what the simulator charges from them)
    flat = " ".join(r.output.split())   # the console wraps long lines
    assert "admission once per request (measured add_request)" in flat and "right after a prefill-bearing step" in flat
    prof = CalibrationProfile.load(out)
    assert prof.step is not None and prof.replay_grid == d and G.for_profile(prof).matches(get_model("tiny"))
