"""Closed-loop workloads (kind: closed): validation, per-(user, k) content, the in-flight bound in the simulator
(one instance, routed instances, PD disaggregation), determinism, refusals freeing a user's slot, and twinfer bench."""

from __future__ import annotations

import math

import numpy as np
import pytest

from costmodels.layout import ParallelLayout
from scheduler.config import SchedulerConfig
from scheduler.request import RequestStatus
from sim.closed_loop import CHUNK, UserContent
from sim.disagg import DisaggSpec
from sim.lengths import ExponentialLength
from sim.runner import scenario_requests, simulate
from sim.scenario import Scenario
from sim.workload import MAX_CONCURRENCY, WorkloadSpec, expected_tokens, generate
from twinfer.config import validate
from twinfer.errors import TwinferError

TP8 = ParallelLayout(tp=8, weight_dtype="fp8")


def closed(**kw) -> WorkloadSpec:
    base = {"kind": "closed", "concurrency": 8, "num_requests": 120,
            "input_len": {"kind": "uniform", "min": 200, "max": 1500}, "output_len": {"kind": "uniform", "min": 20, "max": 200}}
    return validate(WorkloadSpec, {**base, **kw}, "workload")


def scenario(wl: WorkloadSpec, **kw) -> Scenario:
    return Scenario(model="deepseek-v3", hardware="h200", layout=TP8, workload=wl,
                    scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=8192), **kw)


def max_in_flight(requests) -> int:
    """Most requests between arrival and end at once, from the requests' own timestamps (an end before an
    arrival at the same time: a user's next request may arrive the instant its last one ends)."""
    events = []
    for r in requests:
        end = r.finish_time if r.finish_time is not None else r.arrival_time  # refused on arrival
        events += [(r.arrival_time, 1), (end, -1)]
    events.sort()
    most = cur = 0
    for _, d in events:
        cur += d
        most = max(most, cur)
    return most


def check_users(requests, concurrency: int) -> None:
    """Each user's requests one after another: the next arrives at/after the previous one's end."""
    by_user: dict[str, list] = {}
    for r in requests:
        by_user.setdefault(r.session_id, []).append(r)
    assert len(by_user) <= concurrency
    for reqs in by_user.values():
        for a, b in zip(reqs, reqs[1:]):
            end = a.finish_time if a.finish_time is not None else a.arrival_time
            assert b.arrival_time >= end


# ---------------------------------------------------------------- the spec


@pytest.mark.parametrize("data, field", [
    ({"concurrency": 0}, "concurrency"),
    ({"concurrency": MAX_CONCURRENCY + 1}, "concurrency"),
    ({"concurrency": None}, "concurrency: required"),
    ({"rate": 5.0}, "rate: not used when kind is 'closed'"),
    ({"num_requests": None}, "num_requests or duration_s"),
    ({"think_time_s": -1}, "think_time_s"),
    ({"think_time_s": {"kind": "exponential", "mean": 0}}, "think_time_s"),
    ({"think_time_s": {"kind": "exponential", "mean": 1, "max": 1e12}}, "think_time_s: values must stay"),
    ({"num_requests": 10**8}, "num_requests"),
    ({"duration_s": -3}, "duration_s"),
    ({"turns": 3}, "turns: only used when kind is agentic"),
])
def test_bad_closed_specs_name_the_field(data, field):
    with pytest.raises(TwinferError, match=field):
        closed(**data)


def test_concurrency_is_closed_only_and_left_out_of_other_kinds_dumps():
    with pytest.raises(TwinferError, match="concurrency: only used when kind is closed"):
        validate(WorkloadSpec, {"kind": "poisson", "rate": 1, "num_requests": 5, "concurrency": 4}, "w")
    assert "concurrency" not in WorkloadSpec(kind="poisson", rate=1, num_requests=5).model_dump()  # old digests hold
    assert closed().model_dump()["concurrency"] == 8


def test_closed_think_time_defaults_to_zero_and_round_trips():
    wl = closed()
    assert wl.think_time_s.mean() == 0.0
    assert WorkloadSpec(kind="agentic", rate=1, num_requests=5).think_time_s.mean() == 5.0  # agentic keeps its 5 s
    again = WorkloadSpec.model_validate(wl.model_dump(mode="json"))
    assert again == wl
    assert expected_tokens(wl) == pytest.approx((850.0, 110.0))
    with pytest.raises(TwinferError, match="kind 'closed' has no arrival list"):
        generate(wl, np.random.default_rng(0), 64)


