"""The host probe (executor/host_probe.py): a fixed decode step's input build timed, median seconds; bad sizes refused;
validate's ratio to the calibration's probes, and None for profiles that recorded none."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")


def test_host_probe_times_a_fixed_input_build():
    from executor.calibrate import build_engine
    from executor.host_probe import host_probe
    e = build_engine("tiny", None, "cpu", "fp32", 4, 256, num_kv_blocks=32)
    t = host_probe(e.runner, batch=8, ctx=100, repeats=20)
    assert 0 < t < 0.5
    with pytest.raises(ValueError, match="batch, ctx and repeats"):
        host_probe(e.runner, batch=0)


def test_probe_against_the_calibration():
    from ui.cmd_validate import probe_vs_calibration
    prof = SimpleNamespace(provenance={"host_probe_s": {"start": 1e-4, "after_grid": 2e-4, "end": 3e-4}})
    assert probe_vs_calibration([2e-4, 3e-4], prof) == [0.0, 0.5]
    assert probe_vs_calibration([2e-4], SimpleNamespace(provenance={})) is None


def test_validate_prints_the_probe_beside_the_host_drift():
    from rich.console import Console

    from ui.cmd_validate import _print_level
    figs = {"output_throughput": 100.0, "tpot_p50": 0.01}
    lv = SimpleNamespace(name="knee", rate_rps=2.0, fraction_of_capacity=0.8, requests=10, runs=[figs, figs], rel_error={},
                         measured=figs, predicted=figs, spread={}, step={},
                         diagnostics={"decode_host_vs_calibration": [0.1, -0.05], "host_probe_vs_calibration": [0.12, -0.031]})
    con = Console(record=True, width=200)
    _print_level(con, lv)
    text = con.export_text()
    assert "decode host vs calibration" in text and "+10.0% / -5.0%" in text
    assert "host probe vs calibration" in text and "+12.0% / -3.1%" in text


def test_the_issue_probe_is_none_off_cuda_and_refuses_bad_repeats():
    from executor.calibrate import build_engine
    from executor.calibrate import issue_probe
    e = build_engine("tiny", None, "cpu", "fp32", 16, 2048, num_kv_blocks=128)
    assert issue_probe(e) is None   # the forward is the CPU's work there, not an issue
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        issue_probe(e, repeats=0)


def test_the_issue_probe_times_a_held_mixed_steps_issue_and_leaves_the_runner_as_it_was(monkeypatch):
    """On CUDA it runs one fixed mixed step (8 decodes at 1,024 tokens, a 512-token chunk) once, then its held issue
    (executor.calibrate.queued_forward, which needs a GPU: stood in for here); the step's requests are removed and its
    runs are not counted as the engine's steps."""
    import torch

    import executor.calibrate as cal
    from executor.calibrate import build_engine
    from executor.calibrate import ISSUE_DECODES, issue_probe
    e = build_engine("tiny", None, "cpu", "fp32", 16, 2048, num_kv_blocks=256)
    runner = e.runner
    seen = {}

    def fake_queued(r, run, wall_s, repeats):
        run()
        seen.update(requests=len(r.states), wall=wall_s, repeats=repeats)
        return {"queued_forward_s": 0.01, "queued_host_s": 0.004}
    monkeypatch.setattr(cal, "queued_forward", fake_queued)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    proxy = SimpleNamespace(runner=SimpleNamespace(device=SimpleNamespace(type="cuda"), execute=runner.execute,
                                                   remove_request=runner.remove_request, num_steps_run=5,
                                                   states=runner.states),
                            block_size=e.block_size, vocab_size=e.vocab_size, scheduler=e.scheduler,
                            max_model_len=e.max_model_len)
    states0 = len(runner.states)
    assert issue_probe(proxy, repeats=3) == 0.004
    assert seen["repeats"] == 3 and seen["wall"] > 0 and seen["requests"] >= ISSUE_DECODES + 1
    assert len(runner.states) == states0 and proxy.runner.num_steps_run == 5


def test_issue_probe_against_the_calibration_and_the_host_speed_mode():
    from costmodels.calibration import host_probe_reference
    from ui.cmd_validate import parse_host_speed, probe_vs_calibration
    prov = {"host_probe_s": {"start": 1e-4}, "issue_probe_s": {"start": 4e-3, "after_grid": 5e-3, "end": 6e-3}}
    assert host_probe_reference(prov, "issue_probe_s") == pytest.approx(5e-3)
    assert host_probe_reference({"issue_probe_s": None}, "issue_probe_s") is None
    prof = SimpleNamespace(provenance=prov)
    assert probe_vs_calibration([2.5e-3, None, 5e-3], prof, "issue_probe_s") == [-0.5, None, 0.0]
    assert probe_vs_calibration([None, None], prof, "issue_probe_s") is None
    assert parse_host_speed("issue") == ("issue", 1.0) and parse_host_speed(" Probe ") == ("probe", 1.0)


def test_the_issue_probe_is_none_on_an_engine_too_small_for_its_step(monkeypatch):
    """A 512-token engine (calibrate/validate --max-model-len 512) would put the probe's decodes at position 1,024, past
    its RoPE table (an IndexError on the CPU, a device assert on a GPU): no probe there."""
    import executor.calibrate as cal
    from executor.calibrate import build_engine, issue_probe

    e = build_engine("tiny", None, "cpu", "fp32", 16, 512, num_kv_blocks=256)
    monkeypatch.setattr(cal, "queued_forward", lambda *a, **k: {"queued_host_s": 0.004})
    proxy = SimpleNamespace(runner=SimpleNamespace(device=SimpleNamespace(type="cuda")), block_size=e.block_size,
                            vocab_size=e.vocab_size, scheduler=e.scheduler, max_model_len=e.max_model_len)
    assert issue_probe(proxy) is None
