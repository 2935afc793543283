"""benchmarks/host_drift.py on archived H200 matrices: per replay, TPOT's error against the decode host part's drift
from the calibration (runs 26-30: r -0.72 over 117 replays), and a clear exit for a folder without reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "gpu" / "issue16_h200"


def test_tpot_error_follows_the_host_drift_replay_by_replay():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import host_drift

    runs = [RUNS / n for n in ("run26_reasoning_chat_longctx_479edd3", "run27_agentic_summarize_reasoning_8f50a69",
                               "run28_agentic_summarize_chat_5a62520", "run29_agentic_chat_reasoning_266caf6",
                               "run30_chat_deepgemm_e100c64")]
    out = host_drift.main([str(r) for r in runs] + ["--quiet"])
    fit = out["fits"]["host_drift"]
    assert fit["n"] == 117 and fit["r"] == pytest.approx(-0.72, abs=0.01) and fit["slope"] == pytest.approx(-0.269, abs=0.005)
    assert fit["resid_std"] < fit["err_std"]
    assert out["fits"]["probe_drift"] is None          # no run before the probe recorded it
    assert {r["class"] for r in out["rows"]} == {"chat", "agentic", "summarize", "reasoning", "longctx"}
    with pytest.raises(SystemExit, match="no reports.tar.xz or reports.tgz"):
        host_drift.main([str(ROOT / "benchmarks")])
