"""The DSA / MTP piecewise-graph benchmark (benchmarks/gpu/graph_coverage.py) in its CPU smoke mode: every shape runs
both ways, the pieces (uncaptured here) give the eager outputs, and the report has what the GPU run reports."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")


def test_graph_coverage_smoke(tmp_path):
    from benchmarks.gpu import graph_coverage as gc
    out = tmp_path / "g.json"
    saved = dict(gc.SIZES)
    try:
        gc.main(["--out", str(out), "--smoke", "--repeats", "1"])
    finally:
        gc.SIZES.clear()
        gc.SIZES.update(saved)
    res = json.loads(out.read_text())
    dsa, mtp = res["dsa"], res["mtp"]
    assert "error" not in dsa and "error" not in mtp, (dsa.get("error"), mtp.get("error"))
    assert dsa["piecewise_buckets"] > 0 and dsa["topk"] == 64
    assert len(dsa["rows"]) == 2 * 2 + 2 + 1 and len(mtp["rows"]) == 2 * 2
    assert mtp["mtp_layers"] == 1 and mtp["mtp_piece_buckets"] == mtp["piecewise_buckets"]
    for r in dsa["rows"] + mtp["rows"]:
        assert r["rel_err"] < 1e-5, r
        assert r["eager_wall_ms"] > 0 and r["pieces_wall_ms"] > 0 and r["speedup_wall"] > 0
