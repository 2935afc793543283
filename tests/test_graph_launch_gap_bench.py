"""The graph launch-gap benchmark (benchmarks/gpu/graph_launch_gap.py) in its CPU smoke mode: every batch is timed
idle (no spin kernel off CUDA, so nothing held) and the report is written; bad sizes are refused by name."""

from __future__ import annotations

import json

import pytest


def test_graph_launch_gap_smoke(tmp_path):
    from benchmarks.gpu import graph_launch_gap as glg

    res = glg.main(["--out", str(tmp_path / "g.json"), "--smoke", "--batches", "1,3"])
    assert set(res["batches"]) == {"1", "3"} and res["gpu"] == "cpu (smoke)"
    for m in res["batches"].values():
        assert m["idle"]["wall_s"] > 0 and "held" not in m      # no spin kernel on the CPU
    assert json.loads((tmp_path / "g.json").read_text())["batches"].keys() == res["batches"].keys()
    with pytest.raises(SystemExit) as e:
        glg.main(["--out", str(tmp_path / "x.json"), "--smoke", "--batches", "0,2"])
    assert e.value.code == 2


def test_prefix_issue_probe_smoke(tmp_path):
    """benchmarks/gpu/prefix_issue_probe.py in its CPU smoke mode: each shape timed with its pages contiguous and
    scattered (idle only: no spin kernel off CUDA), the scattered plan's pages distinct; bad repeats refused by name."""
    from benchmarks.gpu import prefix_issue_probe as pip_

    res = pip_.main(["--out", str(tmp_path / "p.json"), "--smoke"])
    assert res["gpu"] == "cpu (smoke)" and len(res["shapes"]) == len(pip_.SMOKE_SHAPES)
    for s in res["shapes"]:
        for layout in ("contiguous", "scattered"):
            assert s[layout]["wall_s"] > 0 and s[layout]["forward_host_s"] is None   # nothing held on the CPU
    assert json.loads((tmp_path / "p.json").read_text())["shapes"] == res["shapes"]
    with pytest.raises(SystemExit) as e:
        pip_.main(["--out", str(tmp_path / "x.json"), "--smoke", "--repeats", "0"])
    assert e.value.code == 2


def test_host_speed_probe_smoke(tmp_path):
    """benchmarks/gpu/host_speed_probe.py in its CPU smoke mode: every CPU of the affinity set timed each round, then
    unpinned, and the affinity restored; the summary's ratios are >= 1; bad rounds refused by name with exit 2."""
    import os

    from benchmarks.gpu import host_speed_probe as hsp

    before = os.sched_getaffinity(0)
    out = tmp_path / "h.json"
    assert hsp.main(["--out", str(out), "--cpu", "--rounds", "2", "--repeats", "3"]) == 0
    assert os.sched_getaffinity(0) == before
    res = json.loads(out.read_text())
    cpus = sorted(before)
    assert sorted({r["cpu"] for r in res["rows"]}) == [-1] + cpus and len(res["rows"]) == 2 * (len(cpus) + 1)
    assert all(r["input_build_s"] > 0 and r["python_s"] > 0 for r in res["rows"])
    s = res["summary"]["gpu_idle"]
    assert s["between_cpus_max_over_min"] >= 1 and s["within_cpu_max_over_min_median"] >= 1
    assert hsp.main(["--out", str(out), "--cpu", "--rounds", "0"]) == 2
