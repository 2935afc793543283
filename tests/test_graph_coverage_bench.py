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
    assert len(dsa["rows"]) == 2 * 2 + 2 + 1 and len(mtp["rows"]) == 1 + 2 * 2
    assert mtp["mtp_layers"] == 1 and mtp["mtp_piece_buckets"] == mtp["piecewise_buckets"]
    for r in dsa["rows"] + mtp["rows"]:
        assert r["rel_err"] < 1e-5, r
        assert r["eager_wall_ms"] > 0 and r["pieces_wall_ms"] > 0 and r["speedup_wall"] > 0
    # the padded steps (tokens short of their bucket) split their difference from eager: padding vs graphs, and on
    # the DSA model each layer's top-k; the padding changes no selected key here
    padded = [r for r in dsa["rows"] + mtp["rows"] if "bucket" in r]
    assert {r["shape"] for r in padded} >= {dsa["rows"][-1]["shape"]} and mtp["rows"][0]["shape"] == dsa["rows"][-1]["shape"]
    for r in padded:
        assert r["tokens"] < r["bucket"] and r["rel_err_padded_vs_eager"] < 1e-5 and r["rel_err_pieces_vs_padded"] < 1e-5
    mixed = dsa["rows"][-1]
    assert len(mixed["topk_padded_vs_eager"]) == 4 and all(v == 0 for d in mixed["topk_padded_vs_eager"] for v in d.values())
    assert any("decode_keys_differ" in d for d in mixed["topk_padded_vs_eager"])