def test_exponential_think_time_mean_and_clip():
    d = ExponentialLength(mean=2.0)
    x = d.sample_float(np.random.default_rng(1), 200_000)
    assert x.mean() == pytest.approx(2.0, rel=0.02) and d.mean() == 2.0 and x.min() >= 0
    c = ExponentialLength(mean=2.0, min=0.5, max=3.0)
    y = c.sample_float(np.random.default_rng(2), 200_000)
    # E[clip(X, a, b)] = a + m (e^(-a/m) - e^(-b/m))
    assert c.mean() == pytest.approx(0.5 + 2.0 * (math.exp(-0.25) - math.exp(-1.5)))
    assert y.mean() == pytest.approx(c.mean(), rel=0.01) and y.min() == 0.5 and y.max() == 3.0


def test_user_content_depends_only_on_seed_user_and_k():
    wl = closed(shared_prefix_len=256, num_prefix_groups=3, hash_private_blocks=True, priority_mix={0: 1, 1: 1},
                think_time_s={"kind": "exponential", "mean": 1.0})
    a = UserContent(wl, np.random.default_rng(7), 64)
    forward = [a.draw(u, k) for u in range(4) for k in range(2 * CHUNK + 3)]
    b = UserContent(wl, np.random.default_rng(7), 64)  # another order: late k first, users interleaved
    backward = {(u, k): b.draw(u, k) for k in reversed(range(2 * CHUNK + 3)) for u in (3, 1, 0, 2)}
    assert forward == [backward[(u, k)] for u in range(4) for k in range(2 * CHUNK + 3)]
    assert len({d.key for d in forward}) == len(forward)
    d = forward[5]
    assert len(d.block_hashes) == d.prompt_len // 64 and d.priority in (0, 1) and d.think_s > 0
    assert len({x.block_hashes[:4] for x in forward}) == 3  # one shared prefix per group
    other = UserContent(wl, np.random.default_rng(8), 64).draw(0, 0)
    assert other != forward[0]


# ---------------------------------------------------------------- the simulator


def test_never_more_than_n_in_flight_one_instance():
    run = simulate(scenario(closed()), debug=True)
    res, reqs = run.result, run.requests
    assert res.num_requests == res.metrics.requests_finished == 120
    assert max_in_flight(reqs) == 8  # reaches N (all start at t = 0) and never passes it
    check_users(reqs, 8)
    assert res.metrics.mean_batch_requests <= 8


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "prefix_aware"])
def test_never_more_than_n_in_flight_routed_instances(router):
    wl = closed(concurrency=12, num_requests=150, think_time_s={"kind": "exponential", "mean": 0.2})
    run = simulate(scenario(wl, instances=3, router={"kind": router}), debug=True)
    assert run.result.metrics.requests_finished == 150
    assert max_in_flight(run.requests) <= 12
    check_users(run.requests, 12)


def test_never_more_than_n_in_flight_disaggregated():
    wl = closed(concurrency=10, num_requests=100)
    sc = scenario(wl, disagg=DisaggSpec(prefill_layout=TP8, prefill_instances=2), instances=2)
    run = simulate(sc, debug=True)
    assert run.result.num_gpus == 32 and run.result.metrics.requests_finished == 100
    assert max_in_flight(run.requests) == 10
    check_users(run.requests, 10)
    assert all(r.first_token_time <= r.finish_time for r in run.requests)


def test_disaggregated_first_token_finishes_free_their_users():
    # one-token outputs end on the prefill pool (no decode instance sees them): their users must still go on
    wl = closed(concurrency=5, num_requests=60, output_len={"kind": "uniform", "min": 1, "max": 3})
    run = simulate(scenario(wl, disagg=DisaggSpec(prefill_layout=TP8)), debug=True)
    assert run.result.metrics.requests_finished == run.result.num_requests == 60
    assert any(r.output_len == 1 for r in run.requests) and max_in_flight(run.requests) == 5


