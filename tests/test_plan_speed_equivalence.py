"""The planner's speed-ups change no number: each memoised / fast path equals the path it replaces, bit for bit."""

from __future__ import annotations

import numpy as np

from costmodels import op_table
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.step import StepCostModel


def _sizes() -> np.ndarray:
    """M values below, on, between and above every measured grid (and fractional ones, as x * share gives)."""
    rng = np.random.default_rng(7)
    return np.concatenate([[0.5, 1.0, 3.0, 64.0, 1e5, 3e6], rng.uniform(0.01, 2e4, 300), rng.integers(1, 70_000, 300)]).astype(float)


def test_gemm_table_seconds_equals_time_bit_for_bit():
    """GemmTable.seconds (memoised family and log grids) == GemmTable.time(...).seconds, measured and scaled shapes."""
    table = op_table.load("H200").gemm_table("fp8")
    m = _sizes()
    shapes = sorted(table.families) + [(2112 // 2, 7168), (1536, 7168), (4096, 512), (7168, 2048), (129, 7)]
    for n, k in shapes:
        want = table.time(m, n, k).seconds
        for _ in range(2):   # the second call reads the memo
            got = table.seconds(m, n, k)
            assert got.dtype == want.dtype and np.array_equal(got, want), (n, k)


def _seconds_reference(tg: op_table.TableGemms, row: int, m: np.ndarray) -> np.ndarray:
    """TableGemms.seconds as written before the memo (GemmTable.time per kernel)."""
    flat = np.asarray(m, dtype=float).ravel()
    total = np.zeros(flat.size)
    pos = flat > 0
    if pos.any():
        mp = flat[pos]
        for n, k in tg.shapes[row]:
            t = tg.table.time(mp, n, k).seconds
            if not tg.same_gpu:
                byts = op_table.gemm_bytes(mp, n, k, tg.table.weight_bytes_per_elem)
                t = np.maximum.reduce([t * tg.table.peak_flops / tg.target_flops, byts / (tg.mem_eff * tg.target_bw),
                                       2.0 * mp * n * k / (tg.compute_eff * tg.target_flops)])
            total[pos] += t
    return total.reshape(np.shape(m))


def test_table_gemms_rows_unchanged_on_measured_and_other_gpus():
    """Every covered GEMM row of DeepSeek-V3 FP8 (TP1 / TP8 / DEP16 / TP2xDP4) prices as before, on H200 (measured) and GB300 (scaled)."""
    sizes = _sizes()
    cases = (sizes, np.concatenate([[0.0], sizes]), np.zeros(5), sizes[:12].reshape(3, 4))   # all positive, some 0, all 0, 2-d
    for hw_name in ("h200", "gb300"):
        for tp, dp in ((1, 1), (8, 1), (1, 16), (2, 4)):
            lay = ParallelLayout(tp=tp, dp=dp, ep=tp * dp, weight_dtype="fp8", expert_dtype="fp8")   # the FP8 GEMM table's rows
            sm = StepCostModel(get_model("deepseek-v3"), get_hardware(hw_name), lay)
            tg = sm.g_table
            assert tg is not None
            rows = [r for r in range(len(tg.shapes)) if tg.covers[r]]
            assert rows
            for r in rows:
                for m in cases:
                    got, want = tg.seconds(r, m), _seconds_reference(tg, r, m)
                    assert got.shape == want.shape and np.array_equal(got, want), (hw_name, lay, r, m.shape)
