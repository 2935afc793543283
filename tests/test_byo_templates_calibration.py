"""twinfer hardware/model templates, --print-scenario --all, calibration profiles and measured blocks as the efficiency source."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from costmodels.calibration import CalibrationProfile
from costmodels.catalog import get_model
from costmodels.hardware import Hardware, get_hardware
from costmodels.model_spec import ModelSpec
from twinfer.errors import TwinferError
from ui.cli import app

runner = CliRunner()


def test_hardware_template_is_complete_commented_and_loads(tmp_path):
    r = runner.invoke(app, ["hardware", "--template"])
    assert r.exit_code == 0, r.output
    text = r.stdout
    for name, field in Hardware.model_fields.items():
        assert f"\n{name}:" in text, name                  # every field written out
        assert f"# {field.description}" in text, name     # with its description above it
    p = tmp_path / "a100.yaml"
    p.write_text(text)
    hw = get_hardware(str(p))
    assert hw.name == "A100-SXM4-80GB" and hw.fp8_tflops is None and hw.bf16_tflops == 312
    # more memory visible than the card has: refused at the CLI, naming the field (found trying it as a new user:
    # hbm_visible_gb 100 on an 80 GB card sized the KV pool from 100 GiB)
    import re
    bad = tmp_path / "bad.yaml"
    bad.write_text(re.sub(r"(?m)^hbm_visible_gb:.*$", "hbm_visible_gb: 100", text))
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "ui.cli", "cost", "-m", "llama-3.1-8b", "--hw", str(bad), "--tp", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "hbm_visible_gb" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["H200", "GB300", "MI355X"])
def test_hardware_show_round_trips(tmp_path, name):
    r = runner.invoke(app, ["hardware", "--show", name])
    assert r.exit_code == 0, r.output
    p = tmp_path / "hw.yaml"
    p.write_text(r.stdout)
    assert get_hardware(str(p)) == get_hardware(name)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "deepseek-v3", "deepseek-v4-flash"])
def test_model_show_is_complete_and_round_trips(tmp_path, name):
    r = runner.invoke(app, ["model", "--show", name])
    assert r.exit_code == 0, r.output
    for field in ModelSpec.model_fields:
        assert f"\n{field}:" in r.stdout, field
    p = tmp_path / "m.yaml"
    p.write_text(r.stdout)
    assert get_model(str(p)) == get_model(name)


def test_catalog_listings_run():
    assert "H200" in runner.invoke(app, ["hardware"], env={"COLUMNS": "200"}).stdout
    assert "deepseek-v3" in runner.invoke(app, ["model"], env={"COLUMNS": "200"}).stdout


def test_print_scenario_all_prints_every_effective_value():
    from scheduler.config import SchedulerConfig

    r = runner.invoke(app, ["simulate", "--print-scenario", "--all"])
    assert r.exit_code == 0, r.output
    d = yaml.safe_load(r.stdout)
    assert set(SchedulerConfig.model_fields) <= set(d["scheduler"])  # defaults included
    assert d["layout"]["kv_dtype"] == "bf16" and "calibration" in d and "effects" in d
    short = yaml.safe_load(runner.invoke(app, ["simulate", "--print-scenario"]).stdout)
    assert set(short["scheduler"]) < set(d["scheduler"])
    assert runner.invoke(app, ["simulate", "--all"]).exit_code != 0  # --all alone is a usage error


def _profile(tmp_path, mem_eff: float) -> str:
    cal = CalibrationProfile.default(get_hardware("H200")).model_copy(update={"mem_eff": mem_eff, "created": "test"})
    p = tmp_path / "prof.json"
    cal.save(p)
    return str(p)


def test_calibration_profile_is_honoured_and_named_as_the_source(tmp_path):
    from costmodels.calibration_source import profile_for
    from sim.runner import build_cost_model
    from sim.scenario import scenario_from_dict

    path = _profile(tmp_path, 0.4)
    # on an H100 the H200's measured GEMM tables transfer (on the H200 itself a measured kernel is its own time)
    base = {"model": "llama-3.1-8b", "hardware": "H100", "layout": {"tp": 1}, "workload": {"preset": "chat", "num_requests": 10}}
    plain = build_cost_model(scenario_from_dict(base))
    slow = build_cost_model(scenario_from_dict({**base, "calibration": path}))
    from costmodels.batch import BatchShape

    b = BatchShape.from_lists([1] * 32, [2048] * 32, [True] * 32)
    # the ops priced at the profile's streaming rate (norms, activations, the sampler: "other") stream HBM at 0.4
    # instead of 0.86; the weight GEMMs are the measured kernels moved to the H100 (op_table.transferred): the profile's
    # efficiency only splits their roofline from their time over it, so they keep the kernels' own speed within 10%
    s, p = slow.base.step(b), plain.base.step(b)
    assert s.breakdown["other"] > 1.05 * p.breakdown["other"] and s.time_s > p.time_s
    assert s.breakdown["dense_gemm"] == pytest.approx(p.breakdown["dense_gemm"], rel=0.10)
    assert any(path in n for n in slow.notes)
    assert profile_for(get_hardware("H200"), path).mem_eff == 0.4


def test_simulate_and_cost_take_calibration(tmp_path):
    path = _profile(tmp_path, 0.4)
    # on the H100 (the GQA attention tables measured there, the H200 GEMM tables moved to it): the profile's slower
    # streaming slows the ops it prices and the transferred kernels' roofline part
    args = ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100", "--tp", "1", "--requests", "20", "--json"]
    a = json.loads(runner.invoke(app, args).stdout)
    b = json.loads(runner.invoke(app, args + ["--calibration", path]).stdout)
    assert b["scenario"]["calibration"] == path
    assert b["metrics"]["tpot_s"]["mean"] > a["metrics"]["tpot_s"]["mean"]
    assert any(path in n for n in b["cost_model_notes"])
    r = runner.invoke(app, ["cost", "--model", "llama-3.1-8b", "--tp", "1", "--calibration", path])
    assert r.exit_code == 0 and "prof.json" in r.output.replace("\n", "")


def test_measured_block_is_honoured_per_efficiency_and_named(tmp_path):
    from costmodels.calibration_source import profile_for

    hw = get_hardware("H100").model_copy(update={"name": "H100-mine", "measured": get_hardware("H200").measured.model_copy(
        update={"copy_tbps": 2.68, "bf16_matmul_tflops": 600.0, "fp8_matmul_tflops": None, "deepgemm_fp8_tflops": None,
                "small_gemm": None, "source": "my bench 2026-12-01"})})
    cal = profile_for(hw)
    assert cal.mem_eff == pytest.approx(2.68 / 3.35) and cal.gemm_compute_eff["bf16"] == pytest.approx(600 / 989)
    assert cal.gemm_compute_eff["fp8"] == CalibrationProfile.default(hw).gemm_compute_eff["fp8"]  # not measured: default
    text = "\n".join(cal.notes)
    assert "HBM streaming 0.800 of peak: H100-mine measured block (my bench 2026-12-01)" in text
    assert "GEMM compute fp8" in text and "H200-derived default" in text
    assert "measured.flashmla_decode, measured.deepgemm_masked_grouped not used" in text
    # the cost model uses it without being told (StepCostModel's default calibration)
    from costmodels.layout import ParallelLayout
    from costmodels.step import StepCostModel

    assert StepCostModel(get_model("llama-3.1-8b"), hw, ParallelLayout()).cal.mem_eff == pytest.approx(0.8)
    # the H200 catalog entry's own block gives exactly the defaults (the built-in digest does not move)
    assert profile_for(get_hardware("H200")).model_dump() == CalibrationProfile.default(get_hardware("H200")).model_dump()


def test_measured_block_beating_the_peak_is_refused():
    from costmodels.calibration_source import profile_for

    hw = Hardware.model_validate({**get_hardware("H100").model_dump(), "name": "X", "measured": {"copy_tbps": 9.0}})
    with pytest.raises(TwinferError, match="measured.copy_tbps=9 exceeds hbm_tbps=3.35"):
        profile_for(hw)


def test_docs_name_every_user_field():
    """docs/byo.md documents every field a user sets in these files (a new field without a line there fails)."""
    from pathlib import Path

    from costmodels.hardware import MeasuredCeilings
    from costmodels.layout import ParallelLayout
    from costmodels.model_spec import IndexerConfig, MLAConfig, MoEConfig
    from scheduler.config import SCHEDULER_PRESETS, SchedulerConfig

    doc = (Path(__file__).resolve().parents[1] / "docs" / "byo.md").read_text(encoding="utf-8")
    for cls, prefix in ((Hardware, ""), (MeasuredCeilings, "measured."), (ModelSpec, ""), (MLAConfig, "mla."), (MoEConfig, "moe."),
                        (IndexerConfig, "indexer."), (ParallelLayout, "layout."), (SchedulerConfig, "scheduler.")):
        for name in cls.model_fields:
            assert f"`{prefix}{name}`" in doc, f"{prefix}{name}"
    for preset in SCHEDULER_PRESETS:
        assert f"`{preset}`" in doc


def test_plan_takes_calibration(tmp_path):
    from planner.plan import load_plan

    path = _profile(tmp_path, 0.4)
    base = ["plan", "--model", "llama-3.1-8b", "--hardware", "h200", "--gpus", "2", "--workload", "chat",
            "--slo", "ttft_p90=5s,tpot_p90=200ms", "--simulate", "1", "--sim-requests", "200", "--workers", "1", "--json"]
    a = json.loads(runner.invoke(app, base).stdout)
    r = runner.invoke(app, base + ["--calibration", path, "--out", str(tmp_path / "plan.yaml")])
    assert r.exit_code == 0, r.output
    b = json.loads(r.stdout.split("\nwrote")[0]) if "\nwrote" in r.stdout else json.loads(r.stdout)
    # HBM streaming at 0.4 instead of 0.86: every screened deployment serves fewer tokens per GPU
    assert b["frontier"][0]["screen_output_tokens_per_s_per_gpu"] < a["frontier"][0]["screen_output_tokens_per_s_per_gpu"]
    assert any(path in line for line in b["assumptions"])  # the profile is named as the efficiencies' source
    plan = load_plan(tmp_path / "plan.yaml")
    assert plan.calibration == path and plan.to_scenario().calibration == path
