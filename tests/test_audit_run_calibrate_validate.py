"""Audit of ``twinfer run``, ``twinfer calibrate`` and ``twinfer validate`` (CPU paths): inputs refused cleanly (exit 2,
the flag named, no traceback, before the engine build or the measurement), and labels that say what the figures are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinfer.errors import TwinferError

PROFILE = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
# a run that is not refused finishes in seconds on the CPU (so a missing refusal fails the test, not a timeout)
SMALL = ["-m", "tiny", "-n", "1", "--max-input-len", "8", "--max-output-len", "1"]


@pytest.fixture
def no_engine(monkeypatch):
    """The engine build and the calibration measurement replaced by a failure: a refusal must come before them."""
    import executor.calibrate
    from executor.engine import LLMEngine

    def built(*_a, **_k):
        raise AssertionError("the engine was built before the input was checked")

    monkeypatch.setattr(LLMEngine, "from_args", classmethod(built))
    monkeypatch.setattr(executor.calibrate, "calibrate", built)
    monkeypatch.setattr(executor.calibrate, "build_engine", built)


# ------------------------------------------------------------------------------------------------- twinfer run
def test_run_temperature_outside_the_sampler_range_names_the_flag(cli_exit_2, no_engine):
    """--temperature 1e-5 (or inf) passed the CLI and failed in SamplingParams after the build: 'internal error:
    ValidationError', exit 1."""
    err = cli_exit_2("run", *SMALL, "--temperature", "0.00001")
    assert "--temperature 1e-05: expected 0 (greedy) or 0.0001..10000" in err
    assert "--temperature" in cli_exit_2("run", *SMALL, "--temperature", "inf")


def test_run_refuses_an_infinite_routing_skew(cli_exit_2, no_engine):
    """--routing-skew inf ran: the router bias -inf * ln(1 + 0) is NaN for the most popular expert."""
    assert "--routing-skew" in cli_exit_2("run", *SMALL, "--routing-skew", "inf")


def test_run_refuses_a_file_that_is_not_a_plan(cli_exit_2, no_engine):
    """A calibration profile given as --plan was read as a plan with no scheduler section and ignored without a word."""
    err = cli_exit_2("run", *SMALL, "--plan", PROFILE)
    assert f"--plan {PROFILE}: not a plan (no 'scheduler' section, no 'pools')" in err


def test_run_takes_the_serving_pools_scheduler_from_a_plan_file(tmp_path):
    """A ``twinfer plan`` file keeps its scheduler in its pool, not at the top: it was ignored (the defaults ran)."""
    from costmodels.layout import ParallelLayout
    from planner.plan import Plan, PoolPlan
    from scheduler.config import SchedulerConfig
    from scheduler.metrics import SLO
    from sim.workload import WorkloadSpec
    from ui.cmd_run import plan_scheduler

    path = tmp_path / "plan.yaml"
    Plan(model="tiny", hardware="H200", gpus_budget=1, mode="aggregated",
         pools=[PoolPlan(role="mixed", instances=1, layout=ParallelLayout(),
                         scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256))],
         workload=WorkloadSpec(rate=1.0, num_requests=10), slo=SLO(ttft_s=1.0, tpot_s=0.1)).save(path)
    sc = plan_scheduler(path)
    assert sc["max_num_seqs"] == 8 and sc["max_num_batched_tokens"] == 256
    assert plan_scheduler(path, "tiny") == sc   # run --plan checks the model as serve --plan does
    with pytest.raises(TwinferError, match="was made for model tiny, --model is llama-3.1-8b"):
        plan_scheduler(path, "llama-3.1-8b")
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text("scheduler:\n  max_num_seqs: 4\n")
    assert plan_scheduler(tuned) == {"max_num_seqs": 4}
    tuned.write_text("scheduler: [1, 2]\n")
    with pytest.raises(TwinferError, match="'scheduler' must be a mapping"):
        plan_scheduler(tuned)


