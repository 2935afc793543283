"""Audit 2 of user inputs: kernels --gpu on GPUs without measured ceilings, calibration GEMM efficiencies bounded,
booleans refused where numbers are wanted, physically sane hardware minimums, one-line validation errors."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from costmodels.calibration import CalibrationProfile
from costmodels.hardware import Hardware, list_hardware
from twinfer.config import format_validation_error, validate
from twinfer.errors import TwinferError

ROOT = Path(__file__).resolve().parents[1]
H100_PROFILE = ROOT / "profiles" / "h100" / "calibration_deepseek-v3-5layers_fp8.json"
GPUS = [h.name for h in list_hardware()]


def _hw_file(tmp_path: Path, **change) -> str:
    """The catalog H100 as a hardware YAML with ``change`` applied."""
    data = next(h for h in list_hardware() if h.name == "H100").model_dump(mode="json")
    data.update(change)
    p = tmp_path / "gpu.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


# --- 1. kernels --gpu on a GPU without measured ceilings --------------------------------------------------------------

@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("as_json", [True, False])
def test_kernels_gpu_runs_for_every_catalog_gpu(gpu, as_json, capsys, monkeypatch):
    """`kernels --gpu H100` crashed (AttributeError on its absent measured block): every catalog GPU exits 0."""
    pytest.importorskip("torch")
    import sys

    from ui.cli import main
    monkeypatch.setattr(sys, "argv", ["twinfer", "kernels", "--device", "cpu", "--gpu", gpu] + (["--json"] if as_json else []))
    with pytest.raises(SystemExit) as e:
        main()
    got = capsys.readouterr()
    assert e.value.code in (0, None), got.err
    assert "internal error" not in got.err and "Traceback" not in got.err
    if as_json:
        assert json.loads(got.out)["gpu"] == gpu


def test_kernels_h100_says_no_measured_ceilings_and_uses_datasheet_figures(capsys, monkeypatch):
    pytest.importorskip("torch")
    import sys

    from ui.cli import main
    monkeypatch.setattr(sys, "argv", ["twinfer", "kernels", "--device", "cpu", "--gpu", "H100", "--json"])
    with pytest.raises(SystemExit):
        main()
    out = json.loads(capsys.readouterr().out)
    assert "no measured FP8 matmul and copy ceiling for the H100" in out["measured"]
    assert "datasheet FP8 peak 1979 TFLOP/s" in out["measured"] and "datasheet HBM peak 3.35 TB/s" in out["measured"]
    assert any(r["measured"].startswith("decode ") for r in out["rows"])   # the H100's op tables are read


@pytest.mark.parametrize("gpu", GPUS)
def test_every_catalog_gpu_has_ceilings_for_its_op_tables(gpu, tmp_path, monkeypatch):
    """Every catalog GPU, given op tables (the H100's copied under its name), gets ceilings and a note, measured or not."""
    pytest.importorskip("torch")
    import costmodels.op_table as op_table
    from ui.cmd_kernels import _attach_measured

    shutil.copytree(ROOT / "costmodels" / "data" / "op_tables" / "h100", tmp_path / gpu.lower())
    monkeypatch.setattr(op_table, "DATA", tmp_path)
    rows = [{"op": "moe_experts", "impl": "deepgemm", "tier": 1}]
    name, note = _attach_measured(rows, gpu, "cpu")
    hw = next(h for h in list_hardware() if h.name == gpu)
    assert name == gpu and note.startswith("measured: device time inside CUDA graphs")
    measured = hw.measured is not None and hw.measured.fp8_matmul_tflops and hw.measured.copy_tbps
    assert ("measured FP8 matmul and copy ceilings" in note) == bool(measured)
    assert ("no measured" in note) == (not measured)
    assert rows[0]["measured"].startswith("decode ")


# --- 2. calibration gemm_compute_eff ---------------------------------------------------------------------------------

def _profile(tmp_path: Path, ceff) -> str:
    d = json.loads(H100_PROFILE.read_text())
    d["gemm_compute_eff"] = ceff
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(d))
    return str(p)