def test_never_more_than_n_in_flight_deployment_runner_with_effects():
    # serving effects route the run through sim.deployment's aggregated path
    wl = closed(concurrency=9, num_requests=90, shared_prefix_len=256, num_prefix_groups=2)
    sc = scenario(wl, instances=2, router={"kind": "prefix_aware"}, effects={"host_cache_gb": 1.0})
    assert sc.needs_deployment_runner
    run = simulate(sc, debug=True)
    assert run.result.metrics.requests_finished == 90
    assert max_in_flight(run.requests) == 9
    check_users(run.requests, 9)


def test_next_request_arrives_a_think_time_after_the_last_one_ends():
    run = simulate(scenario(closed(concurrency=1, num_requests=6, think_time_s=0.75)))
    reqs = run.requests
    assert [r.request_id for r in reqs] == [f"r{i}" for i in range(6)] and reqs[0].arrival_time == 0.0
    for a, b in zip(reqs, reqs[1:]):
        assert b.arrival_time == a.finish_time + 0.75


def test_same_seed_same_digest_and_content_independent_of_timing():
    wl = closed(think_time_s={"kind": "exponential", "mean": 0.3}, shared_prefix_len=128, num_prefix_groups=2)
    a, b = simulate(scenario(wl)), simulate(scenario(wl))
    assert a.result.digest == b.result.digest
    assert simulate(scenario(wl, seed=1)).result.digest != a.result.digest
    # another deployment changes when each request is sent, not what user u's k-th request is
    c = simulate(scenario(wl, instances=2))
    def content(run):
        out, seen = {}, {}
        for r in run.requests:
            k = seen[r.session_id] = seen.get(r.session_id, -1) + 1
            out[(r.session_id, k)] = (r.prompt_len, r.output_len, r.block_hashes)
        return out
    ca, cc = content(a), content(c)
    common = set(ca) & set(cc)
    assert len(common) > 100 and all(ca[key] == cc[key] for key in common)
    assert [r.arrival_time for r in a.requests] != [r.arrival_time for r in c.requests]


def test_refused_requests_free_their_users_slot():
    # prompts past max_model_len are refused on arrival; their users go on sending
    wl = closed(concurrency=4, num_requests=60, input_len={"kind": "uniform", "min": 100, "max": 4000})
    sc = scenario(wl).model_copy(update={"scheduler": SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=8192,
                                                                     max_model_len=2048)})
    run = simulate(sc, debug=True)
    m = run.result.metrics
    assert m.requests_dropped > 5 and m.requests_finished > 5
    assert m.requests_dropped + m.requests_finished == run.result.num_requests == 60
    assert all(r.status is RequestStatus.DROPPED for r in run.requests if r.prompt_len + r.output_len > 2048)
    assert max_in_flight(run.requests) <= 4


def test_a_run_that_can_only_refuse_stops_with_an_error():
    wl = closed(concurrency=2, num_requests=None, duration_s=10, input_len=5000)
    sc = scenario(wl).model_copy(update={"scheduler": SchedulerConfig(max_model_len=2048)})
    with pytest.raises(TwinferError, match="refused on arrival"):
        simulate(sc)


def test_duration_bounds_the_sending_and_cli_progress_list_fills():
    wl = closed(concurrency=6, num_requests=None, duration_s=20.0, think_time_s=1.0)
    sc = scenario(wl)
    sink = scenario_requests(sc)
    assert sink == []
    run = simulate(sc, requests=sink)
    assert run.requests is sink and len(sink) == run.result.num_requests > 6
    assert max(r.arrival_time for r in sink) < 20.0 and run.result.simulated_s >= 20.0
    assert all(r.finish_time is not None for r in sink)


def test_more_users_more_throughput_per_gpu_fewer_tokens_per_user():
    one = simulate(scenario(closed(concurrency=1, num_requests=40))).result.metrics
    many = simulate(scenario(closed(concurrency=48, num_requests=400))).result.metrics
    assert many.output_throughput_per_gpu > 5 * one.output_throughput_per_gpu
    assert many.per_user_output_tps_mean < one.per_user_output_tps_mean


