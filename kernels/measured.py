"""Measured fraction of the ceiling per op and implementation, from the committed op tables.

The tables (``costmodels/data/op_tables/<gpu>/*.csv``, written on the GPU by
``benchmarks/gpu/op_tables.py``) hold device time per call inside CUDA graphs with the achieved
TFLOP/s and TB/s. A kernel's fraction of the ceiling at one shape is the binding resource's
share: ``max(TFLOP/s / matmul ceiling, TB/s / copy ceiling)`` (ceilings measured on the same GPU,
passed in by the caller). Summarised as medians over decode shapes (M or batch <= 128) and
prefill shapes (M >= 4096). Reads CSV files only: no cost-model import (layering).
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

# op -> (table file, size column, label of what was measured)
TABLES = {
    "fp8_gemm": ("dense_gemm_fp8.csv", "m", "dense FP8 GEMMs of DeepSeek-V3, TP1"),
    "moe_experts": ("grouped_gemm_masked_fp8.csv", "m", "masked grouped GEMMs only (decode)"),
    "mla_decode": ("mla_decode_bf16.csv", "batch", "MLA decode by batch x context"),
}
DECODE_MAX, PREFILL_MIN = 128, 4096
L2_SPILL_BYTES = 256 << 20     # several times the H200's 50 MB L2 (DOMAIN.md)


def spill_copies(nbytes: int, cap: int = 64) -> int:
    """Copies of an operand of ``nbytes`` that one timed pass cycles through so that no copy stays in L2 (at least one,
    at most ``cap``): the rule the op tables and the calibration's GEMM table are timed by, as a step reads each weight
    once."""
    return int(min(cap, max(1, -(-L2_SPILL_BYTES // max(int(nbytes), 1)))))


def _fraction(row: dict, peak_tflops: float, copy_tbs: float) -> float:
    tf = float(row["tflops"]) if row.get("tflops") else 0.0
    return max(tf / peak_tflops, float(row["tbs"]) / copy_tbs)


def fractions(folder: Path, peak_tflops: float, copy_tbs: float) -> dict[tuple[str, str], dict]:
    """(op, implementation) -> {decode, prefill (median fractions or None), shapes, what}."""
    out: dict[tuple[str, str], dict] = {}
    for op, (fname, size_col, what) in TABLES.items():
        path = Path(folder) / fname
        if not path.is_file():
            continue
        with path.open(newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if "/tp" not in r["name"]]
        for lib in sorted({r["lib"] for r in rows}):
            mine = [r for r in rows if r["lib"] == lib]
            dec = [_fraction(r, peak_tflops, copy_tbs) for r in mine if int(r[size_col]) <= DECODE_MAX]
            pre = [_fraction(r, peak_tflops, copy_tbs) for r in mine if int(r[size_col]) >= PREFILL_MIN]
            out[(op, lib)] = {"decode": round(statistics.median(dec), 3) if dec else None,
                              "prefill": round(statistics.median(pre), 3) if pre else None,
                              "shapes": len(mine), "what": what}
    return out


def summary(entry: dict | None) -> str:
    """One line for the CLI: 'decode 0.71, prefill 0.62 of ceiling (N shapes)'."""
    if entry is None:
        return "not in the measured table"
    parts = [f"{k} {entry[k]:.2f}" for k in ("decode", "prefill") if entry[k] is not None]
    what = f"; {entry['what']}" if "only" in entry["what"] else ""   # say when the table covers part of the op
    return f"{', '.join(parts)} of ceiling ({entry['shapes']} shapes{what})"
