"""The context-mix decode benchmark (benchmarks/gpu/decode_ctx_mix.py): the ways keep the batch and the mean context,
scattering keeps each request's page count with distinct pages, and the CPU smoke run reports every way each round."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")


def test_ways_keep_batch_and_mean_context():
    from benchmarks.gpu.decode_ctx_mix import WAYS, contexts
    for b in (2, 16, 64):
        for c in (512, 2048):
            for way in WAYS:
                got = contexts(way, b, c)
                assert len(got) == b and abs(np.mean(got) - c) <= 1, (way, b, c)
    assert max(contexts("spread", 64, 1000)) == 1900 and min(contexts("bimodal", 4, 1000)) == 250


def test_scatter_keeps_page_counts_and_draws_distinct_pages():
    from types import SimpleNamespace

    from benchmarks.gpu.decode_ctx_mix import scatter
    plan = SimpleNamespace(decodes=[SimpleNamespace(block_ids=list(range(i * 3, i * 3 + 3))) for i in range(5)])
    scatter(plan, 1000, np.random.default_rng(0))
    pages = [p for r in plan.decodes for p in r.block_ids]
    assert [len(r.block_ids) for r in plan.decodes] == [3] * 5 and len(set(pages)) == 15 and max(pages) < 1000
    assert pages != list(range(15))


def test_decode_ctx_mix_smoke(tmp_path):
    from benchmarks.gpu import decode_ctx_mix as m
    out = tmp_path / "x.json"
    m.main(["--out", str(out), "--smoke", "--batches", "2", "--ctx", "16", "--rounds", "2"])
    res = json.loads(out.read_text())
    assert len(res["rounds"]) == 2 and all(set(r) == {"round"} | {f"{w} b=2 c=16" for w in m.WAYS} for r in res["rounds"])
    assert all(v["wall"] > 0 for r in res["rounds"] for k, v in r.items() if k != "round")
    assert res["summary"][1].startswith("  b=2 c=16: spread ")
    with pytest.raises(SystemExit, match="--batches"):
        m.main(["--out", str(out), "--smoke", "--batches", "0"])
