"""Bad files at the command line: one clear `error:` message naming what is wrong, exit status 2, no traceback.

The commands run as subprocesses, all at once (each mostly pays Python's start-up); a few per
command (simulate, cost, plan). Missing files, broken YAML and every other bad input the fuzz
tests find go through the same `main()` error path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_fuzz_helpers import CORPUS, _plan_seed

CLI = [sys.executable, "-m", "ui.cli"]


def _files(tmp: Path) -> dict[str, Path]:
    f = {
        "bad_scenario": ("scenario.yaml", "workload: {preset: chat, rate: -3, num_requests: 10}\n"),
        "bad_gpu": ("gpu.yaml", "name: mygpu\nbf16_tflops: 900\nfp8_tflops: 1800\nhbm_gb: -80\nhbm_tbps: 3\n"
                                "scaleup_gbps: 450\nscaleup_domain: 8\nscaleout_gbps: 400\n"),
        "bad_plan_request": ("req.yaml", "model: deepseek-v3\nhardware: H2OO\ngpus: 8\n"),
        "bad_plan": ("plan.yaml", yaml.safe_dump({**_plan_seed(), "gpus_budget": 0})),
        "unknown_gpu_plan": ("plan2.yaml", yaml.safe_dump({**_plan_seed(), "hardware": "H2OO"})),
        "not_yaml": ("broken.yaml", "workload: {preset: chat\n  rate: [\n"),
    }
    out = {}
    for key, (name, text) in f.items():
        p = tmp / name
        p.write_text(text, encoding="utf-8")
        out[key] = p
    return out


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments, text the error must contain)."""
    f = _files(tmp)
    corpus = CORPUS
    return {
        "simulate-bad-field": (["simulate", "--scenario", str(f["bad_scenario"])], "workload.rate"),
        "simulate-alias-bomb": (["simulate", "--scenario", str(corpus / "scenario" / "yaml_alias_bomb.yaml")], "values"),
        "simulate-bad-trace": (["simulate", "--trace", str(corpus / "trace_jsonl" / "one_line_expands_to_billions_of_hashes.jsonl")],
                               "input_length"),
        "simulate-bad-plan": (["simulate", "--plan", str(f["bad_plan"])], "gpus_budget"),
        "cost-bad-hf-config": (["cost", "--model", str(corpus / "hf_config" / "head_dim_is_a_string.json")], "qk_rope_head_dim"),
        "plan-bad-config": (["plan", "--config", str(f["bad_plan_request"]), "--slo", "ttft_p90=2s,tpot_p90=50ms", "--simulate", "0"],
                            "H2OO"),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    cases = _cases(tmp)
    env = {**os.environ, "TWINFER_DEBUG": "", "COLUMNS": "200"}
    # a corpus file's name ends .json but holds an HF config: get_model reads it as config.json
    hf = tmp / "hf" / "config.json"
    hf.parent.mkdir()
    hf.write_text((CORPUS / "hf_config" / "head_dim_is_a_string.json").read_text(), encoding="utf-8")
    cases["cost-bad-hf-config"] = (["cost", "--model", str(hf)], "qk_rope_head_dim")
    procs = {name: subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for name, (args, _) in cases.items()}
    out = {}
    for name, p in procs.items():
        try:
            so, se = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        out[name] = (p.returncode, so, se, cases[name][1])
    return out


@pytest.mark.parametrize("name", sorted(_cases(Path("/tmp")).keys()))
def test_bad_input_is_one_clear_error_and_exit_2(results, name):
    rc, so, se, must = results[name]
    assert rc == 2, f"exit {rc}\nstdout: {so[-2000:]}\nstderr: {se[-2000:]}"
    assert "Traceback" not in se and "internal error" not in se
    assert se.lstrip().startswith("error:"), se[:500]
    assert must in se, se[:1000]
    assert len(se) < 3000


def test_plan_naming_an_unknown_gpu_is_refused_at_the_cli(tmp_path):
    """A plan naming an unknown GPU is one clear error at the CLI (exit 2), not an internal error."""
    f = _files(tmp_path)
    p = subprocess.run(CLI + ["simulate", "--plan", str(f["unknown_gpu_plan"]), "--requests", "10"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "TWINFER_DEBUG": ""})
    assert p.returncode == 2, p.stderr[-1000:]
    assert "H2OO" in p.stderr
