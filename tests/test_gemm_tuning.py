"""The Triton FP8 GEMM's tuned-tile table (kernels.gemm_tuning): lookup by GPU name, N x K and the smallest tuned M at
or above the GEMM's rows, the environment switch, and a malformed table refused with the field named."""

from __future__ import annotations

import json

import pytest

from kernels import gemm_tuning as gt

TABLE = {"devices": {"NVIDIA H200": {"2112,7168": {"1": [64, 64, 4, 3, 8], "64": [64, 128, 4, 3, 2],
                                                   "512": [128, 256, 8, 4, 1]}}}}


def test_lookup_picks_the_smallest_tuned_rows_at_or_above():
    f = lambda m, n=2112, k=7168, dev="NVIDIA H200": gt.config_for(TABLE, dev, m, n, k)  # noqa: E731
    assert f(1) == (64, 64, 4, 3, 8)
    assert f(2) == f(64) == (64, 128, 4, 3, 2)
    assert f(65) == f(512) == (128, 256, 8, 4, 1)
    assert f(513) is None and f(9000) is None       # past the largest tuned M: the untuned choice
    assert f(64, n=576) is None                     # shape not tuned: the kernel's untuned choice
    assert f(64, dev="NVIDIA H100 80GB HBM3") is None


def test_table_file_env_switch_and_errors(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(TABLE))
    monkeypatch.setenv(gt.ENV, str(path))
    gt.reset()
    assert gt.table_path() == path and gt.load(path)["devices"]["NVIDIA H200"]
    monkeypatch.setenv(gt.ENV, "off")
    assert gt.table_path() is None
    monkeypatch.delenv(gt.ENV)
    assert gt.table_path() == gt.DEFAULT_PATH
    assert gt.load(tmp_path / "absent.json") == {"devices": {}}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"devices": {"NVIDIA H200": {"2112,7168": {"64": [64, 128, 4, 3]}}}}))
    gt.reset()
    with pytest.raises(ValueError, match=r"devices.NVIDIA H200.2112,7168.64.*split_k"):
        gt.load(bad)
    gt.reset()


def test_committed_table_is_valid():
    """The committed table (when there is one) parses and names its provenance per GPU."""
    if not gt.DEFAULT_PATH.exists():
        pytest.skip("no tuned table committed")
    gt.reset()
    t = gt.load(gt.DEFAULT_PATH)
    assert t["devices"] and set(t["devices"]) <= set(t.get("provenance", {}))
    # the H200 table keeps only the rows an end-to-end run did not contradict (M <= 128; its provenance says why)
    h200 = t["devices"].get("NVIDIA H200", {})
    assert h200 and max(int(m) for rows in h200.values() for m in rows) == 128
    assert gt.config_for(t, "NVIDIA H200", 4096, 7168, 16384) is None
    gt.reset()


def test_tuner_candidates_cover_split_k_where_tiles_are_few():
    pytest.importorskip("torch")
    from benchmarks.gpu.tune_fp8_gemm import candidates
    small, mid, large = candidates(1), candidates(128), candidates(4096)
    assert {c[4] for c in small} == {1, 2, 4, 8} and {c[0] for c in small} == {64}
    assert {c[4] for c in mid} == {1, 2, 4} and {c[0] for c in mid} == {64, 128}
    assert {c[4] for c in large} == {1}
    assert all(len(c) == len(gt.FIELDS) for c in small + mid + large)


def test_status_line(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(TABLE))
    monkeypatch.setenv(gt.ENV, str(path))
    gt.reset()
    assert gt.status("H200") == "tuned tiles for NVIDIA H200: 1 N x K shapes at M = 1..512 (t.json)"
    assert gt.status("NVIDIA H200") == gt.status("H200")
    assert gt.status("B200").startswith("no tuned tiles for B200 in t.json (tuned: NVIDIA H200)")
    monkeypatch.setenv(gt.ENV, "off")
    assert "untuned" in gt.status("H200")
    gt.reset()


def test_lookup_resolves_once_per_shape(tmp_path, monkeypatch):
    """``lookup`` (every eager GEMM call) reads the table and the device's name once per shape and environment."""
    from types import SimpleNamespace
    path = tmp_path / "t.json"
    path.write_text(json.dumps(TABLE))
    calls = []
    monkeypatch.setattr(gt, "device_name", lambda dev: calls.append(dev) or "NVIDIA H200")
    monkeypatch.setenv(gt.ENV, str(path))
    gt.reset()
    dev = SimpleNamespace(index=0)
    assert gt.lookup(64, 2112, 7168, dev) == (64, 128, 4, 3, 2) == gt.lookup(64, 2112, 7168, dev)
    assert len(calls) == 1
    monkeypatch.setenv(gt.ENV, "off")   # another environment value: looked up again, untuned
    assert gt.lookup(64, 2112, 7168, dev) is None
    gt.reset()
