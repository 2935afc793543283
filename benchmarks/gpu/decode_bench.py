"""What the decode-step benchmarks on the device share (decode_grid_modes, decode_ctx_mix, graph_launch_gap): the
engine's arguments and the engine itself, the matrix runs' 5-layer V3 FP8 on CUDA, the tiny model on the CPU with
``--smoke`` (a check of the script)."""

from __future__ import annotations

import argparse


def engine_args(ap: argparse.ArgumentParser, batches: str) -> None:
    """``--out``, the engine (``--model``, ``--layers``, ``--dtype``), ``--batches`` (default ``batches``), ``--smoke``."""
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--batches", default=batches)
    ap.add_argument("--smoke", action="store_true", help="tiny on the CPU, small sizes (a check of the script)")


def build(a: argparse.Namespace, max_batch: int, max_model_len: int, num_kv_blocks: int):
    """(engine, device): the arguments' engine on CUDA, or with ``--smoke`` the tiny FP32 model on the CPU (``a``'s
    model, layers and dtype are set to it, so the report says what ran)."""
    from executor.calibrate import build_engine
    device = "cpu" if a.smoke else "cuda"
    if a.smoke:
        a.model, a.layers, a.dtype = "tiny", None, "fp32"
    return build_engine(a.model, a.layers, device, a.dtype, max_batch, max_model_len, num_kv_blocks=num_kv_blocks), device
