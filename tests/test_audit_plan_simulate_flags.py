"""Audit of ``twinfer plan`` on a trace and of the arrival flags of ``twinfer simulate`` / ``twinfer plan``.

A trace has a rate (its requests over their arrival span): the plan printed "at an offered 0.0 req/s" for one, and its
slices replayed the whole trace at the trace's own rate on whatever share of a deployment they simulated while being
ranked as if offered the screened rate. The arrival flags' conflicts read differently per command and path (--trace
with --rate: "only used when kind is ... or closed", which a closed loop refuses), and --workload beside --trace was
silently ignored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from twinfer.errors import TwinferError

TRACE = str(Path(__file__).resolve().parents[1] / "sim" / "data" / "traces" / "sample_chat.jsonl")   # 40 requests
SLO = ["--slo", "ttft_p90=2s,tpot_p90=50ms"]
SMALL_PLAN = ["-m", "qwen3-30b-a3b", "--hw", "h100", "--gpus", "8", *SLO, "--simulate", "1", "--workers", "1"]


def _trace_spec(**kw):
    from sim.workload import WorkloadSpec

    return WorkloadSpec(kind="trace", trace_path=TRACE, **kw)


def _times() -> list[float]:
    return sorted(json.loads(line)["timestamp"] for line in Path(TRACE).read_text().splitlines() if line.strip())


# ------------------------------------------------------------------------------------- item 5: a trace's rate
def test_a_trace_offers_its_requests_over_their_arrival_span():
    from sim.workload import at_rate, offered_rate, trace_arrivals

    t = _times()
    spec = _trace_spec()
    assert trace_arrivals(spec) == (len(t), pytest.approx(t[-1] - t[0]))
    assert offered_rate(spec) == pytest.approx((len(t) - 1) / (t[-1] - t[0]))
    assert offered_rate(_trace_spec(time_scale=0.5)) == pytest.approx(2 * offered_rate(spec))
    fast = at_rate(spec, 25.0)                  # the trace's arrival times scaled: it offers 25 req/s
    assert fast.kind == "trace" and offered_rate(fast) == pytest.approx(25.0)
    first = at_rate(spec, 25.0, 10)             # its first 10 requests, those at 25 req/s
    assert first.max_requests == 10 and offered_rate(first) == pytest.approx(25.0)
    cut = at_rate(_trace_spec(duration_s=2.0), 25.0)   # a duration keeps the same requests
    assert trace_arrivals(cut)[0] == trace_arrivals(_trace_spec(duration_s=2.0))[0]
    gen = at_rate(_trace_spec().model_copy(update={"kind": "poisson", "trace_path": None, "rate": 1.0}), 3.0, 50)
    assert (gen.rate, gen.num_requests, gen.duration_s) == (3.0, 50, None)


def test_a_planner_slice_of_a_trace_is_offered_the_rate_it_is_ranked_at():
    """steady_workload returned the trace unchanged: every slice replayed the whole trace at its own rate."""
    from planner.simulate import steady_workload
    from sim.workload import offered_rate

    wl, warmup = steady_workload(_trace_spec(), 3.5, 20)
    assert warmup == 0.0 and wl.max_requests == 20 and offered_rate(wl) == pytest.approx(3.5)


def test_the_planners_workload_stats_carry_a_traces_rate():
    from planner.workload_stats import workload_stats

    t = _times()
    st = workload_stats(_trace_spec())
    rate = (len(t) - 1) / (t[-1] - t[0])
    assert st.rate == pytest.approx(rate) and st.arrivals == (len(t), pytest.approx(t[-1] - t[0]))
    assert st.describe().startswith(f"{len(t)} requests arriving over {t[-1] - t[0]:,.4g} s as recorded ({rate:,.3g} req/s); ")


def test_a_trace_arriving_at_one_instant_has_no_rate_to_plan_for(tmp_path, cli_exit_2):
    burst = tmp_path / "burst.jsonl"
    burst.write_text("".join(json.dumps({"timestamp": 0.0, "input_length": 100, "output_length": 10}) + "\n" for _ in range(5)))
    err = cli_exit_2("plan", *SMALL_PLAN, "--trace", str(burst))
    assert "has no arrival rate: its 5 request(s) arrive at one instant" in err


def test_plan_of_a_trace_prints_the_rate_its_run_offers(tmp_path):
    """'at an offered 0.0 req/s': the full-scale run's rate was the workload's `rate` field, which a trace has not.
    The plan, its JSON and `simulate --plan` name one offered rate: that of the trace as the plan's run replays it."""
    from typer.testing import CliRunner

    from planner.plan import load_plan
    from sim.workload import offered_rate, trace_arrivals
    from ui.cli import app

    out = tmp_path / "plan.yaml"
    r = CliRunner().invoke(app, ["plan", *SMALL_PLAN, "--trace", TRACE, "--out", str(out)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    pr = plan.predicted
    rate = offered_rate(plan.workload)
    assert plan.workload.kind == "trace" and rate > 0 and pr.request_rate == pytest.approx(rate)
    text = " ".join(r.stdout.split())
    assert f"at an offered {rate:,.1f} req/s" in text
    n, span = trace_arrivals(plan.workload)
    assert f"replayed at time_scale {plan.workload.time_scale:.4g}" in text and f"{n:,} requests arriving over {span:,.4g} s" in text
    assert "note: the trace holds 40 requests" in text   # the plan's run was sized for more than the trace has
    sim = CliRunner().invoke(app, ["simulate", "--plan", str(out)], env={"COLUMNS": "200"})
    assert sim.exit_code == 0, sim.output
    assert f"{n} requests offered at {rate:,.1f} req/s" in " ".join(sim.stdout.split())
    assert "the plan's own run" in sim.stdout
    few = CliRunner().invoke(app, ["simulate", "--plan", str(out), "--requests", "10", "--json"])   # was ignored
    assert few.exit_code == 0 and json.loads(few.stdout)["num_requests"] == 10


# ---------------------------------------------------------------------------- item 8: the arrival flags
@pytest.mark.parametrize("args, words", [
    (["--trace", TRACE, "--rate", "5"],
     "--rate: a trace has no arrival rate to set (--trace replays the file's own arrival times); drop --rate, or drop "
     "--trace for generated arrivals at that rate"),
    (["--concurrency", "4", "--rate", "5"],
     "--rate: a closed loop has no arrival rate (--concurrency makes the workload one: its users set the load); "
     "drop --rate, or drop --concurrency for open arrivals at that rate"),
    (["--think-time-s", "1", "--rate", "5"], "--rate: a closed loop has no arrival rate (--think-time-s makes"),
    (["--trace", TRACE, "--concurrency", "4"],
     "--concurrency: a trace cannot run as a closed loop (--trace replays the file's own arrival times"),
    (["--trace", TRACE, "-w", "chat"], "--workload and --trace: both set the workload"),
    (["--trace", TRACE, "--workload", "chat", "--rate", "3"], "--workload and --trace: both set the workload"),
    (["--trace-format", "jsonl"], "--trace-format: only with --trace PATH"),
])
def test_simulate_arrival_flag_conflicts_name_both_flags(cli_exit_2, args, words):
    err = cli_exit_2("simulate", "-n", "20", *args)
    assert words in err
    assert "only used when kind is" not in err   # the field's message, which listed 'closed' as taking a rate


def test_the_workload_a_flag_meets_is_named_too(tmp_path, cli_exit_2):
    base = {"model": "deepseek-v3", "hardware": "H200", "layout": {"tp": 8}}
    closed, trace = tmp_path / "closed.yaml", tmp_path / "trace.yaml"
    closed.write_text(yaml.safe_dump({**base, "workload": {"kind": "closed", "num_requests": 30, "concurrency": 2}}))
    trace.write_text(yaml.safe_dump({**base, "workload": {"kind": "trace", "trace_path": TRACE}}))
    assert ("--rate: a closed loop has no arrival rate (the scenario's workload is kind: closed: its users set the load)"
            in cli_exit_2("simulate", "-s", str(closed), "--rate", "5"))
    assert ("--rate: a trace has no arrival rate to set (the scenario's workload is a trace"
            in cli_exit_2("simulate", "-s", str(trace), "--rate", "5"))
    assert ("--concurrency: a trace cannot run as a closed loop (the scenario's workload is a trace"
            in cli_exit_2("simulate", "-s", str(trace), "--concurrency", "5"))


def test_a_preset_replaces_a_scenarios_trace_so_rate_applies(tmp_path):
    from ui.cmd_simulate import effective_scenario

    f = tmp_path / "trace.yaml"
    f.write_text(yaml.safe_dump({"model": "deepseek-v3", "hardware": "H200", "layout": {"tp": 8},
                                 "workload": {"kind": "trace", "trace_path": TRACE}}))
    sc = effective_scenario(str(f), workload="chat", rate=5.0, requests=20)
    assert sc.workload.kind == "poisson" and sc.workload.rate == 5.0


def test_a_plan_of_a_trace_refuses_rate_and_closed_loop_flags(tmp_path, cli_exit_2):
    from planner.plan import Plan
    from ui.cmd_simulate import scenario_from_plan

    plan = tmp_path / "p.yaml"
    doc = {"name": "t", "model": "deepseek-v3", "hardware": "H200", "gpus_budget": 8, "mode": "aggregated",
           "pools": [{"role": "mixed", "instances": 1, "layout": {"tp": 8},
                      "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 8192}}],
           "workload": {"kind": "trace", "trace_path": TRACE}, "slo": {"ttft_s": 2, "tpot_s": 0.05},
           "predicted": {"source": "screen", "request_rate": 9.0, "output_tokens_per_s_per_gpu": 1.0,
                         "tokens_per_s_per_user": 1.0, "ttft_s": 1.0, "tpot_s": 0.01}}
    Plan.model_validate(doc)
    plan.write_text(yaml.safe_dump(doc))
    assert "--rate: a trace has no arrival rate to set (the plan's workload is a trace" in cli_exit_2(
        "simulate", "--plan", str(plan), "--rate", "3")   # was: ignored (the trace ran at its own rate)
    assert "--think-time-s: a trace cannot run as a closed loop (the plan's workload is a trace" in cli_exit_2(
        "simulate", "--plan", str(plan), "--think-time-s", "1")
    sc, _ = scenario_from_plan(str(plan), scenario=None, requests=7, rate=None, seed=None, others={})
    assert sc.workload.max_requests == 7   # --requests: the trace's first 7 (num_requests was set and ignored)


def test_a_trace_workload_with_a_rate_names_the_kinds_that_take_one():
    from sim.workload import WorkloadSpec
    from twinfer.config import validate

    with pytest.raises(TwinferError) as e:
        validate(WorkloadSpec, {"kind": "trace", "trace_path": TRACE, "rate": 2}, "workload")
    msg = str(e.value)
    assert "rate: only used when kind is poisson, gamma, constant or agentic (kind is 'trace'" in msg
    assert "closed" not in msg and "time_scale" in msg


@pytest.mark.parametrize("args, words", [
    (["--trace", TRACE, "-w", "chat"], "--workload and --trace: both set the workload"),
    (["--trace-format", "mooncake"], "--trace-format: only with --trace PATH"),
    (["-w", TRACE], f"--workload {TRACE}: a .jsonl file is a trace; give it as --trace {TRACE}"),
    (["--trace", "/nonexistent/t.jsonl"], "/nonexistent/t.jsonl: no such trace file"),
])
def test_plan_takes_the_same_workload_flags_as_simulate(cli_exit_2, args, words):
    """plan had no --trace (a trace only through a workload file), and -w FILE.jsonl failed with a YAML parser's
    message of several lines."""
    assert words in cli_exit_2("plan", *SMALL_PLAN, *args)


def test_plan_trace_flag_sets_a_trace_workload():
    from ui.cmd_plan import build_request

    req = build_request(None, gpus=8, slo="ttft_p90=2s,tpot_p90=50ms", trace=TRACE, trace_format="jsonl")
    assert req.workload.kind == "trace" and req.workload.trace_path == TRACE
    assert np.isclose(req.workload.time_scale, 1.0)
