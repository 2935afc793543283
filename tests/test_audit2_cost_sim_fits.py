"""Audit round 2: host memory is one fit for cost, simulate and plan; an expert dtype on a dense model is refused."""

from __future__ import annotations

import subprocess
import sys

import yaml

from costmodels.hardware import get_hardware


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ui.cli", *args], capture_output=True, text=True, timeout=300)


def _small_host(tmp_path) -> str:
    hw = get_hardware("h200").model_dump()
    hw.update(name="H200-small-host", host_mem_gb=16.0)
    path = tmp_path / "h200small.yaml"
    path.write_text(yaml.safe_dump(hw))
    return str(path)


def test_lookup_tables_past_the_host_memory_are_refused_by_cost_and_simulate_as_plan_leaves_them_out(tmp_path):
    """DeepSeek-V4.1-Flash TP8 keeps 25.3 GB of lookup tables a GPU in host memory by default: on a 16 GB host,
    ``plan`` kept only tables-in-HBM layouts while ``cost`` said 'step fits yes' and ``simulate`` ran it."""
    hw = _small_host(tmp_path)
    for args in (["cost", "-m", "deepseek-v4.1-flash", "--hw", hw, "--tp", "8"],
                 ["simulate", "-m", "deepseek-v4.1-flash", "--hw", hw, "--tp", "8", "-n", "20"]):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stdout[-500:], r.stderr)
        assert "host memory does not fit" in r.stderr and "lookup tables 25.3 GB" in r.stderr and "of 16 GB" in r.stderr
    ok = _cli("cost", "-m", "deepseek-v4.1-flash", "--hw", "h200", "--tp", "8", "--json")
    assert ok.returncode == 0, ok.stderr


def test_an_expert_dtype_on_a_dense_model_is_refused():
    r = _cli("cost", "-m", "llama-3.1-8b", "--tp", "1", "--expert-dtype", "fp4")
    assert r.returncode == 2 and "--expert-dtype fp4" in r.stderr and "dense" in r.stderr, r.stderr


def test_a_steady_after_s_past_the_run_s_arrivals_says_every_figure_is_the_whole_run_s(tmp_path):
    """``steady_after_s`` past the last arrival left no steady window: the steady table and the SLO's window switched
    to the whole run's without a word."""
    f = tmp_path / "s.yaml"
    f.write_text("layout:\n  tp: 8\nworkload:\n  preset: chat\n  num_requests: 300\nsteady_after_s: 1000\n")
    r = _cli("simulate", "-s", str(f))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "steady_after_s 1000 s: no steady window" in text and "is the whole run's" in text
    f.write_text("layout:\n  tp: 8\nworkload:\n  preset: chat\n  num_requests: 300\nsteady_after_s: 10\n")
    assert "no steady window" not in " ".join(_cli("simulate", "-s", str(f)).stdout.split())


def test_an_empty_model_name_is_an_unknown_model_not_the_working_folder():
    r = _cli("cost", "-m", "")
    assert r.returncode == 2 and "unknown model ''" in r.stderr and "folder has no config.json" not in r.stderr, r.stderr
