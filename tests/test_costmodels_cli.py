"""``twinfer cost`` end to end: defaults, JSON, config file, clean errors."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ui.cli import app

runner = CliRunner()


def _run(*args):
    return subprocess.run([sys.executable, "-m", "ui.cli", *args], capture_output=True, text=True, timeout=120)


def test_defaults_table():
    r = runner.invoke(app, ["cost"], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    for word in ("deepseek-v3", "H200", "step time", "expert_gemm", "communication", "max KV tokens", "fits"):
        assert word in r.output


def test_json_output():
    r = runner.invoke(app, ["cost", "--model", "qwen3-30b-a3b", "--hardware", "H100", "--tp", "1", "--batch", "decode:8x1024", "--batch", "prefill:1x2048", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["model"] == "qwen3-30b-a3b" and d["gpus"] == 1
    assert set(d["breakdown_s"]) == {"attention", "indexer", "dense_gemm", "expert_gemm", "communication", "other"}
    assert d["step_time_s"] == pytest.approx(sum(d["breakdown_s"].values()))
    assert d["memory"]["max_kv_tokens"] > 0 and d["fits"] is True


def test_config_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: deepseek-v3\nhardware: h200\ntp: 1\ndp: 8\nep: 8\ndtype: fp8\nbatch: [decode:256x2048]\ntwo_micro_batch: true\n")
    r = runner.invoke(app, ["cost", "--config", str(p), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["layout"]["ep"] == 8


def test_does_not_fit_is_refused_unless_allowed():
    r = _run("cost", "--hardware", "h100", "--dtype", "bf16", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "layout TP8 bf16" in r.stderr and "short by" in r.stderr and "--allow-no-fit" in r.stderr
    r = runner.invoke(app, ["cost", "--hardware", "h100", "--dtype", "bf16", "--allow-no-fit", "--json"])
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert d["fits"] is False and "does not fit" in d["memory"]["explanation"]
    assert d["warnings"] and "DOES NOT FIT" in d["warnings"][0]


@pytest.mark.parametrize("args,expect", [
    (["--batch", "decode:0x4096"], "batch size must be >= 1"),
    (["--batch", "nonsense"], "expected PHASE:BATCHxTOKENS"),
    (["--model", "nope"], "known models: deepseek-v3"),
    (["--hardware", "tpu"], "known hardwares: B200"),
    (["--tp", "0"], "tp: Input should be greater than or equal to 1"),
    (["--ep", "3"], "ep=3 must divide"),
    (["--dtype", "int3"], "dtype"),
])
def test_bad_input_is_a_clean_error(args, expect):
    r = _run("cost", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert expect in r.stderr
    assert "Traceback" not in r.stderr
