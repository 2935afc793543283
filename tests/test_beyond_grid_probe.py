"""The prefill-chunk table's extrapolation beyond its cached levels, against the held-out beyond-grid probe of issue 16
(``benchmarks/gpu/beyond_grid.py``, run in the same device call right after the calibration, read by no fit):
runs 64 and 65 on two H100 boards timed the chunk's attention at 8,192-12,288 cached tokens, where the calibration's
table stops at 6,144, and whole prompt steps over 8,192-10,240 cached tokens."""

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "issue16_h100"
RUNS = ("run64_beyond_probe_longctx_d62ff6a", "run65_beyond_probe_longctx_summarize_agentic_7e2f7ed")


@pytest.mark.parametrize("run", RUNS)
def test_the_chunk_table_extrapolates_beyond_its_cached_levels(run):
    from benchmarks.beyond_grid_check import check
    from sim.timeline_check import unpacked_run

    res = check(unpacked_run(ROOT / run), out=lambda *_: None)
    beyond = np.array([e for _, e in res["chunk"]["beyond"]])
    inside = np.array([e for _, e in res["chunk"]["in"]])
    # every cached level beyond the grid is flagged and priced: 4 new-token counts x 3 levels
    assert beyond.size == 12 and inside.size == 8
    # one layer's chunk attention beyond the grid as close as within it (runs 64 / 65: -1.1 / +2.2% mean, worst
    # -4.8 / +3.6%; within +1.0 / +0.7%)
    assert abs(beyond.mean()) < 0.03 and np.abs(beyond).max() < 0.06
    # whole prompt steps of 2,048-3,584 new tokens over 8,192-10,240 cached: within 3.5% (worst -2.5 / -1.6%)
    steps = [(shape, e) for shape, e in res["steps"]["beyond"] if shape[1] and shape[1][0][0] >= 2048]
    assert len(steps) >= 4 and max(abs(e) for _, e in steps) < 0.035


def test_the_probe_runs_on_the_cpu_engine(monkeypatch):
    """The probe's code path on the tiny model (CPU: no device times, the rows' shapes and conditions only): chunk ops
    at its cached levels, the steps, and each after-long shape under its four conditions."""
    torch = pytest.importorskip("torch")
    import benchmarks.gpu.beyond_grid as bg
    from executor.calibrate import build_engine

    engine = build_engine("tiny", None, "cpu", "fp32", 8, 4096, num_kv_blocks=300)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    for name, value in (("OP_NEW", (16,)), ("OP_CACHED", (32, 64)), ("EXPAND_KEYS", (64,)), ("AFTER_SHAPES", ((16, 64),)),
                        ("AFTER_LONG", (128, 0)), ("REST_S", 0.0), ("IDLE_S", 0.0), ("LOAD_S", 0.01)):
        monkeypatch.setattr(bg, name, value)
    monkeypatch.setattr(bg, "shapes", lambda max_len: [([100] * 2, []), ([], [(16, 64)])])
    got = bg.probe(engine, repeats=1, log=lambda *_: None)
    assert [(p["op"], p.get("cached")) for p in got["ops"]] == [("attn_prefill_chunk", 32), ("attn_prefill_chunk", 64),
                                                                ("kv_expand", None)]
    assert len(got["steps"]) == 2 and got["grid_cached_max"] == 6144
    conds = [r["condition"] for r in got["after_long"]]
    assert len(conds) == 4 and conds[0] == "after a decode step" and "decode steps and the long step" in conds[3]


def test_the_clock_trace_runs_on_the_cpu_engine(monkeypatch):
    """The clock trace's code path on the tiny model with a stand-in NVML reader (the CPU has none: the trace is then
    empty): each sequence's steps in order with host spans, samples taken while they run and in the idle tail."""
    torch = pytest.importorskip("torch")
    import benchmarks.gpu.beyond_grid as bg
    from executor.calibrate import build_engine

    engine = build_engine("tiny", None, "cpu", "fp32", 8, 4096, num_kv_blocks=300)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    for name, value in (("AFTER_SHAPES", ((16, 64),)), ("AFTER_LONG", (128, 0)), ("REST_S", 0.0), ("TRACE_TAIL_S", 0.02),
                        ("TRACE_SEQUENCES", (("long, next", ("long", "next")),))):
        monkeypatch.setattr(bg, name, value)
    assert bg.clock_trace(engine, log=lambda *_: None) == [] or bg._nvml() is not None
    monkeypatch.setattr(bg, "_nvml", lambda: (lambda: (1980.0, 300.0, 0)))
    lines = []
    got = bg.clock_trace(engine, log=lines.append)
    assert [s["step"] for s in got[0]["spans"]] == ["long", "next"]
    spans, samples = got[0]["spans"], got[0]["samples"]
    assert spans[0]["t1"] <= spans[1]["t0"] and samples and samples[-1][0] > spans[-1]["t1"]
    assert all(r[1:] == [1980.0, 300.0, 0] for r in samples)
    assert any("back at the top clock after" in x for x in lines)