@pytest.mark.parametrize("ceff, expect", [
    ({"bf16": 0.75, "fp8": 0, "fp4": 0.37}, "gemm_compute_eff.fp8: Input should be greater than 0 (got 0)"),
    ({"bf16": 0.75, "fp8": -0.5, "fp4": 0.37}, "gemm_compute_eff.fp8: Input should be greater than 0 (got -0.5)"),
    ({"bf16": 0.75, "fp8": 7, "fp4": 0.37}, "gemm_compute_eff.fp8: Input should be less than or equal to 1 (got 7)"),
    ({}, "gemm_compute_eff: bf16 and fp8 missing"),
    ({"fp8": 0.6}, "gemm_compute_eff: bf16 missing"),
    ({"bf16": 0, "fp8": 0.6, "fp4": 0.3}, "gemm_compute_eff.bf16: Input should be greater than 0 (got 0)"),
    ({"bf16": 0.7, "fp8": 0.6, "int8": 0.3}, "gemm_compute_eff.key 'int8': Input should be 'bf16', 'fp8' or 'fp4'"),
    ({"bf16": 0.7, "fp8": True}, "gemm_compute_eff.fp8: true is a boolean, not a number"),
])
def test_gemm_compute_eff_is_bounded(ceff, expect, tmp_path, cli_exit_2):
    """fp8 0 or -0.5 gave a 46-hour step with exit 0, 7 (700% of peak) passed, {} was an internal error."""
    path = _profile(tmp_path, ceff)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # {"bf16": 0} leaked a divide-by-zero RuntimeWarning
        err = cli_exit_2("cost", "--hw", "H200", "--calibration", path)
    assert f"error: {path}: {expect}" in err


def test_gemm_compute_eff_at_the_bound_and_without_fp4_loads(tmp_path):
    cal = CalibrationProfile.load(_profile(tmp_path, {"bf16": 1.0, "fp8": 0.6}))
    assert cal.gemm_compute(1e9, "fp4") == pytest.approx(cal.gemm_compute(1e9, "fp8"))   # fp4 falls back to fp8's


def test_every_committed_calibration_profile_loads():
    files = [p for p in ROOT.rglob("calibration_*.json") if ".git" not in p.parts]
    assert len(files) >= 10
    for p in files:
        cal = CalibrationProfile.load(p)
        assert all(0 < v <= 1 for v in cal.gemm_compute_eff.values()), p


# --- 3. booleans as numbers; physical minimums -----------------------------------------------------------------------

def test_hardware_boolean_rate_is_refused(tmp_path, cli_exit_2):
    path = _hw_file(tmp_path, bf16_tflops=True)
    err = cli_exit_2("cost", "--hw", path, "-m", "llama-3.1-8b")
    assert f"{path}: bf16_tflops: true is a boolean, not a number; give a number" in err


def test_model_boolean_layer_count_is_refused(tmp_path, cli_exit_2):
    from ui.cmd_model import show_text

    p = tmp_path / "m.yaml"
    p.write_text(show_text("llama-3.1-8b").replace("\nnum_layers: 32\n", "\nnum_layers: true\n"))
    err = cli_exit_2("cost", "-m", str(p), "--hw", "H200")
    assert f"{p}: num_layers: true is a boolean, not a number; give an integer" in err


def test_scenario_boolean_rate_is_refused(tmp_path, cli_exit_2):
    text = (ROOT / "sim" / "data" / "default.yaml").read_text().replace("rate: 6.1", "rate: true")
    p = tmp_path / "s.yaml"
    p.write_text(text)
    err = cli_exit_2("simulate", "-s", str(p))
    assert f"{p}: workload.rate: true is a boolean, not a number" in err


@pytest.mark.parametrize("field", ["bf16_tflops", "hbm_tbps", "fp8_tflops", "scaleout_gbps", "host_link_gbps"])
def test_hardware_rates_have_physical_minimums(field, tmp_path, cli_exit_2):
    """bf16_tflops 1e-300 priced a step at 2.8e300 s; hbm_tbps 1e-300 made simulate print absurd numbers."""
    path = _hw_file(tmp_path, **{field: 1e-300})
    err = cli_exit_2("cost", "--hw", path, "-m", "llama-3.1-8b")
    from costmodels.hardware import MINIMUM
    lo, unit = MINIMUM[field]
    assert f"{path}: {field}: below the {lo:g} {unit} minimum" in err and "(got 1e-300)" in err


def test_simulate_refuses_a_tiny_hbm_bandwidth(tmp_path, cli_exit_2):
    path = _hw_file(tmp_path, hbm_tbps=1e-300)
    err = cli_exit_2("simulate", "--hw", path, "-n", "20")
    assert "hbm_tbps: below the 0.0001 TB/s minimum" in err


def test_zero_still_means_absent_and_booleans_stay_booleans():
    base = next(h for h in list_hardware() if h.name == "H100").model_dump(mode="json")
    hw = validate(Hardware, {**base, "fp8_tflops": 0, "scaleup_gbps": 0}, "x")
    assert hw.fp8_tflops is None and hw.scaleup_gbps is None
    from costmodels.catalog import get_model
    from costmodels.model_spec import ModelSpec
    spec = get_model("deepseek-v3").model_dump(mode="json")
    assert validate(ModelSpec, spec, "x").mla.kv_up_proj is True       # a bool field still takes a bool