def test_run_refuses_a_directory_as_out_or_step_log_before_the_run(cli_exit_2, no_engine, tmp_path):
    """-o DIR was refused only when written, after the whole run, as '/tmp: Is a directory' (no flag named)."""
    assert f"--out {tmp_path}: a directory" in cli_exit_2("run", *SMALL, "-o", str(tmp_path))
    assert f"--step-log {tmp_path}: a directory" in cli_exit_2("run", *SMALL, "--step-log", str(tmp_path))


def test_run_refuses_a_bad_workload_before_the_engine_build(cli_exit_2, no_engine):
    """The workload was read after the engine build (minutes for a catalog model on a GPU)."""
    assert "unknown workload preset 'nosuch'" in cli_exit_2("run", *SMALL, "-w", "nosuch")
    assert "rate" in cli_exit_2("run", *SMALL, "--rate", "nan")


# ------------------------------------------------------------------------------------------- twinfer calibrate
def test_calibrate_sampler_line_prints_only_measured_batches():
    """The line said 'measured: ... at 128' where a quick CPU grid measured 1 and 8 rows (552 ms extrapolated)."""
    from costmodels.calibration import SampleTable
    from ui.cmd_calibrate import sampler_line

    line = sampler_line(SampleTable(batch=[1.0, 8.0], seconds=[0.00015, 0.0306], vocab=512, includes_logits=True))
    assert "measured: 0.150 ms at 1 row, 30.600 ms at 8 " in line and "128" not in line


def test_calibrate_refuses_a_directory_out_and_a_cpu_dtype_it_cannot_measure(cli_exit_2, no_engine, tmp_path):
    """-o DIR failed at the save after the whole measurement; --dtype bf16/fp8/fp64 on the CPU measured a profile whose
    op benchmarks all failed (fp32 activations against the engine's weights)."""
    assert f"--out {tmp_path}: a directory" in cli_exit_2("calibrate", "-m", "tiny", "--quick", "-o", str(tmp_path))
    for dt in ("bf16", "fp8", "fp64"):
        err = cli_exit_2("calibrate", "-m", "tiny", "--quick", "--dtype", dt, "-o", str(tmp_path / "p.json"))
        assert f"--dtype {dt} on --device cpu" in err


# -------------------------------------------------------------------------------------------- twinfer validate
def _validate_sim_only(monkeypatch, capsys, profile: str, requests: int, out) -> str:
    """``twinfer validate --sim-only -p PROFILE -n REQUESTS -o OUT`` through the console entry point, in-process; it
    must exit 0. Returns stdout with its whitespace folded (rich wraps lines)."""
    import sys

    from ui.cli import main

    monkeypatch.setattr(sys, "argv", ["twinfer", "validate", "--sim-only", "-p", profile, "-n", str(requests), "-o", str(out)])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code in (0, None)
    return " ".join(capsys.readouterr().out.split())


def test_validate_sim_only_report_names_the_profiles_device_and_dtype(tmp_path, capsys, monkeypatch):
    """--sim-only with an H200 fp8 profile wrote "device": "cpu" (the executor's default, nothing ran) and notes of dummy
    weights and measured compositions; the matrix printed and the report agree."""
    out = tmp_path / "rep.json"
    printed = _validate_sim_only(monkeypatch, capsys, PROFILE, 20, out)
    rep = json.loads(out.read_text())
    assert (rep["model"], rep["dtype"], rep["device"]) == ("deepseek-v3", "fp8", "cuda")
    assert rep["notes"][0].startswith("simulator only (--sim-only): nothing measured")
    assert not any("dummy weights" in n or "measured batch compositions" in n for n in rep["notes"])
    for lv in rep["levels"]:
        assert f"{lv['rate_rps']:.2f} req/s" in printed
        assert f"{lv['predicted']['output_throughput']:.1f}" in printed
        assert f"{lv['predicted']['ttft_p50'] * 1e3:.1f}" in printed
        # each figure's move with every step 2% longer or shorter, printed as the report holds it
        sens = lv["sensitivity"]
        assert set(sens) >= {"output_throughput", "tpot_p50", "ttft_p50", "ttft_p90"}
        assert f"\u00b1{sens['ttft_p90'] * 100:.1f}%" in printed
        assert sens["itl_p50"] >= 0.015   # a step 2% longer is an inter-token gap about 2% longer, queueing aside
    assert any(n.startswith("sensitivity: how far each predicted figure moves") for n in rep["notes"])
    # the scheduler block is the one the simulator ran: the profile's measured engine loop as its host terms (it
    # showed the defaults)
    from costmodels.calibration import CalibrationProfile
    loop = CalibrationProfile.load(PROFILE).step.loop
    assert (rep["scheduler"]["host_step_s"], rep["scheduler"]["host_per_request_s"]) == (loop.fixed_s, loop.per_request_s)


