"""benchmarks/gpu/run_ab_steps.py: A/B step logs grouped by kind and size, compared with the first pass, and the
one-off slow steps (first-call compiles) found."""

from __future__ import annotations

import json

import pytest

from benchmarks.gpu import run_ab_steps as ab


def _log(path, steps):
    path.write_text("\n".join(json.dumps(s) for s in steps) + "\n")
    return path


def _dec(b, ms, graph=True):
    return {"num_decodes": b, "num_prefills": 0, "num_tokens": b, "wall_s": ms / 1e3, "cuda_graph": graph,
            "piecewise_bs": 0}


def _pre(tokens, ms):
    return {"num_decodes": 0, "num_prefills": 1, "num_tokens": tokens, "wall_s": ms / 1e3, "cuda_graph": False,
            "piecewise_bs": 0}


def test_groups_compare_and_outliers(tmp_path, capsys):
    a = _log(tmp_path / "off.jsonl", [_dec(4, 5.0)] * 10 + [_pre(3000, 40.0)] * 4)
    b = _log(tmp_path / "tuned.jsonl", [_dec(4, 4.5)] * 10 + [_pre(3000, 40.0)] * 3 + [_pre(3000, 900.0)])
    out = ab.main([str(a), str(b), "--labels", "off,tuned"])
    g = out["groups"]
    assert set(g) == {"decode graph b=2-8", "prompt <= 4096 tok"}
    assert g["decode graph b=2-8"][1]["median_ms"] == pytest.approx(4.5)
    assert out["totals"]["off"] == pytest.approx(0.21) and out["totals"]["tuned"] == pytest.approx(0.045 + 0.12 + 0.9)
    assert out["outliers"]["off"] == [] and len(out["outliers"]["tuned"]) == 1
    assert out["outliers"]["tuned"][0]["num_tokens"] == 3000 and out["outliers"]["tuned"][0]["x_median"] == pytest.approx(22.5)
    text = capsys.readouterr().out
    assert "x0.900" in text and "tuned: 1 steps over 5x" in text


def test_group_names():
    assert ab.group(_dec(1, 1)) == "decode graph b=1" and ab.group(_dec(40, 1, graph=False)) == "decode eager b=33+"
    assert ab.group({**_dec(9, 1, graph=False), "piecewise_bs": 16}) == "decode pieces b=9-32"
    assert ab.group(_pre(100, 1)) == "prompt <= 128 tok" and ab.group(_pre(9000, 1)) == "prompt > 8192 tok"


def test_bad_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"wall_s": 1}\nnot json\n')
    with pytest.raises(SystemExit, match="bad.jsonl:2"):
        ab.main([str(bad), str(bad)])
    good = _log(tmp_path / "one.jsonl", [_pre(5000, 60.0)] * 5 + [_pre(5719, 3400.0)])
    one = ab.main([str(good)])   # one pass: groups and outliers only
    assert one["outliers"]["one"][0]["num_tokens"] == 5719 and set(one["groups"]) == {"prompt <= 8192 tok"}