def test_bool_walk_handles_unions_lists_and_literals():
    from typing import Literal

    from twinfer.config import bools_as_numbers

    class Inner(BaseModel):
        n: int = 0
        flag: bool = False

    class Outer(BaseModel):
        xs: list[float] = []
        pair: tuple[int, str] = (0, "")
        inner: Inner | None = None
        tag: int | str = 0
        anything: object = None
        version: Literal[1] = 1

    data = {"xs": [1.0, True], "pair": [False, "a"], "inner": {"n": True, "flag": True}, "tag": True,
            "anything": True, "version": True}
    got = {".".join(map(str, p)) for p, _, _ in bools_as_numbers(Outer, data)}
    assert got == {"xs.1", "pair.0", "inner.n", "tag", "version"}
    with pytest.raises(TwinferError, match=r"^f: xs.1: true is a boolean, not a number; give a number \(and 4 more: "):
        validate(Outer, data, "f")


def test_catalogs_and_committed_yaml_still_load():
    from costmodels.catalog import get_model, list_models
    from costmodels.hardware import get_hardware
    from sim.scenario import load_scenario

    assert len(list_hardware()) == len(GPUS) >= 8
    for name in list_models():
        get_model(name)
    get_hardware(str(ROOT / "docs" / "peer" / "vidur-codellama34b-a100" / "a100-sxm4-80gb.yaml"))
    scenarios = [*(ROOT / "docs" / "attention_dp").glob("*.yaml"), *(ROOT / "docs" / "aiconfigurator").glob("*.yaml"),
                 ROOT / "docs" / "replay_v41_32k.yaml", ROOT / "docs" / "peer" / "vidur-codellama34b-a100" / "scenario.yaml",
                 ROOT / "sim" / "data" / "default.yaml"]
    assert len(scenarios) >= 10
    for f in scenarios:
        load_scenario(f)


# --- 4. one-line errors; a file of another type; model --show '' ----------------------------------------------------

def test_a_plan_given_as_a_calibration_is_named_as_a_plan(tmp_path, cli_exit_2):
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump({"kind": "twinfer-plan", "version": 1, "name": "x", "model": "llama-3.1-8b",
                                 "hardware": "H100", "pools": [], "workload": {}}))
    err = cli_exit_2("cost", "--calibration", str(p))
    assert err == f"error: {p} is a twinfer plan file (kind: twinfer-plan), not a calibration profile"


def test_bad_layer_kinds_is_one_line(tmp_path, capsys, monkeypatch):
    import sys

    from ui.cli import main
    from ui.cmd_model import show_text

    p = tmp_path / "m.yaml"
    p.write_text(show_text("llama-3.1-8b").replace("\nlayer_kinds: []\n", "\nlayer_kinds: [" + ", ".join(["fulll"] * 32) + "]\n"))
    monkeypatch.setattr(sys, "argv", ["twinfer", "cost", "-m", str(p), "--hw", "H200"])
    monkeypatch.setenv("COLUMNS", "1000")   # rich folds long lines: count the message's own lines
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {p}: layer_kinds.0: Input should be 'full', 'sliding', 'csa', 'hca' or 'sparse' "
                          "(got 'fulll') (and 31 more: layer_kinds.1, layer_kinds.2, layer_kinds.3, layer_kinds.4, ...)")


def test_format_validation_error_is_one_line():
    class M(BaseModel):
        a: int
        b: int
        c: int

    with pytest.raises(ValidationError) as e:
        M.model_validate({"a": "x"})
    msg = format_validation_error(e.value, "f.yaml")
    assert msg == "f.yaml: a: Input should be a valid integer, unable to parse string as an integer (got 'x') (and 2 more: b, c)"


@pytest.mark.parametrize("cmd", ["model", "hardware"])
@pytest.mark.parametrize("value", ["", "  "])
def test_show_empty_is_an_error(cmd, value, cli_exit_2):
    """`model --show ''` printed the llama-3.1-8b template; `hardware --show ''` errored: both error now."""
    err = cli_exit_2(cmd, "--show", value)
    assert err.startswith(f"error: --show: unknown {cmd if cmd == 'model' else 'hardware'}")


@pytest.mark.parametrize("cmd", ["model", "hardware"])
def test_template_with_an_empty_show_is_refused(cmd, cli_exit_2):
    assert "--template and --show: give one of them" in cli_exit_2(cmd, "--template", "--show", "")
