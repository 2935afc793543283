"""The executor Linear's GEMM tables (``gemm_mem`` over bytes, ``gemm_compute`` over rows): timed at every token
bucket the piecewise graphs pad a step to, and built from the GEMM's device work where every point has it (issue 16:
the small-shape figures carried a launch floor, and a tiled GEMM's staircase in rows fell between powers of 2)."""

from __future__ import annotations

import pytest

from costmodels.calibration import CalibrationProfile, linear_tables
from costmodels.hardware import get_hardware

K, N = 7168, 14336


def _points(device: bool, tile: int = 128) -> list[dict]:
    """Linear points whose device work is a staircase in 128-row tiles (50 us a tile, 40 us from one row) under a
    100 us eager launch floor."""
    out = []
    for m in (1, 8, 64, 128, 256, 272, 384, 512):
        dev = 40e-6 + 50e-6 * -(-m // tile)
        p = {"op": "linear", "m": m, "k": K, "n": N, "dtype": "fp8", "time_s": max(dev, 100e-6) + 20e-6, "spread": 0.01,
             "flops": 2.0 * m * N * K, "bytes": N * K + 2.0 * m * (K + N), "backend": "triton"}
        if device:
            p["device_s"] = dev
        out.append(p)
    return out


def _seconds(prof: CalibrationProfile, p: dict) -> float:
    hw = get_hardware("H200")
    top = max(prof.gemm_compute_eff.values())
    ceff = float(prof.tables["gemm_compute"](p["m"])) * prof.gemm_compute_eff["fp8"] / top
    return max(p["flops"] / (hw.tflops("fp8") * 1e12 * ceff), p["bytes"] / (float(prof.tables["gemm_mem"](p["bytes"])) * hw.hbm_bw))


@pytest.mark.parametrize("device", [True, False])
def test_tables_answer_each_measured_row_count_with_its_own_seconds(device):
    pts = _points(device)
    tabs = linear_tables(pts, "H200")
    prof = CalibrationProfile.default(get_hardware("H200"))
    prof = prof.model_copy(update={"tables": {**prof.tables, **tabs}})
    for p in pts:
        want = p["device_s"] if device else p["time_s"]
        assert _seconds(prof, p) == pytest.approx(want, rel=1e-9), p["m"]
    assert ("device seconds" in tabs["gemm_compute"].x_is) is device
    # the staircase is in the table: 272 rows (three tiles) cost more than interpolating 256 and 384 in log rows would
    if device:
        assert tabs["gemm_compute"](272) < tabs["gemm_compute"](256)


def test_eager_when_any_point_lacks_device_work():
    pts = _points(True)
    del pts[3]["device_s"]
    tabs = linear_tables(pts, "H200")
    assert "device seconds" not in tabs["gemm_compute"].x_is
    assert linear_tables([p for p in pts if p["op"] != "linear"], "H200") == {}


def test_earlier_profiles_rebuild_to_their_stored_tables():
    """Every committed H200 profile timed its Linear eagerly: rebuilt from its points, the tables are the stored ones,
    so re-fitting an archived run (scripts/matrix_offline.py --refit) predicts as before."""
    prof = CalibrationProfile.load("profiles/h200/calibration_deepseek-v3-5layers_fp8.json")
    tabs = linear_tables(prof.op_points, prof.step.hardware_basis)
    assert set(tabs) == {"gemm_mem", "gemm_compute"}
    for k, t in tabs.items():
        assert t.model_dump() == prof.tables[k].model_dump()


def test_refit_builds_the_tables_from_device_work(monkeypatch):
    import costmodels.step_fit as sf
    from costmodels.step_profile import HostTerms, LoopTerms, StepProfile

    prof = CalibrationProfile.default(get_hardware("H200"))
    eager = linear_tables(_points(False), "H200")
    pts = _points(True)
    prof = prof.model_copy(update={"op_points": pts, "tables": {**prof.tables, **eager}})
    seen = {}

    def fake_fit(p, points, **kw):
        seen.update(p.tables)
        return StepProfile(model="deepseek-v3", num_layers=5)

    class _St:
        points, model, dtype, device, graph_sizes, piecewise_sizes = [], "deepseek-v3", "fp8", "cuda", [], []
        hardware_basis = "H200"
        loop, host = LoopTerms(), HostTerms()

    monkeypatch.setattr(sf, "fit_step_profile", fake_fit)
    sf.refit_profile(prof.model_copy(update={"step": _St()}))
    assert seen["gemm_compute"].model_dump() == linear_tables(pts, "H200")["gemm_compute"].model_dump()
    assert "device seconds" in seen["gemm_mem"].x_is


def test_linear_rows_cover_every_piecewise_bucket():
    pytest.importorskip("torch")
    from executor.calibrate import linear_rows

    buckets = [1, 2, 4, 8, 16, 24, 256, 272, 288, 4096]
    rows = linear_rows(True, buckets)
    assert set(buckets) <= set(rows) and {512, 8192} <= set(rows) and rows == sorted(set(rows))
    assert linear_rows(True) == [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert linear_rows(False, buckets) == [1, 8, 64, 256]


def _gemm_points(scale: float, lib: str = "triton") -> list[dict]:
    """``gemm`` points of the 5-layer DeepSeek-V3's FP8 shapes: the committed H200 table's times x ``scale`` at its rows."""
    from costmodels.op_table import load

    fams = load("H200").gemm_table("fp8", (lib,)).families
    return [{"op": "gemm", "m": int(m), "n": n, "k": k, "dtype": "fp8", "device_s": float(t) * scale, "backend": lib}
            for (n, k), (ms, ts) in fams.items() for m, t in zip(ms, ts)]


def test_a_calibrations_own_gemm_points_price_its_gemms():
    """A profile that timed the model's GEMM shapes itself (bench_gemm_shapes) prices its FP8 GEMMs from them, on the
    GPU it ran on; without them, or on another GPU, the committed op table does, as before."""
    import numpy as np

    from costmodels.op_table import table_from_points
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_ops import TOKENS

    prof = CalibrationProfile.load("profiles/h200/calibration_deepseek-v3-5layers_fp8.json")

    def gemm_s(p):
        c = ProfiledStepCost(p).base
        return float(c.gemms(TOKENS, np.array([272.0])).time.sum()), c

    before, c0 = gemm_s(prof)
    own = prof.model_copy(update={"op_points": prof.op_points + _gemm_points(2.0)})
    after, c1 = gemm_s(own)
    assert c1.g_table.table.source and not c0.g_table.table.source
    assert "own GEMM shapes" in c1.gemm_table_note()
    assert 1.6 * before < after < 2.0 * before   # the FP8 GEMMs doubled; BF16 ones (analytic) did not
    # measured on another GPU, the points do not speak for this one's GEMMs
    moved = own.model_copy(update={"measured_on": "H100"})
    assert not gemm_s(moved)[1].g_table.table.source
    # two libraries, or none: no table of its own
    assert table_from_points(_gemm_points(1.0) + _gemm_points(1.0, "deepgemm"), "H200") is None
    assert table_from_points([], "H200") is None


def test_bench_gemm_shapes_is_cuda_only():
    pytest.importorskip("torch")
    from executor.calibrate import bench_gemm_shapes, build_engine

    eng = build_engine("tiny", None, "cpu", "fp32", 4, 256, num_kv_blocks=64)
    assert bench_gemm_shapes(eng, [1, 8]) == []


def test_own_gemm_table_prices_the_grids_device_work_on_the_h200(tmp_path):
    """The first calibration with the model's GEMM shapes timed at the token buckets (H200, the async bench's in-process
    calibration at 72dd381), re-fitted: against the grid's eager forwards' device work alone (spin-held), its own table
    beats the committed op table read log-log, most where a step's rows fall just past a 128-row tile (257-384 rows:
    the committed table was 7% short)."""
    import shutil

    import numpy as np

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile

    shutil.copy("benchmarks/gpu/issue23_h200/run_async_calibrated_72dd381/calibration.json", tmp_path / "calibration_x.json")

    def device_ratios(own: bool) -> np.ndarray:
        prof = run_profile(tmp_path, "auto", own_gemms=own)
        c = ProfiledStepCost(prof)
        out = []
        for p in prof.step.points:
            if p.queued_forward_s is None or p.graph_bs:
                continue
            new = np.array([1] * len(p.decode_ctx) + [n for n, _ in p.prefill])
            ctx = np.array(list(p.decode_ctx) + [x for _, x in p.prefill])
            dec = np.array([True] * len(p.decode_ctx) + [False] * len(p.prefill))
            rows = prof.step.piecewise_bucket(int(new.sum())) or int(new.sum())
            out.append((rows, c.eager_device(new, ctx, dec) / p.queued_forward_s))
        return np.array(out)

    committed, own = device_ratios(False), device_ratios(True)
    mape = lambda a: float(np.mean(np.abs(a[:, 1] - 1.0)))  # noqa: E731
    band = lambda a: a[(a[:, 0] > 256) & (a[:, 0] <= 384), 1]  # noqa: E731
    assert mape(own) < 0.025 < mape(committed)
    assert abs(np.median(band(own)) - 1.0) < 0.03 < abs(np.median(band(committed)) - 1.0)
