"""Bring your own GPU and model: files from a temp folder through cost, simulate and plan; named errors; dtype rules."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from costmodels.catalog import get_model
from costmodels.hardware import Hardware, get_hardware
from twinfer.config import validate
from twinfer.errors import TwinferError
from ui.cli import app

runner = CliRunner()

# a small Llama-architecture config.json, as Hugging Face ships it (unmodified keys)
LLAMA_CFG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 8192, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# a GPU without FP8 and without NVLink (PCIe only)
PCIE_GPU = {
    "schema_version": 1, "name": "PCIe-GPU", "bf16_tflops": 150, "hbm_gb": 48, "hbm_tbps": 0.86,
    "scaleup_domain": 8, "scaleout_gbps": 100, "host_link_gbps": 32,
}


@pytest.fixture
def byo(tmp_path):
    """A folder holding gpu.yaml (no FP8, no NVLink), model/config.json (BF16) and fp8model/config.json (FP8 checkpoint)."""
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(PCIE_GPU))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(LLAMA_CFG))
    (tmp_path / "fp8model").mkdir()
    fp8 = {**LLAMA_CFG, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}
    (tmp_path / "fp8model" / "config.json").write_text(json.dumps(fp8))
    return tmp_path


def test_optional_features_absent_not_faked(byo):
    hw = get_hardware(str(byo / "gpu.yaml"))
    assert hw.fp8_tflops is None and not hw.has_fp8 and hw.fp4_tflops is None
    assert not hw.has_scaleup and hw.scaleup_bw == 32e9  # peers over PCIe (host link)
    zero = validate(Hardware, {**PCIE_GPU, "fp8_tflops": 0, "scaleup_gbps": 0})
    assert zero.fp8_tflops is None and zero.scaleup_gbps is None  # 0 says "absent" too
    with pytest.raises(TwinferError, match="fp8_tflops is not set"):
        hw.tflops("fp8")


def test_custom_gpu_and_hf_config_through_cost(byo):
    from ui.cmd_cost import CostConfig, run_cost

    res = run_cost(CostConfig(model=str(byo / "model"), hardware=str(byo / "gpu.yaml"), tp=2, batch=["decode:8x1024"]))
    assert res["hardware"] == "PCIe-GPU" and res["layout"]["weight_dtype"] == "bf16" and res["step_time_s"] > 0
    r = runner.invoke(app, ["cost", "--model", str(byo / "model"), "--hardware", str(byo / "gpu.yaml"), "--tp", "2"])
    assert r.exit_code == 0, r.output


def test_custom_gpu_and_hf_config_through_simulate_with_relative_paths(byo, tmp_path_factory, monkeypatch):
    scen = {"name": "byo", "model": "model", "hardware": "gpu.yaml", "layout": {"tp": 2},
            "workload": {"preset": "chat", "rate": 2.0, "num_requests": 40}, "scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 4096}}
    (byo / "scen.yaml").write_text(yaml.safe_dump(scen))
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))  # relative paths must resolve from the file's folder, not here
    r = runner.invoke(app, ["simulate", "--scenario", str(byo / "scen.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["scenario"]["hardware"] == str(byo / "gpu.yaml") and d["scenario"]["layout"]["weight_dtype"] == "bf16"
    assert d["metrics"]["requests_finished"] == 40
    from sim.scenario import load_scenario

    assert load_scenario(byo / "scen.yaml").model == str(byo / "model")


def test_relative_trace_and_calibration_paths_resolve_from_the_scenario_folder(byo):
    from sim.scenario import resolve_relative_paths

    data = {"model": "deepseek-v3", "hardware": "H200", "calibration": "prof.json",
            "workload": {"kind": "trace", "trace_path": "traces/a.jsonl"}}
    out = resolve_relative_paths(data, byo)
    assert out["model"] == "deepseek-v3" and out["hardware"] == "H200"  # catalog names stay names
    assert out["calibration"] == str(byo / "prof.json") and out["workload"]["trace_path"] == str(byo / "traces/a.jsonl")
    assert resolve_relative_paths({"calibration": "/abs/p.json"}, byo)["calibration"] == "/abs/p.json"


def test_custom_gpu_and_hf_config_through_plan(byo):
    r = runner.invoke(app, ["plan", "--model", str(byo / "model"), "--hardware", str(byo / "gpu.yaml"), "--gpus", "2",
                            "--workload", "chat", "--slo", "ttft_p90=5s,tpot_p90=200ms", "--simulate", "0", "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["status"] == "ok" and d["hardware"] == "PCIe-GPU"
    rec = d["recommended"]
    assert rec["hardware"] == str(byo / "gpu.yaml") and rec["model"] == str(byo / "model")
    assert all(p["layout"]["weight_dtype"] == "bf16" for p in rec["pools"])  # the checkpoint's dtype


@pytest.mark.parametrize("field,value,named", [
    ("bf16_tflops", -1, "bf16_tflops"),
    ("hbm_tbps", "fast", "hbm_tbps"),
    ("scaleup_domain", 0, "scaleup_domain"),
    ("fp8_tflops", -5, "fp8_tflops"),
    ("hbm_gbps", 3.0, "hbm_gbps"),            # a typo: unknown fields are refused by name
    ("schema_version", 2, "schema_version"),
    ("measured", {"copy_tbps": 0}, "measured.copy_tbps"),
    ("measured", {"copy_bw": 1.0}, "measured.copy_bw"),
    ("name", "", "name"),
    ("host_link_gbps", 1e9, "host_link_gbps"),   # unbounded before: a typo'd exponent priced KV offload as free
    ("host_mem_gb", 1e12, "host_mem_gb"),
    ("price_per_gpu_hour", 1e7, "price_per_gpu_hour"),
])
def test_each_malformed_hardware_field_is_named(tmp_path, field, value, named):
    p = tmp_path / "gpu.yaml"
    p.write_text(yaml.safe_dump({**PCIE_GPU, field: value}))
    with pytest.raises(TwinferError) as e:
        get_hardware(str(p))
    assert f"{named}:" in str(e.value) and str(p) in str(e.value)


def test_missing_hardware_field_is_named(tmp_path):
    p = tmp_path / "gpu.yaml"
    p.write_text(yaml.safe_dump({k: v for k, v in PCIE_GPU.items() if k != "hbm_tbps"}))
    with pytest.raises(TwinferError, match="hbm_tbps: Field required"):
        get_hardware(str(p))


@pytest.mark.parametrize("edit,named", [
    ({"num_layers": 0}, "num_layers"),
    ({"family": "gpt"}, "family"),
    ({"hidden_size": "big"}, "hidden_size"),
    ({"schema_version": 7}, "schema_version"),
    ({"moe": {"n_routed_experts": 4, "top_k": 8, "moe_intermediate_size": 64}}, "top_k=8 exceeds n_routed_experts=4"),
    ({"moe": {"n_routed_experts": 256, "top_k": 8, "moe_intermediate_size": 64, "n_group": 7}},
     "n_group=7 does not divide n_routed_experts=256"),
    ({"moe": {"n_routed_experts": 256, "top_k": 8, "moe_intermediate_size": 64, "n_group": 8, "topk_group": 9}},
     "topk_group=9 exceeds n_group=8"),
    ({"moe": {"n_routed_experts": 256, "top_k": 8, "moe_intermediate_size": 64, "first_k_dense": 100}},
     "moe.first_k_dense=100 leaves no MoE layer of num_layers=32"),
])
def test_each_malformed_modelspec_field_is_named(tmp_path, edit, named):
    spec = yaml.safe_load(runner.invoke(app, ["model", "--show", "llama-3.1-8b"]).stdout)
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump({**spec, **edit}))
    with pytest.raises(TwinferError, match=named):
        get_model(str(p))


@pytest.mark.parametrize("edit,named", [
    ({"hidden_size": None}, "lacks required key 'hidden_size'"),
    ({"num_attention_heads": "16"}, "'num_attention_heads' must be an integer in 1..65536"),
    ({"num_hidden_layers": -2}, "'num_hidden_layers' must be a non-negative integer"),
    # a key with a ModelSpec field of its name takes that field's bounds
    ({"hc_sinkhorn_iters": -1}, r"'hc_sinkhorn_iters' must be an integer in 1\.\.1000 \(got -1\)"),
    ({"hc_sinkhorn_iters": 5000}, r"'hc_sinkhorn_iters' must be an integer in 1\.\.1000 \(got 5000\)"),
    ({"hc_mult": 0}, r"'hc_mult' must be an integer in 1\.\.64 \(got 0\)"),
    ({"quantization_config": "fp8"}, "'quantization_config' must be a mapping"),
])
def test_each_malformed_hf_config_key_is_named(tmp_path, edit, named):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_CFG, **edit}))
    with pytest.raises(TwinferError, match=named):
        get_model(str(tmp_path))


def test_dtypes_follow_the_checkpoint_and_fp8_on_a_gpu_without_it_is_refused(byo):
    from sim.scenario import scenario_from_dict

    wl = {"preset": "chat", "num_requests": 10}
    fp8_h200 = scenario_from_dict({"model": str(byo / "fp8model"), "hardware": "H200", "layout": {"tp": 1}, "workload": wl})
    assert fp8_h200.layout.weight_dtype == "fp8"  # from quantization_config, not the layout's bf16 default
    with pytest.raises(TwinferError, match="layout.weight_dtype: fp8 needs FP8 tensor cores and PCIe-GPU has none"):
        scenario_from_dict({"model": str(byo / "fp8model"), "hardware": str(byo / "gpu.yaml"), "layout": {"tp": 1}, "workload": wl})
    ok = scenario_from_dict({"model": str(byo / "fp8model"), "hardware": str(byo / "gpu.yaml"),
                             "layout": {"tp": 1, "weight_dtype": "bf16"}, "workload": wl})
    assert ok.layout.weight_dtype == "bf16"  # set explicitly: served dequantised, the user's choice
    from ui.cmd_cost import CostConfig, run_cost

    with pytest.raises(TwinferError, match="fp8 needs FP8 tensor cores"):
        run_cost(CostConfig(model=str(byo / "fp8model"), hardware=str(byo / "gpu.yaml"), tp=1))


def test_overrides_on_the_builtin_default_do_not_keep_its_fp8_weights(byo):
    from ui.cmd_simulate import effective_scenario

    sc = effective_scenario(None, model=str(byo / "model"))
    assert sc.layout.weight_dtype == "bf16"  # the default's fp8 described DeepSeek-V3, not this model
    assert effective_scenario(None, model=str(byo / "model"), dtype="fp8").layout.weight_dtype == "fp8"
    r = runner.invoke(app, ["simulate", "--hardware", str(byo / "gpu.yaml"), "--print-scenario"])
    assert isinstance(r.exception, TwinferError) and "layout.weight_dtype: fp8 needs FP8 tensor cores" in str(r.exception)


def test_unknown_names_say_files_work():
    with pytest.raises(TwinferError, match="hardware YAML file"):
        get_hardware("A100")
    with pytest.raises(TwinferError, match="config.json"):
        get_model("codellama-34b")


def test_a_model_file_past_any_published_size_is_refused_naming_the_field(tmp_path):
    """A hidden size of 1e12 was accepted and priced (a step of 7e9 ms with --allow-no-fit): every size has an upper
    bound ten or more times the largest published model's."""
    import subprocess
    import sys

    tpl = subprocess.run([sys.executable, "-m", "ui.cli", "model", "--show", "deepseek-v3"], capture_output=True, text=True, timeout=120)
    assert tpl.returncode == 0
    for field, value in (("hidden_size", "1000000000000"), ("vocab_size", "100000000000000")):
        f = tmp_path / f"{field}.yaml"
        f.write_text("\n".join(f"{field}: {value}" if ln.startswith(f"{field}:") else ln for ln in tpl.stdout.splitlines()) + "\n")
        r = subprocess.run([sys.executable, "-m", "ui.cli", "cost", "--model", str(f), "--allow-no-fit"], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and f"{field}: Input should be less than or equal to" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
