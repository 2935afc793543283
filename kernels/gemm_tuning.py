"""Tuned tiles for the Triton block-scaled FP8 GEMM, per GPU and GEMM shape (vLLM keeps per-device config files
for its fused MoE the same way).

The table (``kernels/configs/triton_fp8_gemm.json``, written by ``benchmarks/gpu/tune_fp8_gemm.py`` on the GPU it
names, committed with its provenance)::

    {"provenance": {...}, "devices": {"NVIDIA H200": {"2112,7168": {"1": [64, 64, 4, 3, 4], "64": [...], ...}}}}

maps a device name and ``"N,K"`` to tuned row counts M, each with ``[BLOCK_M, BLOCK_N, num_warps, num_stages,
split_k]``. :func:`lookup` gives the config of the smallest tuned M at or above the GEMM's rows; None past the
largest tuned M, or where the GPU or the shape is not in the table (the kernel's untuned choice then: a table may
cover only the rows it was shown to help). ``TWINFER_TRITON_GEMM_
CONFIGS``: another table's path (a tuner's output before it is committed), or ``off`` for none.
"""

from __future__ import annotations

import bisect
import json
import os
from pathlib import Path

ENV = "TWINFER_TRITON_GEMM_CONFIGS"
DEFAULT_PATH = Path(__file__).with_name("configs") / "triton_fp8_gemm.json"
FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "split_k")

_tables: dict[str, dict] = {}                    # path -> parsed {"devices": ...}
_names: dict[int, str] = {}                      # CUDA device index -> name
_cache: dict[tuple, tuple | None] = {}           # (ENV's value, device index, m, n, k) -> config


def table_path() -> Path | None:
    v = os.environ.get(ENV, "").strip()
    if v.lower() in ("off", "none", "0"):
        return None
    return Path(v) if v else DEFAULT_PATH


def load(path: Path) -> dict:
    """The table at ``path`` ({"devices": {}} when absent), checked: every config five positive integers."""
    key = str(path)
    if key not in _tables:
        if not path.exists():
            _tables[key] = {"devices": {}}
        else:
            data = json.loads(path.read_text())
            for dev, shapes in data.get("devices", {}).items():
                for nk, rows in shapes.items():
                    for m, cfg in rows.items():
                        if len(cfg) != len(FIELDS) or not all(isinstance(v, int) and v > 0 for v in cfg) or int(m) < 1:
                            raise ValueError(f"{path}: devices.{dev}.{nk}.{m}: expected M >= 1 -> {list(FIELDS)} as "
                                             f"positive integers, got {cfg}")
            _tables[key] = data
    return _tables[key]


def config_for(table: dict, device_name: str, m: int, n: int, k: int) -> tuple[int, ...] | None:
    """The tuned config of ``table`` for ``device_name`` at M = ``m`` and this N x K, or None."""
    rows = table.get("devices", {}).get(device_name, {}).get(f"{n},{k}")
    if not rows:
        return None
    ms = sorted(int(x) for x in rows)
    i = bisect.bisect_left(ms, m)
    return tuple(rows[str(ms[i])]) if i < len(ms) else None


def device_name(device) -> str:
    import torch
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _names:
        _names[idx] = torch.cuda.get_device_name(idx)
    return _names[idx]


def lookup(m: int, n: int, k: int, device) -> tuple[int, ...] | None:
    """The tuned config for an ``m x n x k`` GEMM on ``device`` (a CUDA device), or None (untuned). Every eager GEMM
    call asks: a repeat costs one dict lookup (the table path and the device's name are resolved on the first)."""
    key = (os.environ.get(ENV, ""), device.index, m, n, k)
    try:
        return _cache[key]
    except KeyError:
        path = table_path()
        _cache[key] = None if path is None else config_for(load(path), device_name(device), m, n, k)
        return _cache[key]


def status(gpu: str | None) -> str:
    """One line for ``twinfer kernels``: whether the Triton FP8 GEMM has tuned tiles for ``gpu`` (a device name, with
    or without the "NVIDIA " prefix) in the table it would read."""
    path = table_path()
    if path is None:
        return f"tuned tiles off ({ENV}=off): untuned choice"
    try:
        devices = load(path).get("devices", {})
    except (OSError, ValueError) as e:
        return f"tuned-tile table {path} unreadable ({e})"
    match = [d for d in devices if gpu and (d == gpu or d.replace("NVIDIA ", "") == gpu.replace("NVIDIA ", ""))]
    if not match:
        return f"no tuned tiles for {gpu or 'this device'} in {path.name} (tuned: {', '.join(devices) or 'none'}): untuned choice"
    shapes = devices[match[0]]
    rows = sorted({int(m) for r in shapes.values() for m in r})
    return f"tuned tiles for {match[0]}: {len(shapes)} N x K shapes at M = {rows[0]}..{rows[-1]} ({path.name})"


def reset() -> None:
    """Forget loaded tables and lookups (a test or the tuner switching tables)."""
    _tables.clear()
    _cache.clear()
