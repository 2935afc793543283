"""What a first-seen shape costs masked SDPA, per backend choice (a few seconds on the device; CUDA only).

The executor's prefill attention is one masked SDPA call per chunk (``kernels.torch_fast.attention_sdpa``) whose
(new, cached) shape changes nearly every step under chunked prefill. cuDNN's backend builds an execution plan per
exact shape, so its first call at a shape costs tens of ms of host; the memory-efficient kernel has no per-shape
plan. This times, for the default backend order, cuDNN alone and the executor's pinned order, the first and second
call of several shapes never run before in the process (MLA prefill: 128 heads, q/k 192, v 128, bf16).

    python3 scripts/sdpa_first_call.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def first_and_again(fn) -> tuple[float, float]:
    """Seconds of the first and the second synchronised call."""
    import torch
    out = []
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out[0], out[1]


def main() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.torch_fast import PREFILL_SDPA_BACKENDS

    if not torch.cuda.is_available():
        raise SystemExit("sdpa_first_call: needs a CUDA device")
    dev = torch.device("cuda")
    h, dqk, dv = 128, 192, 128
    priority = getattr(torch._C, "_get_sdp_priority_order", lambda: "?")
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "priority before the first call", priority())
    orders = {"default order": None, "cudnn only": [SDPBackend.CUDNN_ATTENTION], "pinned (executor)": PREFILL_SDPA_BACKENDS,
              "flash split (MLA)": "flash"}
    for k, (name, order) in enumerate(orders.items()):
        for j, (n, c) in enumerate(((1000 + 37 * k, 3000 + 11 * k), (517 + 13 * k, 5003 + 7 * k), (2049 + k, 1 + k))):
            s = n + c
            q = torch.randn(1, h, n, dqk, device=dev, dtype=torch.bfloat16)
            kk = torch.randn(1, h, s, dqk, device=dev, dtype=torch.bfloat16)
            v = torch.randn(1, h, s, dv, device=dev, dtype=torch.bfloat16)
            mask = (torch.arange(s, device=dev)[None, :] <= torch.arange(c, c + n, device=dev)[:, None])[None, None]

            def call():
                if order == "flash":   # the executor's MLA prefill chunk (kernels/prefill_attention.py): no mask, two flash calls
                    from kernels.prefill_attention import flash_prefill
                    return flash_prefill(q[0].transpose(0, 1), kk[0].transpose(0, 1), v[0].transpose(0, 1), 1.0)
                if order is None:
                    return F.scaled_dot_product_attention(q, kk, v, attn_mask=mask)
                with sdpa_kernel(order):
                    return F.scaled_dot_product_attention(q, kk, v, attn_mask=mask)
            try:
                first, again = first_and_again(call)
            except RuntimeError as e:
                print(f"{name:18s} new {n:5d} cached {c:5d}: not run ({str(e).splitlines()[0][:100]})")
                continue
            print(f"{name:18s} new {n:5d} cached {c:5d}: first {first * 1e3:7.2f} ms, again {again * 1e3:7.2f} ms, "
                  f"one-time {1e3 * (first - again):+7.2f} ms")
    print("priority after the calls (torch sets its default at the first dispatch; 3 = cuDNN):", priority())


if __name__ == "__main__":
    main()
