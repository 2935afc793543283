"""benchmarks/bf16_transfer_check.py: the arithmetic that compares a device run's BF16 GEMMs with the cost model's
BF16 prices (the FP8-to-BF16 transfer), on a run written from the committed FP8 table."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bf16_transfer_check as chk  # noqa: E402
from benchmarks.gpu.op_tables import FIELDS  # noqa: E402


def _run_csv(tmp_path: Path, bf16_factor: float) -> Path:
    """A dense_bf16 run: DeepGEMM FP8 rows from the committed H200 table, BF16 rows at ``bf16_factor`` times the
    rule's price on them."""
    from costmodels import op_table
    from costmodels.calibration_source import profile_for
    from costmodels.hardware import get_hardware
    tab = op_table.load("H200").gemm_table("fp8")
    hw = get_hardware("H200")
    rows = []
    for (n, k) in [(2112, 7168), (7168, 2048)]:
        ms, ts = tab.families[(n, k)]
        for m, t in zip(ms, ts):
            rows.append({"op": "dense_gemm", "lib": "deepgemm", "dtype": "fp8", "name": f"g{n}", "m": int(m), "n": n, "k": k,
                         "device_us": t * 1e6})
        bf = chk.bf16_seconds(tab, hw, profile_for(hw), n, k, ms) * bf16_factor
        for m, t in zip(ms, bf):
            rows.append({"op": "dense_gemm", "lib": "cublas", "dtype": "bf16", "name": f"g{n}", "m": int(m), "n": n, "k": k,
                         "device_us": t * 1e6})
    rows.append({"op": "dense_gemm", "lib": "cublas", "dtype": "bf16", "name": "failed", "m": 1, "n": 256, "k": 7168,
                 "error": "RuntimeError: x"})
    path = tmp_path / "op_tables.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    return path


def test_a_bf16_run_at_the_rules_price_reads_zero_error_and_a_slower_one_its_factor(tmp_path):
    out = chk.compare(chk.read_rows(_run_csv(tmp_path, 1.0)))
    assert len(out) == 26 and all(o["name"] != "failed" for o in out)
    assert all(o["same_run_s"] == pytest.approx(o["measured_s"], rel=1e-3) for o in out)
    assert all(o["table_s"] == pytest.approx(o["measured_s"], rel=1e-3) for o in out)   # the run is the table (4 digits)
    med, worst, _ = chk.summary(chk.compare(chk.read_rows(_run_csv(tmp_path, 1.25))), "same_run_s")
    assert med == pytest.approx(0.2, rel=1e-3) and worst == pytest.approx(-0.2, rel=1e-3)


def test_cli_refuses_a_missing_file_and_a_run_without_bf16_rows(tmp_path, capsys):
    assert chk.main([str(tmp_path / "nope.csv")]) == 2
    empty = tmp_path / "e.csv"
    empty.write_text(",".join(FIELDS) + "\n")
    assert chk.main([str(empty)]) == 2
    assert "no timed BF16" in capsys.readouterr().err
    assert chk.main([str(_run_csv(tmp_path, 1.0))]) == 0
    assert "rule on the same run's FP8 kernels: median |error| 0.0%" in capsys.readouterr().out
