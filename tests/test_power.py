"""The board power limit as a step-time mechanism (costmodels.power): the clock law, the governor's averages, the
committed H200 model, and the simulator and validate pricing prompt steps at the same clock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from costmodels.power import PowerGovernor, PowerModel, power_model


def _model(**kw) -> PowerModel:
    base = dict(gpu="h200", max_mhz=1980, cap_w=700, idle_w=130, busy_w=120, w_per_pflops=1000, w_per_tbps=100, gamma=2.0,
                tau_s=0.5, clock_share_prompt=0.5, clock_share_decode=0.1)
    return PowerModel(**{**base, **kw})


def test_the_clock_law():
    m = _model()
    # under the limit: full clock, no stretch
    assert m.demand_w(1.0, 0.2, 1.5) == pytest.approx(130 + 120 + 200 + 150)
    assert m.phi(1.0, 0.2, 1.5) == 1.0 and m.stretch(1.0, True) == 1.0
    # over it: the SM-clocked part (1000 W per PF/s) scales as phi ** gamma so the total meets the limit
    f = 0.5   # 130 + 120 + 500 + 150 = 900 W demand: 200 W over, the clocked part 500 W -> 300 W
    phi = m.phi(1.0, f, 1.5)
    assert phi == pytest.approx(math.sqrt(300 / 500))
    assert 130 + 120 + 150 + 1000 * f * phi ** m.gamma == pytest.approx(m.cap_w)
    # device time: only the clocked share stretches, prompt and decode steps by their own shares
    assert m.stretch(phi, True) == pytest.approx(1 + 0.5 * (1 / phi - 1))
    assert m.stretch(phi, False) == pytest.approx(1 + 0.1 * (1 / phi - 1))
    # never below the floor, whatever the demand
    assert m.phi(1.0, 100.0, 1.5) == m.min_phi
    assert m.phi(1.0, 0.0, 50.0) == 1.0   # nothing clocked to lower: the clock cannot help


def test_the_governor_averages_work_over_its_time_constant():
    m = _model(tau_s=0.5)
    g = PowerGovernor(m)
    assert g.phi_at(0.0) == 1.0
    # 10 ms steps of 8 TFLOP back to back (0.8 PF/s) for 5 s: the average converges to the rates
    t = 0.0
    for _ in range(500):
        g.add(t, t + 0.01, 8e12, 1e10)
        t += 0.01
    assert g.u == pytest.approx(1.0, abs=1e-4) and g.f == pytest.approx(0.8, rel=1e-3) and g.b == pytest.approx(1.0, rel=1e-3)
    busy_phi = g.phi_at(t)
    assert busy_phi < 1.0
    # an idle second decays the averages by exp(-1 / 0.5): the limit lets go
    assert g.phi_at(t + 1.0) > busy_phi
    assert g.phi_at(t + 3.0) == 1.0
    # a span overlapping the last one folds in from where the averages are (no double count, no error)
    f0 = g.f
    g.add(t - 0.005, t + 0.005, 4e12, 0.0)
    assert g.t == pytest.approx(t + 0.005) and g.f < f0


def test_the_governor_with_a_control_window_attacks_fast_and_releases_slowly():
    """``attack_s`` (an H100's limiter traced through NVML: clock_trace_97748ab): the clock a step starts at is the one
    the last ``attack_s``'s average work allows, or where lower the clock still returning at ``tau_s``."""
    m = _model(tau_s=0.1, attack_s=0.1)
    e = _model(tau_s=0.1)
    g, ge = PowerGovernor(m), PowerGovernor(e)
    # one 115 ms step at 0.6 PF/s from rest (130 + 120 + 600 + 100 = 950 W demand): the window holds all of it
    for x in (g, ge):
        x.add(0.0, 0.115, 0.6e15 * 0.115, 1e12 * 0.115)
    want = m.phi(1.0, 0.6, 1.0)
    assert want < 0.9
    assert g.phi_at(0.115) == pytest.approx(want)
    # the one exponential average of the same history has not reached the limit's clock
    assert ge.phi_at(0.115) > g.phi_at(0.115)
    # idle past the window: the work is out of it, the clock returns at tau_s from where the limit held it
    for gap in (0.15, 0.3):
        assert g.at(0.115 + gap) == (0.0, 0.0, 0.0)
        assert g.phi_at(0.115 + gap) == pytest.approx(1 - (1 - want) * math.exp(-gap / 0.1))
    # sustained load: the window's clock is the work's own, as the exponential average's settles to
    g2, t = PowerGovernor(m), 0.0
    for _ in range(200):
        g2.add(t, t + 0.01, 0.6e15 * 0.01, 1e12 * 0.01)
        t += 0.01
    assert g2.phi_at(t) == pytest.approx(want)
    # under the limit the window leaves the clock full
    g3 = PowerGovernor(m)
    g3.add(0.0, 0.2, 0.1e15 * 0.2, 0.0)
    assert g3.phi_at(0.2) == 1.0
    with pytest.raises(ValueError, match="attack_s"):
        _model(attack_s=0.0)


def test_bad_terms_are_refused_by_field():
    with pytest.raises(ValueError, match="clock_share_prompt"):
        _model(clock_share_prompt=1.5)
    with pytest.raises(ValueError, match="tau_s"):
        _model(tau_s=0.0)


def test_the_committed_h200_model_and_its_record():
    m = power_model("H200")
    assert m is not None and m.gpu == "h200"
    assert 600 <= m.cap_w <= 720 and 100 <= m.idle_w <= 200 and m.max_mhz == 1980
    assert "power_fit.py" in m.source and m.fit["fit_runs"] and m.fit["held_out_clock_mae_mhz"]
    # decode-heavy serving (0.05 PF/s, 1.5 TB/s) stays at full clock; prefill-heavy (0.7 PF/s) is limited
    assert m.phi(1.0, 0.05, 1.5) == 1.0
    assert m.phi(1.0, 0.7, 1.5) < 0.95
    assert power_model("B200") is None   # no model where none was measured: full clock, as the tables were timed


def _with_board(monkeypatch, model):
    """Profiles price with ``model`` as their board's (its reference loops' fit replaced)."""
    monkeypatch.setattr(PowerModel, "for_board", lambda self, ref, work: model)


def _ref_profile(prof):
    from costmodels.power import PowerReference, RefLoop
    loop = dict(steps=100, step_s_first=0.01, step_s_late=0.01, busy=1.0, watts=500.0, mhz=1980.0)
    return prof.model_copy(update={"power_ref": PowerReference(idle_w=130, max_mhz=1980, decode=RefLoop(decode_ctx=[2048] * 64, **loop),
                                                                 prompt=RefLoop(prefill=[(4096, 0)], **loop))})


def test_a_board_s_terms_from_its_reference_loops():
    """Reference loops made by a known board (its busy power, power per FLOP, limit and clock share) give that board
    back."""
    from costmodels.power import PowerReference, RefLoop
    kind = _model(busy_w=80, gamma=1.6, cap_w=650, clock_share_prompt=0.2, w_per_pflops=900)
    true = dict(busy_w=130.0, w_f=1150.0, gamma=1.6, cap_w=690.0, share=0.3)
    work = {"d": (2e12, 1.2e10), "p": (4e13, 1.5e10)}   # FLOPs, bytes of one decode / prompt step

    def w(dec, draft, new, cached):
        return work["p"] if new else work["d"]
    # the decode loop: under the limit at full clock, 10 ms steps, 97% busy
    d_t, busy = 0.010, 0.97
    d_w = 130 + busy * (true["busy_w"] + true["w_f"] * 2e12 / d_t / 1e15 + kind.w_per_tbps * 1.2e10 / d_t / 1e12)
    # the prompt loop: settles where its power meets the limit; its steps slower by the clocked share
    p_first = 0.050
    rest = lambda phi: 130 + busy * (true["busy_w"] + kind.w_per_tbps * 1.5e10 / (p_first * (1 + true["share"] * (1 / phi - 1))) / 1e12)  # noqa: E731
    clocked = lambda phi: busy * true["w_f"] * 4e13 / (p_first * (1 + true["share"] * (1 / phi - 1))) / 1e15  # noqa: E731
    lo, hi = 0.5, 1.0
    for _ in range(80):   # the clock where rest + clocked * phi ** gamma meets the limit
        mid = (lo + hi) / 2
        if rest(mid) + clocked(mid) * mid ** true["gamma"] > true["cap_w"]:
            hi = mid
        else:
            lo = mid
    phi = lo
    p_late = p_first * (1 + true["share"] * (1 / phi - 1))
    ref = PowerReference(board="GPU-x", idle_w=130, max_mhz=1980,
                         decode=RefLoop(decode_ctx=[2048] * 64, steps=300, step_s_first=d_t, step_s_late=d_t, busy=busy,
                                        watts=d_w, mhz=1980, capped=0.0),
                         prompt=RefLoop(prefill=[(4096, 0)], steps=60, step_s_first=p_first, step_s_late=p_late, busy=busy,
                                        watts=true["cap_w"], mhz=1980 * phi, capped=1.0))
    b = kind.for_board(ref, w)
    assert b.busy_w == pytest.approx(true["busy_w"], rel=1e-6)
    assert b.cap_w == true["cap_w"] and b.w_per_pflops == pytest.approx(true["w_f"], rel=1e-4)
    # the prompt steps' clock share stays the kind's: the loop's first steps already ran under the limit
    assert b.clock_share_prompt == kind.clock_share_prompt
    assert b.gamma == kind.gamma and b.tau_s == kind.tau_s and "GPU-x" in b.source
    # the board's model reproduces its prompt loop's settle: at the loop's averaged rates the clock is the measured one
    f = busy * 4e13 / p_late / 1e15
    assert b.phi(busy, f, busy * 1.5e10 / p_late / 1e12) == pytest.approx(phi, rel=1e-4)
    # an idle reading taken too soon (above what the loops allow): the busy power goes to 0 and the idle power the
    # loops imply replaces the reading; the board's model still reproduces both loops
    b3 = kind.for_board(ref.model_copy(update={"idle_w": 300.0}), w)
    assert b3 is not None and b3.busy_w == 0.0 and 130 < b3.idle_w < 300
    f_d, b_d = busy * 2e12 / d_t / 1e15, busy * 1.2e10 / d_t / 1e12
    assert b3.demand_w(busy, f_d, b_d) == pytest.approx(d_w, rel=1e-6) and b3.phi(busy, f_d, b_d) == 1.0
    assert b3.phi(busy, f, busy * 1.5e10 / p_late / 1e12) == pytest.approx(phi, rel=1e-4)
    # a decode loop clocked low with no power cap holding it (another limit): no board model (full clock)
    assert kind.for_board(ref.model_copy(update={"decode": ref.decode.model_copy(update={"mhz": 1800.0})}), w) is None
    # a hot board: the limit holds the decode loop too (issue 16 run 63's H200: 694 W at 1,935 MHz). Its watts are
    # the limit met with its clocked part at phi_d ** gamma: the busy power and power per FLOP come back all the same,
    # the board's model reproduces the decode loop's clock, and the prompt loop (which started from an average
    # already at the limit, so its first steps were not at full clock) keeps the kind's clock share
    hot = dict(true, cap_w=580.0)
    d_rest = 130 + busy * (hot["busy_w"] + kind.w_per_tbps * 1.2e10 / d_t / 1e12)
    d_clk = busy * hot["w_f"] * 2e12 / d_t / 1e15
    phi_d = ((hot["cap_w"] - d_rest) / d_clk) ** (1 / true["gamma"])
    assert 0.8 < phi_d < 0.98
    p_rest = 130 + busy * (hot["busy_w"] + kind.w_per_tbps * 1.5e10 / p_late / 1e12)
    p_clk = busy * hot["w_f"] * 4e13 / p_late / 1e15
    phi_p = ((hot["cap_w"] - p_rest) / p_clk) ** (1 / true["gamma"])
    ref_hot = ref.model_copy(update={
        "decode": ref.decode.model_copy(update={"watts": hot["cap_w"], "mhz": 1980 * phi_d, "capped": 1.0}),
        "prompt": ref.prompt.model_copy(update={"watts": hot["cap_w"], "mhz": 1980 * phi_p})})
    bh = kind.for_board(ref_hot, w)
    assert bh is not None and bh.cap_w == hot["cap_w"]
    assert bh.busy_w == pytest.approx(hot["busy_w"], rel=1e-6) and bh.w_per_pflops == pytest.approx(hot["w_f"], rel=1e-6)
    assert bh.phi(busy, f_d, b_d) == pytest.approx(phi_d, rel=1e-6)
    assert bh.clock_share_prompt == kind.clock_share_prompt
    # a prompt loop the limit did not hold pins nothing of the limit: the kind's terms stay
    ref2 = ref.model_copy(update={"prompt": ref.prompt.model_copy(update={"capped": 0.0, "mhz": 1980.0})})
    b2 = kind.for_board(ref2, w)
    assert (b2.cap_w, b2.w_per_pflops, b2.clock_share_prompt) == (kind.cap_w, kind.w_per_pflops, kind.clock_share_prompt)
    # the decode loop alone sets the busy power at the kind's per-FLOP power
    assert b2.busy_w == pytest.approx(true["busy_w"] + (true["w_f"] - kind.w_per_pflops) * 2e12 / d_t / 1e15, rel=1e-6)


def test_the_simulator_and_validate_price_prompt_steps_at_the_same_clock(monkeypatch):
    """A limit low enough to bind on a chat load: the simulator's pipelined loop stretches prompt steps, and validate's
    per-step prediction of the same sequence (idle gaps given) charges each step the same wall."""
    from tests.test_pipelined_launch import _profile, _run

    from costmodels.profiled import ProfiledStepCost
    from ui.cmd_validate import predict_steps

    prof = _ref_profile(_profile(True))
    plans0, col0, b0, _ = _run(_profile(True), rate=30.0)
    assert b0.governor is None   # no reference loops of its board: full clock
    walls0 = np.array([r.duration_s for r in col0.step_records])
    _with_board(monkeypatch, _model(cap_w=300, busy_w=120, w_per_pflops=2000, tau_s=0.2))
    plans, col, backend, _ = _run(prof, rate=30.0)
    assert backend.governor is not None
    walls = np.array([r.duration_s for r in col.step_records])
    starts = np.array([r.start_s for r in col.step_records])
    cold = np.array([p.cold for p in plans])
    idle = np.where(cold, starts - np.concatenate(([0.0], starts[:-1] + walls[:-1])), 0.0)
    pred = predict_steps(ProfiledStepCost(prof), prof, plans, True, cold, np.maximum(idle, 0.0))
    assert np.allclose(pred, walls, rtol=1e-9, atol=1e-12)
    # the limit bound: the prompt steps' walls are longer than at full clock
    prompt = np.array([bool(p.prefill) for p in plans])
    assert prompt.any() and walls[prompt].mean() > walls0[np.array([bool(p.prefill) for p in plans0])].mean()
    # and without the idle gaps validate would decay the average less: not the simulator's walls
    if idle.max() > 0.05:
        assert not np.allclose(predict_steps(ProfiledStepCost(prof), prof, plans, True, cold), walls, rtol=1e-9)


def test_which_power_model_a_profile_prices_with():
    from tests.test_pipelined_launch import _profile

    from costmodels.profiled import ProfiledStepCost
    prof = _profile()
    assert ProfiledStepCost(prof).power is None                      # measured before the reference loops: full clock
    with_ref = _ref_profile(prof)
    pm = ProfiledStepCost(with_ref).power
    assert pm is not None and pm.idle_w == 130 and "reference loops" in pm.source   # its board's
    assert ProfiledStepCost(with_ref, power=False).power is None
    kind = power_model("h200")
    assert ProfiledStepCost(prof, power=kind).power is kind           # given explicitly (matrix_offline --power-kind)


def test_validate_names_the_board_s_power_limit(tmp_path):
    """``twinfer validate --sim-only`` on a profile with its board's reference loops says how it prices the limit, and
    prices at full clock with ``--no-power-limit`` (the predicted capacity moves with it)."""
    from typer.testing import CliRunner

    from tests.test_pipelined_launch import _profile
    from ui.cli import app

    f = tmp_path / "prof.json"
    _ref_profile(_profile()).save(f)
    args = ["validate", "--sim-only", "--profile", str(f), "--workload", "summarize", "--requests", "8", "--async-overlap",
            "--max-input-len", "3800", "--max-output-len", "256"]   # cut on purpose: 6 of 8 exceed --max-model-len 4096
    on = CliRunner().invoke(app, args)
    off = CliRunner().invoke(app, args + ["--no-power-limit"])
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    flat = " ".join(on.output.split())
    assert "board power limit" in flat and "reference loops" in flat
    assert "board power limit" not in off.output


def test_the_board_model_predicts_the_probe_s_other_shapes():
    """Run 45's H100: the board model fitted to its calibration's two loops (decode 64 x 2,048; a 4,096 prompt) against
    the power probe on the same board a minute later (benchmarks/gpu/issue16_h100/power_probe_aadbeb3), shapes the fit
    never saw: the uncapped shapes' board power within 15 W, the limited shapes' clock within 80 MHz, and at the clock
    they ran, their slowdown from the loop's first step (from rest: full clock) within 1.2 points (the clock share)."""
    import json
    from pathlib import Path

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "issue16_h100"
    c = ProfiledStepCost(run_profile(unpacked_run(root / "run45_async_triton_summarize_agentic_longctx_aadbeb3"), None))
    b = c.power
    probe = json.loads((root / "power_probe_aadbeb3" / "power_probe.json").read_text())
    rows = {r["shape"]: r for r in probe["rows"]}
    shapes = {"decode b=16 @2048": ([2048] * 16, []), "mixed 22 dec@2000 + 430 over 2000": ([2000] * 22, [(430, 2000)]),
              "prefill 2048 over 1024": ([], [(2048, 1024)]), "mixed 16 dec@2000 + 2 x 2048": ([2000] * 16, [(2048, 0), (2048, 1024)])}
    for name, (dec, pre) in shapes.items():
        r = rows[name]
        f, by = c.step_work(dec, 0, [a for a, _ in pre], [x for _, x in pre])
        t, u = r["dev_late_ms"] / 1e3, min(1.0, r["busy"])
        rates = (u, u * f / t / 1e15, u * by / t / 1e12)
        phi = b.phi(*rates)
        if r["capped_late"] < 0.5:
            assert phi == 1.0 and abs(b.demand_w(*rates) - r["watts_late"]) < 15, name
        else:
            first = probe["steps"][name]["dev_ms"][0]   # the loop's first step, from rest
            assert abs(phi * b.max_mhz - r["mhz_late"]) < 80, name
            assert abs(b.stretch(r["mhz_late"] / b.max_mhz, True) - r["dev_late_ms"] / first) < 0.012, name


def test_a_reference_loop_s_summary():
    """``executor.power_ref.loop_summary``: device seconds first / late, the busy share up to when the device finished
    (the host runs launches ahead: its last launch is not the end), and the last half's power, clock and capped share."""
    pytest.importorskip("torch")
    from executor.power_ref import loop_summary

    t = [100.0 + 0.05 * i for i in range(40)]               # launches every 50 ms, each step 50 ms of device work
    dev = [0.048] * 10 + [0.050] * 30
    r = {"t": t, "dev": dev, "which": [0] * 40, "t_done": t[-1] + 8 * 0.05}   # the host 8 launches ahead at the end
    smi = [(100.0 + 0.1 * k, 1980.0 if k < 12 else 1850.0, 650.0 if k < 12 else 700.0, 50.0, 0 if k < 12 else 4)
           for k in range(30)]
    s = loop_summary(r, smi)
    assert s["steps"] == 40 and s["step_s_first"] == 0.048 and s["step_s_late"] == 0.050
    assert s["busy"] == pytest.approx(sum(dev) / (8 * 0.05 + 0.05 * 39), rel=1e-9) and s["busy"] < 1
    assert s["watts"] == 700.0 and s["mhz"] == 1850.0 and s["capped"] == 1.0


def test_the_reference_loops_sample_their_own_board(monkeypatch):
    """On a multi-GPU host nvidia-smi prints a line per GPU: the loops' sampler names the board by its UUID."""
    pytest.importorskip("torch")
    import types

    import torch

    import executor.power_ref as pr

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="1234-abcd"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert pr.smi_target("cuda:3") == ["-i", "GPU-1234-abcd"]
    calls = []
    monkeypatch.setattr(pr.subprocess, "Popen", lambda args, **kw: calls.append(args) or "proc")
    assert pr.start_smi("/dev/null", target=pr.smi_target("cuda")) == "proc"
    assert calls[0][:3] == ["nvidia-smi", "-i", "GPU-1234-abcd"]

    def boom(i):
        raise RuntimeError("no CUDA")
    monkeypatch.setattr(torch.cuda, "get_device_properties", boom)
    assert pr.smi_target("cuda") == []


def test_from_rest_the_board_model_leaves_the_step_after_a_long_one_at_full_clock():
    """``benchmarks/power_from_rest.py``: the probe's 2,048-over-8,192 step right after an 8,192-token prompt step from
    rest runs 4.6-4.9% slow on two H100 boards (runs 65 and beyond_probe_24c871d). Run 65's board model cannot produce
    that: its 75 ms average of the long step's 809 W reaches 665 W of the 691 W limit, so the next step starts at full
    clock and is still at full clock halfway through; run 64's board (850 W) gives +0.3% / +1.4%. Sustained long steps
    are limited (phi 0.89-0.92). An open gap, pinned so that a limiter with a faster attack shows here first."""
    from pathlib import Path

    from benchmarks.power_from_rest import from_rest
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "issue16_h100"
    r65 = from_rest(root / "run65_beyond_probe_longctx_summarize_agentic_7e2f7ed", log=lambda *_: None)
    r64 = from_rest(root / "run64_beyond_probe_longctx_d62ff6a", log=lambda *_: None)
    assert r65["cap_w"] == pytest.approx(691, abs=1) and r65["long_w"] == pytest.approx(809, abs=1)
    assert r65["gap 0.0"]["start"][1] == 1.0 and r65["gap 0.0"]["middle"][1] == 1.0
    assert r64["gap 0.0"]["start"][2] < 0.005 and r64["gap 0.0"]["middle"][2] < 0.02
    assert all(r["gap 0.3"]["start"][1] == 1.0 for r in (r64, r65))
    assert 0.85 < r64["sustained_phi"] < r65["sustained_phi"] < 0.95
