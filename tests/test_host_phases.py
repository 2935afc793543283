"""The runner's host phases (executor.model_runner.HOST_PHASES): each step's record splits its host time into building
the inputs, issuing the sampler, waiting for the tokens and the bookkeeping after, inside the step's wall time; a
replay sums them per plan and the validation samples carry them as columns (where a calibration's grid points also
keep them, serving and grid compare phase by phase)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from executor.engine import LLMEngine, SamplingParams  # noqa: E402
from executor.model_runner import HOST_PHASES  # noqa: E402
from executor.replay import replay  # noqa: E402
from sim.validate import PHASE_KEYS, StepSample, compact_samples  # noqa: E402


def _engine(**sc) -> LLMEngine:
    return LLMEngine.from_args("tiny", device="cpu", dtype="fp32", seed=0, num_kv_blocks=64,
                               scheduler_config={"block_size": 16, **sc})


def test_step_records_split_the_host_time_inside_the_wall():
    e = _engine(draft_len=1)
    recs = []
    e.step_log = recs.append
    e.generate([[3, 4, 5, 6] * 5, [7, 8] * 9], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    assert recs and PHASE_KEYS == HOST_PHASES
    for r in recs:
        ph = r["host_phases"]
        assert set(ph) == set(HOST_PHASES) and all(v >= 0 for v in ph.values())
        assert sum(ph.values()) <= r["wall_s"] * 1.001 + 1e-6
        assert ph["post"] > 0   # MTP drafting (draft_len 1) runs after the tokens are read back


def test_replay_sums_phases_and_samples_carry_columns():
    e = _engine(async_overlap=False)   # the synchronous loop (the pipelined one, executor/overlap.py, times none)
    res = replay(e, [(0.0, f"r{i}", [5 + i] * (9 + i), 4) for i in range(3)], temperature=0.0)
    steps = [s for s in res.steps if s.num_steps == 1]
    assert steps and all(set(s.host_phases) == set(HOST_PHASES) for s in steps)
    assert all(sum(s.host_phases.values()) <= s.runner_s * 1.001 + 1e-6 for s in steps)
    samples = [StepSample(decode_ctx=s.decode_ctx, prefill=s.prefill, measured_s=s.iter_s, runner_s=s.runner_s,
                          host_phases=s.host_phases) for s in steps]
    cols = compact_samples(samples)
    for k in PHASE_KEYS:
        assert len(cols[f"{k}_host_s"]) == len(steps) and all(v is not None and v >= 0 for v in cols[f"{k}_host_s"])
    bare = compact_samples([StepSample(decode_ctx=[3], prefill=[], measured_s=0.01)])
    assert not any(k.endswith("_host_s") and k != "forward_host_s" for k in bare)


def test_calibration_grid_points_keep_median_phases():
    from executor.calibrate import measure_steps
    e = _engine(async_overlap=False)
    pts = measure_steps(e, [([40, 50], []), ([20], [(24, 0)])], repeats=3, log=lambda s: None)
    assert len(pts) == 2
    for p in pts:
        assert set(p.host_phases) == set(HOST_PHASES) and sum(p.host_phases.values()) <= p.wall_s * 1.5


def test_step_residuals_compares_phases_with_the_grid(capsys):
    """benchmarks/step_residuals.py's phase table: serving's mean per phase against the grid's points at that batch."""
    from types import SimpleNamespace

    import numpy as np

    from benchmarks.step_residuals import PHASE_COLS, phases_vs_grid
    pt = lambda b, ph: SimpleNamespace(graph_bs=b, loop_s=None, prefill=[], decode_ctx=[100] * b,  # noqa: E731
                                       host_phases=ph, forward_host_s=0.4e-3)
    grid = {"inputs": 0.2e-3, "sample": 0.1e-3, "readback": 3e-3, "post": 0.05e-3}
    prof = SimpleNamespace(step=SimpleNamespace(points=[pt(8, grid), pt(8, grid), pt(16, None)]))
    n = 30
    c = {"prefill_chunks": np.zeros(n), "graph_bs": np.full(n, 8), "decodes": np.full(n, 8),
         "forward_host_s": np.full(n, 0.5e-3), **{col: np.full(n, 1e-3) for col in PHASE_COLS}}
    phases_vs_grid(prof, c)
    out = capsys.readouterr().out
    assert "b=  8:    30 steps:  1.00 vs  0.20 |  1.00 vs  0.10 |  1.00 vs  3.00 |  1.00 vs  0.05 |  0.50 vs  0.40" in out
    c["inputs_host_s"][:] = np.nan   # older runs: no phases, nothing printed
    phases_vs_grid(prof, c)
    assert capsys.readouterr().out == ""


def test_step_residuals_after_eager_by_prompt_tokens(capsys):
    """benchmarks/step_residuals.py: decode steps right after a prompt-bearing step, binned by its prompt tokens."""
    from types import SimpleNamespace

    import numpy as np

    from benchmarks.step_residuals import after_eager_by_tokens
    # one replay: (prompt step of 3000 tokens, decode +0.5 ms over the model, decode exact) x 12, then 12 x 300 tokens
    pre, dec = [], []
    for tok, extra in [(3000, 0.5e-3)] * 12 + [(300, 0.0)] * 12:
        pre += [tok, 0, 0]
        dec += [0.0, extra, 0.0]
    n = len(pre)
    res = np.array(dec)
    c = {"prefill_chunks": np.array([1 if t else 0 for t in pre]), "prefill_tokens": np.array(pre),
         "cls": np.array(["a"] * n), "level": np.array(["low"] * n), "replay": np.ones(n),
         "measured_s": 0.005 + res, "pred": np.full(n, 0.005)}
    prof = SimpleNamespace(provenance={"after_eager": {"chunk_tokens": 1024,
                                                       "decode_after_ms_by_tokens": {"512": [0.1, 0.0], "4096": [0.6, 0.1]}}})
    rows = after_eager_by_tokens(prof, c)
    assert [(r["bin"], r["steps"]) for r in rows] == [("1-512", 12), ("2049-4096", 12)]
    assert rows[1]["residual_ms"] == pytest.approx(0.5) and rows[0]["residual_ms"] == pytest.approx(0.0)
    out = capsys.readouterr().out
    assert "4096 tok +0.600 ms" in out and "1024-token one" in out