def test_the_planner_refuses_a_closed_loop_clearly():
    from planner.request import PlanRequest

    with pytest.raises(TwinferError, match="workload.kind: 'closed'"):
        validate(PlanRequest, {"gpus": 8, "workload": closed().model_dump(mode="json"),
                               "slo": {"ttft_s": 2.0, "tpot_s": 0.05}}, "plan")


# ---------------------------------------------------------------- twinfer bench against a live (fake-engine) server

try:
    from test_bench_run import fake_server  # noqa: F401  (the module-scoped fake OpenAI server)
    HAVE_SERVE = True
except pytest.skip.Exception:  # the serve extra is not installed
    HAVE_SERVE = False
needs_serve = pytest.mark.skipif(not HAVE_SERVE, reason="needs the serve extra (fastapi, uvicorn)")


def bench_users_sequential(records) -> None:
    """Per user, the next request starts after the previous one's response ended."""
    by_user: dict[int, list] = {}
    for r in sorted(records, key=lambda r: r.start_s):
        by_user.setdefault(r.user, []).append(r)
    for recs in by_user.values():
        for a, b in zip(recs, recs[1:]):
            assert b.start_s >= a.start_s + a.e2e_s - 1e-9


@needs_serve
def test_bench_user_loop_keeps_n_in_flight(fake_server):  # noqa: F811
    import asyncio

    from executor import bench_client as bc
    from ui.cmd_bench import user_loop

    spec = closed(concurrency=3, num_requests=10, input_len=40, output_len=6, think_time_s=0.01)
    loop = user_loop(spec, seed=0, block_size=16)
    run = asyncio.run(bc.run_benchmark(fake_server.url, [], prompt_mode="ids", users=loop, warmup=1))
    assert len(run.records) == 10 and all(r.success and r.output_tokens == 6 for r in run.records)
    assert run.max_in_flight == 3 and {r.user for r in run.records} == {0, 1, 2}
    bench_users_sequential(run.records)
    # user u's k-th request is the simulator's (seed, u, k) draw: its index is (u << 32) | k
    assert sorted(r.index for r in run.records if r.user == 0)[:2] == [0, 1]


@needs_serve
def test_bench_user_loop_stops_sending_at_the_duration(fake_server):  # noqa: F811
    import asyncio

    from executor import bench_client as bc

    items = lambda u, k: (bc.BenchItem((u << 32) | k, 0.0, 30, 4), 0.02)  # noqa: E731
    run = asyncio.run(bc.run_benchmark(fake_server.url, [], prompt_mode="ids",
                                       users=bc.UserLoop(2, items, duration_s=0.3)))
    # how many requests fit in 0.3 s depends on the machine's load; what may not is a request sent after the
    # duration, or a user that never sent (each sends its first at t = 0); the run ending at all is the stop
    assert {r.user for r in run.records} == {0, 1} and all(r.scheduled_s < 0.3 and r.success for r in run.records)
    assert run.max_in_flight <= 2
    bench_users_sequential(run.records)
    with pytest.raises(ValueError, match="num_requests or duration_s"):
        bc.UserLoop(2, items)


@needs_serve
def test_bench_failed_requests_free_their_users(fake_server):  # noqa: F811
    import asyncio

    from executor import bench_client as bc

    # every other prompt is over the server's 1024-token context: a 400, and the user sends its next one
    items = lambda u, k: (bc.BenchItem((u << 32) | k, 0.0, 5000 if k % 2 else 30, 4), 0.0)  # noqa: E731
    run = asyncio.run(bc.run_benchmark(fake_server.url, [], prompt_mode="ids", users=bc.UserLoop(2, items, num_requests=8)))
    assert len(run.records) == 8 and all(r.success == (r.index % 2 == 0) for r in run.records)  # fails: the odd k
    assert all("400" in r.error for r in run.records if not r.success)
    bench_users_sequential(run.records)