def test_validate_sim_only_refuses_an_unknown_model_a_dtype_or_device_it_does_not_predict(cli_exit_2):
    """-m nosuch / --dtype bf16 / --device tpu with --sim-only printed the profile's fp8 deepseek-v3 predictions and
    labelled the report with the given names."""
    base = ("validate", "--sim-only", "-p", PROFILE, "-n", "5")
    assert "--model nosuch: --sim-only predicts the model the profile measured (deepseek-v3)" in cli_exit_2(*base, "-m", "nosuch")
    assert "--dtype bf16: --sim-only predicts what the profile measured (fp8)" in cli_exit_2(*base, "--dtype", "bf16")
    assert "--device tpu: expected cpu or cuda" in cli_exit_2(*base, "--device", "tpu")


def test_validate_refuses_a_device_as_trace_too_many_levels_and_a_directory_out(cli_exit_2, tmp_path):
    """--trace /dev/null read 'no such trace file'; 10,000 levels ran 10,000 simulations; -o DIR failed after them."""
    base = ("validate", "--sim-only", "-p", PROFILE, "-n", "5")
    assert "--trace /dev/null: not a regular file" in cli_exit_2(*base, "--trace", "/dev/null")
    assert "--levels: 10000 levels; at most 20" in cli_exit_2(*base, "--levels", ",".join(["0.5"] * 10000))
    assert f"--out {tmp_path}: a directory" in cli_exit_2(*base, "-o", str(tmp_path))


def test_validate_report_names_the_dtype_the_engine_ran(monkeypatch):
    """An executor validation on the CPU with an fp8 H200 profile and no --dtype built the engine in fp32 and named
    the profile's fp8 in the report."""
    import types

    import executor.calibrate
    import ui.cmd_validate as cv

    seen = {}

    def fake_build(model, num_layers, device, dtype, *a, **k):
        seen["engine"] = dtype
        return types.SimpleNamespace(max_model_len=256)

    def fake_levels(*a, **k):
        seen["report"] = k["dtype"]
        raise TwinferError("stop before the replays")

    monkeypatch.setattr(executor.calibrate, "build_engine", fake_build)
    monkeypatch.setattr(cv, "run_levels", fake_levels)
    with pytest.raises(TwinferError, match="stop before"):
        cv.validate(trace=None, workload="chat", requests=5, model=None, num_layers=None, profile=Path(PROFILE), device=None,
                    dtype=None, levels="0.5", max_num_seqs=4, max_batched_tokens=256, max_model_len=256, max_input_len=128,
                    max_output_len=8, num_kv_blocks=None, seed=0, out=None, plot=None, sim_only=False,
                    calibrate_first=False, warm=False, async_overlap=False, runs=1, power_limit=True,
                    host_speed="calibration")
    assert seen == {"engine": "fp32", "report": "fp32"}


# -------------------------------------------------------------------------------------------- twinfer hardware
def test_hardware_show_names_the_flag_and_a_non_regular_file(cli_exit_2, tmp_path):
    """--show /dev/null and --show DIR read "unknown hardware '/dev/null'" (they exist: not a name), without the flag."""
    assert "--show /dev/null: not a regular file" in cli_exit_2("hardware", "--show", "/dev/null")
    assert f"--show {tmp_path}: a directory" in cli_exit_2("hardware", "--show", str(tmp_path))
    assert "--show: unknown hardware 'H999'" in cli_exit_2("hardware", "--show", "H999")


