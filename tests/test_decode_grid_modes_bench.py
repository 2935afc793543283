"""The decode host-phase benchmark (benchmarks/gpu/decode_grid_modes.py) in its CPU smoke mode: every round measures
every batch three ways and reports each host phase and the wall."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")


def test_decode_grid_modes_smoke(tmp_path):
    from benchmarks.gpu import decode_grid_modes as dgm
    from costmodels.step_profile import HOST_PHASES

    out = tmp_path / "m.json"
    dgm.main(["--out", str(out), "--smoke", "--batches", "1,3", "--rounds", "2"])
    res = json.loads(out.read_text())
    assert res["batches"] == [1, 3] and len(res["rounds"]) == 2
    for row in res["rounds"]:
        for mode in dgm.MODES:
            assert set(row[mode]) == {"1", "3"}, (mode, row[mode])
            for m in row[mode].values():
                assert set(m) == set(HOST_PHASES) | {"wall", "steps"} and m["steps"] >= 3 and m["wall"] > 0
                assert all(m[k] >= 0 for k in HOST_PHASES)
    with pytest.raises(SystemExit, match="--batches"):
        dgm.main(["--out", str(out), "--smoke", "--batches", "0"])