@needs_serve
def test_twinfer_bench_concurrency_and_closed_workload_file(fake_server, tmp_path):  # noqa: F811
    import json

    import yaml
    from typer.testing import CliRunner

    from ui.cli import app

    args = ["bench", "--url", fake_server.url, "--input-len", "32", "--output-len", "4", "--json", "--prompt-mode", "ids"]
    r = CliRunner().invoke(app, args + ["--workload", "chat", "-n", "8", "--concurrency", "3"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    c, m = doc["config"], doc["metrics"]
    assert c["closed_loop"] and c["concurrency"] == 3 and 1 <= c["max_in_flight"] <= 3 and c["think_time_s_mean"] == 0
    assert m["requests_finished"] == 8 and m["output_tokens"] == 32 and m["per_user_output_tps_mean"] > 0
    path = tmp_path / "closed.yaml"
    path.write_text(yaml.safe_dump({"kind": "closed", "concurrency": 2, "num_requests": 5,
                                    "think_time_s": {"kind": "exponential", "mean": 0.01}}))
    r = CliRunner().invoke(app, args + ["--workload", str(path), "--concurrency", "4"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert doc["config"]["concurrency"] == 4 and doc["metrics"]["requests_finished"] == 5
    assert doc["config"]["think_time_s_mean"] == 0.01
    r = CliRunner().invoke(app, args + ["--workload", str(path), "--rate", "3"])
    assert r.exit_code != 0 and "rate: not used when kind is 'closed'" in str(r.exception)
    r = CliRunner().invoke(app, args + ["--workload", "chat", "--rate", "3", "--think-time-s", "1"])
    assert r.exit_code != 0 and "--think-time-s: only for a closed loop" in str(r.exception)


# ---------------------------------------------------------------- twinfer simulate


def test_twinfer_simulate_concurrency_flag():
    import json

    from typer.testing import CliRunner

    from ui.cli import app

    args = ["simulate", "-n", "150", "--concurrency", "12", "--think-time-s", "0.5", "--json"]
    a, b = CliRunner().invoke(app, args), CliRunner().invoke(app, args)
    assert a.exit_code == 0, a.output
    doc = json.loads(a.stdout)
    assert doc["digest"] == json.loads(b.stdout)["digest"]
    wl = doc["scenario"]["workload"]
    assert wl["kind"] == "closed" and wl["concurrency"] == 12 and wl.get("rate") is None
    assert doc["metrics"]["requests_finished"] == doc["num_requests"] == 150
    text = CliRunner().invoke(app, ["simulate", "-n", "100", "--concurrency", "12"], env={"COLUMNS": "200"}).stdout
    assert "closed loop: 12 users; mean requests in flight" in text
    for bad, msg in ((["--concurrency", "4", "--rate", "3"], "--rate: a closed loop has no arrival rate"),
                     (["--concurrency", "0"], "concurrency"),
                     (["--workload", "agentic", "--concurrency", "4"], "cannot run as a closed loop")):
        r = CliRunner().invoke(app, ["simulate", "-n", "50"] + bad)
        assert r.exit_code != 0 and msg in (r.output + str(r.exception))


def test_simulate_concurrency_flag_fills_a_closed_file_without_one(tmp_path):
    """A file with `kind: closed` and no concurrency was refused ("set workload.concurrency in the file, or pass
    --concurrency") even with --concurrency: the scenario was validated before the flag applied."""
    import json

    import yaml
    from typer.testing import CliRunner

    from ui.cli import app

    f = tmp_path / "cl.yaml"
    f.write_text(yaml.safe_dump({"model": "deepseek-v3", "hardware": "H200", "layout": {"tp": 8},
                                 "workload": {"kind": "closed", "num_requests": 30}}))
    r = CliRunner().invoke(app, ["simulate", "-s", str(f), "--concurrency", "4", "--think-time-s", "0.25", "--json"])
    assert r.exit_code == 0, r.output
    wl = json.loads(r.stdout)["scenario"]["workload"]
    assert wl["kind"] == "closed" and wl["concurrency"] == 4 and wl["think_time_s"]["value"] == 0.25
    for bad, msg in ((["--concurrency", "0"], "--concurrency (workload.concurrency)"),
                     (["--concurrency", "4", "--rate", "3"], "--rate: a closed loop has no arrival rate"),
                     (["--think-time-s", "1"], "or pass --concurrency")):
        r = CliRunner().invoke(app, ["simulate", "-s", str(f)] + bad)
        assert isinstance(r.exception, TwinferError) and msg in str(r.exception), (bad, r.output, r.exception)  # exit 2