def test_hardware_table_shows_the_catalog_files_figures(capsys, monkeypatch):
    """Each row of the catalog table holds costmodels/data/hardware.yaml's figures for that GPU (HBM: what CUDA sees,
    hbm_visible_gb where the file gives it, as cost sizes it)."""
    from importlib import resources

    import yaml

    from ui.cmd_hardware import _print_catalog

    monkeypatch.setenv("COLUMNS", "200")
    _print_catalog()
    rows = {ln.split()[0]: ln.split() for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    for e in yaml.safe_load(resources.files("costmodels").joinpath("data/hardware.yaml").read_text()):
        cells = rows[e["name"]][1:10]
        want = [e["bf16_tflops"], e.get("fp8_tflops"), e.get("fp4_tflops"), e.get("hbm_visible_gb") or e["hbm_gb"], e["hbm_tbps"], e.get("scaleup_gbps"),
                e["scaleup_domain"], e["scaleout_gbps"], e.get("price_per_gpu_hour") or None]
        assert cells == ["-" if w is None else f"{w:g}" for w in want], e["name"]


def test_run_refuses_a_max_model_len_past_the_models_context():
    """The engine capped `run --max-model-len 100000000000` to tiny's 4,096 tokens without a word, where calibrate and
    validate refused it; vLLM refuses a max_model_len past max_position_embeddings."""
    from typer.testing import CliRunner

    from ui.cli import app

    r = CliRunner().invoke(app, ["run", "-m", "tiny", "--max-model-len", "100000000000"])
    assert isinstance(r.exception, TwinferError), r.output
    assert "max_model_len: 100,000,000,000 is past tiny's context of 4,096 tokens" in str(r.exception)


def test_validate_warns_of_a_profile_calibrated_on_a_moving_host(tmp_path, capsys, monkeypatch):
    """A profile whose host probes (start, after the grid, end of its calibration) read 146-486 us, as H100 run 51's did:
    validate says before its levels that the host terms came from a moving host, and the report keeps it in its
    notes; the committed H200 profile (no probes recorded) gets neither."""
    data = json.loads(Path(PROFILE).read_text())
    data["provenance"]["host_probe_s"] = {"start": 3.5737e-4, "after_grid": 1.4637e-4, "end": 4.8597e-4}
    moving = tmp_path / "moving.json"
    moving.write_text(json.dumps(data))
    for prof, warned in ((str(moving), True), (PROFILE, False)):
        out = tmp_path / "rep.json"
        printed = _validate_sim_only(monkeypatch, capsys, prof, 8, out)
        notes = json.loads(out.read_text())["notes"]
        assert ("warning: the host's speed moved during calibration" in printed) == warned
        assert any("start 357 us, after_grid 146 us, end 486 us (232% apart" in n for n in notes) == warned


def test_simulate_on_a_profile_calibrated_on_a_moving_host_says_so(tmp_path):
    """The same warning among the notes `twinfer simulate` prints first (``calibration_source.profile_for``), right
    after the line naming the profile; a profile whose probes agree, or that recorded none, adds nothing."""
    from costmodels.calibration_source import profile_for
    from costmodels.hardware import get_hardware

    data = json.loads(Path(PROFILE).read_text())
    hw = get_hardware("H200")
    for probes, warned in (({"start": 1.5062e-4, "after_grid": 2.7124e-4, "end": 2.8615e-4}, True),
                           ({"start": 1.3754e-4, "after_grid": 1.3839e-4, "end": 1.3750e-4}, False), (None, False)):
        data["provenance"]["host_probe_s"] = probes
        path = tmp_path / "p.json"
        path.write_text(json.dumps(data))
        notes = profile_for(hw, path).notes
        assert notes[0].startswith("efficiencies from calibration profile")
        assert notes[1].startswith("the host's speed moved during calibration") == warned
        assert ("(90% apart, > 25%)" in notes[1]) == warned
