"""A bad value given by flag is reported under the flag the user typed, next to the field it sets (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ui.cli", "simulate", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,flag,field", [
    (["--rate", "-3"], "--rate", "workload.rate"),
    (["-n", "-5"], "--requests", "workload.num_requests"),
    (["--max-num-seqs", "0"], "--max-num-seqs", "scheduler.max_num_seqs"),
])
def test_bad_flag_value_names_the_flag(args, flag, field):
    r = _simulate(*args)
    assert r.returncode == 2, r.stderr
    assert f"{flag} ({field})" in r.stderr and "Traceback" not in r.stderr


def test_bad_scenario_file_value_keeps_the_field_only(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("workload:\n  preset: chat\n  rate: -1\n")
    r = _simulate("-s", str(f))
    assert r.returncode == 2 and "workload.rate" in r.stderr and "--rate" not in r.stderr


def test_nested_file_error_shows_its_value_once(tmp_path):
    f = tmp_path / "hw.yaml"
    tpl = subprocess.run([sys.executable, "-m", "ui.cli", "hardware", "--template"], capture_output=True, text=True, timeout=120)
    assert tpl.returncode == 0
    f.write_text("\n".join("hbm_tbps: -1" if ln.startswith("hbm_tbps:") else ln for ln in tpl.stdout.splitlines()) + "\n")
    r = _simulate("--hw", str(f), "-n", "10")
    assert r.returncode == 2 and "hbm_tbps" in r.stderr and "(got -1)" in r.stderr
    assert r.stderr.count("(got ") == 1, r.stderr


@pytest.mark.parametrize("text,fmt", [("", "jsonl"), ("\n  \n", "mooncake")])
def test_trace_without_requests_is_refused_naming_the_file(tmp_path, text, fmt):
    f = tmp_path / "empty.jsonl"
    f.write_text(text)
    r = _simulate("--trace", str(f), "--trace-format", fmt)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"{f}: the trace holds no requests" in r.stderr and "Traceback" not in r.stderr
    assert "latency" not in r.stdout  # no empty report


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_flag_value_is_named_as_such(value):
    """NaN fails every bound, so the bound's own message ("less than or equal to 1e9 (got nan)") misled: the flag and
    field are named with what is wrong with the value, as a YAML file's .nan is."""
    r = _simulate("--rate", value)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"--rate (workload.rate): {value} is not allowed; numbers must be finite" in r.stderr, r.stderr


def test_a_profile_measured_on_a_cpu_is_refused_as_a_gpus_calibration(tmp_path):
    """A CPU calibration (the tiny model's torch reference path) priced DeepSeek-V3 on 8 x H200 at a 26-minute TTFT with
    only a note: its efficiencies are not a GPU's."""
    from pathlib import Path

    from costmodels.calibration import CalibrationProfile

    root = Path(__file__).resolve().parents[1]
    prof = CalibrationProfile.load(root / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
    f = tmp_path / "cpu.json"
    prof.model_copy(update={"measured_on": "cpu"}).save(f)
    r = _simulate("--calibration", str(f), "-n", "10")
    assert r.returncode == 2 and "measured on a CPU" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_validate_refuses_a_model_its_profile_did_not_measure():
    """Validating another model than the profile measured printed a note and reported +2766% errors: refused before
    the engine is built, as --sim-only refuses it."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "ui.cli", "validate", "-p", str(root / "profiles" / "h200" /
                        "calibration_deepseek-v3-5layers_fp8.json"), "-m", "llama-3.1-8b", "-n", "2", "--levels", "0.8"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--model llama-3.1-8b: the profile measured deepseek-v3" in r.stderr, r.stderr
