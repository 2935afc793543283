"""benchmarks/host_samplers.py on a synthetic run folder: steps placed on the Unix clock by replay_t0_unix, joined with
/proc/stat samples per window, and the host part by batch."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _run(tmp_path: Path, with_t0: bool = True) -> Path:
    shutil.copy(ROOT / "profiles/h200/calibration_deepseek-v3-5layers_fp8.json", tmp_path / "calibration_x.json")
    n = 200
    s = {"decodes": [4] * n, "decode_ctx_mean": [500.0] * n, "prefill_tokens": [0] * n, "prefill_chunks": [0] * n,
         "prefill_ctx": [0] * n, "graph_bs": [4] * n, "measured_s": [0.006] * n, "forward_s": [0.0045] * n,
         "start_s": [0.01 * i for i in range(100)] * 2}
    (tmp_path / "samples_chat_x.json").write_text(json.dumps({"low": s}))
    diag = {"replay_t0_unix": [1000.0, 1010.0]} if with_t0 else {}
    (tmp_path / "validation_chat_x.json").write_text(json.dumps({"levels": [{"name": "low", "diagnostics": diag}]}))
    lines = [f"{1000 + 0.5 * i:.3f} cpu  {100 * i} 0 {10 * i} {1000 * i} 0 0 0 {i} 0 0 | 606 3" for i in range(40)]
    (tmp_path / "cpu_stat.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_windows_join_steps_and_cpu_samples(tmp_path, capsys):
    import host_samplers as hs

    hs.main([str(_run(tmp_path))])
    out = capsys.readouterr().out
    assert "t+   0.0    100" in out and "t+  10.0    100" in out        # the two replays, 10 s apart
    assert "{'606': '3'}" in out and "chat low" in out
    assert "steal" in out and " 0.1%" in out                           # steal 1 of 1111 jiffies per sample step
    assert "chat       2-8:" in out


def test_a_run_without_replay_clock_says_why(tmp_path):
    import host_samplers as hs

    with pytest.raises(SystemExit, match="no replay_t0_unix"):
        hs.main([str(_run(tmp_path, with_t0=False))])
