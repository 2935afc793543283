"""The twin loop on the CPU with the reference kernels: calibrate the tiny model, validate it, errors reported.

CPU timings are noisy (and this machine may be shared), so this asserts the pipeline and its
arithmetic, not the accuracy. Kept small: a handful of step shapes, one timed run each, six requests.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

from costmodels.calibration import CalibrationProfile  # noqa: E402
from costmodels.profiled import ProfiledStepCost  # noqa: E402
from costmodels.step_profile import HOST_SPEED_RANGE, HostTerms, term_bound  # noqa: E402
from ui.cli import app  # noqa: E402


def test_tiny_calibrate_then_validate_on_cpu(tmp_path, monkeypatch):
    from costmodels import step_fit
    from executor import calibrate as cal_mod
    from executor.calibrate import build_engine, calibrate
    from scheduler.config import SchedulerConfig
    from scheduler.request import Request
    from ui.cmd_validate import run_levels

    seen = []

    def fit(profile, *a, **kw):   # what the calibration's own fit sees
        seen.append(profile)
        return step_fit.fit_step_profile(profile, *a, **kw)
    monkeypatch.setattr(cal_mod, "fit_step_profile", fit)
    engine = build_engine("tiny", None, "cpu", "fp32", 8, 128, num_kv_blocks=40)
    prof = calibrate("tiny", None, "cpu", "fp32", quick=True, repeats=1, max_model_len=128, max_num_seqs=8, engine=engine,
                     command="pytest", log=lambda s: None)
    # the fit prices steps from the same op points the saved profile predicts from (a profile whose points time the
    # model's own GEMMs prices them from those: fitted without them, run 27's scales were fitted on other GEMM times)
    assert len(seen) == 1 and seen[0].op_points == prof.op_points and prof.op_points
    # and knows the GPU it ran on: the own GEMM table prices only there (H100 run 45's fit priced the committed H200
    # table's GEMMs, under the defaults' measured_on, and its predictions its own)
    assert seen[0].measured_on == prof.measured_on
    # and an offline refit from the profile's own points (scripts/matrix_offline.py --refit auto) is the same fit
    re = step_fit.refit_profile(prof, "auto").step
    assert re.hardware_basis == prof.step.hardware_basis
    flat = lambda h: {k: v for k, v in h.model_dump().items() if not isinstance(v, list)}  # noqa: E731
    assert flat(re.host) == pytest.approx(flat(prof.step.host), rel=1e-6, abs=1e-12)
    assert re.fit.mape == pytest.approx(prof.step.fit.mape, rel=1e-6)
    path = tmp_path / "tiny.json"
    prof.save(path)
    back = CalibrationProfile.load(path)
    st = back.step
    assert st is not None and st.model == "tiny" and st.device == "cpu" and st.fit.points >= 10
    assert back.provenance["command"] == "pytest" and back.provenance["gpu"] == "cpu" and back.op_points
    assert st.fit.mape is not None and st.loop.fixed_s >= 0
    # admission (add_request) timed over prompt lengths, capped by the window, and priced per prompt token
    adm = back.provenance["admission"]
    assert [p["prompt_tokens"] for p in adm] == [16, 127] and all(p["seconds"] > 0 for p in adm)
    assert st.loop.admit_s + st.loop.admit_per_token_s > 0
    # a step right after a prefill-bearing one, against the same step after a decode step: measured, >= 0
    ae = back.provenance["after_eager"]
    assert ae["rounds"] == 3 and {"decode_ms", "mixed_ms"} <= set(ae) and st.host.after_eager_s >= 0
    # the host's speed sampled at the calibration's start, after its grid and at its end (executor/host_probe.py)
    hp = back.provenance["host_probe_s"]
    assert list(hp) == ["start", "after_grid", "end"] and all(v > 0 for v in hp.values())
    cost = ProfiledStepCost(back)
    assert cost.chunked_step_time(np.array([20, 30]), 0, [16], [0]) > 0
    # prefill attention over cached context measured as the executor runs it (MLAAttention.prefill_attend)
    chunk = [p for p in back.op_points if p["op"] == "attn_prefill_chunk"]
    assert {(p["new"], p["cached"]) for p in chunk} == {(16, 0), (64, 0), (16, 48), (64, 48)}
    # MoE points: eager time on every device; the in-graph device time only where CUDA graphs exist
    moe = [p for p in back.op_points if p["op"] == "moe_experts"]
    assert moe and all(p["time_s"] > 0 and "device_s" not in p for p in moe)
    assert all("device_s" not in p for p in chunk)
    # the chunk's key/value expansion over keys (MLAAttention.prefill_expand), a table the step model prices from
    kvx = [p for p in back.op_points if p["op"] == "kv_expand"]
    assert [p["keys"] for p in kvx] == [16, 96] and "kv_expand" in back.tables and "kv_expand" in st.op_tables
    tab = back.tables["attn_prefill_chunk"]
    assert float(tab([64], [48])[0][0]) == pytest.approx(next(p["time_s"] for p in chunk if (p["new"], p["cached"]) == (64, 48)))

    reqs = [Request(f"q{i}", 0.02 * i, 12 + 3 * i, 3) for i in range(6)]
    base = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=128)
    rep, samples = run_levels(cost, back, reqs, base, 40, [2.0], engine, model="tiny", dtype="fp32", warm=False)
    lv = rep.levels[0]
    assert lv.measured["requests_finished"] == 6 and lv.predicted["requests_finished"] == 6
    assert lv.rel_error["output_throughput"] is not None and lv.step["n"] > 0
    assert rep.step_overall["mape"] is not None and set(rep.targets) >= {"step_mape", "ttft_p90"}
    assert all(s.predicted_s > 0 and s.measured_s > 0 for s in samples[lv.name])
    assert lv.diagnostics["gc_gen2_collections"] >= 0   # host counters over the measured replays (CUDA adds the allocator's)
    json.loads(rep.model_dump_json())
    # two replays per level: measured figures are the median of the runs, with their spread
    rep2, samples2 = run_levels(cost, back, reqs, base, 40, [2.0], engine, model="tiny", dtype="fp32", warm=False, runs=2)
    lv2 = rep2.levels[0]
    assert len(lv2.runs) == 2 and lv2.measured["requests_finished"] == 6
    t0 = lv2.diagnostics["replay_t0_unix"]        # each replay's engine-clock zero on the Unix clock, for host samplers
    # the first replay ran in between (the Unix anchors are rounded to 1 ms and the Unix clock may be slewed while the
    # engine's monotonic one is not: 10 ms of slack, against replays of 0.1 s and more)
    assert len(t0) == 2 and t0[1] - t0[0] >= lv2.runs[0]["duration_s"] - 1e-2
    # each replay's host probe, and its ratio to the calibration's (the median of its three)
    probes, vs = lv2.diagnostics["host_probe_s"], lv2.diagnostics["host_probe_vs_calibration"]
    assert len(probes) == 2 and all(p > 0 for p in probes)
    assert vs == pytest.approx([p / float(np.median(list(hp.values()))) - 1.0 for p in probes], abs=2e-4)
    vals = sorted(r["output_throughput"] for r in lv2.runs)
    assert lv2.measured["output_throughput"] == pytest.approx(sum(vals) / 2)
    assert lv2.spread["output_throughput"] == pytest.approx((vals[1] - vals[0]) / lv2.measured["output_throughput"])
    assert len(samples2[lv2.name]) > len(samples[lv.name])  # the steps of both runs
    assert lv2.diagnostics["host_speed_priced"] == 1.0 and any("calibration's host speed" in n for n in rep2.notes)
    # --host-speed probe: the level priced on the median of its replays' probes over the calibration's (host terms x
    # that, device terms as fitted), held at what the profile's host terms can be moved to (StepProfile.max_host_speed)
    # and within HOST_SPEED_RANGE (ui/cmd_validate.py: run_levels). The probe is faked to read set multiples of the
    # calibration's: a real one reads whatever the host's load is (16% slower on a loaded 2-core CI machine, past a
    # profile that moved at most 1x, so the priced speed was held below the probes' ratio), and the known readings
    # assert each branch of the rule on every host.
    from executor import host_probe as host_probe_mod
    ref = float(np.median(list(hp.values())))   # what validate reads its probes against (host_probe_reference)

    def probed(*reads, prof=back, cost=cost):
        """The level's diagnostics and the report's notes, the probe before each replay reading ``reads`` x ``ref``."""
        it = iter(reads)
        monkeypatch.setattr(host_probe_mod, "host_probe", lambda runner, *a, **k: ref * next(it))
        rep, _ = run_levels(cost, prof, reqs, base, 40, [2.0], engine, model="tiny", dtype="fp32", warm=False,
                            runs=len(reads), host_speed="probe")
        return rep.levels[0].diagnostics, rep.notes

    # a faster host, within every bound: priced at the median of the probes (of two, their mean), as recorded
    d3, notes3 = probed(0.7, 0.9)
    assert d3["host_probe_vs_calibration"] == pytest.approx([-0.3, -0.1], abs=2e-4)
    assert d3["host_speed_priced"] == pytest.approx(0.8, abs=1e-4)
    assert any("host speed its replays read" in n for n in notes3)
    # a probe reading past what the profile's host terms can be moved to: held there, the ratio recorded as read. The
    # measured profile's limit moves with its terms (the range's top where after_eager_s measured 0 and no term is near
    # its bound, where the range's clamp alone would hold the probe), so this profile has after_eager_s at its bound,
    # as a clipped measurement leaves it: its limit is then exactly 1x (the CI run's profile's), the profile as measured
    held = back.model_copy(update={"step": back.step.model_copy(update={
        "host": back.step.host.model_copy(update={"after_eager_s": term_bound(HostTerms, "after_eager_s")})})})
    assert held.step.max_host_speed() == 1.0
    d4, _ = probed(1.16, prof=held, cost=ProfiledStepCost(held))
    assert d4["host_probe_vs_calibration"] == pytest.approx([0.16], abs=2e-4)
    assert d4["host_speed_priced"] == 1.0
    # and one past the range's bottom at its bottom
    d5, _ = probed(HOST_SPEED_RANGE[0] / 2)
    assert d5["host_speed_priced"] == pytest.approx(HOST_SPEED_RANGE[0], abs=1e-4)


def test_twin_commands_are_registered_and_simulate_prints_a_band(tmp_path):
    r = CliRunner()
    for cmd in ("calibrate", "validate", "tune"):
        res = r.invoke(app, [cmd, "--help"])
        assert res.exit_code == 0, res.output
    from pathlib import Path
    prof = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
    common = ["--model", "deepseek-v3", "--num-layers", "5", "--profile", prof, "--requests", "12", "--max-input-len", "256",
              "--max-output-len", "8"]
    res = r.invoke(app, ["validate", *common, "--sim-only", "--levels", "0.5,2"])
    assert res.exit_code == 0, res.output
    assert "predicted capacity" in res.output
    plan = tmp_path / "winner.yaml"
    res = r.invoke(app, ["tune", *common, "--plan-out", str(plan)])
    assert res.exit_code == 0, res.output
    assert "predicted gain" in res.output
    # the winner is a plan twinfer serve --plan runs: its scheduler section configures the engine
    import yaml

    from executor.engine import LLMEngine
    from scheduler.config import SchedulerConfig
    doc = yaml.safe_load(plan.read_text())
    win = doc["tune"]["winner"]
    sc = SchedulerConfig.model_validate(doc["scheduler"])
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (win["max_num_seqs"], win["max_num_batched_tokens"])
    from ui.serve_plan import serving_options
    world, opts = serving_options(str(plan), "cpu")
    assert world == 1
    eng = LLMEngine.from_args("tiny", device="cpu", dtype="fp32", max_model_len=256, **opts)
    assert eng.scheduler.config.max_num_seqs == win["max_num_seqs"]
    assert eng.scheduler.config.max_num_batched_tokens == win["max_num_batched_tokens"]
    res = r.invoke(app, ["simulate", "--requests", "50", "--error-band", "auto"])
    assert res.exit_code == 0, res.output
    assert "error band" in res.output


def test_graph_device_time_is_none_off_cuda_and_never_raises():
    import torch

    from executor.calibrate import _graph_device_time, _queued_device_time
    assert _graph_device_time(lambda: torch.ones(3).sum(), torch.device("cpu")) is None
    assert _queued_device_time(lambda: torch.ones(3).sum(), torch.device("cpu"), 1e-3) is None


def test_after_eager_decay_behind_several_chunk_sizes(tmp_path):
    """The decay after an eager step is measured behind 512 / 2048 / 4096-token chunks too, within half the window and
    the step budget (serving's decode steps after bigger prompt steps paid more in H200 runs 26-27), and the profile
    prices it by the prompt step's size (host.after_eager_decode_by_tokens, with the main probe's chunk size)."""
    from costmodels.step_fit import loop_scheduler_terms
    from executor.calibrate import AFTER_EAGER_DECODE_STEPS, after_eager_sizes, build_engine, calibrate
    from scheduler.config import SchedulerConfig

    assert after_eager_sizes(build_engine("tiny", None, "cpu", "fp32", 8, 128, num_kv_blocks=40)) == []
    e = build_engine("tiny", None, "cpu", "fp32", 8, 1536, num_kv_blocks=160)
    assert after_eager_sizes(e) == [512]
    lines = []
    prof = calibrate("tiny", None, "cpu", "fp32", quick=True, repeats=1, max_model_len=1536, max_num_seqs=8, engine=e,
                     command="pytest", log=lines.append)
    ae = prof.provenance["after_eager"]
    assert ae["chunk_tokens"] == 768 and list(ae["decode_after_ms_by_tokens"]) == ["512"]
    assert len(ae["decode_after_ms_by_tokens"]["512"]) == AFTER_EAGER_DECODE_STEPS
    assert any("after a prompt chunk of 512 tokens" in s for s in lines)
    by = prof.step.host.after_eager_decode_by_tokens
    assert [t for t, _ in by] == [512, 768] and all(len(v) == AFTER_EAGER_DECODE_STEPS and min(v) >= 0 for _, v in by)
    path = tmp_path / "p.json"
    prof.save(path)
    back = CalibrationProfile.load(path)
    assert [list(x) for x in back.step.host.after_eager_decode_by_tokens] == [list(x) for x in by]
    SchedulerConfig(**{k: v for k, v in loop_scheduler_terms(back.step).items() if k.startswith("host_after")})


def test_admission_is_measured_as_serving_admits(monkeypatch):
    """Each admission gets its own prompt and follows one runner step (a replay's iteration runs a step between two
    arrivals); back to back on one hot prompt list it read 2-3x less than serving's iterations admitted (H200 run 28),
    as on a CPU engine. The step's requests leave the runner afterwards."""
    from executor.calibrate import build_engine, measure_admission

    e = build_engine("tiny", None, "cpu", "fp32", 8, 1024, num_kv_blocks=160)
    events, prompts = [], []
    run0 = e.runner.execute

    def execute(plan, *a, **k):
        events.append("step")
        return run0(plan, *a, **k)
    monkeypatch.setattr(e.runner, "execute", execute)
    from executor import engine as engine_mod
    add0 = engine_mod.LLMEngine.add_request

    def add(self, rid, ids, *a, **k):
        events.append("admit")
        prompts.append(ids)
        return add0(self, rid, ids, *a, **k)
    monkeypatch.setattr(engine_mod.LLMEngine, "add_request", add)
    before = set(e.runner.states)
    terms, pts = measure_admission(e, lengths=[16, 256], repeats=3, temperature=0.7)
    assert [p["prompt_tokens"] for p in pts] == [16, 256] and set(terms) == {"admit_s", "admit_per_token_s"}
    assert events == ["step", "admit"] * 8
    assert len({tuple(p) for p in prompts}) == 8 and [len(p) for p in prompts] == [16] * 4 + [256] * 4
    assert set(e.runner.states) == before
