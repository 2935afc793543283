"""The input precision the Triton kernels ask ``tl.dot`` for."""

from __future__ import annotations

import torch


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision for fp32 operands, following torch's own fp32 matmul setting: Triton
    rounds fp32 to TF32 by default, so with ``torch.set_float32_matmul_precision("highest")`` (torch's
    default) the kernels must ask for IEEE fp32 to agree with ``torch.matmul`` (issue 22's fp32 parity)."""
    if dtype != torch.float32:
        return "tf32"   # ignored for 16-bit and fp8 operands
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"
