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
