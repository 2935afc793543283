"""Audit 2: serve --plan applies the plan or says what it cannot run (it ran the defaults without a word); validate
refuses a workload most of whose requests its --max-model-len would clip (and notes it where some are); an agentic
run prints the arrival rate it offered; a replay policy on a model without window layers is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from twinfer.errors import TwinferError
from ui.cli import app

PROFILE = str(Path(__file__).resolve().parents[1] / "profiles" / "h100" / "calibration_deepseek-v3-5layers_fp8.json")


def _plan(path: Path, *, model: str = "tiny", tp: int = 2, instances: int = 1, max_num_seqs: int = 7,
          weight_dtype: str = "bf16") -> Path:
    from costmodels.layout import ParallelLayout
    from planner.plan import Plan, PoolPlan
    from scheduler.config import SchedulerConfig
    from scheduler.metrics import SLO
    from sim.workload import WorkloadSpec

    Plan(model=model, hardware="H100", gpus_budget=tp * instances, mode="aggregated",
         pools=[PoolPlan(role="mixed", instances=instances, layout=ParallelLayout(tp=tp, weight_dtype=weight_dtype),
                         scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=4224))],
         workload=WorkloadSpec(rate=1.0, num_requests=10), slo=SLO(ttft_s=1.0, tpot_s=0.1)).save(path)
    return path


# ------------------------------------------------------------------------------------------- 1. serve --plan
def test_serve_plan_of_a_tp2_instance_applies_its_scheduler_and_says_what_one_server_does_not_run(tmp_path, capsys):
    """A plan of tp=2 (EP width 1, 2 GPUs) gave (1, {}): the engine ran its defaults and nothing was said."""
    from ui.serve_plan import serving_options

    world, opts = serving_options(str(_plan(tmp_path / "p.yaml", instances=2)), "cpu", "tiny")
    assert world == 1 and opts["scheduler_config"].max_num_seqs == 7
    assert opts["scheduler_config"].max_num_batched_tokens == 4224
    err = " ".join(capsys.readouterr().err.split())
    assert "the plan runs 2 instances of its serving pool; this server is one of them (start 1 more" in err
    assert "spans 2 GPUs (tp=2, dp=1, pp=1)" in err and "runs the whole model on one device" in err
    assert "max_num_seqs 7, max_num_batched_tokens 4224" in err
    # one note a line, each naming what it is about
    assert all(line.startswith("twinfer serve: ") for line in capsys.readouterr().err.splitlines())


def test_serve_plan_scheduler_reaches_the_engine(tmp_path):
    pytest.importorskip("torch")
    from executor.engine import LLMEngine
    from ui.serve_plan import serving_options

    _, opts = serving_options(str(_plan(tmp_path / "p.yaml")), "cpu", "tiny")
    eng = LLMEngine.from_args("tiny", device="cpu", dtype="fp32", max_model_len=256, **opts)
    assert eng.scheduler.config.max_num_seqs == 7


def test_serve_plan_for_another_model_is_exit_2_before_the_engine(tmp_path, monkeypatch, cli_exit_2):
    pytest.importorskip("uvicorn")
    import ui.cmd_serve as cs

    monkeypatch.setattr(cs, "build_engine", lambda *a, **k: pytest.fail("engine built"))
    plan = _plan(tmp_path / "p.yaml", model="llama-3.1-8b")
    err = cli_exit_2("serve", "-m", "tiny", "--load-format", "dummy", "--device", "cpu", "--port", "0", "--plan", str(plan))
    assert f"--plan {plan} was made for model llama-3.1-8b, --model is tiny" in err and "--model llama-3.1-8b" in err


def test_serve_plan_model_match_takes_aliases_and_checkpoint_folders(tmp_path):
    from ui.serve_plan import same_model

    assert same_model("tiny", "TINY") and same_model("llama3.1-8b", "llama-3.1-8b")   # an alias
    assert not same_model("llama-3.1-8b", "tiny")
    assert not same_model("/no/such/folder", "tiny")
    # a checkpoint folder is named by its folder: the same network as the catalog's is the same model
    import costmodels
    hf = json.loads((Path(costmodels.__file__).parent / "data" / "models" / "llama-3.1-8b.json").read_text())["hf_config"]
    ckpt = tmp_path / "Meta-Llama-3.1-8B-Instruct"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(hf))
    assert same_model("llama-3.1-8b", str(ckpt)) and not same_model("llama-3.1-70b", str(ckpt))


def test_serve_cli_passes_the_plan_to_the_engine_and_prints_its_notes(tmp_path, monkeypatch, capsys):
    pytest.importorskip("uvicorn")
    import ui.cmd_serve as cs

    got = {}

    class Built(Exception):
        pass

    def fake_build(*a, **k):
        got.update(k)
        raise Built

    monkeypatch.setattr(cs, "build_engine", fake_build)
    plan = _plan(tmp_path / "p.yaml", weight_dtype="fp8")
    with pytest.raises(Built):
        cs.serve(model="tiny", load_format="dummy", plan=str(plan), device="cpu", dtype=None, host="127.0.0.1", port=0,
                 api_key=None, served_model_name=None, max_model_len=None, num_kv_blocks=None, seed=0, max_queue=8,
                 drain_timeout=1.0, read_timeout=1.0, max_connections=8, log_level="warning", async_overlap=None)
    world, kw = got["plan_options"]
    assert world == 1 and kw["scheduler_config"].max_num_seqs == 7
    err = " ".join(capsys.readouterr().err.split())
    assert "the plan's weights are fp8 (layout.weight_dtype); this server runs bf16 (--dtype)" in err


def test_serve_plan_refuses_a_file_that_is_not_a_plan(tmp_path):
    """Any mapping without 'scheduler' or 'pools' (a calibration profile, a scenario) was served on the defaults."""
    from ui.serve_plan import serving_options

    with pytest.raises(TwinferError, match=r"not a plan \(no 'scheduler' section, no 'pools'\)"):
        serving_options(PROFILE, "cpu", "tiny")


def test_run_and_serve_read_a_plan_through_one_function(tmp_path):
    from ui.cmd_run import plan_scheduler
    from ui.serve_plan import read_plan

    plan = _plan(tmp_path / "p.yaml")
    assert plan_scheduler(plan) == read_plan(plan, "twinfer serve").scheduler
    assert plan_scheduler(plan)["max_num_seqs"] == 7


# ------------------------------------------------------------------------------------- 2. validate clipping
def test_validate_refuses_a_workload_its_context_would_clip_nearly_whole(cli_exit_2):
    """long-context (16k-32k prompts) at the default --max-model-len 4096 ran as 4,094-token prompts with one output
    token each, the report still saying long-context, TPOT '-' everywhere, nothing said."""
    err = cli_exit_2("validate", "-p", PROFILE, "--sim-only", "-n", "20", "-w", "long-context")
    assert "--max-model-len 4096: 20 of 20 requests of 'long-context' do not fit it" in err
    assert "give --max-model-len" in err and "--max-input-len/--max-output-len" in err


def test_validate_notes_the_requests_its_context_clipped(tmp_path):
    out = tmp_path / "rep.json"
    r = CliRunner().invoke(app, ["validate", "-p", PROFILE, "--sim-only", "-n", "20", "-w", "chat", "-o", str(out)],
                           env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "2 of 20 requests clipped to fit --max-model-len 4096" in text
    notes = json.loads(out.read_text())["notes"]
    assert any(n.startswith("2 of 20 requests clipped to fit --max-model-len 4096") for n in notes)
    # asking for a context that fits them: no note
    r = CliRunner().invoke(app, ["validate", "-p", PROFILE, "--sim-only", "-n", "20", "-w", "chat", "--max-model-len",
                                 "27747", "--levels", "0.5"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "clipped" not in r.output


def test_clamp_requests_counts_only_what_the_context_clipped():
    from scheduler.request import Request
    from ui.cmd_validate import clamp_requests, context_clip_note

    reqs = [Request("a", 0.0, 100, 10, ()), Request("b", 1.0, 5000, 10, ()), Request("c", 2.0, 30, 3, ())]
    out, clipped, longest = clamp_requests(reqs, 64, None, None, 4096)
    assert clipped == 1 and longest == 5010 and out[1].prompt_len + out[1].output_len <= 4095
    # --max-input-len shortens on purpose: not counted
    _, clipped, longest = clamp_requests([Request("b", 1.0, 5000, 10, ())], 64, 1000, None, 4096)
    assert (clipped, longest) == (0, 1010)
    assert context_clip_note(0, 3, 100, 4096, "chat") is None
    assert "1 of 3 requests clipped to fit --max-model-len 4096" in context_clip_note(1, 3, 5010, 4096, "chat")
    with pytest.raises(TwinferError, match="--max-model-len 4096: 2 of 3 requests"):
        context_clip_note(2, 3, 5010, 4096, "chat")


def test_bench_and_validate_share_the_clipped_wording():
    from ui.cmd_bench import clipped_note

    assert clipped_note(3, 10, "the server's max_model_len 4096") == \
        "3 of 10 requests clipped to fit the server's max_model_len 4096"


# ------------------------------------------------------------------------------------ 3. agentic offered rate
def test_agentic_run_prints_the_rate_its_arrivals_offered():
    """200 agentic turns arrived at ~2.1 req/s (sessions ramping up) and the line said 'offered at 5.0 req/s'."""
    r = CliRunner().invoke(app, ["simulate", "-w", "agentic", "-n", "200", "--json"])
    assert r.exit_code == 0, r.output
    w = json.loads(r.stdout)["metrics"]["whole_run"]
    realized = (w["requests_arrived"] - 1) / (w["arrivals_to_s"] - w["arrivals_from_s"])
    assert realized < 4.0
    r = CliRunner().invoke(app, ["simulate", "-w", "agentic", "-n", "200"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert f"200 requests offered at {realized:,.1f} req/s (first to last arrival; agentic: sessions start at " in text
    assert "workload rate 5.0 req/s" in text and "offered at 5.0" not in text


def test_poisson_run_still_prints_its_rate():
    from ui.cmd_simulate import _offered

    assert _offered({"kind": "poisson", "rate": 2.5}) == " offered at 2.5 req/s"
    assert _offered({"kind": "closed", "concurrency": 4}) == ""


# ------------------------------------------------------------------------------ 4. replay without windows
@pytest.mark.parametrize("rule", ["recompute", "replay:128", "replay"])
def test_replay_rule_on_a_model_without_window_layers_is_exit_2(cli_exit_2, rule):
    """deepseek-v3 has no sliding-window layers: the run was byte-identical to no flag, exit 0."""
    err = cli_exit_2("simulate", "-n", "5", "--replay", rule, "--print-scenario")
    assert f"--replay '{rule}'" in err and "deepseek-v3" in err and "no sliding-window layers" in err
    assert len(err.splitlines()) == 1


def test_persist_and_window_models_still_take_replay_rules():
    for args in (["--replay", "persist"], ["-m", "deepseek-v4-flash", "--replay", "recompute"]):
        r = CliRunner().invoke(app, ["simulate", "-n", "5", *args, "--print-scenario"])
        assert r.exit_code == 0, r.output


def test_replay_in_a_scenario_file_on_a_model_without_windows_names_the_field(cli_exit_2, tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: deepseek-v3\nhardware: h200\nlayout: {tp: 8}\nscheduler: {replay: {kinds: {sliding: replay:64}}}\n"
                 "workload: {kind: poisson, rate: 1, num_requests: 5}\n")
    err = cli_exit_2("simulate", "--scenario", str(f), "--print-scenario")
    assert "scheduler.replay: kinds.sliding replay:64 on deepseek-v3, which has no sliding-window layers" in err
